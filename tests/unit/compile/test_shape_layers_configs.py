"""Configs over tp other than Megatron's on a block's ops (compile.shape_layers, strategy.megatron): a matmul split
by its reduction dimension, by its output where Megatron splits the reduction, or by tokens; the attention core
split by sequence (query rows). Each op shaped at its config, the collectives resharding inserts (forward and the
backward's conjugates) and the memory of a weight held whole.

The tiny GPT (tests/conftest.py: hidden 32, 4 heads of 8, ffn 128, vocab 256, tied embeddings, biases) at
micro-batch 2 x 32 tokens in bf16 on 8 A100s, tp 2 x dp 4 (as tests/unit/compile/test_shape_layers.py): a hidden
state of the micro-batch is 64 tokens x 32 x 2 bytes = 4096 bytes; q, k and v of all heads 64 x 96 x 2 = 12288
bytes; k and v of the whole sequence 2 x 64 x 4 heads x 8 x 2 = 8192 bytes.
"""

import pytest
import yaml

from conftest import TINY_GPT_MODEL_YAML, a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.comm.collectives import collective_time_s
from trainsim.compile.build import compile_job
from trainsim.compile.shape_layers import shape_layers
from trainsim.compile.splits import plan_mesh_comms
from trainsim.cost.pricing import Pricer, axis_layout
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import Comm, Layer, Op, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import StrategyTree

HIDDEN_BYTES = 64 * 32 * 2
QKV_BYTES = 64 * 96 * 2
KV_BYTES = 2 * 64 * 4 * 8 * 2
VOCAB = [("embedding.tokens", "reduce"), ("head.proj", "out"), ("head.loss", "out")]
MEGATRON_MLP = [("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.act", "out"), ("blocks.*.mlp.fc2", "reduce")]
QKV_CORE = [("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "out")]


def _tiny(dp: int = 4, tied: bool = True) -> tuple[Job, OpGraph]:
    text = TINY_GPT_MODEL_YAML.replace("tied_embeddings: true", f"tied_embeddings: {str(tied).lower()}")
    spec = parse_model(yaml.safe_load(text))
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 4 * dp, "tp": 2, "dp": dp})
    job = make_job(spec, a100_cluster(2 * dp), par)
    return job, build_transformer(spec, DeviceSlice.of(job.parallel))


def _plan(job: Job, graph: OpGraph, splits: list[tuple[str, str]]) -> LoweredPlan:
    tree = StrategyTree.from_graph(graph)
    for path, dim in splits:
        tree = tree.split(path, "compute", dim, 2, axis="tp")
    return shape_layers(job, tree.lower(job.parallel))


def _comms(layer: Layer) -> list[tuple[str, str, str, float]]:
    return [(c.name, c.collective, c.phase, c.buffer_bytes) for c in layer.comms]


def _op(layer: Layer, name: str) -> Op:
    return next(op for op in layer.fwd if op.name == name)


def _tp_tasks(graph: ExecGraph, layer: str) -> list[tuple[str, float]]:
    return [(t.name.split(" mb")[0], t.duration_s) for t in graph.tasks
            if t.category == "tp_comm" and t.micro_batch == 0 and t.layer == layer]


def test_qkv_split_by_its_reduction_dimension_all_reduces_q_k_v_before_a_whole_core() -> None:
    """qkv on half the hidden features (its weight's rows) of each rank, the core and the projection whole:
    forward, qkv slices its half of the whole input (no collective) and its partial q, k and v (12288 bytes)
    are all-reduced over the 2 ranks; backward, qkv's input gradient holds half the features: all-gathered
    (4096 bytes). qkv does 2 x 64 x 96 x 16 FLOPs; a rank holds half its weight and the whole projection.
    Compiled at op level, the all-reduce's task takes the collective model's time of 12288 bytes over the tp pair."""
    job, graph = _tiny()
    plan = _plan(job, graph, [*VOCAB, ("blocks.*.attn.qkv", "reduce"), *MEGATRON_MLP])
    block = plan.layers[1].layer
    assert _comms(block) == [
        ("attn.ar", "all-reduce", "fwd", QKV_BYTES), ("mlp.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES), ("mlp.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms
    assert _op(block, "qkv").shape == (1, 64, 96, 16) and _op(block, "qkv").flops == 2 * 64 * 96 * 16
    assert _op(block, "attention").shape == (2 * 4, 32, 32, 8)  # all 4 heads, every query row
    out_params = 32 * 32 + 32
    assert block.param_count == (4352 - out_params) / 2 + out_params + 8352 / 2 == 6880
    layout = axis_layout("tp", job.parallel, job.cluster)
    by_hand = collective_time_s("all-reduce", QKV_BYTES, layout, job.cluster, Calibration())
    pricer = Pricer(Calibration())
    assert by_hand == pricer.collective_s("all-reduce", QKV_BYTES, layout, job)
    tasks = _tp_tasks(compile_job(job, plan, pricer, "op"), "L1.block")
    assert tasks[0] == ("attn.ar all-reduce", by_hand)
    assert [name for name, _ in tasks] == ["attn.ar all-reduce", "mlp.ar all-reduce", "mlp.ar all-reduce",
                                           "attn.ag all-gather"]  # the backward meets the MLP first
    seconds = {name: pricer.collective_s(kind, size, layout, job) for name, kind, size in (
        ("ar12288", "all-reduce", QKV_BYTES), ("ar", "all-reduce", HIDDEN_BYTES), ("ag", "all-gather", HIDDEN_BYTES))}
    layer_level = _tp_tasks(compile_job(job, plan, pricer, "layer"), "L1.block")  # one task per phase
    assert layer_level == [("tp comm", seconds["ar12288"] + seconds["ar"]), ("tp comm", seconds["ag"] + seconds["ar"])]


def test_qkv_split_by_reduction_before_a_core_split_by_heads_reduce_scatters() -> None:
    """The reader splits the heads: qkv's partial sums are reduce-scattered onto them (forward), the core's
    input gradient of its heads all-gathered (the conjugate, backward)."""
    job, graph = _tiny()
    attention = [("blocks.*.attn.qkv", "reduce"), ("blocks.*.attn.core", "out"), ("blocks.*.attn.out", "reduce")]
    block = _plan(job, graph, [*VOCAB, *attention, *MEGATRON_MLP]).layers[1].layer
    assert [c for c in _comms(block) if c[0].startswith("attn")] == [
        ("attn.rs", "reduce-scatter", "fwd", QKV_BYTES), ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.ag", "all-gather", "bwd", QKV_BYTES), ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES)]


def test_the_attention_core_split_by_sequence_gathers_keys_and_values() -> None:
    """qkv by heads, the core by query rows, the projection row parallel: q, k and v change from heads-split to
    rows-split by an all-to-all (each rank's 12288 / 2 bytes), the core all-gathers the keys and values of the
    whole sequence of all heads (8192 bytes; backward their gradient reduce-scattered), its output changes back
    to heads-split by an all-to-all (4096 / 2 bytes) before the projection; each conjugate in the backward. The
    core runs all 4 heads on 16 of the 32 query rows against 32 keys."""
    job, graph = _tiny()
    attention = [("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "seq"), ("blocks.*.attn.out", "reduce")]
    plan = _plan(job, graph, [*VOCAB, *attention, *MEGATRON_MLP])
    block = plan.layers[1].layer
    assert [c for c in _comms(block) if c[0].startswith("attn")] == [
        ("attn.a2a", "all-to-all", "fwd", QKV_BYTES / 2), ("attn.kv.ag", "all-gather", "fwd", KV_BYTES),
        ("attn.a2a", "all-to-all", "fwd", HIDDEN_BYTES / 2), ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.a2a", "all-to-all", "bwd", HIDDEN_BYTES / 2), ("attn.kv.rs", "reduce-scatter", "bwd", KV_BYTES),
        ("attn.a2a", "all-to-all", "bwd", QKV_BYTES / 2), ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    core = _op(block, "attention")
    assert core.shape == (2 * 4, 16, 32, 8) and core.flops == 4.0 * 8 * 16 * 32 * 8 * 0.5  # causal, flash
    pricer = Pricer(Calibration())
    layout = axis_layout("tp", job.parallel, job.cluster)
    tasks = dict(_tp_tasks(compile_job(job, plan, pricer, "op"), "L1.block"))
    assert tasks["attn.kv.ag all-gather"] == pricer.collective_s("all-gather", KV_BYTES, layout, job)
    assert tasks["attn.kv.rs reduce-scatter"] == pricer.collective_s("reduce-scatter", KV_BYTES, layout, job)


def test_an_mlp_split_by_tokens_holds_its_weights_whole_and_sums_their_gradients_over_dp_and_tp() -> None:
    """fc1, GELU and fc2 on half the tokens each, their weights whole on both tp ranks: forward, fc1 slices its
    tokens (no collective) and fc2's output is all-gathered (4096 bytes); backward, fc1's input gradient is
    all-gathered. A rank holds the attention's half and the whole MLP: 4352 / 2 + 8352 = 10528 parameters per
    block; its weight memory follows. Each rank makes the MLP's weight gradients from its own tokens, so they are
    summed over the 2 tp ranks as well as the 4 dp ranks, once per iteration: the gradient sync holds a bucket of
    the two MLPs' 2 x 8352 parameters over 8 ranks, the rest (4608 + 2 x 2176 + 64) over the dp group's 4."""
    job, graph = _tiny()
    tokens = [("blocks.*.mlp.fc1", "seq"), ("blocks.*.mlp.act", "seq"), ("blocks.*.mlp.fc2", "seq")]
    attention = [*QKV_CORE, ("blocks.*.attn.out", "reduce")]
    plan = _plan(job, graph, [*VOCAB, *attention, *tokens])
    block = plan.layers[1].layer
    assert [c for c in _comms(block) if c[0].startswith("mlp")] == [
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES), ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert _op(block, "fc1").shape == (1, 32, 128, 32)
    assert block.param_count == 4352 / 2 + 8352 == 10528
    held = sum(a.layer.param_count for a in plan.layers)
    assert held == 4608 + 2 * 10528 + 64
    pricer = Pricer(Calibration())
    compiled = compile_job(job, plan, pricer, "layer")
    assert compiled.devices[0].static_breakdown["weights"] == held * policy_for("bf16").weight_bytes
    grad = policy_for("bf16").grad_bytes
    synced = [(t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm"]
    assert synced == [
        ("dp all-reduce bucket0 L2.block..L1.block",
         pricer.collective_s("all-reduce", 2 * 8352 * grad, job.cluster.group_layout(8, 1), job)),
        ("dp all-reduce bucket1 L3.head..L0.embedding",
         pricer.collective_s("all-reduce", (4608 + 2 * 2176 + 64) * grad, pricer.layout("grad", job), job))]


def test_without_data_parallelism_a_token_split_weight_is_still_summed_over_its_tp_ranks() -> None:
    """dp 1: the plain plan syncs no gradient; the MLP split by tokens sums its 2 x 8352 parameters' gradients
    over the tp pair, once per iteration."""
    job, graph = _tiny(dp=1)
    tokens = [("blocks.*.mlp.fc1", "seq"), ("blocks.*.mlp.act", "seq"), ("blocks.*.mlp.fc2", "seq")]
    pricer = Pricer(Calibration())
    megatron = _plan(job, graph, [*VOCAB, *QKV_CORE, ("blocks.*.attn.out", "reduce"), *MEGATRON_MLP])
    plan = _plan(job, graph, [*VOCAB, *QKV_CORE, ("blocks.*.attn.out", "reduce"), *tokens])
    assert [t for t in compile_job(job, megatron, pricer, "layer").tasks if t.category == "dp_comm"] == []
    synced = [(t.name, t.duration_s) for t in compile_job(job, plan, pricer, "layer").tasks
              if t.category == "dp_comm"]
    assert synced == [("dp all-reduce bucket0 L2.block..L1.block", pricer.collective_s(
        "all-reduce", 2 * 8352 * policy_for("bf16").grad_bytes, job.cluster.group_layout(2, 1), job))]


def test_the_projection_split_by_its_output_gathers_its_input_and_output() -> None:
    """out_proj on half the hidden features it writes, its reduction whole: it all-gathers the core's output of
    all heads (4096 bytes) and its own output is all-gathered for the residual add (4096 bytes); backward, its
    input gradient is partial over the pair and reduce-scattered onto the core's heads."""
    job, graph = _tiny()
    block = _plan(job, graph, [*VOCAB, *QKV_CORE, ("blocks.*.attn.out", "out"), *MEGATRON_MLP]).layers[1].layer
    assert [c for c in _comms(block) if c[0].startswith("attn")] == [
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("attn.rs", "reduce-scatter", "bwd", HIDDEN_BYTES), ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    assert _op(block, "out_proj").shape == (1, 64, 16, 32)
    assert block.comms[0] == Comm("attn.ag", "all-gather", "tp", "fwd", HIDDEN_BYTES)


def test_the_head_projection_split_by_its_reduction_dimension_reduce_scatters_the_logits() -> None:
    """An untied head's projection on half the hidden features: its partial logits (64 x 256 x 2 = 32768 bytes)
    are reduce-scattered onto the vocab-parallel cross-entropy's classes (forward; its three statistics
    all-reduced as Megatron's); backward, the conjugates: the logits' gradient, split by classes, all-gathered
    (each rank's dX = dY W^T of its features needs all of dY), then the projection's input gradient (half the
    features) all-gathered. A rank holds half the 256 x 32 projection. A tied table's projection takes the
    lookup's split only."""
    job, graph = _tiny(tied=False)
    attention = [*QKV_CORE, ("blocks.*.attn.out", "reduce")]
    head = [("embedding.tokens", "reduce"), ("head.proj", "reduce"), ("head.loss", "out")]
    plan = _plan(job, graph, [*head, *attention, *MEGATRON_MLP])
    layer = plan.layers[3].layer
    assert _comms(layer) == [("logits.rs", "reduce-scatter", "fwd", 64 * 256 * 2),
                             ("logits.ag", "all-gather", "bwd", 64 * 256 * 2),
                             ("logits.ag", "all-gather", "bwd", HIDDEN_BYTES),
                             ("loss.max", "all-reduce", "fwd", 64 * 4), ("loss.target", "all-reduce", "fwd", 64 * 4),
                             ("loss.sum_exp", "all-reduce", "fwd", 64 * 4)]
    assert _op(layer, "logits").shape == (1, 64, 256, 16)
    assert layer.param_count == 64 + 256 * 32 / 2
    job, graph = _tiny()
    with pytest.raises(ConfigError, match=r"tiny-gpt ties its embedding table to the head's projection"):
        _plan(job, graph, [*head, *attention, *MEGATRON_MLP])
