"""The split executor (measure/split_model.py): placements' rank coordinates and collective groups, exact; a strategy
tree's op splits run for real on 2 gloo ranks compute what the plain data-parallel plan computes; the memory cap
turns a run into outcome "oom"; bad flags are one line."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_GPT_MODEL_YAML
from trainsim.cli.main import app
from trainsim.strategy.placement import Placement

torch = pytest.importorskip("torch")

from trainsim.measure.split_model import coords, members  # noqa: E402

runner = CliRunner()


PAIRS = """\
strategy_tree:
  schedule: {micro_batches: 1}
  split:
    - {path: "blocks.*.attn.qkv", item: compute, dim: out, parts: 2}
    - {path: "blocks.*.attn.out", item: compute, dim: reduce, parts: 2}
    - {path: "blocks.*.residual1", item: compute, dim: batch, parts: 2}
    - {path: "blocks.*.mlp.fc1", item: compute, dim: out, parts: 2}
    - {path: "blocks.*.mlp.fc2", item: compute, dim: reduce, parts: 2}
    - {path: "blocks.*.residual2", item: compute, dim: batch, parts: 2}
"""
PLAIN = "strategy_tree:\n  schedule: {micro_batches: 1}\n"


def test_coordinates_put_a_shards_ranks_together() -> None:
    # batch 2 x feature 2 of 4: rank 2j+q holds batch part j, feature part q
    p = Placement(4, batch=2, feature=2)
    assert [(coords(p, r)["batch"], coords(p, r)["feature"]) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # batch 2 of 4, replicated twice: ranks 0 and 1 hold part 0
    q = Placement(4, batch=2)
    assert [(coords(q, r)["batch"], coords(q, r)["replica"]) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_collectives_group_is_one_shard_of_the_coarser_placement() -> None:
    fine, coarse = Placement(4, batch=4), Placement(4, batch=2, feature=2)
    assert [members(fine, coarse, r) for r in range(4)] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    partial, whole = Placement(4, partial=4), Placement(4, batch=4)
    assert members(partial, whole, 3) == (0, 1, 2, 3)


def _run(tmp_path: Path, tree: str, name: str, *extra: str) -> dict[str, object]:
    model = tmp_path / "tiny-gpt.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    tree_file = tmp_path / f"{name}.yaml"
    tree_file.write_text(tree)
    result = runner.invoke(app, ["measure", "--model", str(model), "--num-gpus", "2", "--micro-batch", "2",
                                 "--global-batch", "4", "--seq-len", "16", "--precision", "fp32", "--tree",
                                 str(tree_file), "--iterations", "1", "--warmup", "0", "--out",
                                 str(tmp_path / "runs"), "--run-id", name, "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_megatron_pairs_carved_from_data_parallel_ranks_compute_the_plain_loss(tmp_path: Path) -> None:
    plain = _run(tmp_path, PLAIN, "plain")
    pairs = _run(tmp_path, PAIRS, "pairs")
    assert pairs["settings"]["outcome"] == "ok"  # type: ignore[index]
    assert pairs["final_loss"] == pytest.approx(plain["final_loss"], rel=1e-5)


def test_a_run_over_its_memory_cap_records_oom(tmp_path: Path) -> None:
    run = _run(tmp_path, PLAIN, "capped", "--memory-cap-gib", "0.000001")
    assert run["settings"]["outcome"] == "oom"  # type: ignore[index]


@pytest.mark.parametrize(("flags", "field"), [(["--memory-cap-gib", "-1"], "memory_cap_gib"),
                                              (["--tree", "no-such-tree.yaml"], "tree")])
def test_bad_split_run_flags_are_one_line(flags: list[str], field: str) -> None:
    result = runner.invoke(app, ["measure", "--model", "gpt3-125m", "--num-gpus", "1", "--precision", "fp32",
                                 *flags])
    assert result.exit_code == 2
    assert field in result.output and "Traceback" not in result.output


def test_a_tree_with_a_stage_on_its_own_mesh_is_refused(tmp_path: Path) -> None:
    """`trainsim measure` runs one mesh per job: stage 1 at tp 2 of a tp 1 x dp 2 x pp 2 job is predicted, not run."""
    tree = tmp_path / "stage1-tp2.yaml"
    tree.write_text("strategy_tree:\n  map:\n    - {stage: 0, tp: 1}\n    - {path: blocks.6-11, stage: 1, tp: 2}\n"
                    "    - {path: head, stage: 1, tp: 2}\n")
    result = runner.invoke(app, ["measure", "--model", "gpt3-125m", "--num-gpus", "4", "--pp", "2",
                                 "--precision", "fp32", "--tree", str(tree)])
    assert result.exit_code == 2
    assert "maps a stage to a mesh of its own" in result.output and "Traceback" not in result.output
