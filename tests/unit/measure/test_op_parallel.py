"""A strategy tree's per-op tp configs run for real (measure/op_parallel.py, measure/tp_degrees.py): every op at its
own degree over consecutive tp ranks, or whole, on 2 and 4 gloo ranks, computes what the unsplit model computes
(the loss after two optimizer steps; and, for the splits other than Megatron's, every gradient of one step,
tp_gradients, which an AdamW loss cannot check for scale); the degrees handed to the ranks; the layouts not
measured are refused in one line."""

import json
from pathlib import Path

import pytest
from tp_gradients import TINY_LLAMA_MODEL_YAML, Case, compare_gradients
from tp_gradients import tree_yaml as _tree
from typer.testing import CliRunner

from conftest import REPO_DIR, TINY_GPT_MODEL_YAML
from trainsim.cli.main import app
from trainsim.frontends.catalog.build import build_graph
from trainsim.jobfile import job_from_settings
from trainsim.measure.tp_degrees import plan_tp_degrees, plan_tp_layout
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.tree_yaml import load_tree_yaml

runner = CliRunner()
MEGATRON = REPO_DIR / "data" / "strategies" / "megatron"


# a split read whole: q, k, v into a whole projection (core split), the ffn features into a whole activation, the
# logits into a whole cross-entropy (the tied table split)
GATHERS = _tree(2, "embedding.tokens reduce 2", "blocks.*.attn.qkv out 2", "blocks.*.attn.core out 2",
                "blocks.*.mlp.fc1 out 2", "head.proj out 2")
# a whole tensor read split: q, k, v of a whole qkv into a split core, the activation's output into a split fc2,
# whole logits into a vocab-parallel cross-entropy
SLICES = _tree(2, "blocks.*.attn.core out 2", "blocks.*.attn.out reduce 2", "blocks.*.mlp.fc2 reduce 2",
               "head.loss out 2")
# tp 4: pairs of ranks and whole ops mixed (the tied table and logits over pairs, the loss whole; qkv over pairs
# into a whole core, the projection over all 4; fc1 whole, the activation and fc2 over pairs)
PAIRS4 = _tree(4, "embedding.tokens reduce 2", "blocks.*.attn.qkv out 2", "blocks.*.attn.out reduce 4",
               "blocks.*.mlp.act out 2", "blocks.*.mlp.fc2 reduce 2", "head.proj out 2")


# the splits other than Megatron's (measure/op_splits.py) on 4 ranks: qkv by its reduction dimension over 4 into
# a whole core; the core by query rows over pairs (qkv and the projection over the pairs); the MLP by tokens over
# pairs
REDUCE4 = _tree(4, "embedding.tokens reduce 4", "blocks.*.attn.qkv reduce 4", "blocks.*.mlp.fc1 reduce 4",
                "blocks.*.mlp.act out 4", "blocks.*.mlp.fc2 reduce 4", "head.proj out 4", "head.loss out 4")
ROWS_TOKENS4 = _tree(4, "embedding.tokens reduce 4", "blocks.*.attn.qkv out 2", "blocks.*.attn.core seq 2",
                     "blocks.*.attn.out reduce 2", "blocks.*.mlp.fc1 seq 2", "blocks.*.mlp.act seq 2",
                     "blocks.*.mlp.fc2 seq 2", "head.proj out 4", "head.loss out 4")


# LLaMA: q, k and v (grouped, 2 kv heads) of a split qkv gathered into a whole rope and core, the SwiGLU's split
# gate and up into a whole activation, an untied head's split logits into a whole loss beside a whole lookup
LLAMA_GATHERS = _tree(2, "blocks.*.attn.qkv out 2", "blocks.*.mlp.gate_up out 2", "head.proj out 2")
# LLaMA: the core (rope, grouped keys and values) by query rows, the SwiGLU MLP by tokens
LLAMA_ROWS_TOKENS = _tree(2, "blocks.*.attn.qkv out 2", "blocks.*.attn.rope seq 2", "blocks.*.attn.core seq 2",
                          "blocks.*.attn.out reduce 2", "blocks.*.mlp.gate_up seq 2", "blocks.*.mlp.act seq 2",
                          "blocks.*.mlp.down seq 2", "head.proj out 2", "head.loss out 2")


def _settings(tmp_path: Path, ranks: int, model_yaml: str = TINY_GPT_MODEL_YAML) -> list[str]:
    model = tmp_path / "tiny-model.yaml"
    model.write_text(model_yaml)
    return ["--model", str(model), "--micro-batch", "2", "--global-batch", "2", "--seq-len", "16", "--precision",
            "fp32", *(["--tp", str(ranks)] if ranks > 1 else ["--num-gpus", "1"])]


def _loss(tmp_path: Path, ranks: int, tree: str | Path | None, name: str,
          model_yaml: str = TINY_GPT_MODEL_YAML) -> float:
    flags = []
    if tree is not None:
        path = tree if isinstance(tree, Path) else tmp_path / f"{name}.yaml"
        if not isinstance(tree, Path):
            path.write_text(tree)
        flags = ["--tree", str(path)]
    result = runner.invoke(app, ["measure", *_settings(tmp_path, ranks, model_yaml), *flags, "--iterations", "1",
                                 "--warmup", "2", "--out", str(tmp_path / "runs"), "--run-id", name, "--json"])
    assert result.exit_code == 0, result.output
    run = json.loads(result.output)
    assert run["settings"]["world_size"] == ranks
    return float(run["final_loss"])


@pytest.fixture(scope="module")
def unsplit_loss(tmp_path_factory: pytest.TempPathFactory) -> float:
    pytest.importorskip("torch")
    return _loss(tmp_path_factory.mktemp("unsplit"), 1, None, "unsplit")


@pytest.mark.parametrize(("ranks", "tree"), [
    (2, MEGATRON / "gpt-tp2-attn-only.yaml"), (2, MEGATRON / "gpt-tp2-mlp-only.yaml"),
    (2, MEGATRON / "gpt-tp2-qkv-gather.yaml"), (2, MEGATRON / "gpt-tp2-vocab-whole.yaml"), (2, GATHERS),
    (2, SLICES), (4, MEGATRON / "gpt-tp4-mlp-tp2.yaml"), (4, PAIRS4),
    (2, MEGATRON / "gpt-tp2-qkv-reduce.yaml"), (2, MEGATRON / "gpt-tp2-attn-seq.yaml"),
    (2, MEGATRON / "gpt-tp2-mlp-tokens.yaml"), (2, MEGATRON / "gpt-tp2-norms-seq.yaml"), (4, REDUCE4),
    (4, ROWS_TOKENS4)],
    ids=["attn-only", "mlp-only", "qkv-gather", "vocab-whole", "gathers", "slices", "tp4-mlp-tp2", "pairs4",
         "qkv-reduce", "attn-seq", "mlp-tokens", "norms-seq", "reduce4", "rows-tokens4"])
def test_per_op_tp_configs_compute_the_unsplit_models_loss(tmp_path: Path, unsplit_loss: float, ranks: int,
                                                           tree: str | Path) -> None:
    assert _loss(tmp_path, ranks, tree, "tree") == pytest.approx(unsplit_loss, rel=1e-5)


def test_a_llama_with_gathers_rows_and_tokens_computes_its_unsplit_loss(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    unsplit = _loss(tmp_path, 1, None, "llama-unsplit", TINY_LLAMA_MODEL_YAML)
    assert _loss(tmp_path, 2, LLAMA_GATHERS, "llama-gathers", TINY_LLAMA_MODEL_YAML) == pytest.approx(unsplit,
                                                                                                        rel=1e-5)
    assert _loss(tmp_path, 2, LLAMA_ROWS_TOKENS, "llama-rows-tokens", TINY_LLAMA_MODEL_YAML) == pytest.approx(
        unsplit, rel=1e-5)


def _layout(tmp_path: Path, tree: str, tp: int) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, str]]]:
    model = tmp_path / "tiny-gpt.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    job = job_from_settings({"model": str(model), "tp": tp, "num_gpus": tp, "micro_batch": 2, "global_batch": 2,
                             "seq_len": 16, "precision": "fp32", "cluster": "local-cpu"})
    path = tmp_path / "tree.yaml"
    path.write_text(tree)
    plan = load_tree_yaml(path, build_graph(job.model, DeviceSlice.of(job.parallel))).lower(job.parallel)
    return plan_tp_degrees(plan, job.parallel), plan_tp_layout(plan, job.parallel)[1]


def _degrees(tmp_path: Path, tree: str, tp: int) -> dict[str, dict[str, int]]:
    return _layout(tmp_path, tree, tp)[0]


def test_the_ranks_get_each_ops_degree_where_it_is_not_megatrons(tmp_path: Path) -> None:
    qkv_gather = (MEGATRON / "gpt-tp2-qkv-gather.yaml").read_text()
    block = {"attention": 1, "out_proj": 1}
    assert _degrees(tmp_path, qkv_gather, 2) == {"block:0": block, "block:1": block}
    assert _degrees(tmp_path, PAIRS4, 4) == {
        "embed": {"lookup": 2}, "head": {"logits": 2, "cross_entropy": 1},
        **{f"block:{i}": {"qkv": 2, "attention": 1, "fc1": 1, "gelu": 2, "fc2": 2} for i in (0, 1)}}
    megatron = _tree(2, "embedding.tokens reduce 2", "blocks.*.attn.qkv out 2", "blocks.*.attn.core out 2",
                     "blocks.*.attn.out reduce 2", "blocks.*.mlp.fc1 out 2", "blocks.*.mlp.act out 2",
                     "blocks.*.mlp.fc2 reduce 2", "head.proj out 2", "head.loss out 2")
    assert _degrees(tmp_path, megatron, 2) == {}


def test_the_ranks_get_each_split_that_is_not_megatrons(tmp_path: Path) -> None:
    blocks = ("block:0", "block:1")
    cases = {"gpt-tp2-qkv-reduce.yaml": ({"qkv": 2}, {"qkv": "reduce"}),
             "gpt-tp2-attn-seq.yaml": ({"attention": 2}, {"attention": "seq"}),
             "gpt-tp2-mlp-tokens.yaml": ({name: 2 for name in ("fc1", "gelu", "fc2")},
                                         {name: "seq" for name in ("fc1", "gelu", "fc2")}),
             "gpt-tp2-norms-seq.yaml": ({name: 2 for name in ("norm1", "residual1", "norm2", "residual2")},
                                        {name: "seq" for name in ("norm1", "residual1", "norm2", "residual2")})}
    for name, (degrees, dims) in cases.items():
        assert _layout(tmp_path, (MEGATRON / name).read_text(), 2) == (
            {b: degrees for b in blocks}, {b: dims for b in blocks}), name
    assert _layout(tmp_path, REDUCE4, 4)[1] == {b: {"qkv": "reduce", "fc1": "reduce"} for b in blocks}


@pytest.mark.parametrize(("tree", "flags", "words"), [
    (_tree(4, "embedding.tokens reduce 4", "blocks.*.attn.qkv out 4", "blocks.*.attn.core out 2",
           "blocks.*.attn.out reduce 2", "head.proj out 4", "head.loss out 4"), ["--tp", "4", "--global-batch", "2"],
     "qkv over 4, attention over 2"),
    ((MEGATRON / "gpt-tp2-attn-only.yaml").read_text(), ["--tp", "2", "--dp", "2", "--global-batch", "4"],
     "dp=2 with --tree"),
    ((MEGATRON / "gpt-tp2-lookup-tokens.yaml").read_text(), ["--tp", "2", "--global-batch", "2"],
     "lookup batch=1 seq=2 out=1 reduce=1' is invalid: measured where an op takes Megatron's split"),
    (_tree(2, "blocks.*.attn.core seq 2"), ["--tp", "2", "--global-batch", "2"],
     "attention by seq over 2, qkv over 1, out_proj over 1' is invalid: measured with qkv and out_proj Megatron's"),
    (_tree(2, "blocks.*.attn.qkv out 2", "blocks.*.attn.core seq 2", "blocks.*.attn.out reduce 2",
           "blocks.*.mlp.fc1 seq 2", "blocks.*.mlp.act seq 2"), ["--tp", "2", "--global-batch", "2"],
     "measured where every op of the MLP is split by seq over the same ranks"),
    (_tree(2, "blocks.*.mlp.fc1 seq 2", "blocks.*.mlp.act seq 2", "blocks.*.mlp.fc2 reduce 2"),
     ["--tp", "2", "--global-batch", "2"], "measured where every op of the MLP is split by seq over the same ranks"),
    (_tree(2, "blocks.*.norm1 seq 2", "blocks.*.attn.qkv out 2", "blocks.*.attn.core out 2",
           "blocks.*.attn.out reduce 2", "blocks.*.mlp.fc1 out 2", "blocks.*.mlp.act out 2",
           "blocks.*.mlp.fc2 reduce 2"), ["--tp", "2", "--global-batch", "2"],
     "measured where norm1, residual1, norm2 and residual2 are all split by seq over tp=2"),
    (_tree(2, "blocks.*.attn.qkv reduce 2", "blocks.*.attn.core out 2", "blocks.*.attn.out out 2"),
     ["--tp", "2", "--global-batch", "2"], "out_proj batch=1 seq=1 out=2 reduce=1' is invalid"),
    (_tree(2, "blocks.*.attn.qkv out 2", "blocks.*.attn.core seq 2", "blocks.*.attn.softmax seq 2",
           "blocks.*.attn.out reduce 2"), ["--tp", "2", "--global-batch", "2", "--attention", "math"],
     "the core split by seq (block:0) is measured with flash2"),
    ((MEGATRON / "gpt-tp2-attn-only.yaml").read_text(), ["--tp", "2", "--global-batch", "2", "--precision",
                                                         "amp-bf16"], "fp32")])
def test_per_op_tp_layouts_not_measured_are_one_line(tmp_path: Path, tree: str, flags: list[str],
                                                     words: str) -> None:
    model = tmp_path / "tiny-gpt.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    path = tmp_path / "tree.yaml"
    path.write_text(tree)
    result = runner.invoke(app, ["measure", "--model", str(model), "--micro-batch", "2", "--seq-len", "16",
                                 "--precision", "fp32", "--tree", str(path), *flags])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


GRADIENT_TREES = ("gpt-tp2-qkv-reduce", "gpt-tp2-attn-seq", "gpt-tp2-mlp-tokens", "gpt-tp2-norms-seq",
                  "gpt-tp2-qkv-gather")


@pytest.fixture(scope="module")
def gradient_failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    pytest.importorskip("torch")
    cases = {name: Case(model_yaml=TINY_GPT_MODEL_YAML, tree_yaml=(MEGATRON / f"{name}.yaml").read_text())
             for name in GRADIENT_TREES}
    return compare_gradients(cases, tmp_path_factory.mktemp("gradients"))


@pytest.mark.parametrize("name", GRADIENT_TREES)
def test_the_splits_compute_the_unsplit_gradients(gradient_failures: dict[str, str], name: str) -> None:
    # the losses above come after AdamW steps, which barely see a gradient scaled: here every gradient is compared
    assert not gradient_failures[name], gradient_failures[name]
