"""`trainsim predict --frontend torch --tree FILE`: a CNN given as an nn.Module factory with its convolutions split
over tp by the shipped trees (both engines), beside the catalog's description of the same CNN carved from the
data-parallel pair; a captured GPT-2 with Megatron's vocab-parallel lookup beside the catalog's plain tp 2; bad
input in one line (exit 2)."""

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app

pytest.importorskip("torch")
pytest.importorskip("transformers")

RUNNER = CliRunner()
TREES = "data/strategies/frontend"
CNN = ["predict", "--cluster", "local-cpu", "--num-gpus", "2", "--precision", "fp32", "--global-batch", "8",
       "--json"]
CAPTURED = ["--frontend", "torch", "--model", f"{TREES}/models/small_cnn.py:build", "--tp", "2", "--micro-batch", "8"]


def _run(args: list[str]) -> dict[str, Any]:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("tree", ["cnn-torch-tp2-channels.yaml", "cnn-torch-tp2-pool.yaml"])
def test_captured_cnn_splits_price_alike_in_both_engines(tree: str) -> None:
    runs = [_run([*CNN, *CAPTURED, "--tree", f"{TREES}/{tree}", "--engine", engine])
            for engine in ("sim", "analytical")]
    assert runs[0]["iteration_time_s"] == pytest.approx(runs[1]["iteration_time_s"], rel=1e-9)
    assert runs[0]["breakdown"]["tp_comm"] > 0.0


def test_captured_cnn_pays_the_catalog_cnns_collectives() -> None:
    """Each block's conv1 by out over the tp pair (torch) and over the data-parallel pair carved as the pair
    (catalog, the stem whole): the same two all-reduces of 8 x 64 x 32 x 32 and 8 x 64 x 16 x 16 fp32 values per
    direction, so the same collective time; the catalog's data-parallel pair also syncs its whole weights'
    gradients (dp_comm), which the tp ranks, reading the same samples, need not."""
    torch_run = _run([*CNN, *CAPTURED, "--tree", f"{TREES}/cnn-torch-tp2-channels.yaml", "--engine", "sim"])
    catalog_run = _run([*CNN, "--model", f"{TREES}/models/small-cnn.yaml", "--micro-batch", "4",
                        "--tree", f"{TREES}/cnn-catalog-dp2-channels.yaml", "--engine", "sim"])
    assert torch_run["breakdown"]["tp_comm"] == pytest.approx(catalog_run["breakdown"]["comm"], rel=1e-9)
    assert catalog_run["breakdown"]["dp_comm"] > 0.0 == torch_run["breakdown"].get("dp_comm", 0.0)


def test_captured_megatron_tree_with_the_vocab_parallel_lookup_pays_plain_tp2s_collectives() -> None:
    gpt2 = ["predict", "--model", "data/strategies/proteus/small/models/gpt2-small.yaml", "--cluster", "local-cpu",
            "--num-gpus", "2", "--tp", "2", "--micro-batch", "2", "--global-batch", "2", "--seq-len", "32",
            "--precision", "fp32", "--engine", "sim", "--json"]
    torch_run = _run([*gpt2, "--frontend", "torch", "--tree", f"{TREES}/gpt2-torch-tp2-megatron.yaml"])
    catalog_run = _run(gpt2)
    assert torch_run["breakdown"]["tp_comm"] == pytest.approx(catalog_run["breakdown"]["tp_comm"], rel=1e-9)


def test_a_conv_split_by_seq_is_one_line_exit_2(tmp_path: Path) -> None:
    tree = tmp_path / "seq.yaml"
    tree.write_text("strategy_tree:\n  split:\n    - {path: 'blocks.*.conv1', item: compute, dim: seq, parts: 2, "
                    "axis: tp}\n")
    result = RUNNER.invoke(app, [*CNN, *CAPTURED, "--tree", str(tree), "--engine", "sim"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "conv1" in lines[0] and "seq=2" in lines[0] and "no sequence dimension" in lines[0]
