"""A block's attention or MLP unsplit over tp in a strategy tree (compile.shape_layers): its ops shaped whole on
each tp rank, the collectives the resharding between the configs inserts, and the memory that follows.

The tiny GPT (tests/conftest.py: hidden 32, 4 heads of 8, ffn 128, vocab 256, 2 blocks, tied embeddings,
learned positions, biases) at micro-batch 2 x 32 tokens in bf16 on 8 A100s, tp 2 x dp 4: a hidden state of the
micro-batch is 64 tokens x 32 x 2 bytes = 4096 bytes. Parameters: a block's attention and norms
32 x 96 + 32 x 32 + 96 + 32 (biases) + 2 x 2 x 32 (two LayerNorms) = 4352, its MLP 2 x 32 x 128 + 128 + 32 =
8352; the embedding 256 x 32 + 32 x 32 = 9216 (vocab-parallel: 4608 per tp rank); the head's final norm 64.
"""

from pathlib import Path

import pytest
import yaml

from conftest import TINY_GPT_MODEL_YAML, a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.loader import load_model
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.shape_layers import repeated_flops, shape_layers
from trainsim.compile.splits import plan_mesh_comms
from trainsim.cost.pricing import Pricer, axis_layout
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import Comm, Layer, Op, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan, default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import StrategyTree
from trainsim.strategy.tree_yaml import load_tree_yaml

HIDDEN_BYTES = 64 * 32 * 2  # a micro-batch's hidden state: 2 x 32 tokens x hidden 32, bf16
ATTN_PARAMS, MLP_PARAMS, EMBED_PER_RANK, HEAD_PARAMS = 4352, 8352, 4608, 64
ROOT = Path(__file__).resolve().parents[3]
MEGATRON_ATTN = [("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "out"), ("blocks.*.attn.out", "reduce")]
MEGATRON_MLP = [("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.act", "out"), ("blocks.*.mlp.fc2", "reduce")]
VOCAB = [("embedding.tokens", "reduce"), ("head.proj", "out"), ("head.loss", "out")]


def _tiny(tp: int = 2, dp: int = 4, tied: bool = True, **strategy: object) -> tuple[Job, OpGraph]:
    text = TINY_GPT_MODEL_YAML.replace("tied_embeddings: true", f"tied_embeddings: {str(tied).lower()}")
    spec = parse_model(yaml.safe_load(text))
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 2 * dp * 2, "tp": tp, "dp": dp,
                              **strategy})
    job = make_job(spec, a100_cluster(tp * dp * par.cp), par)
    return job, build_transformer(spec, DeviceSlice.of(job.parallel))


def _tree(graph: OpGraph, splits: list[tuple[str, str]]) -> StrategyTree:
    tree = StrategyTree.from_graph(graph)
    for path, dim in splits:
        tree = tree.split(path, "compute", dim, 2, axis="tp")
    return tree


def _block(plan: LoweredPlan, index: int) -> Layer:
    return plan.layers[index].layer


def _tp_tasks(graph: ExecGraph, layer: str) -> list[tuple[str, float]]:
    """The tp collectives of micro-batch 0 on a layer, in task order (its forward's before its backward's)."""
    return [(t.name.split(" mb")[0], t.duration_s) for t in graph.tasks
            if t.category == "tp_comm" and t.micro_batch == 0 and t.layer == layer]


def _mlp(layer: Layer) -> list[Op]:
    return [op for op in layer.fwd + layer.bwd if ".mlp." in op.module_path]


def _op(layer: Layer, name: str) -> Op:
    return next(op for op in layer.fwd if op.name == name)


def _attn(layer: Layer) -> list[Op]:
    return [op for op in layer.fwd + layer.bwd if ".attn." in op.module_path]


def test_attention_only_tp_pays_one_all_reduce_pair_per_block() -> None:
    """qkv column parallel, the core by heads, the projection row parallel; the MLP and norms unsplit. Forward:
    the projection's partial sums are all-reduced before the residual add (4096 bytes); nothing before fc1,
    whose input is whole on both ranks, nor after fc2, which makes whole sums. Backward: qkv's input gradient is
    partial over the 2 ranks (each holds dY W of its heads): all-reduced before norm1's backward."""
    job, graph = _tiny()
    plan = shape_layers(job, _tree(graph, VOCAB + MEGATRON_ATTN).lower(job.parallel))
    block = _block(plan, 1)
    assert block.comms == (Comm("attn.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES),
                           Comm("attn.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "qkv"))
    assert _block(plan, 2) is block  # one rebuilt layer for the instances with the same modules whole
    assert plan_mesh_comms(plan, job.model, job.parallel)[2] == block.comms  # the compiler's, the layer's own
    megatron = [c.name for c in graph.layers[1].comms]
    assert megatron == ["attn.ar", "mlp.ar", "attn.ar", "mlp.ar"]  # two pairs per block under Megatron's splits
    pricer = Pricer(Calibration())
    all_reduce_s = pricer.collective_s("all-reduce", HIDDEN_BYTES, axis_layout("tp", job.parallel, job.cluster), job)
    for level in ("op", "layer"):
        compiled = compile_job(job, plan, pricer, level)  # type: ignore[arg-type]
        names = ["attn.ar all-reduce", "attn.ar all-reduce"] if level == "op" else ["tp comm", "tp comm"]
        for layer in ("L1.block", "L2.block"):
            assert _tp_tasks(compiled, layer) == [(names[0], all_reduce_s), (names[1], all_reduce_s)]


def test_the_unsplit_mlp_runs_the_tp1_mlp_and_holds_its_weights() -> None:
    """Each tp rank runs the whole MLP: its ops (forward and backward) are the tp=1 graph's, fc1 2 x 64 x 128 x 32
    FLOPs; the attention's are the tp=2 graph's. A rank holds the attention's half, the whole MLP: 4352 / 2 +
    8352 = 10528 parameters per block, 4608 + 2 x 10528 + 64 = 25728 in all (plain tp 2: 17376), and its model
    states follow (bf16 weights, 2 bytes each)."""
    job, graph = _tiny()
    _, whole = _tiny(tp=1)
    plan = shape_layers(job, _tree(graph, VOCAB + MEGATRON_ATTN).lower(job.parallel))
    block = _block(plan, 1)
    assert _mlp(block) == _mlp(whole.layers[1]) and _mlp(block) != _mlp(graph.layers[1])
    assert _attn(block) == _attn(graph.layers[1])
    fc1 = next(op for op in block.fwd if op.name == "fc1")
    assert fc1.flops == 2 * 64 * 128 * 32 and fc1.shape == (1, 64, 128, 32)
    assert block.param_count == ATTN_PARAMS / 2 + MLP_PARAMS == 10528
    held = sum(a.layer.param_count for a in plan.layers)
    assert held == EMBED_PER_RANK + 2 * 10528 + HEAD_PARAMS == 25728
    assert sum(a.layer.param_count for a in default_plan(graph, job.parallel).layers) == 17376
    device = compile_job(job, plan, Pricer(Calibration()), "op").devices[0]
    assert device.static_breakdown["weights"] == 25728 * policy_for("bf16").weight_bytes == 25728 * 2


def test_the_unsplit_mlp_is_priced_as_the_tp1_mlp() -> None:
    """At op level the compute tasks of fc1 (forward) are the tp=1 fc1's op time, not the tp=2 one's."""
    job, graph = _tiny()
    _, whole = _tiny(tp=1)
    pricer = Pricer(Calibration())
    compiled = compile_job(job, _tree(graph, VOCAB + MEGATRON_ATTN).lower(job.parallel), pricer, "op")
    fc1 = [t.duration_s for t in compiled.tasks if t.name == "F0 L1.block fc1"]
    whole_fc1 = next(op for op in whole.layers[1].fwd if op.name == "fc1")
    split_fc1 = next(op for op in graph.layers[1].fwd if op.name == "fc1")
    assert fc1 == [pricer.op_time_s(whole_fc1, job)]
    assert pricer.op_time_s(whole_fc1, job) > pricer.op_time_s(split_fc1, job)


def test_the_repeated_mlp_counts_in_hardware_flops_not_model_flops() -> None:
    """Each tp rank runs the whole MLP: per micro-batch and block it repeats the half it would not run under
    Megatron's split, whose GEMMs are 3 x 2 x 64 x 128 x 32 / 2 = 1572864 FLOPs (fc1 and fc2, forward, input and
    weight gradients). HFU counts the repeat, MFU (the model's FLOPs) does not."""
    job, graph = _tiny()
    _, whole = _tiny(tp=1)
    plan = _tree(graph, VOCAB + MEGATRON_ATTN).lower(job.parallel)
    per_block = sum(op.flops for op in _mlp(whole.layers[1])) - sum(op.flops for op in _mlp(graph.layers[1]))
    gemms = [op for op in _mlp(whole.layers[1]) if op.kind == "matmul"]
    assert sum(op.flops for op in gemms) / 2 == 6 * 2 * 64 * 128 * 32 / 2 == 1572864
    assert repeated_flops(job, plan) == 2 * per_block
    assert repeated_flops(job, default_plan(graph, job.parallel)) == 0.0
    result = SimEstimator(Pricer(Calibration())).estimate(job, graph, plan)
    per_micro_batch = graph.total_flops("fwd") + graph.total_flops("bwd")
    assert result.hfu / result.mfu == pytest.approx(1.0 + 2 * per_block / per_micro_batch, rel=1e-12)
    closed = AnalyticalEstimator(Pricer(Calibration())).estimate(job, graph, plan)
    assert closed.model_flops_per_iteration == result.model_flops_per_iteration
    assert closed.hfu / closed.mfu == pytest.approx(result.hfu / result.mfu, rel=1e-12)


def test_mlp_only_tp_and_a_split_that_differs_between_blocks() -> None:
    """The converse (the MLP split, attention whole): one all-reduce pair after fc2 and before norm2's backward.
    Block 0 Megatron, block 1 whole on every rank (no tp split on any of its ops): block 1 pays nothing over
    tp and runs the tp=1 block."""
    job, graph = _tiny()
    _, whole = _tiny(tp=1)
    mlp_only = shape_layers(job, _tree(graph, VOCAB + MEGATRON_MLP).lower(job.parallel))
    assert _block(mlp_only, 1).comms == (Comm("mlp.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES),
                                         Comm("mlp.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "fc1"))
    assert _attn(_block(mlp_only, 1)) == _attn(whole.layers[1])
    assert _block(mlp_only, 1).param_count == ATTN_PARAMS + MLP_PARAMS / 2
    first = [(path.replace("blocks.*", "blocks.0"), dim) for path, dim in MEGATRON_ATTN + MEGATRON_MLP]
    per_block = shape_layers(job, _tree(graph, VOCAB + first).lower(job.parallel))
    assert _block(per_block, 1) is graph.layers[1]
    assert _block(per_block, 2).comms == ()
    assert _block(per_block, 2).fwd == whole.layers[1].fwd and _block(per_block, 2).bwd == whole.layers[1].bwd
    compiled = compile_job(job, per_block, Pricer(Calibration()), "op")
    assert len(_tp_tasks(compiled, "L1.block")) == 4 and _tp_tasks(compiled, "L2.block") == []


def test_an_unsplit_mlp_under_sequence_parallelism_gathers_its_input() -> None:
    """With sp the hidden state is split by sequence between the blocks. The MLP whole: forward, an all-gather
    of norm2's output before fc1 (4096 bytes gathered), fc2's whole output sliced for residual2 (no
    collective); backward, residual2's gradient (a sequence share) all-gathered for fc2's backward, fc1's
    input gradient (whole) sliced for norm2's. The attention keeps Megatron-LM's all-gather and reduce-scatter
    pairs."""
    job, graph = _tiny(sp=True)
    seq = [("embedding.positions", "seq"), ("blocks.*.norm?", "seq"), ("blocks.*.residual?", "seq"),
           ("head.norm", "seq")]
    plan = shape_layers(job, _tree(graph, VOCAB + seq + MEGATRON_ATTN).lower(job.parallel))
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in _block(plan, 1).comms] == [
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "bwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    # the whole MLP keeps its gathered input (64 tokens, not the 32 of its sequence share)
    assert _block(plan, 1).saved_bytes["none"] - graph.layers[1].saved_bytes["none"] == pytest.approx(
        32 * 32 * 2 + 64 * (128 - 64) * 2 * 2)


def test_megatrons_splits_keep_the_plan_and_its_layers() -> None:
    """A plan whose configs are Megatron's everywhere (default_plan, from_parallel) is not rebuilt."""
    job, graph = _tiny(sp=True)
    plan = default_plan(graph, job.parallel)
    assert shape_layers(job, plan) is plan
    tree_plan = StrategyTree.from_parallel(graph, job.parallel).lower(job.parallel)
    assert shape_layers(job, tree_plan) is tree_plan


def test_qkv_split_before_a_whole_attention_core_gathers_q_k_and_v() -> None:
    """qkv column parallel (out 2: 2 of the 4 heads' q, k, v per rank), the attention core and the projection
    whole, the MLP Megatron's. Forward: the core reads q, k and v of all heads: an all-gather of qkv's output,
    64 tokens x 96 x 2 bytes = 12288 bytes gathered; the projection makes whole sums (nothing before the residual
    add). Backward: each rank computes the core's whole input gradient and keeps its heads' slice (no
    collective); qkv's input gradient is partial over the 2 ranks: all-reduced (4096 bytes). Per block a rank
    holds qkv's half with the norms, (32 x 96 + 96 + 128) / 2 = 1648, the projection whole, 32 x 32 + 32 = 1056,
    and the MLP's half, 4176: 6880 parameters."""
    job, graph = _tiny()
    _, whole = _tiny(tp=1)
    splits = [*VOCAB, ("blocks.*.attn.qkv", "out"), *MEGATRON_MLP]
    plan = shape_layers(job, _tree(graph, splits).lower(job.parallel))
    block = _block(plan, 1)
    qkv_bytes = 64 * 96 * 2
    assert block.comms == (Comm("attn.ag", "all-gather", "tp", "fwd", qkv_bytes),
                           Comm("mlp.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES),
                           Comm("attn.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "qkv"),
                           Comm("mlp.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "fc1"))
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms  # the compiler's, the layer's own
    ops = {op.name: op for op in block.fwd}
    assert ops["qkv"] == _op(graph.layers[1], "qkv") and ops["qkv"].flops == 2 * 64 * 48 * 32
    assert ops["attention"] == _op(whole.layers[1], "attention")
    assert ops["out_proj"] == _op(whole.layers[1], "out_proj") and ops["out_proj"].flops == 2 * 64 * 32 * 32
    assert _mlp(block) == _mlp(graph.layers[1])
    assert block.param_count == (32 * 96 + 96 + 128) / 2 + 32 * 32 + 32 + MLP_PARAMS / 2 == 6880
    # kept for the backward beyond Megatron's: q, k, v whole (+6144), the core's output whole (+2048), the
    # core's log-sum-exp of all 4 heads (2 x 4 x 32 x 4 bytes, +512)
    assert block.saved_bytes["none"] - graph.layers[1].saved_bytes["none"] == 6144 + 2048 + 512
    pricer = Pricer(Calibration())
    layout = axis_layout("tp", job.parallel, job.cluster)
    gather_s = pricer.collective_s("all-gather", qkv_bytes, layout, job)
    reduce_s = pricer.collective_s("all-reduce", HIDDEN_BYTES, layout, job)
    assert gather_s > 0.0 and reduce_s > 0.0 and gather_s != reduce_s
    compiled = compile_job(job, plan, pricer, "op")
    assert _tp_tasks(compiled, "L1.block") == [("attn.ag all-gather", gather_s), ("mlp.ar all-reduce", reduce_s),
                                               ("mlp.ar all-reduce", reduce_s), ("attn.ar all-reduce", reduce_s)]


def test_the_attention_core_split_before_a_whole_projection_gathers_its_output() -> None:
    """qkv and the core split by heads, the projection whole: the projection reads the core's output whole, an
    all-gather of 64 tokens x 32 x 2 bytes = 4096 bytes; backward as above (the core's output gradient is
    whole on every rank, sliced)."""
    job, graph = _tiny()
    splits = [*VOCAB, ("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "out"), *MEGATRON_MLP]
    block = _block(shape_layers(job, _tree(graph, splits).lower(job.parallel)), 1)
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms] == [
        ("attn.ag", "all-gather", "fwd", 64 * 32 * 2), ("mlp.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES), ("mlp.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    assert _op(block, "attention") == _op(graph.layers[1], "attention")


def test_fc1_split_before_a_whole_fc2_gathers_the_ffn_features() -> None:
    """fc1 column parallel and GELU on its 64 features per rank, fc2 whole; the attention Megatron's. Forward:
    fc2 reads all 128 ffn features: an all-gather of 64 tokens x 128 x 2 bytes = 16384 bytes gathered, and fc2
    makes whole sums (nothing before residual2). Backward: fc2's input gradient is whole on every rank, sliced
    for GELU's; fc1's input gradient is partial: all-reduced (4096 bytes). A rank holds fc1's half,
    (32 x 128 + 128) / 2 = 2112, and fc2 whole, 128 x 32 + 32 = 4128: 8416 parameters with the attention's half."""
    job, graph = _tiny()
    _, whole = _tiny(tp=1)
    splits = VOCAB + MEGATRON_ATTN + [("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.act", "out")]
    plan = shape_layers(job, _tree(graph, splits).lower(job.parallel))
    block = _block(plan, 1)
    ffn_bytes = 64 * 128 * 2
    assert block.comms == (Comm("attn.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES),
                           Comm("mlp.ag", "all-gather", "tp", "fwd", ffn_bytes),
                           Comm("attn.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "qkv"),
                           Comm("mlp.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "fc1"))
    assert _op(block, "fc1") == _op(graph.layers[1], "fc1") and _op(block, "gelu") == _op(graph.layers[1], "gelu")
    assert _op(block, "fc2") == _op(whole.layers[1], "fc2") and _op(block, "fc2").flops == 2 * 64 * 32 * 128
    assert _attn(block) == _attn(graph.layers[1])
    assert block.param_count == ATTN_PARAMS / 2 + (32 * 128 + 128) / 2 + 128 * 32 + 32 == 8416
    pricer = Pricer(Calibration())
    gather_s = pricer.collective_s("all-gather", ffn_bytes, axis_layout("tp", job.parallel, job.cluster), job)
    assert ("mlp.ag all-gather", gather_s) in _tp_tasks(compile_job(job, plan, pricer, "op"), "L2.block")


def test_a_whole_fc1_before_a_row_split_fc2_gathers_the_gradient_backward() -> None:
    """fc1 and GELU whole, fc2 row parallel (reduce 2): forward, fc2 slices its half of the whole features (no
    collective) and its partial sums are all-reduced; backward, fc2's input gradient holds half the features
    and GELU's backward reads them all: the conjugate of the slice, an all-gather of 16384 bytes."""
    job, graph = _tiny()
    splits = VOCAB + MEGATRON_ATTN + [("blocks.*.mlp.fc2", "reduce")]
    block = _block(shape_layers(job, _tree(graph, splits).lower(job.parallel)), 1)
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms] == [
        ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES), ("mlp.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES), ("mlp.ag", "all-gather", "bwd", 64 * 128 * 2)]


def test_a_split_an_op_cannot_take_is_refused_in_one_line() -> None:
    """The attention core has no reduction dimension; the lookup takes Megatron's split (reduce), a split by
    tokens, or none, not both at once; a tied table looked up by tokens needs a whole projection."""
    job, graph = _tiny()
    splits = [*VOCAB, ("blocks.*.attn.core", "reduce"), *MEGATRON_MLP]
    with pytest.raises(ConfigError, match=r"blocks.0.attn.core split.compute@tp='reduce=2' is invalid: ops take "
                                          r"Megatron's splits over tp=2: attention splits out=2 over tp; give that, "
                                          r"or no tp splits; or any split of its batch, seq, out whose parts divide "
                                          r"2, or none \(the attention whole on each tp rank\)") as info:
        _tree(graph, splits).lower(job.parallel)
    assert "\n" not in str(info.value)
    lookup_by_seq_and_rows = [("embedding.tokens", "seq"), *VOCAB, *MEGATRON_ATTN, *MEGATRON_MLP]
    with pytest.raises(ConfigError, match=r"embedding.tokens split.compute@tp='seq=2 reduce=2' is invalid: .* lookup "
                                          r"splits reduce=2 over tp; give that, or no tp splits; or that split over "
                                          r"fewer ranks dividing 2, a batch or seq split whose parts divide 2 \(each "
                                          r"rank its own tokens from the whole table\), or none \(the lookup whole on "
                                          r"each tp rank\)"):
        _tree(graph, lookup_by_seq_and_rows).lower(job.parallel)
    lookup_by_seq = [("embedding.tokens", "seq"), *VOCAB[1:], *MEGATRON_ATTN, *MEGATRON_MLP]
    with pytest.raises(ConfigError, match=r"ties its embedding table to the head's projection"):  # tied, by tokens
        shape_layers(job, _tree(graph, lookup_by_seq).lower(job.parallel))


def test_a_whole_attention_under_context_parallelism_gathers_all_heads_keys_and_values() -> None:
    """cp 2: the attention reads the keys and values of the whole sequence, all-gathered over cp (backward: their
    gradient reduce-scattered). Whole on each tp rank, it gathers all 4 heads': 2 (k, v) x 2 samples x 32 tokens
    x 4 heads x 8 x 2 bytes = 8192 bytes; under Megatron's split its 2 heads': 4096."""
    job, graph = _tiny(tp=2, dp=2, cp=2)
    plan = shape_layers(job, _tree(graph, VOCAB + MEGATRON_MLP).lower(job.parallel))
    kv = [(c.name, c.collective, c.phase, c.buffer_bytes) for c in _block(plan, 1).comms if c.axis == "cp"]
    assert kv == [("kv.ag", "all-gather", "fwd", 8192.0), ("kv.rs", "reduce-scatter", "bwd", 8192.0)]
    assert [c.buffer_bytes for c in graph.layers[1].comms if c.axis == "cp"] == [4096.0, 4096.0]
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == _block(plan, 1).comms  # the compiler's, the layer's


def test_the_shipped_attention_only_tree_pays_half_the_tp_collectives() -> None:
    """data/strategies/megatron/gpt-tp2-attn-only.yaml on GPT-3 125M: per block one all-reduce pair over tp
    instead of two, the MLP's weights whole."""
    spec = load_model("gpt3-125m")
    par = ParallelSpec.parse({"micro_batch": 4, "seq_len": 1024, "global_batch": 64, "tp": 2})
    job = make_job(spec, a100_cluster(8), par)
    graph = build_transformer(spec, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
    tree_file = ROOT / "data" / "strategies" / "megatron" / "gpt-tp2-attn-only.yaml"
    plan = load_tree_yaml(tree_file, graph).lower(job.parallel)
    shaped = shape_layers(job, plan)
    blocks = [a.layer for a in shaped.layers if a.layer.kind == "block"]
    assert len(blocks) == 12 and all(b is blocks[0] for b in blocks)
    assert [c.name for c in blocks[0].comms] == ["attn.ar", "attn.ar"]
    hidden = 768
    assert blocks[0].comms[0].buffer_bytes == 4 * 1024 * hidden * 2
    assert blocks[0].param_count - graph.layers[1].param_count == pytest.approx((2 * hidden * 4 * hidden + 4 * hidden
                                                                                 + hidden) / 2)


LOGITS_BYTES = 64 * 256 * 2  # a micro-batch's logits: 64 tokens x vocab 256, bf16


def _vocab_tasks(graph: ExecGraph) -> list[str]:
    return [name for layer in ("L0.embedding", "L3.head") for name, _ in _tp_tasks(graph, layer)]


def test_the_embedding_and_the_head_whole_on_each_tp_rank() -> None:
    """No tp split on the lookup, the vocabulary projection or the cross-entropy (the tied table whole on both
    ranks; the blocks Megatron's): no collective on the embedding (Megatron's: an all-reduce of the partial
    lookups, 4096 bytes) nor on the head (Megatron's: the all-reduce of the projection's input gradient and the
    three fp32 statistics of 64 tokens x 4 bytes). Each rank holds the whole table, 256 x 32 + 32 x 32 = 9216
    parameters (Megatron's: 4608), and computes all logits: 2 x 64 x 256 x 32 FLOPs, the fp32 softmax of
    64 x 256 x 4 bytes kept."""
    job, graph = _tiny()
    plan = shape_layers(job, _tree(graph, MEGATRON_ATTN + MEGATRON_MLP).lower(job.parallel))
    embedding, head = _block(plan, 0), _block(plan, 3)
    assert graph.layers[0].comms == (Comm("embed.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES),)
    assert [(c.name, c.buffer_bytes) for c in graph.layers[-1].comms] == [
        ("logits.ar", HIDDEN_BYTES), ("loss.max", 256.0), ("loss.target", 256.0), ("loss.sum_exp", 256.0)]
    assert embedding.comms == () and head.comms == ()
    assert embedding.param_count == 256 * 32 + 32 * 32 == 2 * EMBED_PER_RANK
    assert head.param_count == HEAD_PARAMS  # tied: the projection's weight is the embedding's table
    assert _op(head, "logits").flops == 2 * 64 * 256 * 32 and _op(head, "logits").shape == (1, 64, 256, 32)
    assert head.saved_bytes["none"] == HIDDEN_BYTES + 64 * 256 * 4
    assert _block(plan, 1) is graph.layers[1]  # the blocks keep Megatron's layer
    compiled = compile_job(job, plan, Pricer(Calibration()), "op")
    assert _vocab_tasks(compiled) == []
    assert _vocab_tasks(compile_job(job, default_plan(graph, job.parallel), Pricer(Calibration()), "op")) == [
        "embed.ar all-reduce", "loss.max all-reduce", "loss.target all-reduce", "loss.sum_exp all-reduce",
        "logits.ar all-reduce"]
    # HFU counts the half of the head each rank repeats: the projection's forward and two gradients, 3 x 2 x 64 x
    # 128 x 32 FLOPs, and the cross-entropy's other half (the tp=1 head's ops less the tp=2 head's)
    _, whole = _tiny(tp=1)
    head_ops = [op for op in whole.layers[-1].fwd + whole.layers[-1].bwd if "head.proj" in op.module_path]
    split_ops = [op for op in graph.layers[-1].fwd + graph.layers[-1].bwd if "head.proj" in op.module_path]
    assert sum(op.flops for op in head_ops) - sum(op.flops for op in split_ops) == 3 * 2 * 64 * 128 * 32
    repeat = sum(op.flops for op in whole.layers[-1].fwd + whole.layers[-1].bwd) - sum(
        op.flops for op in graph.layers[-1].fwd + graph.layers[-1].bwd)
    assert repeated_flops(job, _tree(graph, MEGATRON_ATTN + MEGATRON_MLP).lower(job.parallel)) == repeat


def test_logits_split_before_a_whole_cross_entropy_gathers_the_logits() -> None:
    """An untied head: the projection column parallel (128 of the 256 classes per rank), the cross-entropy
    whole: forward, an all-gather of the logits, 64 x 256 x 2 = 32768 bytes gathered, and no statistics
    all-reduced; backward, the loss gradient of all classes is sliced to the rank's half, and the projection's
    input gradient, partial over the ranks, all-reduced (4096 bytes). The rank holds half the projection:
    64 + 256 x 32 / 2 = 4160 parameters."""
    job, graph = _tiny(tied=False)
    splits = [("embedding.tokens", "reduce"), ("head.proj", "out"), *MEGATRON_ATTN, *MEGATRON_MLP]
    plan = shape_layers(job, _tree(graph, splits).lower(job.parallel))
    head = _block(plan, 3)
    assert head.comms == (Comm("logits.ag", "all-gather", "tp", "fwd", LOGITS_BYTES),
                          Comm("logits.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "logits"))
    assert head.param_count == HEAD_PARAMS + 256 * 32 / 2 == graph.layers[-1].param_count == 4160
    assert _op(head, "logits") == _op(graph.layers[-1], "logits")
    assert _op(head, "cross_entropy").flops == 2 * _op(graph.layers[-1], "cross_entropy").flops
    assert _block(plan, 0) is graph.layers[0]
    pricer = Pricer(Calibration())
    gather_s = pricer.collective_s("all-gather", LOGITS_BYTES, axis_layout("tp", job.parallel, job.cluster), job)
    assert ("logits.ag all-gather", gather_s) in _tp_tasks(compile_job(job, plan, pricer, "op"), "L3.head")


def test_an_untied_embedding_whole_beside_a_vocab_parallel_head() -> None:
    """The untied lookup whole: no all-reduce of partial lookups, the whole table (9216 parameters); the head
    keeps Megatron's collectives."""
    job, graph = _tiny(tied=False)
    splits = [("head.proj", "out"), ("head.loss", "out"), *MEGATRON_ATTN, *MEGATRON_MLP]
    plan = shape_layers(job, _tree(graph, splits).lower(job.parallel))
    assert _block(plan, 0).comms == () and _block(plan, 0).param_count == 9216
    assert _block(plan, 3) is graph.layers[-1]


def test_a_tied_table_split_one_way_and_whole_the_other_is_refused() -> None:
    job, graph = _tiny()
    splits = [("embedding.tokens", "reduce"), *MEGATRON_ATTN, *MEGATRON_MLP]
    with pytest.raises(ConfigError, match=r"tiny-gpt ties its embedding table to the head's projection: split "
                                          r"embedding.tokens \(reduce\) and head.proj \(out\) over tp alike, or "
                                          r"neither"):
        shape_layers(job, _tree(graph, splits).lower(job.parallel))


def test_the_embedding_and_the_head_whole_under_sequence_parallelism() -> None:
    """With sp the blocks read the hidden state split by sequence. The lookup whole: its whole output is sliced
    for the positions' sequence split (Megatron's: a reduce-scatter of partial lookups); backward, the sequence
    shares of its output gradient are all-gathered for the whole table's gradient (4096 bytes). The head whole:
    the final norm's sequence shares all-gathered before the projection, as Megatron's; backward, its whole
    input gradient sliced (Megatron's: a reduce-scatter of partial sums)."""
    job, graph = _tiny(tied=False, sp=True)
    seq = [("embedding.positions", "seq"), ("blocks.*.norm?", "seq"), ("blocks.*.residual?", "seq"),
           ("head.norm", "seq")]
    plan = shape_layers(job, _tree(graph, seq + MEGATRON_ATTN + MEGATRON_MLP).lower(job.parallel))
    assert _block(plan, 0).comms == (Comm("embed.ag", "all-gather", "tp", "bwd", HIDDEN_BYTES),)
    assert _block(plan, 3).comms == (Comm("logits.ag", "all-gather", "tp", "fwd", HIDDEN_BYTES),)
    assert [c.name for c in graph.layers[0].comms] == ["embed.rs", "embed.ag"]


def _shipped(name: str) -> tuple[OpGraph, LoweredPlan]:
    spec = load_model("gpt3-125m")
    par = ParallelSpec.parse({"micro_batch": 4, "seq_len": 1024, "global_batch": 64, "tp": 2})
    job = make_job(spec, a100_cluster(8), par)
    graph = build_transformer(spec, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
    plan = load_tree_yaml(ROOT / "data" / "strategies" / "megatron" / name, graph).lower(job.parallel)
    return graph, shape_layers(job, plan)


def test_the_shipped_qkv_gather_and_vocab_whole_trees() -> None:
    """gpt-tp2-qkv-gather.yaml on GPT-3 125M (4 x 1024 tokens, hidden 768, 12 heads): per block an all-gather of
    q, k and v, 4096 x 3 x 768 x 2 bytes, in place of the projection's all-reduce; gpt-tp2-vocab-whole.yaml: the
    blocks Megatron's (the graph's layer), no tp collective on the embedding or the head."""
    graph, qkv = _shipped("gpt-tp2-qkv-gather.yaml")
    block = qkv.layers[1].layer
    assert [(c.name, c.collective, c.phase) for c in block.comms] == [
        ("attn.ag", "all-gather", "fwd"), ("mlp.ar", "all-reduce", "fwd"), ("attn.ar", "all-reduce", "bwd"),
        ("mlp.ar", "all-reduce", "bwd")]
    assert block.comms[0].buffer_bytes == 4096 * 3 * 768 * 2
    graph, vocab = _shipped("gpt-tp2-vocab-whole.yaml")
    assert vocab.layers[0].layer.comms == () and vocab.layers[-1].layer.comms == ()
    assert all(a.layer is graph.layers[1] for a in vocab.layers[1:-1])


def _tree4(graph: OpGraph, splits: list[tuple[str, str, int]]) -> StrategyTree:
    tree = StrategyTree.from_graph(graph)
    for path, dim, parts in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree


VOCAB4 = [("embedding.tokens", "reduce", 4), ("head.proj", "out", 4), ("head.loss", "out", 4)]
ATTN4 = [("blocks.*.attn.qkv", "out", 4), ("blocks.*.attn.core", "out", 4), ("blocks.*.attn.out", "reduce", 4)]
MLP2 = [("blocks.*.mlp.fc1", "out", 2), ("blocks.*.mlp.act", "out", 2), ("blocks.*.mlp.fc2", "reduce", 2)]


def test_an_mlp_split_over_2_of_4_tp_ranks_all_reduces_over_2() -> None:
    """tp 4 x dp 2: the attention split 4 ways (Megatron's), the MLP 2 ways, Megatron's pattern over each pair of
    consecutive tp ranks (ranks 0-1 and 2-3 each hold one copy of the MLP, split in two). fc2's partial sums are
    all-reduced over the 2 ranks of a pair (4096 bytes), and so is fc1's input gradient; the attention's pair
    spans the 4. A rank runs fc1 on 64 of the 128 ffn features (2 x 64 x 64 x 32 FLOPs) and holds 4352 / 4 +
    8352 / 2 = 5264 parameters per block (Megatron's tp 4: 3176). Compiled at op level, the MLP's collectives
    take the Pricer's all-reduce time over 2 ranks, the attention's over 4."""
    job, graph = _tiny(tp=4, dp=2)
    plan = shape_layers(job, _tree4(graph, VOCAB4 + ATTN4 + MLP2).lower(job.parallel))
    block = _block(plan, 1)
    assert block.comms == (Comm("attn.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES),
                           Comm("mlp.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES, ranks=2),
                           Comm("attn.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, 0, "qkv"),
                           Comm("mlp.ar", "all-reduce", "tp", "bwd", HIDDEN_BYTES, ranks=2))
    assert _op(block, "fc1").flops == 2 * 64 * 64 * 32 and _attn(block) == _attn(graph.layers[1])
    assert block.param_count == ATTN_PARAMS / 4 + MLP_PARAMS / 2 == 5264
    assert graph.layers[1].param_count == 3176
    pricer = Pricer(Calibration())
    pair_s = pricer.collective_s("all-reduce", HIDDEN_BYTES, job.cluster.group_layout(2, 1), job)
    four_s = pricer.collective_s("all-reduce", HIDDEN_BYTES, axis_layout("tp", job.parallel, job.cluster), job)
    assert pair_s != four_s
    assert _tp_tasks(compile_job(job, plan, pricer, "op"), "L1.block") == [
        ("attn.ar all-reduce", four_s), ("mlp.ar all-reduce", pair_s), ("mlp.ar all-reduce", pair_s),
        ("attn.ar all-reduce", four_s)]


def test_heads_split_4_ways_then_2_gather_over_pairs() -> None:
    """qkv split 4 ways (1 head per rank), the core and the projection 2 ways (2 heads per rank): the core reads
    its pair's heads: an all-gather over 2 ranks of 12288 / 2 = 6144 bytes gathered; the projection's partial
    sums are all-reduced over the pair; backward, the core's input gradient (2 heads) is sliced to qkv's one
    head, and qkv's input gradient all-reduced over all 4 ranks."""
    job, graph = _tiny(tp=4, dp=2)
    attn = [("blocks.*.attn.qkv", "out", 4), ("blocks.*.attn.core", "out", 2), ("blocks.*.attn.out", "reduce", 2)]
    block = _block(shape_layers(job, _tree4(graph, VOCAB4 + attn + MLP2).lower(job.parallel)), 1)
    assert [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("attn.ag", "all-gather", "fwd", 6144.0, 2), ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES, 2),
        ("mlp.ar", "all-reduce", "fwd", HIDDEN_BYTES, 2), ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES, 0),
        ("mlp.ar", "all-reduce", "bwd", HIDDEN_BYTES, 2)]


def test_a_vocabulary_split_over_2_of_4_tp_ranks() -> None:
    """The tied table and the logits split over pairs of tp ranks: the lookups' partial sums, the projection's
    input gradient and the three cross-entropy statistics all-reduced over 2 ranks; half the table per rank,
    9216 / 2 = 4608 parameters. A split 3 ways of 4 is refused."""
    job, graph = _tiny(tp=4, dp=2)
    vocab = [("embedding.tokens", "reduce", 2), ("head.proj", "out", 2), ("head.loss", "out", 2)]
    plan = shape_layers(job, _tree4(graph, vocab + ATTN4 + MLP2).lower(job.parallel))
    assert _block(plan, 0).comms == (Comm("embed.ar", "all-reduce", "tp", "fwd", HIDDEN_BYTES, ranks=2),)
    assert _block(plan, 0).param_count == 4608
    assert {(c.name, c.ranks) for c in _block(plan, 3).comms} == {
        ("logits.ar", 2), ("loss.max", 2), ("loss.target", 2), ("loss.sum_exp", 2)}
    with pytest.raises(ConfigError, match=r"blocks.0.mlp.fc1 split.compute@tp='out=3' is invalid: .* fc1 splits "
                                          r"out=4 over tp; give that, or no tp splits; or any split of its batch, "
                                          r"seq, out, reduce whose parts divide 4, or none \(the fc1 whole on each "
                                          r"tp rank\)"):
        _tree4(graph, [*VOCAB4, *ATTN4, ("blocks.*.mlp.fc1", "out", 3)]).lower(job.parallel)
