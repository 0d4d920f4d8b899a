"""A strategy tree's tp configs on a captured graph run for real (measure/front_end_tp.py, measure/front_end_model.py):
the tiny GPT-2 the torch front-end captures (tests/conftest.py's tiny GPT: 2 blocks, hidden 32, 4 heads, ffn 128,
vocabulary 256, tied; micro-batch 2 x 16 tokens, fp32) with its attention and MLP pairs split over 2 gloo ranks as
torch's ColwiseParallel and RowwiseParallel computes what the unsplit Hugging Face model computes (every gradient
of one step, and the loss after AdamW steps through `trainsim measure`), and its step issues the collectives the
compiler prices for the captured graph; the configs not mapped are refused in one line."""

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from front_end_gradients import compare
from tp_gradients import TINY_LLAMA_MODEL_YAML
from tp_gradients import tree_yaml as _tree
from typer.testing import CliRunner

from conftest import TINY_GPT_MODEL_YAML
from trainsim.cli.main import app
from trainsim.compile.shape_layers import shape_layers
from trainsim.errors import ConfigError
from trainsim.frontends.registry import ModelSource
from trainsim.jobfile import job_from_settings
from trainsim.measure.front_end_tp import front_end_styles
from trainsim.measure.tp_degrees import priced_tp_collectives
from trainsim.pipeline import graph_for
from trainsim.strategy.tree_yaml import load_tree_yaml

pytest.importorskip("transformers")
runner = CliRunner()
PAIRS = ("blocks.*.*.attn.c_attn out 2", "blocks.*.*.attn.c_proj reduce 2", "blocks.*.*.mlp.c_fc out 2",
         "blocks.*.*.mlp.c_proj reduce 2")
ATTN_MLP = _tree(2, *PAIRS)
SETTINGS = {"frontend": "torch", "tp": 2, "num_gpus": 2, "micro_batch": 2, "global_batch": 4, "seq_len": 16,
            "precision": "fp32", "cluster": "local-cpu", "optimizer_impl": "loop"}
# a LLaMA as torch.fuse captures it: q, k and v in one GEMM under self_attn (with the rope and the core), gate and up
# under mlp; the projection and down_proj written back to whole outputs and split by their reduction
LLAMA_PAIRS = _tree(2, "blocks.*.*.self_attn out 2", "blocks.*.*.self_attn.o_proj out 1",
                    "blocks.*.*.self_attn.o_proj reduce 2", "blocks.*.*.mlp out 2", "blocks.*.*.mlp.down_proj out 1",
                    "blocks.*.*.mlp.down_proj reduce 2")
LLAMA_STYLES = {f"model.layers.{b}.{path}": style for b in (0, 1) for path, style in (
    ("self_attn", "colwise"), ("self_attn.o_proj", "rowwise"), ("mlp", "colwise"), ("mlp.down_proj", "rowwise"))}
STYLES = {f"transformer.h.{b}.{path}": style for b in (0, 1) for path, style in (
    ("attn.c_attn", "colwise"), ("attn.c_proj", "rowwise"), ("mlp.c_fc", "colwise"), ("mlp.c_proj", "rowwise"))}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny-gpt.yaml"
    path.write_text(TINY_GPT_MODEL_YAML)
    return path


@pytest.fixture(scope="module")
def captured(model_path: Path) -> tuple[Any, Any]:
    job = job_from_settings({**SETTINGS, "model": str(model_path)})
    return job, graph_for(job, ModelSource(str(model_path), "torch"))


def _styles(captured: tuple[Any, Any], tree: str, tmp_path: Path) -> tuple[dict[str, str], Any]:
    job, graph = captured
    path = tmp_path / "tree.yaml"
    path.write_text(tree)
    plan = load_tree_yaml(path, graph).lower(job.parallel)
    shaped = shape_layers(job, plan)
    return front_end_styles(plan, shaped, 2), shaped


def test_megatrons_pairs_map_onto_torchs_styles(captured: tuple[Any, Any], tmp_path: Path) -> None:
    assert _styles(captured, ATTN_MLP, tmp_path)[0] == STYLES
    attention = {k: v for k, v in STYLES.items() if ".attn." in k}
    assert _styles(captured, _tree(2, *PAIRS[:2]), tmp_path)[0] == attention


@pytest.mark.parametrize(("splits", "words"), [
    (PAIRS[:1], "attn.c_attn': 'colwise'} is invalid"),  # the projection inferred, not given: no pair
    ((*PAIRS, "head out 2"), "(head)"),  # the vocabulary-parallel head
    (("blocks.*.*.mlp.c_fc seq 2", "blocks.*.*.mlp.c_proj seq 2"), "transformer.h.0.mlp.c_fc seq=2"),
    (("blocks.*.*.attn.c_attn out 2", "blocks.*.*.attn.c_proj out 2"),
     "this layer's priced collectives: attn.ag all-gather fwd")])
def test_configs_not_mapped_are_refused_in_one_line(captured: tuple[Any, Any], tmp_path: Path,
                                                    splits: tuple[str, ...], words: str) -> None:
    with pytest.raises(ConfigError, match="measured where a linear layer takes Megatron's column split") as error:
        _styles(captured, _tree(2, *splits), tmp_path)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_the_split_model_computes_the_unsplit_gradients_and_the_priced_collectives(
        captured: tuple[Any, Any], model_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    failures, rows = compare({**SETTINGS, "model": str(model_path)}, STYLES, tmp_path / "ranks")
    assert not any(failures), failures
    _, shaped = _styles(captured, ATTN_MLP, tmp_path)
    micro_batches = 2
    assert Counter((c, b) for c, b in rows) == Counter(
        {row: n * micro_batches for row, n in priced_tp_collectives(shaped).items()})
    # by hand: per micro-batch and block an all-reduce of the hidden state (2 x 16 x 32 x 4 = 4096 bytes) after
    # each projection and of each module's input gradient
    assert Counter((c, b) for c, b in rows) == Counter({("all-reduce", 4096): 2 * 2 * 4})


def _measure(tmp_path: Path, model_path: Path, name: str, *flags: str) -> Any:
    return runner.invoke(app, ["measure", "--model", str(model_path), "--frontend", "torch", "--micro-batch", "2",
                               "--global-batch", "2", "--seq-len", "16", "--precision", "fp32", *flags,
                               "--iterations", "1", "--warmup", "2", "--out", str(tmp_path / "runs"),
                               "--run-id", name, "--json"])


def test_measure_runs_the_tree_on_the_captured_models_ranks(model_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    tree = tmp_path / "tree.yaml"
    tree.write_text(ATTN_MLP)
    unsplit = _measure(tmp_path, model_path, "unsplit", "--num-gpus", "1")
    split = _measure(tmp_path, model_path, "split", "--tp", "2", "--tree", str(tree))
    assert unsplit.exit_code == 0 and split.exit_code == 0, unsplit.output + split.output
    run = json.loads(split.output)
    assert run["settings"]["world_size"] == 2
    assert run["final_loss"] == pytest.approx(json.loads(unsplit.output)["final_loss"], rel=1e-5)


@pytest.mark.parametrize(("flags", "words"), [
    (["--tp", "2"], "needs a strategy tree splitting the model's modules"),
    (["--tp", "2", "--dp", "2", "--global-batch", "4"], "dp=2 with --frontend torch"),
    (["--num-gpus", "1", "--frontend", "jax"], "frontend"),
    (["--num-gpus", "1", "--precision", "amp-bf16"], "fp32")])
def test_front_end_runs_not_measured_are_one_line(model_path: Path, tmp_path: Path, flags: list[str],
                                                  words: str) -> None:
    result = _measure(tmp_path, model_path, "refused", *flags)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_a_captured_llamas_fused_projections_run_as_their_linear_layers(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "tiny-llama.yaml"
    model.write_text(TINY_LLAMA_MODEL_YAML)
    job = job_from_settings({**SETTINGS, "model": str(model)})
    captured = (job, graph_for(job, ModelSource(str(model), "torch")))
    styles, shaped = _styles(captured, LLAMA_PAIRS, tmp_path)
    assert styles == LLAMA_STYLES
    failures, rows = compare({**SETTINGS, "model": str(model)}, styles, tmp_path / "ranks")
    assert not any(failures), failures
    # q, k and v (gate and up) read one f: one all-reduce of their input gradient per module, as priced
    assert Counter((c, b) for c, b in rows) == Counter(
        {row: n * 2 for row, n in priced_tp_collectives(shaped).items()}) == Counter({("all-reduce", 4096): 16})
