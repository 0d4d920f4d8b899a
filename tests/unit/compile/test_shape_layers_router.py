"""An MoE block's norms, residual adds and router at configs over tp other than Megatron's (compile.shape_layers,
strategy.megatron replicable_module "tokens" and "router", dispatch_layout): the norms and residual adds split by
tokens as a dense block's; the router split by tokens or whole, its weight whole and its gradient summed over the
tp ranks that split its tokens; the token dispatch starting from the tokens each rank routed.

The tiny MoE (tests/conftest.py's tiny GPT without biases, every block an MoE of 4 experts, top-2: hidden 32, 4
heads of 8, ffn 128, LayerNorm) at micro-batch 2 x 32 tokens in bf16 on 8 A100s, tp x ep 2 x dp. The hidden
state of the micro-batch's 64 tokens is H = 64 x 32 x 2 = 4096 bytes; their 128 routed copies (top-2) R = 8192
bytes; the dispatch moves each copy's bf16 routing probability beside it (megatron-core 0.16.1's all-to-all
dispatcher), RP = 8192 + 128 x 2 = 8448 bytes, and x (1 + 1 / 32) for a rank's own copies' x bytes; the
combine moves the hidden states alone. The router's weight is 32 x 4 = 128 parameters; Megatron's block at tp 2
x ep 2 holds 4224 / 2 + 32896 / 4 = 10336 per rank (the builder counts the router with the experts: 128 / 4 = 32
of them, and the norms, 2 x 64, divided by tp).
"""

import dataclasses

import pytest
import yaml

from conftest import TINY_GPT_MODEL_YAML, a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.shape_layers import expert_grad_groups, shape_layers, shaped_graph
from trainsim.compile.splits import plan_mesh_comms, plan_tp_token_params
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import Comm, Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan, default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import StrategyTree

TINY_MOE_YAML = (TINY_GPT_MODEL_YAML.replace("name: tiny-gpt", "name: tiny-moe").replace("bias: true", "bias: false")
                 + "num_experts: 4\ntop_k: 2\nmoe_every: 1\n")
H, R = 4096.0, 8192.0
RP = 8448.0  # R with the routing probabilities
ROUTER_PARAMS, MEGATRON_BLOCK_PARAMS = 128, 10336
TOKEN_OPS = ("blocks.*.norm1", "blocks.*.residual1", "blocks.*.norm2", "blocks.*.residual2")
ROUTER = "blocks.*.moe.router"


def _job(tp: int = 2, sp: bool = False) -> Job:
    spec = parse_model(yaml.safe_load(TINY_MOE_YAML))
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 32, "tp": tp, "ep": 2, "sp": sp})
    return make_job(spec, a100_cluster(8), par)


def _graph(job: Job) -> OpGraph:
    assert isinstance(job.model, TransformerSpec)
    return build_transformer(job.model, DeviceSlice.of(job.parallel))


def _tree(job: Job, splits: list[tuple[str, str, int]]) -> StrategyTree:
    """Megatron's splits, each (path, dim, parts) in `splits` over tp instead."""
    tree = StrategyTree.from_parallel(_graph(job), job.parallel)
    for path, dim, parts in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp", override=True)
    return tree


def _plan(job: Job, splits: list[tuple[str, str, int]]) -> LoweredPlan:
    return shape_layers(job, _tree(job, splits).lower(job.parallel))


def _experts_over_pairs() -> list[tuple[str, str, int]]:
    """The experts over pairs of tp 4 ranks under sp (Megatron-Core's expert_tensor_parallel_size 2): fc1 and the
    activation split out 2 ways, fc2 reduce 2 ways, the pair's tokens (seq 2)."""
    paths = ("blocks.*.moe.mlp.fc1", "blocks.*.moe.mlp.act", "blocks.*.moe.mlp.fc2")
    return [(path, "seq", 2) for path in paths] + [(path, "reduce" if path.endswith("fc2") else "out", 2)
                                                   for path in paths]


def _block(job: Job, plan: LoweredPlan) -> Layer:
    block = plan.layers[1].layer
    assert block.kind == "moe_block" and plan.layers[2].layer is block
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms  # the compiler's, the layer's own
    return block


def _tp(block: Layer) -> list[tuple[str, str, str, float, int]]:
    return [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms if c.axis == "tp"]


def _ep(block: Layer) -> list[float]:
    return [c.buffer_bytes for c in block.comms if c.axis == "ep"]


def _shape(block: Layer, name: str) -> tuple[int, ...]:
    return next(op.shape for op in block.fwd if op.name == name)


def test_moe_norms_and_residual_adds_by_sequence_without_sp_reshard_around_them() -> None:
    """tp 2 x ep 2 without sp, the MoE block's norms and residual adds on half the tokens each (per-op sequence
    parallelism), its router (Megatron's: whole) and experts Megatron's. Forward: qkv gathers norm1's halves (attn.ag),
    the projection's partial sums are reduce-scattered onto residual1's (attn.rs), the router gathers norm2's (mlp.ag),
    the experts' partial sums are reduce-scattered onto residual2's (mlp.rs) and the block hands on the whole hidden
    state (block.ag), each H. Backward: the conjugates; the experts' input gradient, partial over the pair, all-reduced
    onto the whole router (mlp.ar), then sliced to norm2's halves. The all-to-alls over ep move all 64 tokens' routed
    copies (R; the dispatch's RP), as Megatron's. The norms are held whole (64 parameters each, not 32): 10336 + 2 x 32
    = 10400 per block, their 2 x 64 summed over the tp pair with the dp ranks."""
    job = _job()
    plan = _plan(job, [(path, "seq", 2) for path in TOKEN_OPS])
    block = _block(job, plan)
    assert _tp(block) == [
        ("attn.ag", "all-gather", "fwd", H, 0), ("attn.rs", "reduce-scatter", "fwd", H, 0),
        ("mlp.ag", "all-gather", "fwd", H, 0), ("mlp.rs", "reduce-scatter", "fwd", H, 0),
        ("block.ag", "all-gather", "fwd", H, 0),
        ("attn.ag", "all-gather", "bwd", H, 0), ("attn.rs", "reduce-scatter", "bwd", H, 0),
        ("block.ag", "all-gather", "bwd", H, 0),
        ("mlp.ag", "all-gather", "bwd", H, 0), ("mlp.ar", "all-reduce", "bwd", H, 0)]
    assert _ep(block) == [RP, R, R, RP]
    assert [_shape(block, name) for name in ("norm1", "residual1", "norm2", "residual2")] == [(32 * 32,)] * 4
    assert block.param_count == MEGATRON_BLOCK_PARAMS + 2 * (64 - 32) == 10400
    assert plan_tp_token_params(plan, job.model, job.parallel) == {1: {2: 128.0}, 2: {2: 128.0}}


def test_an_moe_norm_split_by_its_features_all_reduces_its_statistics() -> None:
    """tp 2 x ep 2 without sp, the MoE block's norm2 split by its hidden features (as a dense block's may be): its
    two LayerNorm statistics per token (64 x 4 bytes, fp32) all-reduced forward and its two gradient statistics
    backward; the router, whole, reads its feature halves all-gathered (mlp.ag, H), and in the backward norm2's
    input gradient halves are gathered for residual1's whole one (block.ag, H). The norm holds its half of the
    gain and bias (32, as Megatron's count divided by tp): 10336 parameters, nothing summed over tp."""
    job = _job()
    plan = _plan(job, [("blocks.*.norm2", "out", 2)])
    block = _block(job, plan)
    assert [c for c in _tp(block) if not c[0].startswith("attn")] == [
        ("norm2.sum", "all-reduce", "fwd", 256.0, 0), ("norm2.sum_sq", "all-reduce", "fwd", 256.0, 0),
        ("mlp.ag", "all-gather", "fwd", H, 0), ("mlp.ar", "all-reduce", "fwd", H, 0),
        ("norm2.sum_dy", "all-reduce", "bwd", 256.0, 0), ("norm2.sum_dy_xhat", "all-reduce", "bwd", 256.0, 0),
        ("block.ag", "all-gather", "bwd", H, 0), ("mlp.ar", "all-reduce", "bwd", H, 0)]
    assert _shape(block, "norm2") == (64 * 16,)
    assert block.param_count == MEGATRON_BLOCK_PARAMS
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


def test_a_router_whole_under_sp_dispatches_all_its_tokens() -> None:
    """tp 2 x ep 2 with sp, the router whole on each tp rank: it reads norm2's halves gathered (mlp.ag, H) and
    routes all 64 tokens, so each rank dispatches all their routed copies (R per all-to-all, RP with their
    probabilities, as Megatron's without sp) with no
    gather before the experts; the experts' partial sums travel back through the combine unreduced and are
    reduce-scattered onto residual2's halves as the hidden state (mlp.rs, H). Backward: residual2's gradient
    halves gathered (mlp.ag, H); the experts' input gradient, partial over the pair, all-reduced onto the whole
    router (mlp.ar, H; Megatron's: a reduce-scatter). The router runs 64 rows and is held whole: 10336 - 128 / 4
    + 128 = 10432 per block; both ranks routed the same tokens, so nothing is summed over tp."""
    job = _job(sp=True)
    plan = _plan(job, [(ROUTER, "seq", 1)])
    block = _block(job, plan)
    assert [c for c in _tp(block) if c[0].startswith("mlp")] == [
        ("mlp.ag", "all-gather", "fwd", H, 0), ("mlp.rs", "reduce-scatter", "fwd", H, 0),
        ("mlp.ag", "all-gather", "bwd", H, 0), ("mlp.ar", "all-reduce", "bwd", H, 0)]
    assert _ep(block) == [RP, R, R, RP]
    assert _shape(block, "router") == (1, 64, 4, 32)
    assert block.param_count == MEGATRON_BLOCK_PARAMS - ROUTER_PARAMS / 4 + ROUTER_PARAMS == 10432
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


def test_a_router_by_sequence_without_sp_dispatches_its_own_tokens() -> None:
    """tp 2 x ep 2 without sp, the router on half the sequence: each rank routes its 32 tokens and the all-to-all over
    ep dispatches their 64 routed copies (4096 bytes, half Megatron's R; 4224 with their probabilities); the pair's
    routed tokens are then all-gathered before the experts (mlp.ag, RP with their probabilities) and the experts'
    partial sums reduce-scattered back onto each rank's own before the combine (mlp.rs, R: Megatron-Core's dispatcher
    order), and residual2, whole, reads the combined halves gathered (mlp.ag, H). Backward, as the pass meets them: the
    routed gradient gathered (R), the experts' input gradient and the probabilities' reduce-scattered (RP), norm2's
    gradient gathered from the router's halves (H). The router (32 rows) is held whole and its gradient summed over the
    pair with the dp ranks: a bucket of the two blocks' 2 x 128 router parameters over 8 ranks, the rest over the dp
    group of 4, each its all-reduce of bf16 gradients; before them the experts' 2 x (32896 / 4 - 128 / 4) = 2 x 8192
    over their expert data-parallel ranks (tp index 0 of the dp / ep = 2 ranks holding those experts: 0 and 4)."""
    job = _job()
    plan = _plan(job, [(ROUTER, "seq", 2)])
    block = _block(job, plan)
    assert _tp(block) == [
        ("attn.ar", "all-reduce", "fwd", H, 0),
        ("mlp.ag", "all-gather", "fwd", RP, 0), ("mlp.rs", "reduce-scatter", "fwd", R, 0),
        ("mlp.ag", "all-gather", "fwd", H, 0),
        ("attn.ar", "all-reduce", "bwd", H, 0),
        ("mlp.ag", "all-gather", "bwd", R, 0), ("mlp.rs", "reduce-scatter", "bwd", RP, 0),
        ("mlp.ag", "all-gather", "bwd", H, 0)]
    assert _ep(block) == [4224.0, 4096.0, 4096.0, 4224.0] and 32 * 2 * 32 * 2.0 == 4096.0
    assert _shape(block, "router") == (1, 32, 4, 32)
    assert block.param_count == 10432
    assert plan_tp_token_params(plan, job.model, job.parallel) == {1: {2: 128.0}, 2: {2: 128.0}}
    pricer = Pricer(Calibration())
    compiled = compile_job(job, _tree(job, [(ROUTER, "seq", 2)]).lower(job.parallel), pricer, "layer")
    held = sum(a.layer.param_count for a in plan.layers)
    assert held == 4608 + 2 * 10432 + 64
    assert compiled.devices[0].static_breakdown["weights"] == held * policy_for("bf16").weight_bytes
    grad = policy_for("bf16").grad_bytes
    assert expert_grad_groups(job, plan) == {1: (8192.0, (0, 4)), 2: (8192.0, (0, 4))}
    assert [(t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm"] == [
        ("dp all-reduce bucket0 L2.moe_block..L1.moe_block",
         pricer.collective_s("all-reduce", 2 * 8192 * grad, job.cluster.ranks_layout((0, 4)), job)),
        ("dp all-reduce bucket1 L2.moe_block..L1.moe_block",
         pricer.collective_s("all-reduce", 2 * ROUTER_PARAMS * grad, job.cluster.group_layout(8, 1), job)),
        ("dp all-reduce bucket2 L3.head..L0.embedding", pricer.collective_s(
            "all-reduce", (held - 2 * ROUTER_PARAMS - 2 * 8192) * grad, pricer.layout("grad", job), job))]


def test_a_router_split_as_the_experts_over_pairs_skips_their_gather() -> None:
    """tp 4 x ep 2 with sp, the experts over pairs of tp ranks (on the pair's 32 tokens) and the router split by
    sequence into halves, as the experts: the router reads norm2's quarters gathered over the pair (mlp.ag: 32 x
    32 x 2 = 2048 bytes over 2 ranks), each rank dispatches its pair's 32 tokens' 64 routed copies (4096 bytes,
    4224 with their probabilities; Megatron-Core's order: its own 16 tokens', 2048 (2112), then the pair's routed
    tokens gathered, 4096 over 2) and the
    experts read them with no gather; their partial sums travel back unreduced and are reduce-scattered onto
    residual2's quarters (mlp.rs: 2048 over 2). Backward: residual2's quarters gathered over the pair (2048), the
    experts' input gradient all-reduced over it onto the router's halves (2048). The router's weight whole
    (4224 / 4 + 32896 / 4 - 128 / 4 + 128 = 9376 per block) and its gradient summed over the 2 ranks that split
    its tokens."""
    job = _job(tp=4, sp=True)
    plan = _plan(job, [*_experts_over_pairs(), (ROUTER, "seq", 2)])
    block = _block(job, plan)
    assert [c for c in _tp(block) if c[0].startswith("mlp")] == [
        ("mlp.ag", "all-gather", "fwd", 2048.0, 2), ("mlp.rs", "reduce-scatter", "fwd", 2048.0, 2),
        ("mlp.ag", "all-gather", "bwd", 2048.0, 2), ("mlp.ar", "all-reduce", "bwd", 2048.0, 2)]
    assert _ep(block) == [4224.0, 4096.0, 4096.0, 4224.0]
    assert _ep(_block(job, _plan(job, _experts_over_pairs()))) == [2112.0, 2048.0, 2048.0, 2112.0]
    assert block.param_count == 4224 / 4 + 32896 / 4 - ROUTER_PARAMS / 4 + ROUTER_PARAMS == 9376
    assert plan_tp_token_params(plan, job.model, job.parallel) == {1: {2: 128.0}, 2: {2: 128.0}}
    # the experts' gradient over their expert data-parallel ranks (tp ranks 0 and 2 of dp rank 0), the router's
    # share no longer counted with them: 32896 / 4 - 128 / 4 = 8192 parameters
    assert expert_grad_groups(job, plan) == {1: (8192.0, (0, 2)), 2: (8192.0, (0, 2))}


def test_experts_over_pairs_without_sp_all_reduce_the_combined_hidden_state() -> None:
    """tp 4 x ep 2 without sp, the experts over pairs (the router whole, Megatron's): every rank dispatches all
    64 tokens, so the experts' partial sums over the pair travel back through the combine and are all-reduced over
    the pair as the hidden state (H over 2 ranks), not as the 128 routed copies (R); the experts' input gradient
    likewise in the backward. The dispatch moves the copies' probabilities too (RP)."""
    job = _job(tp=4)
    paths = ("blocks.*.moe.mlp.fc1", "blocks.*.moe.mlp.act", "blocks.*.moe.mlp.fc2")
    block = _block(job, _plan(job, [(path, "reduce" if path.endswith("fc2") else "out", 2) for path in paths]))
    assert [c for c in _tp(block) if c[0].startswith("mlp")] == [
        ("mlp.ar", "all-reduce", "fwd", H, 2), ("mlp.ar", "all-reduce", "bwd", H, 2)]
    assert _ep(block) == [RP, R, R, RP]


def test_an_moe_block_s_last_add_by_features_under_sp_exchanges_its_skip_input_by_all_to_all() -> None:
    """With sp, the MoE block's residual2 adds its half of the features (sequence whole): the experts' routed
    tokens are gathered over the pair with their probabilities (mlp.ag, RP) and their partial sums
    reduce-scattered back onto the tokens each rank dispatched (mlp.rs, R: Megatron-Core's all-to-all dispatcher
    under sp), the combined
    sequence half exchanged by all-to-all onto the feature half (mlp.a2a, H / 2), its skip input (residual1's
    sequence half) likewise (block.a2a, H / 2) and the block hands on the sequence split by all-to-all again;
    backward each exchange back. residual2 runs 64 x 16 elements; parameters unchanged."""
    job = _job(sp=True)
    plan = _plan(job, [("blocks.*.residual2", "seq", 1), ("blocks.*.residual2", "out", 2)])
    block = _block(job, plan)
    tp = [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms if c.axis == "tp"]
    assert tp == [("attn.ag", "all-gather", "fwd", H), ("attn.rs", "reduce-scatter", "fwd", H),
                  ("mlp.ag", "all-gather", "fwd", RP), ("block.a2a", "all-to-all", "fwd", H / 2),
                  ("mlp.rs", "reduce-scatter", "fwd", R), ("mlp.a2a", "all-to-all", "fwd", H / 2),
                  ("block.a2a", "all-to-all", "fwd", H / 2),
                  ("attn.ag", "all-gather", "bwd", H), ("attn.rs", "reduce-scatter", "bwd", H),
                  ("block.a2a", "all-to-all", "bwd", H / 2), ("block.a2a", "all-to-all", "bwd", H / 2),
                  ("mlp.a2a", "all-to-all", "bwd", H / 2),
                  ("mlp.ag", "all-gather", "bwd", R), ("mlp.rs", "reduce-scatter", "bwd", RP)]
    assert next(op for op in block.fwd if op.name == "residual2").shape == (64 * 16,)
    assert block.param_count == MEGATRON_BLOCK_PARAMS


@pytest.mark.parametrize("sp", [True, False])
def test_megatron_s_own_router_and_norm_configs_compile_to_the_plain_plan(sp: bool) -> None:
    """A tree writing Megatron's configs of the MoE block's norms, residual adds and router (the sequence split
    under sp, whole without) rebuilds nothing."""
    job = _job(sp=sp)
    parts = 2 if sp else 1
    plan = _tree(job, [(path, "seq", parts) for path in (*TOKEN_OPS, ROUTER)]).lower(job.parallel)
    graph = _graph(job)
    assert plan == default_plan(graph, job.parallel) and shape_layers(job, plan) is plan


@pytest.mark.parametrize(("tp", "splits", "message"), [
    (4, [*_experts_over_pairs(), (ROUTER, "batch", 2), (ROUTER, "seq", 1)],
     r"blocks.0.moe.router split.compute@tp='batch=2' is invalid: the router split 2 ways by batch beside experts "
     r"split 2 ways by seq .*each rank dispatches the tokens it routed"),
    (2, [("blocks.*.residual2", "out", 2)],
     r"blocks.0.residual2 split.compute@tp='seq=2 out=2' is invalid: .*or any split of its batch, seq, out whose "
     r"parts divide 2, or none \(the residual2 whole on each tp rank\)"),
    (2, [(ROUTER, "out", 2)], r"router split.compute@tp='seq=2 out=2' is invalid: .*or any split of its batch, "
                              r"seq whose parts divide 2, or none \(the router whole on each tp rank\)"),
])
def test_the_configs_still_refused_say_why_in_one_line(tp: int, splits: list[tuple[str, str, int]],
                                                        message: str) -> None:
    """A router split by batch beside experts on their pair's sequence shares (the tokens a rank routed neither
    hold its experts' nor lie within them: not priced), a residual add split by sequence and by its hidden
    features into more parts than tp, the router by its experts: refused, in one line."""
    job = _job(tp=tp, sp=True)
    with pytest.raises(ConfigError, match=message) as info:
        _tree(job, splits).lower(job.parallel)
    assert "\n" not in str(info.value)


def test_the_closed_form_prices_the_router_s_shaped_block() -> None:
    """The analytical engine prices the graph whose MoE block is the one shaped for a router by sequence (its time,
    memory and hardware FLOPs); its model FLOPs (MFU) stay the model's, the unshaped graph's."""
    job = _job()
    graph = _graph(job)
    tree = StrategyTree.from_parallel(graph, job.parallel).split(ROUTER, "compute", "seq", 2, axis="tp",
                                                                   override=True)
    plan = tree.lower(job.parallel)
    shaped = shaped_graph(job, graph, plan)
    assert shaped.layers[1] == shape_layers(job, plan).layers[1].layer
    estimator = AnalyticalEstimator(Pricer(Calibration()))
    on_tree, on_shaped = estimator.estimate(job, graph, plan), estimator.price(job, shaped).result()
    model_fields = ("model_flops_per_iteration", "tflops_per_gpu", "mfu")
    assert dataclasses.replace(on_tree, **{name: 0.0 for name in model_fields}) == \
        dataclasses.replace(on_shaped, **{name: 0.0 for name in model_fields})
    # the model's FLOPs are the unshaped graph's: the router whole on each rank (Megatron's without sp); the
    # shaped block's router runs 32 of the 64 rows, 2 x 32 x 4 x 32 = 8192 FLOPs fewer forward, twice that
    # backward, in 2 blocks, 32 / (2 x 4) = 4 micro-batches, on 8 GPUs
    saved = 3 * 2 * 32 * 4 * 32 * 2 * 4 * 8
    assert on_tree.model_flops_per_iteration - on_shaped.model_flops_per_iteration == saved == 1572864
    assert on_tree.hardware_flops_per_iteration == on_shaped.hardware_flops_per_iteration
    assert Comm("dispatch", "all-to-all", "ep", "fwd", 4224.0) in shaped.layers[1].comms
