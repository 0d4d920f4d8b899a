"""An MoE block at Megatron's split as Megatron-Core runs it: the all-to-all token dispatcher's volumes under sp
(MoEAlltoAllTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py, megatron-core 0.9.0 and 0.16.1)
and the expert data-parallel group that sums the experts' gradient and shards their ZeRO states
(megatron/core/parallel_state.py, distributed/distributed_data_parallel.py, optimizer/__init__.py, 0.16.1).

The tiny MoE of test_shape_layers_experts.py (hidden 32, 4 experts top-2, ffn 128, no biases; micro-batch 2 x 32
tokens, bf16) on 8 A100s at tp 2 x ep 2 x dp 4. T = 64 local tokens, k = 2, h = 32, 2 bytes: a rank's sequence
share is 32 tokens; their 64 routed copies are 64 x 32 x 2 = 4096 bytes; the tp pair's 128 routed copies 8192.
The dispatch (not the combine) moves each copy's routing probability beside it (bf16, megatron-core 0.16.1's
token_dispatch and dispatch_postprocess): 4096 + 64 x 2 = 4224 bytes, the pair's 8192 + 128 x 2 = 8448.
A block holds 32896 / (tp ep) = 8224 parameters of experts and router at Megatron's split, the router's share
128 / 4 = 32 of them: 8192 expert parameters per rank.
"""

import pytest

from conftest import a100_cluster, tiny_moe_job
from trainsim.catalog.calibration import Calibration
from trainsim.compile.build import compile_job
from trainsim.cost.memory import model_state_bytes, owned_params
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import ExpertShard, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.expert_groups import expert_data_ranks, expert_data_size, experts_own_group
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec

ROUTED_OWN, ROUTED_PAIR = 4096.0, 8192.0  # the rank's own routed copies; the tp pair's
DISPATCHED_OWN, DISPATCHED_PAIR = 4224.0, 8448.0  # the same with their bf16 routing probabilities
EXPERT_PARAMS = 8192.0  # per rank and block at Megatron's split


def _tiny(tp: int = 2, ep: int = 2, sp: bool = True, zero: int = 0) -> tuple[Job, OpGraph]:
    job = tiny_moe_job(tp, ep, sp, zero=zero)
    assert isinstance(job.model, TransformerSpec)
    return job, build_transformer(job.model, DeviceSlice.of(job.parallel))


def test_megatron_split_under_sp_dispatches_each_rank_s_own_tokens_then_gathers_them_over_tp() -> None:
    """Megatron-Core's all-to-all dispatcher under sp: each tp rank routes its own 32 tokens, the all-to-all over
    ep moves their 64 routed copies (T k h / tp = 4096 bytes per rank, not the 8192 of all 64 local tokens), then
    the pair's routed copies are all-gathered over tp (an 8192-byte buffer: each rank receives the other's 4096)
    and reduce-scattered after the experts; the combine's all-to-all moves 4096 again. The dispatch's all-to-all
    and gather carry the copies' probabilities too (4224, 8448), and their conjugates the probabilities'
    gradient; the combine's the expert outputs alone. The attention keeps Megatron's pair of hidden-state
    collectives (64 x 32 x 2 = 4096)."""
    _, graph = _tiny()
    block = graph.layers[1]
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms if c.axis == "ep"] == [
        ("dispatch", "all-to-all", "fwd", DISPATCHED_OWN), ("combine", "all-to-all", "fwd", ROUTED_OWN),
        ("combine", "all-to-all", "bwd", ROUTED_OWN), ("dispatch", "all-to-all", "bwd", DISPATCHED_OWN)]
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms if c.name.startswith("mlp")] == [
        ("mlp.ag", "all-gather", "fwd", DISPATCHED_PAIR), ("mlp.rs", "reduce-scatter", "fwd", ROUTED_PAIR),
        ("mlp.ag", "all-gather", "bwd", ROUTED_PAIR), ("mlp.rs", "reduce-scatter", "bwd", DISPATCHED_PAIR)]
    # the experts still run the pair's 128 routed copies, each on half of its ffn features
    assert next(op for op in block.fwd if op.name == "fc1").shape == (1, 128, 64, 32)


def test_without_sp_the_dispatch_keeps_its_order_and_at_ep_1_the_routed_copies_are_gathered() -> None:
    """Without sp every tp rank holds all 64 tokens and dispatches them all (8192 bytes, 8448 with the
    probabilities; Megatron-Core refuses MoE training at tp > 1 without sp: moe_layer.py, 0.16.1). At ep 1 the
    all-to-all dispatcher's all-to-all is the identity (mappings.all_to_all on a group of one) and the pair's 128
    routed copies are still all-gathered over tp (8448 with their probabilities, 8192 back): k = 2 times the
    hidden state's 4096, which the all-gather dispatcher would move; no ep collective."""
    _, no_sp = _tiny(sp=False)
    assert [c.buffer_bytes for c in no_sp.layers[1].comms if c.axis == "ep"] == [
        DISPATCHED_PAIR, ROUTED_PAIR, ROUTED_PAIR, DISPATCHED_PAIR]
    _, ep1 = _tiny(ep=1)
    assert [(c.name, c.buffer_bytes) for c in ep1.layers[1].comms if c.name.startswith("mlp")] == [
        ("mlp.ag", DISPATCHED_PAIR), ("mlp.rs", ROUTED_PAIR), ("mlp.ag", ROUTED_PAIR), ("mlp.rs", DISPATCHED_PAIR)]
    assert not any(c.axis == "ep" for c in ep1.layers[1].comms)


@pytest.mark.parametrize(("settings", "expert_tp", "ranks"), [
    ({"tp": 2, "ep": 2, "sp": True}, 2, (0, 4)),  # tp index 0 of the even dp ranks (8 GPUs: dp 4)
    ({"tp": 2, "ep": 2, "sp": True}, 1, (0, 1, 4, 5)),  # experts whole: both tp ranks ran other tokens
    ({"tp": 2, "ep": 2, "sp": False}, 1, (0, 4)),  # without sp both ran the same tokens: summed once
    ({"tp": 2, "ep": 4, "sp": True}, 2, (0,)),  # dp 4 / ep 4: each rank alone holds its experts
    ({"tp": 1, "ep": 2, "sp": False}, 1, (0, 2, 4, 6)),
    ({"tp": 2, "cp": 2, "ep": 2, "sp": True}, 2, (0, 4)),  # dp 2: the ep group strides over cp (0, 2)
    ({"tp": 2, "cp": 2, "ep": 2, "sp": True, "pp": 2}, 2, (0,)),  # dp 1: the ep group is the 2 cp ranks
])
def test_expert_data_parallel_group_is_megatron_core_s(settings: dict[str, object], expert_tp: int,
                                                       ranks: tuple[int, ...]) -> None:
    """Rank 0's expert data-parallel group: world / (etp x ep x pp) ranks (megatron-core 0.16.1's
    initialize_model_parallel) with etp = tp / (tp / d under sp), the ranks holding rank 0's expert shard."""
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 32, **settings})
    par = make_job(tiny_moe_job().model, a100_cluster(8), par).parallel
    assert expert_data_ranks(par, expert_tp) == ranks
    assert expert_data_size(par, expert_tp) == len(ranks)
    assert experts_own_group(par, expert_tp) == (ranks != tuple(range(0, 8, par.tp)))


def test_expert_gradients_reduce_over_the_expert_data_parallel_group_in_both_engines() -> None:
    """ZeRO 0 at Megatron's split: the 2 blocks' 2 x 8192 expert parameters go in a bucket of their own, all-reduced
    over ranks 0 and 4 (bf16: 32768 bytes), every other parameter over the dp group of 4; the closed form's
    gradient queue holds the same two buckets, priced the same."""
    job, graph = _tiny()
    pricer = Pricer(Calibration())
    plan = default_plan(graph, job.parallel)
    compiled = compile_job(job, plan, pricer)
    dense = sum(a.layer.param_count for a in plan.layers) - 2 * EXPERT_PARAMS
    expert_s = pricer.collective_s("all-reduce", 2 * EXPERT_PARAMS * 2.0, job.cluster.ranks_layout((0, 4)), job)
    dense_s = pricer.collective_s("all-reduce", dense * 2.0, pricer.layout("grad", job), job)
    assert [(t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm"] == [
        ("dp all-reduce bucket0 L2.moe_block..L1.moe_block", expert_s),
        ("dp all-reduce bucket1 L3.head..L0.embedding", dense_s)]
    stage = pricer.partition(graph, 1).stages[0]
    assert pricer.gradient_queues(stage, job).reduce.total_s == pytest.approx(expert_s + dense_s, rel=1e-12)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_expert_states_are_sharded_over_their_expert_data_parallel_group(zero: int) -> None:
    """ZeRO-1: the optimizer states (fp32 master and two moments: 12 bytes a parameter) of the 2 x 8192 expert
    parameters over the 2 ranks of their group, the rest over dp 4; ZeRO-2 the bf16 gradients too, ZeRO-3 the
    weights. The closed form's memory and the simulator's resident states agree; the optimizer step steps the
    parameters a GPU owns: (held - 16384) / 4 + 16384 / 2."""
    job, graph = _tiny(zero=zero)
    held = sum(layer.count * layer.param_count for layer in graph.layers)
    experts = 2 * EXPERT_PARAMS
    expected = {"weights": (held - experts) * 2 / (4 if zero >= 3 else 1) + experts * 2 / (2 if zero >= 3 else 1),
                "gradients": (held - experts) * 2 / (4 if zero >= 2 else 1) + experts * 2 / (2 if zero >= 2 else 1),
                "optimizer": (held - experts) * 12 / 4 + experts * 12 / 2}
    assert model_state_bytes(held, job.parallel, {2: experts}) == pytest.approx(expected, rel=1e-12)
    assert owned_params(held, job.parallel, {2: experts}) == pytest.approx((held - experts) / 4 + experts / 2)
    pricer = Pricer(Calibration())
    stages = pricer.partition(graph, 1).stages
    memory = pricer.memory(stages, job).breakdown
    assert {name: memory[name] for name in expected} == pytest.approx(expected, rel=1e-12)
    compiled = compile_job(job, default_plan(graph, job.parallel), pricer)
    assert {name: compiled.devices[0].static_breakdown[name] for name in expected} == pytest.approx(expected,
                                                                                                 rel=1e-12)


def test_the_experts_keep_their_routed_input_for_the_weight_gradient() -> None:
    """The experts' first matmul keeps the 128 routed copies it reads (the dispatched tokens gathered over the
    pair: 8192 bytes), beside Megatron's count of the block (sp, gelu, dropout masks): the norm inputs, qkv and
    router inputs and two masks of the rank's 32 tokens (32 x 32 x (4 x 2 + 2) = 10240), q k v (64 x 6 x 8 x 2
    = 6144), the projection's input (64 x 2 x 8 x 2 = 2048), fc1's output and gelu's (2 x 128 x 64 x 2 =
    32768); and what the routing keeps (megatron-core 0.16.1's moe_utils.permute and the experts' weighted
    activation): the int64 permutation index of the rank's 32 x 2 routed copies (512) and its routing map, a byte
    per token and expert (32 x 4 = 128), the 128 routed copies' bf16 probabilities (256) and, the activation
    being GeLU (which Megatron-Core does not fuse with the probabilities), its output, kept by the product for
    the probabilities' gradient (128 x 64 x 2 = 16384)."""
    _, graph = _tiny()
    block = graph.layers[1]
    routing = 32 * 2 * 8 + 32 * 4 + 128 * 2 + 128 * 64 * 2
    assert block.saved_bytes["selective"] == 10240 + 6144 + 2048 + 32768 + ROUTED_PAIR + routing
    assert block.experts == ExpertShard(EXPERT_PARAMS, 2)


@pytest.mark.parametrize(("tp", "ep", "sp", "zero"), [(2, 2, True, 1), (2, 2, True, 0), (2, 4, True, 1),
                                                     (1, 2, False, 2), (2, 2, False, 1), (2, 1, True, 1)])
def test_engines_agree_on_moe_jobs_with_runtime_effects_off(tp: int, ep: int, sp: bool, zero: int) -> None:
    """The simulator without the overlap slow-down and link sharing against the closed form: within 2%."""
    job, graph = _tiny(tp=tp, ep=ep, sp=sp, zero=zero)
    analytical = AnalyticalEstimator(Pricer(Calibration())).estimate(job, graph)
    sim = SimEstimator(Pricer(Calibration()), overlap=False, sharing=False).estimate(job, graph)
    assert sim.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.02)
    assert sim.peak_memory_bytes == pytest.approx(analytical.peak_memory_bytes, rel=0.02)


def test_experts_no_other_rank_holds_send_no_gradient_in_either_engine() -> None:
    """tp 2 x ep 4 x dp 4, sp: each rank's experts (one of the 4) are held by no other rank (expert data-parallel
    group of dp / ep = 1), so their 2 x (32896 - 128) / (tp ep) = 2 x 4096 parameters are reduced nowhere: the
    simulator's one bucket and the closed form's queue hold every other parameter, over the dp group."""
    job, graph = _tiny(ep=4)
    pricer = Pricer(Calibration())
    plan = default_plan(graph, job.parallel)
    assert [layer.experts for layer in graph.layers if layer.experts] == [ExpertShard(4096.0, 2)]
    dense = sum(a.layer.param_count for a in plan.layers) - 2 * 4096.0
    dense_s = pricer.collective_s("all-reduce", dense * 2.0, pricer.layout("grad", job), job)
    compiled = compile_job(job, plan, pricer)
    assert [(t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm"] == [
        ("dp all-reduce bucket0 L3.head..L0.embedding", dense_s)]
    stage = pricer.partition(graph, 1).stages[0]
    assert pricer.gradient_queues(stage, job).reduce.total_s == pytest.approx(dense_s, rel=1e-12)


def test_the_router_runs_the_rank_s_own_tokens() -> None:
    """Megatron-Core's TopKRouter runs the MoE layer's input as the rank holds it: its 32-token sequence share
    under sp (2 x 32 x 32 x 4 = 8192 FLOPs), all 64 local tokens without sp."""
    _, sp = _tiny()
    _, no_sp = _tiny(sp=False)
    for graph, tokens in ((sp, 32), (no_sp, 64)):
        router = next(op for op in graph.layers[1].fwd if op.name == "router")
        assert router.shape == (1, tokens, 4, 32)
        assert router.flops == 2 * tokens * 4 * 32


def _cp_job() -> tuple[Job, OpGraph]:
    """The tiny MoE on 16 A100s (2 servers of 8) at tp 2 x cp 2 x ep 4 x dp 4, sp: 32 local tokens, 16 a rank."""
    job = tiny_moe_job(cp=2, ep=4, num_gpus=16)
    assert isinstance(job.model, TransformerSpec)
    return job, build_transformer(job.model, DeviceSlice.of(job.parallel))


def test_with_cp_the_ep_group_strides_over_cp_ranks_and_its_links_are_priced() -> None:
    """Megatron-Core 0.16.1's expert mesh (tp-ep-dp-pp with cp folded into the expert data parallelism): rank 0's
    ep group is ranks 0, 2, 4, 6 (stride tp: cp ranks first), on one server, where trainsim's earlier ep group of
    4 consecutive data-parallel ranks (0, 4, 8, 12) crossed both. The dispatch's all-to-all (16 tokens x 2 copies
    x 32 x 2 bytes + 32 probabilities x 2 = 2112 bytes a rank) is priced on those ranks' links (the simulator's
    forward ep task of a block: the dispatch and the combine's 2048, in both engines); the expert
    data-parallel group is ranks 0 and 8 (position over cp and dp a multiple of 4)."""
    job, graph = _cp_job()
    pricer = Pricer(Calibration())
    layout = pricer.layout("ep", job)
    assert layout == job.cluster.ranks_layout((0, 2, 4, 6)) and layout.num_nodes == 1
    assert job.cluster.ranks_layout((0, 4, 8, 12)).num_nodes == 2
    assert expert_data_ranks(job.parallel, 2) == (0, 8)
    dispatch = [c.buffer_bytes for c in graph.layers[1].comms if c.name == "dispatch"]
    assert dispatch == [2112.0, 2112.0]
    compiled = compile_job(job, default_plan(graph, job.parallel), pricer)
    first = next(t for t in compiled.tasks if t.category == "ep_comm")
    assert first.duration_s == pytest.approx(pricer.collective_s("all-to-all", 2112.0, layout, job)
                                             + pricer.collective_s("all-to-all", 2048.0, layout, job), rel=1e-12)
    analytical = AnalyticalEstimator(Pricer(Calibration())).estimate(job, graph)
    sim = SimEstimator(Pricer(Calibration()), overlap=False, sharing=False).estimate(job, graph)
    assert sim.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.02)


def test_swiglu_experts_keep_only_the_probabilities_beside_their_tensors() -> None:
    """The tiny MoE with SwiGLU experts: Megatron-Core 0.16.1 fuses the probabilities into the activation
    (weighted_bias_swiglu_impl keeps its input and the probabilities), so the routing keeps the index (512), the
    map (128) and the 128 copies' probabilities (256) alone; the block: 10240 + 6144 + 2048, the gate and up
    outputs and the product (64 x 2 x 128 + 64 x 128) x 2 = 49152, the routed input 8192, and 896."""
    job = tiny_moe_job()
    spec = job.model
    assert isinstance(spec, TransformerSpec)
    swiglu = spec.model_copy(update={"mlp": "swiglu"})
    block = build_transformer(swiglu, DeviceSlice.of(job.parallel)).layers[1]
    assert block.saved_bytes["selective"] == 10240 + 6144 + 2048 + 49152 + ROUTED_PAIR + 512 + 128 + 256
