"""Splits over tp on the JAX front-end's jaxpr (compile.shape_front_end through the name stacks'
module paths): a two-Dense MLP written with jax.named_scope around each module (fc1 16 -> 64 features, fc2 back;
the bias add its own equation in the Dense's scope), micro-batch 2 x 8 tokens, fp32, tp 2 on the local CPU, and
causal self-attention of 2 heads written as einsums. Exact: fc1 column (out) then fc2 row (reduce) pays one
all-reduce of the MLP's output forward and one of fc1's input gradient backward, 2 x 8 x 16 x 4 = 1024 bytes each,
and halves every matmul. Differential: the same MLP captured by the torch front-end, split by the same tree, has
the same collectives and matmul FLOPs.

A block's parameters: fc1 16 x 64 + 64 = 1088, fc2 64 x 16 + 16 = 1040: 2128.
"""

from typing import Any

import pytest

from trainsim.catalog import load_cluster
from trainsim.compile.shape_layers import shape_layers
from trainsim.errors import ConfigError
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import Comm, Layer, OpGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import predict
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

jax = pytest.importorskip("jax")
pytest.importorskip("networkx")

import jax.numpy as jnp  # noqa: E402

from trainsim.frontends.jax.capture import graph_from_jax  # noqa: E402

BATCH, SEQ, HIDDEN, FFN = 2, 8, 16, 64
OUT_BYTES = BATCH * SEQ * HIDDEN * 4  # the MLP's output, fp32: 1024
BLOCK_PARAMS = HIDDEN * FFN + FFN + FFN * HIDDEN + HIDDEN  # 2128
MEGATRON = [("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.fc2", "reduce")]


def mlp(p: dict[str, Any], x: Any) -> Any:
    with jax.named_scope("mlp"):
        with jax.named_scope("fc1"):
            y = x @ p["w1"] + p["b1"]
        y = jax.nn.gelu(y)
        with jax.named_scope("fc2"):
            return y @ p["w2"] + p["b2"]


def mlp_params() -> dict[str, Any]:
    shapes = {"w1": (HIDDEN, FFN), "b1": (FFN,), "w2": (FFN, HIDDEN), "b2": (HIDDEN,)}
    return {key: jax.ShapeDtypeStruct(shape, jnp.float32) for key, shape in shapes.items()}


def one_mlp_step(p: dict[str, Any], x: Any) -> Any:
    """The loss's gradient over the parameters and the input (so fc1's input gradient is computed); the MLP in a
    block's scope, the layer (the tree's blocks.0)."""
    def loss(p: dict[str, Any], x: Any) -> Any:
        with jax.named_scope("block0"):
            y = mlp(p, x)
        return (y**2).mean()

    return jax.value_and_grad(loss, argnums=(0, 1))(p, x)


def two_blocks_step(ps: list[dict[str, Any]], x: Any) -> Any:
    def loss(ps: list[dict[str, Any]]) -> Any:
        y = x
        for index, p in enumerate(ps):
            with jax.named_scope(f"block{index}"):
                y = mlp(p, y)
        return (y**2).mean()

    return jax.value_and_grad(loss)(ps)


def _input() -> Any:
    return jax.ShapeDtypeStruct((BATCH, SEQ, HIDDEN), jnp.float32)


def _job(tp: int = 2, sp: bool = False) -> Job:
    par = ParallelSpec.parse({"micro_batch": BATCH, "seq_len": SEQ, "global_batch": BATCH, "tp": tp, "dp": 1,
                              "precision": "fp32", "sp": sp})
    spec = opaque_spec("mlp", "jax train step", split_by_tree=True)  # as the JAX front-end gives it
    return make_job(spec, load_cluster("local-cpu").with_num_gpus(tp), par)


def _plan(job: Job, graph: OpGraph, splits: list[tuple[str, str]], parts: int = 2) -> LoweredPlan:
    tree = StrategyTree.from_graph(graph)
    for path, dim in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree.lower(job.parallel)


def _comm_keys(comms: tuple[Comm, ...]) -> list[tuple[str, str, str, float, int, bool]]:
    return sorted((c.name, c.collective, c.phase, c.buffer_bytes, c.ranks, bool(c.column_input)) for c in comms)


def _matmul_flops(layer: Layer, phase: str) -> dict[str, float]:
    """Matmul FLOPs by module path below the block (mlp.fc1, mlp.fc2)."""
    out: dict[str, float] = {}
    for op in layer.fwd if phase == "fwd" else layer.bwd:
        if op.kind == "matmul":
            key = op.module_path[op.module_path.index("mlp"):]
            out[key] = out.get(key, 0.0) + op.flops
    return out


@pytest.fixture(scope="module")
def one_mlp() -> OpGraph:
    return graph_from_jax(one_mlp_step, mlp_params(), _input())


def test_ops_carry_their_data_dependencies_and_what_they_keep(one_mlp: OpGraph) -> None:
    """fc1's matmul reads the layer's input (-1), its bias add the matmul, fc2's matmul the GELU's last
    equation; the MLP hands on fc2's bias add (the loss's layer reads it); each saved tensor is counted once."""
    mlp_layer = one_mlp.layers[0]
    assert one_mlp.frontend == "jax" and mlp_layer.name == "block0" and mlp_layer.full_param_count == BLOCK_PARAMS
    ops = mlp_layer.fwd
    fc1, fc2 = (next(i for i, op in enumerate(ops) if op.module_path == f"block0.mlp.{name}" and op.kind == "matmul")
                for name in ("fc1", "fc2"))
    assert ops[fc1].inputs == (-1,) and ops[fc1 + 1].inputs == (fc1,) and ops[fc2].inputs == (fc2 - 1,)
    assert mlp_layer.hands_on == fc2 + 1 == len(ops) - 1 and ops[fc2 + 1].module_path == "block0.mlp.fc2"
    tree = StrategyTree.from_graph(one_mlp)  # the top-level scope is the layer's node
    assert {"blocks.0.mlp", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"} <= set(tree.nodes)
    assert sum(op.saved_bytes for op in ops) == mlp_layer.saved_bytes["none"] > 0


def test_column_then_row_pays_one_all_reduce_each_way(one_mlp: OpGraph) -> None:
    """fc1 by out, fc2 by reduce (Megatron's MLP): the all-reduce of fc2's partial sums before its bias add
    (1024 bytes forward), the all-reduce of fc1's input gradient backward (1024 bytes, fc1 its column-parallel
    matmul); each of the four backward and two forward matmuls does half its 2 x 16 x 64 x 16 FLOPs; the GELU's
    equations run on half the features; each rank holds half of either weight, the biases whole (NB)."""
    job = _job()
    plan = shape_layers(job, _plan(job, one_mlp, [("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.fc2", "reduce")]))
    block = plan.layers[0].layer
    assert [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("mlp.ar", "all-reduce", "fwd", OUT_BYTES, 0), ("mlp.ar", "all-reduce", "bwd", OUT_BYTES, 0)]
    assert block.comms[1].column_input == "block0.mlp.fc1" and not block.comms[0].column_input
    half = 2 * BATCH * SEQ * HIDDEN * FFN / 2
    assert [op.flops for op in block.fwd if op.kind == "matmul"] == [half, half]
    assert [op.flops for op in block.bwd if op.kind == "matmul"] == [half] * 4
    assert {op.shape for op in block.fwd if op.module_path == "block0.mlp"} == {(BATCH, SEQ, FFN // 2)}
    assert block.param_count == BLOCK_PARAMS - HIDDEN * FFN == 1104
    assert plan.layers[1].layer.comms == ()  # the loss reads the whole output


def test_sim_and_analytical_agree_on_the_split_mlp(one_mlp: OpGraph) -> None:
    job = _job()
    plan = _plan(job, one_mlp, MEGATRON)
    sim = predict(job, "sim", graph=one_mlp, plan=plan)
    closed = predict(job, "analytical", graph=one_mlp, plan=plan)
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=1e-6)
    assert sim.breakdown["tp_comm"] > 0.0 and sim.breakdown["tp_comm"] == pytest.approx(closed.breakdown["tp_comm"])


# per block, forward then backward: without sp fc2's output all-reduced forward, fc1's input gradient backward;
# under sp (compile.front_end_sequence) the block's input all-gathered before fc1 and fc2's partial sums
# reduce-scattered by sequence forward, the conjugates backward; every buffer the whole 2 x 8 x 16 fp32 tensor
WHOLE = [("mlp.ar", "all-reduce", "bwd", OUT_BYTES, 0, True), ("mlp.ar", "all-reduce", "fwd", OUT_BYTES, 0, False)]
SEQUENCE = [("mlp.ag", "all-gather", "bwd", OUT_BYTES, 0, False), ("mlp.ag", "all-gather", "fwd", OUT_BYTES, 0, True),
            ("mlp.rs", "reduce-scatter", "bwd", OUT_BYTES, 0, True),
            ("mlp.rs", "reduce-scatter", "fwd", OUT_BYTES, 0, False)]


@pytest.mark.parametrize(("sp", "expected"), [(False, WHOLE), (True, SEQUENCE)])
def test_the_same_mlp_through_the_torch_front_end_pays_the_same(sp: bool, expected: list[tuple[object, ...]]
                                                                ) -> None:
    """Two MLP blocks through both front-ends (torch: nn.Linear, a tanh GELU, a ModuleList "blocks"; JAX: the
    name scopes block0/mlp/fc1 ...), split by the same tree, with and without sp: per block the same collectives
    (name, kind, phase, bytes, ranks; the hand-counted ones above) and the same matmul FLOPs forward and backward
    by module; the loss's layer pays none on either."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from trainsim.frontends.torch.capture import TensorSpec, graph_from_module

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(HIDDEN, FFN), nn.GELU("tanh"), nn.Linear(FFN, HIDDEN)

        def forward(self, x: Any) -> Any:
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = Mlp()

        def forward(self, x: Any) -> Any:
            return self.mlp(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return x

    def loss(y: Any) -> Any:
        return torch.mean(y**2)

    captured = graph_from_module(Net(), [TensorSpec((BATCH, SEQ, HIDDEN))], loss_fn=loss, fused=True)
    traced = graph_from_jax(two_blocks_step, [mlp_params(), mlp_params()], _input())
    job = _job(sp=sp)
    theirs = shape_layers(job, _plan(job, captured, MEGATRON)).layers
    ours = shape_layers(job, _plan(job, traced, MEGATRON)).layers
    assert [a.layer.kind for a in ours] == ["block", "block", "block"]  # the loss's layer: unscoped equations
    assert [a.layer.kind for a in theirs] == ["block", "block", "head"]
    for mine, other in zip(ours, theirs, strict=True):
        assert _comm_keys(mine.layer.comms) == _comm_keys(other.layer.comms)
        if other.layer.kind == "block":
            assert _comm_keys(mine.layer.comms) == expected
            for phase in ("fwd", "bwd"):
                assert _matmul_flops(mine.layer, phase) == _matmul_flops(other.layer, phase)
    assert sum(len(a.layer.comms) for a in ours) == 2 * len(expected)


@pytest.mark.parametrize(("splits", "words"), [
    ([("blocks.*.mlp", "reduce")], "no reduction dimension"),  # the GELU's equations, under mlp itself
    ([("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.fc2", "out")], None),  # allowed: gathered before fc2
])
def test_configs_on_jax_ops(one_mlp: OpGraph, splits: list[tuple[str, str]], words: str | None) -> None:
    job = _job()
    if words is None:
        block = shape_layers(job, _plan(job, one_mlp, splits)).layers[0].layer
        assert ("mlp.ag", "all-gather", "fwd") in [(c.name, c.collective, c.phase) for c in block.comms]
        return
    with pytest.raises(ConfigError, match=words) as info:
        shape_layers(job, _plan(job, one_mlp, splits))
    assert "\n" not in str(info.value)


HEADS = 2


def attention(p: dict[str, Any], x: Any) -> Any:
    """Causal self-attention in jax.numpy: a fused qkv Dense, the scores and the weighted sum as einsums over
    (batch, heads), a softmax, the projection Dense and the residual add."""
    head_dim = HIDDEN // HEADS
    with jax.named_scope("attn"):
        with jax.named_scope("qkv"):
            qkv = x @ p["wqkv"] + p["bqkv"]
        q, k, v = (t.reshape(BATCH, SEQ, HEADS, head_dim) for t in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(head_dim))
        scores = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), scores, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(BATCH, SEQ, HIDDEN)
        with jax.named_scope("proj"):
            return x + out @ p["wo"] + p["bo"]


def attention_step(p: dict[str, Any], x: Any) -> Any:
    def loss(p: dict[str, Any], x: Any) -> Any:
        with jax.named_scope("block0"):
            y = attention(p, x)
        return (y**2).mean()

    return jax.value_and_grad(loss, argnums=(0, 1))(p, x)


@pytest.fixture(scope="module")
def one_attention() -> OpGraph:
    shapes = {"wqkv": (HIDDEN, 3 * HIDDEN), "bqkv": (3 * HIDDEN,), "wo": (HIDDEN, HIDDEN), "bo": (HIDDEN,)}
    params = {key: jax.ShapeDtypeStruct(shape, jnp.float32) for key, shape in shapes.items()}
    return graph_from_jax(attention_step, params, _input())


def test_attention_written_as_einsums_splits_its_heads(one_attention: OpGraph) -> None:
    """qkv by out, the projection by reduce (Megatron's attention): the einsums read q, k and v split by features
    and keep the split as their heads, in their batch dim (2 samples x 2 heads -> 2 x 1 on each rank: half their
    2 x 4 x 8 x 8 x 8 FLOPs, forward and the four backward); the softmax's equations run on half the scores; one
    attn.ar all-reduce of 1024 bytes each way; each rank holds half of either weight: 1088 - 384 - 128 = 576."""
    job = _job()
    plan = _plan(job, one_attention, [("blocks.*.attn.qkv", "out"), ("blocks.*.attn.proj", "reduce")])
    block = shape_layers(job, plan).layers[0].layer
    assert [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("attn.ar", "all-reduce", "fwd", OUT_BYTES, 0), ("attn.ar", "all-reduce", "bwd", OUT_BYTES, 0)]
    einsums = [op for op in block.fwd + block.bwd if op.kind == "matmul" and op.module_path == "block0.attn"]
    assert len(einsums) == 6 and {(op.shape, op.flops) for op in einsums} == {((2, 8, 8, 8), 2 * 2 * 8 * 8 * 8)}
    scores = [op for op in block.fwd if op.module_path == "block0.attn" and op.kind == "elementwise" and op.flops > 0
              and op.shape[:1] == (BATCH,) and len(op.shape) == 4]  # (batch, heads, queries, keys)
    assert len(scores) > 3 and {op.shape[:3] for op in scores} == {(BATCH, 1, SEQ)}  # 1 of the 2 heads
    assert block.param_count == 1088 - 384 - 128 == 576
    assert block.saved_bytes["none"] == one_attention.layers[0].saved_bytes["none"] / 2  # every op split in 2


def test_einsums_split_by_rows_are_refused_in_one_line(one_attention: OpGraph) -> None:
    job = _job()
    with pytest.raises(ConfigError, match="splits its batch or heads") as info:
        shape_layers(job, _plan(job, one_attention, [("blocks.*.attn", "seq")]))
    assert "\n" not in str(info.value) and "block0 block0.attn (dot_general" in str(info.value)


def test_tp_without_a_tree_is_refused(one_mlp: OpGraph) -> None:
    job = _job()
    for engine in ("sim", "analytical"):
        with pytest.raises(ConfigError, match="the jax front-end's graph is one device's whole model"):
            predict(job, engine, graph=one_mlp)
