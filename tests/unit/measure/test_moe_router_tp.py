"""An MoE block's router over tp run for real (measure/moe_splits.py, measure/tp_degrees.py): the experts at
Megatron's split over the tp pair, the router whole (Megatron's config without sp) or split by sequence, on 2 gloo
ranks. The tiny Mixtral (tp_gradients' tiny LLaMA: SwiGLU, RMSNorm, rope, 2 kv heads, no biases; every block an
MoE of 4 experts, top-2; micro-batch 2 x 16 tokens, fp32) computes what the unsplit model computes: every
gradient of one step (a doubled gradient fails: the mutation case) and the loss after two AdamW steps; the step
issues exactly the collectives the predictor prices, plus the two it leaves out (each MoE block's tokens-per-expert
counts, and the router's gradient sum over the pair, priced with the gradient buckets); the layouts not run are
refused in one line."""

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tp_gradients import TINY_LLAMA_MODEL_YAML, Case, compare_gradients, step_collectives
from tp_gradients import tree_yaml as _tree
from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.compile.shape_layers import shape_layers
from trainsim.frontends.catalog.build import build_graph
from trainsim.jobfile import job_from_settings
from trainsim.measure.tp_degrees import plan_tp_layout, priced_tp_collectives
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.tree_yaml import load_tree_yaml

runner = CliRunner()
MOE = "num_experts: 4\ntop_k: 2\nmoe_every: 1\n"
TINY_MIXTRAL_YAML = TINY_LLAMA_MODEL_YAML.replace("name: tiny-llama", "name: tiny-mixtral") + MOE
MEGATRON = ("embedding.tokens reduce 2", "blocks.*.attn.qkv out 2", "blocks.*.attn.rope out 2",
            "blocks.*.attn.core out 2", "blocks.*.attn.out reduce 2", "blocks.*.moe.mlp.gate_up out 2",
            "blocks.*.moe.mlp.act out 2", "blocks.*.moe.mlp.down reduce 2", "head.proj out 2", "head.loss out 2")
ROUTER_WHOLE = _tree(2, *MEGATRON)
ROUTER_SEQ = _tree(2, *MEGATRON, "blocks.*.moe.router seq 2")
CASES = {"router-whole": Case(model_yaml=TINY_MIXTRAL_YAML, tree_yaml=ROUTER_WHOLE),
         "router-seq": Case(model_yaml=TINY_MIXTRAL_YAML, tree_yaml=ROUTER_SEQ),
         "router-seq, router gradient summed twice": Case(model_yaml=TINY_MIXTRAL_YAML, tree_yaml=ROUTER_SEQ,
                                                          sum_token_splits_twice=True)}
# the job of tp_gradients' cases: 2 micro-batches of 2 x 16 tokens a step
SETTINGS = {"tp": 2, "num_gpus": 2, "micro_batch": 2, "global_batch": 4, "seq_len": 16, "precision": "fp32",
            "cluster": "local-cpu"}
BLOCKS, EXPERTS, HIDDEN = 2, 4, 32


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("moe-gradients")
    return compare_gradients(CASES, path), path


@pytest.mark.parametrize("name", ["router-whole", "router-seq"])
def test_the_router_over_tp_computes_the_unsplit_gradients(compared: tuple[dict[str, str], Path],
                                                           name: str) -> None:
    failures, _ = compared
    assert not failures[name], failures[name]


def test_a_doubled_router_gradient_is_caught(compared: tuple[dict[str, str], Path]) -> None:
    failure = compared[0]["router-seq, router gradient summed twice"]
    assert "layers.0.mlp.router.weight" in failure and "layers.1.mlp.router.weight" in failure, failure
    assert "experts" not in failure  # only the doubled gradients differ


def _plan(tree: str, tmp_path: Path) -> Any:
    model, path = tmp_path / "model.yaml", tmp_path / "tree.yaml"
    model.write_text(TINY_MIXTRAL_YAML)
    path.write_text(tree)
    job = job_from_settings({"model": str(model), **SETTINGS})
    plan = load_tree_yaml(path, build_graph(job.model, DeviceSlice.of(job.parallel))).lower(job.parallel)
    return job, shape_layers(job, plan)


@pytest.mark.parametrize("name", ["router-whole", "router-seq"])
def test_the_step_issues_the_priced_collectives(compared: tuple[dict[str, str], Path], tmp_path: Path,
                                                name: str) -> None:
    _, path = compared
    _, plan = _plan(CASES[name].tree_yaml, tmp_path)
    micro_batches = 2
    priced = Counter({row: n * micro_batches for row, n in priced_tp_collectives(plan).items()})
    # not priced as tp collectives: each MoE block's tokens-per-expert counts (2 ranks x 4 int64) where the router
    # splits its tokens, and after the backward each block's router gradient (32 x 4 fp32) summed over the pair
    counts = Counter({("all-gather", 2 * EXPERTS * 8): BLOCKS * micro_batches}) if name == "router-seq" else Counter()
    router_sums = Counter({("all-reduce", HIDDEN * EXPERTS * 4): BLOCKS})
    assert Counter(step_collectives(path, CASES, name)) == priced + counts + router_sums


def test_the_blocks_collectives_are_priced_as_megatron_cores_dispatch(tmp_path: Path) -> None:
    # per micro-batch and block, by hand: H = 32 tokens x 32 x 4 bytes = 4096, the 64 routed copies R = 8192 and
    # their probabilities 64 x 4 = 256 bytes; attn.ar forward and backward either way
    by_seq = Counter({("all-reduce", 4096): 2, ("all-gather", 8448): 1, ("reduce-scatter", 8192): 1,  # forward
                      ("all-gather", 8192): 1, ("reduce-scatter", 8448): 1,  # backward
                      ("all-gather", 4096): 2})  # the whole hidden state forward, the router's input gradient
    whole = Counter({("all-reduce", 4096): 4})  # mlp.ar forward and backward
    for tree, block in ((ROUTER_SEQ, by_seq), (ROUTER_WHOLE, whole)):
        _, plan = _plan(tree, tmp_path)
        layers = [a.layer for a in plan.layers if a.layer.kind == "moe_block"]
        assert len(layers) == BLOCKS
        for layer in layers:
            assert Counter((c.collective, int(c.buffer_bytes)) for c in layer.comms if c.axis == "tp") == block


def test_the_ranks_get_the_routers_split(tmp_path: Path) -> None:
    job, plan = _plan(ROUTER_SEQ, tmp_path)
    blocks = {f"block:{i}": {"router": 2} for i in range(BLOCKS)}
    assert plan_tp_layout(plan, job.parallel) == (
        blocks, {b: {"router": "seq"} for b in blocks})
    job, plan = _plan(ROUTER_WHOLE, tmp_path)
    assert plan_tp_layout(plan, job.parallel) == ({}, {})


def _measure(tmp_path: Path, model_yaml: str, tree: str | None, name: str, *flags: str) -> Any:
    model = tmp_path / f"{name}-model.yaml"
    model.write_text(model_yaml)
    tree_flags = []
    if tree is not None:
        path = tmp_path / f"{name}.yaml"
        path.write_text(tree)
        tree_flags = ["--tree", str(path)]
    ranks = ["--tp", "2"] if tree is not None else ["--num-gpus", "1"]
    return runner.invoke(app, ["measure", "--model", str(model), "--micro-batch", "2", "--global-batch", "2",
                               "--seq-len", "16", "--precision", "fp32", *ranks, *tree_flags, *flags,
                               "--iterations", "1", "--warmup", "2", "--out", str(tmp_path / "runs"),
                               "--run-id", name, "--json"])


def test_the_measured_loss_is_the_unsplit_models(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    losses = {}
    for name, tree in (("unsplit", None), ("router-whole", ROUTER_WHOLE), ("router-seq", ROUTER_SEQ)):
        result = _measure(tmp_path, TINY_MIXTRAL_YAML, tree, name)
        assert result.exit_code == 0, result.output
        losses[name] = float(json.loads(result.output)["final_loss"])
    assert losses["router-whole"] == pytest.approx(losses["unsplit"], rel=1e-5)
    assert losses["router-seq"] == pytest.approx(losses["unsplit"], rel=1e-5)


@pytest.mark.parametrize(("model_yaml", "tree", "words"), [
    (TINY_MIXTRAL_YAML, _tree(2, *MEGATRON[:5], "blocks.*.moe.mlp.gate_up out 1", "blocks.*.moe.mlp.act out 1",
                              "blocks.*.moe.mlp.down reduce 1", *MEGATRON[8:]),
     "measured where an MoE block's experts take Megatron's split over tp=2"),
    (TINY_MIXTRAL_YAML, _tree(2, *MEGATRON, "blocks.*.moe.router batch 2"), "router batch=2"),
    (TINY_MIXTRAL_YAML, _tree(2, *MEGATRON, "blocks.*.norm2 seq 2"), "in a dense block"),
    (TINY_MIXTRAL_YAML.replace("bias: false", "bias: true"), ROUTER_SEQ, "experts without biases")])
def test_moe_layouts_not_measured_are_one_line(tmp_path: Path, model_yaml: str, tree: str, words: str) -> None:
    result = _measure(tmp_path, model_yaml, tree, "refused")
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
