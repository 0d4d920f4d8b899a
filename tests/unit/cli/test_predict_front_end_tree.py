"""`trainsim predict --frontend torch --tree FILE --engine sim`: a captured GPT-2 split over tp by a shipped tree
file, beside the catalog's counterpart, and one-line refusals (exit 2)."""

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app

pytest.importorskip("torch")
pytest.importorskip("transformers")

RUNNER = CliRunner()
JOB = ["predict", "--model", "data/strategies/proteus/small/models/gpt2-small.yaml", "--cluster", "local-cpu",
       "--num-gpus", "2", "--tp", "2", "--micro-batch", "2", "--global-batch", "2", "--seq-len", "32",
       "--precision", "fp32", "--engine", "sim", "--json"]
TREES = "data/strategies/frontend"


def test_captured_attention_split_pays_the_catalog_collectives() -> None:
    """The attention split over the tp pair on both front-ends: the same tp communication (one all-reduce pair
    per block, 4 blocks), the same weights to the MiB (the captured graph holds the norms whole: 1 KiB more)."""
    runs = {}
    for frontend, tree in (("torch", "gpt2-torch-tp2-attn.yaml"), ("catalog", "gpt2-catalog-tp2-attn.yaml")):
        result = RUNNER.invoke(app, [*JOB, "--frontend", frontend, "--tree", f"{TREES}/{tree}"])
        assert result.exit_code == 0, result.output
        runs[frontend] = json.loads(result.stdout)
    torch_run, catalog_run = runs["torch"], runs["catalog"]
    assert torch_run["breakdown"]["tp_comm"] == pytest.approx(catalog_run["breakdown"]["tp_comm"], rel=1e-9)
    assert torch_run["memory_breakdown"]["weights"] == pytest.approx(catalog_run["memory_breakdown"]["weights"],
                                                                     rel=1e-3)


@pytest.mark.parametrize(("extra", "words"), [
    ([], "give a strategy tree that splits its ops over tp"),
    (["--tree", "data/strategies/megatron/gpt-tp2-attn-only.yaml"], "matches no node"),
])
def test_bad_input_is_one_line_exit_2(extra: list[str], words: str) -> None:
    result = RUNNER.invoke(app, [*JOB, "--frontend", "torch", *extra])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]
