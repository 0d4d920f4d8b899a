"""`trainsim predict --frontend torch --tree FILE --engine sim` with pipeline stages on meshes of their own: the
shipped GPT-2 file (stage 0 on tp 1 x dp 2, captured again at half the micro-batch; stage 1 on tp 2) beside its
catalog counterpart, and one-line refusals (exit 2)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app

pytest.importorskip("torch")
pytest.importorskip("transformers")

RUNNER = CliRunner()
JOB = ["predict", "--model", "data/strategies/proteus/small/models/gpt2-small.yaml", "--cluster", "local-cpu",
       "--num-gpus", "4", "--tp", "2", "--pp", "2", "--micro-batch", "4", "--global-batch", "16", "--seq-len", "128",
       "--precision", "fp32", "--json"]
TREES = "data/strategies/frontend"


def test_captured_stage_meshes_pay_the_catalog_communication() -> None:
    """The same stage meshes on both front-ends (the documented command): stage 1, on tp 2, is the bottleneck of
    both, with the same tp communication (its attention and MLP all-reduce pairs, its vocab-parallel head) and
    pipeline transfers; the captured graph's own kernels make it slower, by a few per cent."""
    runs = {}
    for frontend, tree in (("torch", "gpt2-torch-stage0-tp1.yaml"), ("catalog", "gpt2-catalog-stage0-tp1.yaml")):
        result = RUNNER.invoke(app, [*JOB, "--engine", "sim", "--frontend", frontend, "--tree", f"{TREES}/{tree}"])
        assert result.exit_code == 0, result.output
        runs[frontend] = json.loads(result.stdout)
    torch_run, catalog_run = runs["torch"], runs["catalog"]
    for key in ("tp_comm", "pp_comm"):
        assert torch_run["breakdown"][key] == pytest.approx(catalog_run["breakdown"][key], rel=1e-9), key
    assert 1.0 < torch_run["iteration_time_s"] / catalog_run["iteration_time_s"] < 1.1


def test_a_tp_split_on_a_stage_at_tp_1_is_one_line_exit_2(tmp_path: Path) -> None:
    tree = tmp_path / "tree.yaml"
    tree.write_text(Path(f"{TREES}/gpt2-torch-stage0-tp1.yaml").read_text().replace('"blocks.2-3.*.attn.c_attn"',
                                                                                     '"blocks.*.*.attn.c_attn"'))
    result = RUNNER.invoke(app, [*JOB, "--engine", "sim", "--frontend", "torch", "--tree", str(tree)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "must divide tp=1 (the layer's stage runs its own mesh: tp=1 dp=2)" in lines[0]


def test_the_analytical_engine_refuses_stage_meshes_in_one_line() -> None:
    result = RUNNER.invoke(app, [*JOB, "--engine", "analytical", "--frontend", "torch", "--tree",
                                 f"{TREES}/gpt2-torch-stage0-tp1.yaml"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "engine='analytical' is invalid: places layers" in lines[0]
