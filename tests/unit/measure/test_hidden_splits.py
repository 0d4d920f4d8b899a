"""The norms, residual adds, final norm and positions split by hidden features over tp, and the adds, final norm
and positions by tokens (measure/hidden_splits.py), run for real on gloo ranks: the loss and every parameter's
gradient equal the unsplit model's (tp_gradients: a gradient comparison, not a loss after AdamW steps); `trainsim
measure --tree` runs them; the layouts handed to the ranks; what stays refused is one line."""

import json
from pathlib import Path

import pytest
from tp_gradients import TINY_LLAMA_MODEL_YAML, Case, compare_gradients, tree_yaml
from typer.testing import CliRunner

from conftest import REPO_DIR, TINY_GPT_MODEL_YAML
from trainsim.cli.main import app
from trainsim.frontends.catalog.build import build_graph
from trainsim.jobfile import job_from_settings
from trainsim.measure.tp_degrees import plan_tp_layout
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.tree_yaml import load_tree_yaml

runner = CliRunner()
MEGATRON = REPO_DIR / "data" / "strategies" / "megatron"
_MEGATRON_ROWS = ("embedding.tokens reduce 2", "blocks.*.attn.qkv out 2", "blocks.*.attn.core out 2",
                  "blocks.*.attn.out reduce 2", "blocks.*.mlp.fc1 out 2", "blocks.*.mlp.act out 2",
                  "blocks.*.mlp.fc2 reduce 2", "head.proj out 2", "head.loss out 2")
# every norm and add, the final norm and the positions by features: the skip shares the norm's slice, one gather
# at each block's end
ALL_FEATURES = tree_yaml(2, *_MEGATRON_ROWS, "embedding.positions out 2", "head.norm out 2",
                         *(f"blocks.*.{name} out 2" for name in ("norm1", "residual1", "norm2", "residual2")))
# norm1 and residual2 by features, norm2 and residual1 whole: the add's skip sliced from the whole state, residual1
# whole for norm2 and then sliced for residual2
MIXED = tree_yaml(2, *_MEGATRON_ROWS, "blocks.*.norm1 out 2", "blocks.*.residual2 out 2")
LLAMA_ROWS = ("blocks.*.attn.qkv out 2", "blocks.*.attn.rope out 2", "blocks.*.attn.core out 2",
              "blocks.*.attn.out reduce 2",
              "blocks.*.mlp.gate_up out 2", "blocks.*.mlp.act out 2", "blocks.*.mlp.down reduce 2",
              "head.proj out 2", "head.loss out 2")
# LLaMA: RMSNorms (one statistic each way), no biases, an untied head, by features with the adds
LLAMA_FEATURES = tree_yaml(2, *LLAMA_ROWS, "head.norm out 2",
                           *(f"blocks.*.{name} out 2" for name in ("norm1", "residual1", "norm2", "residual2")))

# residual2 alone by tokens: residual1 whole, sliced as residual2's skip
ADD2_SEQ = tree_yaml(2, *_MEGATRON_ROWS, "blocks.*.residual2 seq 2")
# the positions and the final norm by tokens: the table and the gain whole, their gradients summed over tp
ENDS_SEQ = tree_yaml(2, *_MEGATRON_ROWS, "embedding.positions seq 2", "head.norm seq 2")


_FOUR_RANKS = tree_yaml(4, *(row.replace(" 2", " 4") for row in _MEGATRON_ROWS), "head.norm out 4",
                        "blocks.*.norm1 out 4", "blocks.*.residual1 out 4", "blocks.*.norm2 out 4")
FEATURE_CASES = {
    "norms-features": Case(model_yaml=TINY_GPT_MODEL_YAML,
                           tree_yaml=(MEGATRON / "gpt-tp2-norms-features.yaml").read_text()),
    "adds-features": Case(model_yaml=TINY_GPT_MODEL_YAML,
                          tree_yaml=(MEGATRON / "gpt-tp2-adds-features.yaml").read_text()),
    "all-features": Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=ALL_FEATURES),
    "mixed": Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=MIXED),
    "llama": Case(model_yaml=TINY_LLAMA_MODEL_YAML, tree_yaml=LLAMA_FEATURES),
    "adds-seq": Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=(MEGATRON / "gpt-tp2-adds-seq.yaml").read_text()),
    "add2-seq": Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=ADD2_SEQ),
    "ends-seq": Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=ENDS_SEQ)}
# the block's forward, collectives included, runs again inside the backward (torch.utils.checkpoint)
FULL_RECOMPUTE = Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=ALL_FEATURES, settings={"recompute": "full"})
FOUR_RANKS = Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=_FOUR_RANKS, tp=4)


@pytest.fixture(scope="module")
def gradient_failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    pytest.importorskip("torch")
    cases = {**FEATURE_CASES, "full-recompute": FULL_RECOMPUTE, "four-ranks": FOUR_RANKS}
    return compare_gradients(cases, tmp_path_factory.mktemp("gradients"))


@pytest.mark.parametrize("name", FEATURE_CASES)
def test_a_split_by_features_computes_the_unsplit_gradients(gradient_failures: dict[str, str], name: str) -> None:
    assert not gradient_failures[name], gradient_failures[name]


def test_splits_by_features_under_full_recompute_compute_the_unsplit_gradients(
        gradient_failures: dict[str, str]) -> None:
    assert not gradient_failures["full-recompute"], gradient_failures["full-recompute"]


def test_norms_by_features_over_four_ranks_compute_the_unsplit_gradients(gradient_failures: dict[str, str]) -> None:
    assert not gradient_failures["four-ranks"], gradient_failures["four-ranks"]


def test_measure_runs_a_tree_split_by_features(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "tiny-gpt.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    tree = tmp_path / "tree.yaml"
    tree.write_text(ALL_FEATURES)
    result = runner.invoke(app, ["measure", "--model", str(model), "--tp", "2", "--micro-batch", "2",
                                 "--global-batch", "2", "--seq-len", "16", "--precision", "fp32", "--tree",
                                 str(tree), "--iterations", "1", "--warmup", "1", "--out", str(tmp_path / "runs"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    run = json.loads(result.output)
    assert run["settings"]["world_size"] == 2 and run["final_loss"] > 0


def _layout(tmp_path: Path, tree: str) -> dict[str, dict[str, str]]:
    model = tmp_path / "tiny-gpt.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    job = job_from_settings({"model": str(model), "tp": 2, "num_gpus": 2, "micro_batch": 2, "global_batch": 2,
                             "seq_len": 16, "precision": "fp32", "cluster": "local-cpu"})
    path = tmp_path / "tree.yaml"
    path.write_text(tree)
    plan = load_tree_yaml(path, build_graph(job.model, DeviceSlice.of(job.parallel))).lower(job.parallel)
    return plan_tp_layout(plan, job.parallel)[1]


def test_the_ranks_get_each_split_by_features(tmp_path: Path) -> None:
    block = {name: "features" for name in ("norm1", "residual1", "norm2", "residual2")}
    assert _layout(tmp_path, ALL_FEATURES) == {"embed": {"pos_add": "features"}, "head": {"final_norm": "features"},
                                               "block:0": block, "block:1": block}
    assert _layout(tmp_path, MIXED) == {f"block:{i}": {"norm1": "features", "residual2": "features"}
                                        for i in (0, 1)}
    assert _layout(tmp_path, ADD2_SEQ) == {f"block:{i}": {"residual2": "seq"} for i in (0, 1)}
    assert _layout(tmp_path, ENDS_SEQ) == {"embed": {"pos_add": "seq"}, "head": {"final_norm": "seq"}}


@pytest.mark.parametrize(("tree", "words"), [
    (tree_yaml(2, "blocks.*.norm1 out 2", "blocks.*.attn.qkv reduce 2"),
     "measured where the norms, adds and positions split by features (the final norm and the positions by seq "
     "too) are split over tp=2 and the other ops"),
    (tree_yaml(2, *_MEGATRON_ROWS, "blocks.*.residual1 out 2", "blocks.*.norm2 seq 2"),
     "measured where norm1, residual1, norm2 and residual2 are all split by seq"),
    (tree_yaml(2, *_MEGATRON_ROWS, "blocks.*.residual1 out 2", "blocks.*.residual2 seq 2"),
     "or the residual adds alone, and the block's other ops take Megatron's split"),
    (tree_yaml(2, "head.norm out 2", "head.proj out 1"),
     "measured where the norms, adds and positions split by features"),
    (tree_yaml(2, "blocks.*.residual1 reduce 2"), "residual1 split.compute@tp='reduce=2' is invalid")])
def test_splits_by_features_not_measured_are_one_line(tmp_path: Path, tree: str, words: str) -> None:
    model = tmp_path / "tiny-gpt.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    path = tmp_path / "tree.yaml"
    path.write_text(tree)
    result = runner.invoke(app, ["measure", "--model", str(model), "--micro-batch", "2", "--seq-len", "16",
                                 "--precision", "fp32", "--tree", str(path), "--tp", "2", "--global-batch", "2"])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
