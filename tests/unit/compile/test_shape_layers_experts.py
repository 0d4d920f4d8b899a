"""An MoE block's experts over fewer tp ranks than tp in a strategy tree (compile.shape_layers,
strategy.megatron): Megatron-Core's expert tensor parallelism (expert_tensor_parallel_size, megatron-core 0.16.1).

The tiny MoE (tests/conftest.py's tiny GPT without biases, every block an MoE of 4 experts, top-2: hidden 32, 4
heads of 8, ffn 128, vocab 256) at micro-batch 2 x 32 tokens in bf16 on 8 A100s. A block's attention and norms
hold 32 x 96 + 32 x 32 + 2 x 2 x 32 = 4224 parameters, its experts and router 4 x 2 x 32 x 128 + 32 x 4 = 32896
(the builder counts the router with the experts). With sp each of tp 2 ranks holds 32 of the 64 tokens; top-2
routing makes 64 routed copies of them (128 of the micro-batch's 64 tokens), 64 x 32 x 2 = 4096 bytes of hidden
states (8192 for all 128). The dispatch carries each copy's bf16 routing probability beside it (megatron-core
0.16.1's all-to-all dispatcher): 4096 + 64 x 2 = 4224 bytes (8448 for 128); the combine the hidden states alone.
"""

from pathlib import Path

import pytest
import yaml

from conftest import a100_cluster, tiny_moe_job
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.shape_layers import expert_grad_groups, shape_layers, shaped_graph
from trainsim.compile.splits import plan_mesh_comms
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import Comm, Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree
from trainsim.strategy.tree_yaml import load_tree_yaml

ATTN_PARAMS, EXPERT_PARAMS = 4224, 32896
EXPERTS = ("blocks.*.moe.mlp.fc1", "blocks.*.moe.mlp.act", "blocks.*.moe.mlp.fc2")


def _tiny(tp: int = 2, ep: int = 2, sp: bool = True) -> tuple[Job, OpGraph]:
    job = tiny_moe_job(tp, ep, sp)
    assert isinstance(job.model, TransformerSpec)
    return job, build_transformer(job.model, DeviceSlice.of(job.parallel))


def _experts_over(job: Job, graph: OpGraph, d: int) -> StrategyTree:
    """Megatron's splits, the experts over d tp ranks: fc1 and the activation split out, fc2 reduce d ways (none
    at 1), and under sp the tokens of the d ranks (the sequence split tp / d ways)."""
    tree = StrategyTree.from_parallel(graph, job.parallel)
    tp = job.parallel.tp
    for path in EXPERTS:
        dim = "reduce" if path.endswith("fc2") else "out"
        tree = tree.split(path, "compute", dim, d, axis="tp", override=True)
        if job.parallel.sp and tp // d > 1:
            tree = tree.split(path, "compute", "seq", tp // d, axis="tp", override=True)
    return tree


def _moe(job: Job, tree: StrategyTree) -> Layer:
    plan = shape_layers(job, tree.lower(job.parallel))
    block = plan.layers[1].layer
    assert block.kind == "moe_block" and plan.layers[2].layer is block
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms  # the compiler's, the layer's own
    return block


def _flops(layer: Layer, name: str) -> float:
    return next(op.flops for op in layer.fwd if op.name == name)


def test_experts_whole_over_tp2_with_sp_pay_no_expert_tp_collective() -> None:
    """tp 2 x ep 2 x dp 4, sp, the experts whole on each tp rank (Megatron-Core's expert_tensor_parallel_size 1):
    each tp rank routes its own 32 tokens and its 2 experts run their 64 routed copies whole. No all-gather
    before fc1 and no reduce-scatter after fc2 (Megatron's split: one pair of 4096 bytes each way); the
    attention keeps its pair. The all-to-alls over ep move the rank's own routed copies: 4096 bytes (Megatron's
    split, which gathers the hidden state over tp first, dispatches all 128: 8192). fc1 runs 64 rows x 128 ffn
    features x 32: 2 x 64 x 128 x 32 = 524288 FLOPs, as many as Megatron's 128 rows x 64 features. A rank holds
    its 2 experts whole: 32896 / 2 = 16448 parameters, twice Megatron's 32896 / 4 = 8224; with the attention's
    4224 / 2: 18560 per block. Megatron's split (d = tp) dispatches the rank's own 64 routed copies too
    (Megatron-Core's all-to-all dispatcher under sp), then gathers the pair's 128 over tp (8192 bytes, 8448 with
    their probabilities) and reduce-scatters them after the experts. The dispatch's all-to-alls carry the
    probabilities (4224), the combine's not."""
    job, graph = _tiny()
    block = _moe(job, _experts_over(job, graph, 1))
    megatron = graph.layers[1]
    assert block.comms == (
        Comm("dispatch", "all-to-all", "ep", "fwd", 4224.0), Comm("combine", "all-to-all", "ep", "fwd", 4096.0),
        Comm("combine", "all-to-all", "ep", "bwd", 4096.0), Comm("dispatch", "all-to-all", "ep", "bwd", 4224.0),
        Comm("attn.ag", "all-gather", "tp", "fwd", 4096.0, 0, "qkv"),
        Comm("attn.rs", "reduce-scatter", "tp", "fwd", 4096.0),
        Comm("attn.ag", "all-gather", "tp", "bwd", 4096.0),
        Comm("attn.rs", "reduce-scatter", "tp", "bwd", 4096.0, 0, "qkv"))
    assert [(c.name, c.buffer_bytes) for c in megatron.comms if c.axis == "tp"] == [
        ("attn.ag", 4096.0), ("attn.rs", 4096.0), ("mlp.ag", 8448.0), ("mlp.rs", 8192.0),
        ("attn.ag", 4096.0), ("attn.rs", 4096.0), ("mlp.ag", 8192.0), ("mlp.rs", 8448.0)]
    assert [c.buffer_bytes for c in megatron.comms if c.axis == "ep"] == [4224.0, 4096.0, 4096.0, 4224.0]
    assert _flops(block, "fc1") == _flops(megatron, "fc1") == 2 * 64 * 128 * 32
    assert _flops(block, "fc2") == 2 * 64 * 32 * 128 and _flops(block, "gelu") == 8 * 64 * 128
    assert next(op for op in block.fwd if op.name == "fc1").shape == (1, 64, 128, 32)
    assert megatron.param_count == ATTN_PARAMS / 2 + EXPERT_PARAMS / 4 == 10336
    assert block.param_count == ATTN_PARAMS / 2 + EXPERT_PARAMS / 2 == 18560
    assert [op for op in block.fwd if ".moe." not in op.module_path] == \
        [op for op in megatron.fwd if ".moe." not in op.module_path]


def test_experts_whole_without_sp_run_all_tokens_on_each_tp_rank() -> None:
    """Without sp every tp rank holds all 64 tokens: the experts whole run all 128 routed copies on each rank (2 x 128 x
    128 x 32 = 1048576 FLOPs for fc1, twice Megatron's), with no tp collective and all-to-alls of 8192 bytes (the
    dispatch's 8448 with the probabilities), as Megatron's split moves. (Megatron-Core refuses MoE with tp > 1 and no sp
    in training, moe_layer.py, megatron-core 0.16.1; trainsim prices it, as it prices Megatron's split without sp.) Both
    tp ranks ran the same tokens: the experts' gradient (16448 less the router's 128 / 2) is summed over the dp / ep = 2
    data-parallel ranks holding those experts at tp index 0, ranks 0 and 4, once."""
    job, graph = _tiny(sp=False)
    block = _moe(job, _experts_over(job, graph, 1))
    assert [(c.name, c.axis) for c in block.comms if c.axis == "tp"] == [("attn.ar", "tp")] * 2
    assert [c.buffer_bytes for c in block.comms if c.axis == "ep"] == [8448.0, 8192.0, 8192.0, 8448.0]
    assert _flops(block, "fc1") == 2 * _flops(graph.layers[1], "fc1") == 2 * 128 * 128 * 32
    assert block.param_count == 18560
    assert expert_grad_groups(job, shape_layers(job, _experts_over(job, graph, 1).lower(job.parallel))) == {
        1: (16384.0, (0, 4)), 2: (16384.0, (0, 4))}


def test_experts_over_pairs_of_tp4_gather_the_routed_tokens_over_2_ranks() -> None:
    """tp 4 x ep 2 x dp 1 (8 GPUs), sp, the experts over pairs of tp ranks (expert_tensor_parallel_size 2): each rank
    routes its 16 tokens, the all-to-all over ep moves their 32 routed copies (2048 bytes, 2112 with their
    probabilities), then an all-gather over the 2 ranks of the pair gathers the pair's 64 (4096 bytes, 4224 with their
    probabilities) and a reduce-scatter over them follows fc2 (4096), both conjugated backward (Megatron-Core's order:
    MoEAlltoAllTokenDispatcher, all-to-all over ep, then all-gather over the expert tp group). fc1 on 64 rows x 64
    features; 32896 / 2 / 2 parameters."""
    job, graph = _tiny(tp=4)
    block = _moe(job, _experts_over(job, graph, 2))
    assert [c for c in block.comms if c.name.startswith("mlp")] == [
        Comm("mlp.ag", "all-gather", "tp", "fwd", 4224.0, 2), Comm("mlp.rs", "reduce-scatter", "tp", "fwd", 4096.0, 2),
        Comm("mlp.ag", "all-gather", "tp", "bwd", 4096.0, 2), Comm("mlp.rs", "reduce-scatter", "tp", "bwd", 4224.0, 2)]
    assert [c.buffer_bytes for c in block.comms if c.axis == "ep"] == [2112.0, 2048.0, 2048.0, 2112.0]
    assert _flops(block, "fc1") == 2 * 64 * 64 * 32
    assert block.param_count == ATTN_PARAMS / 4 + EXPERT_PARAMS / 2 / 2


def test_whole_experts_sum_their_gradient_over_their_expert_data_parallel_ranks() -> None:
    """tp 2 x ep 2 x dp 4 with sp, experts whole: the 2 tp ranks ran other tokens through the same experts, so
    their expert gradients are summed with each other's and with the dp / ep = 2 data-parallel ranks holding
    the same experts: ranks 0, 1, 4 and 5 (Megatron-Core's expert data-parallel group, world / (etp x ep) = 4).
    The simulator's gradient buckets: the experts' 2 x 16384 parameters (16448 less the router's 128 / 2,
    summed with the dp group) over those 4 ranks, every other parameter over the dp group, each bucket its
    all-reduce of bf16 gradients (2 bytes) on its ranks' layout. Megatron's split (d = tp = 2): each rank holds
    32896 / 4 - 32 = 8192 expert parameters, summed over the dp / ep = 2 ranks at its tp index: 0 and 4."""
    job, graph = _tiny()
    plan = _experts_over(job, graph, 1).lower(job.parallel)
    groups = expert_grad_groups(job, shape_layers(job, plan))
    assert groups == {1: (16384.0, (0, 1, 4, 5)), 2: (16384.0, (0, 1, 4, 5))}
    assert expert_grad_groups(job, default_plan(graph, job.parallel)) == {1: (8192.0, (0, 4)), 2: (8192.0, (0, 4))}
    pricer = Pricer(Calibration())
    compiled = compile_job(job, plan, pricer)
    others = sum(a.layer.param_count for a in shape_layers(job, plan).layers) - 2 * 16384
    expert_s = pricer.collective_s("all-reduce", 2 * 16384 * 2.0, job.cluster.ranks_layout((0, 1, 4, 5)), job)
    dense_s = pricer.collective_s("all-reduce", others * 2.0, job.cluster.group_layout(4, 2), job)
    assert [(t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm"] == [
        ("dp all-reduce bucket0 L2.moe_block..L1.moe_block", expert_s),
        ("dp all-reduce bucket1 L3.head..L0.embedding", dense_s)]
    plain = compile_job(job, default_plan(graph, job.parallel), pricer)
    assert [(t.name, t.duration_s) for t in plain.tasks if t.category == "dp_comm"] == [
        ("dp all-reduce bucket0 L2.moe_block..L1.moe_block",
         pricer.collective_s("all-reduce", 2 * 8192 * 2.0, job.cluster.ranks_layout((0, 4)), job)),
        ("dp all-reduce bucket1 L3.head..L0.embedding", pricer.collective_s(
            "all-reduce", (sum(a.layer.param_count for a in default_plan(graph, job.parallel).layers) - 2 * 8192)
            * 2.0, job.cluster.group_layout(4, 2), job))]


def test_expert_configs_other_than_megatron_core_s_are_refused_in_one_line() -> None:
    """Under sp the experts' tokens stay split: `out=1` without the sequence split would run every rank's
    experts on gathered tokens, which Megatron-Core has no setting for; the expert ops take one degree; the
    router splits tokens only (its top-k spans the experts), not its experts (out)."""
    job, graph = _tiny()
    tree = StrategyTree.from_parallel(graph, job.parallel)
    with pytest.raises(ConfigError, match=r"blocks.0.moe.mlp.fc1 split.compute@tp='nothing' is invalid: .*fc1 "
                                          r"splits out=2 over tp; give that, or no tp splits; or seq=2 \(the "
                                          r"experts whole on each tp rank: expert tensor parallelism 1\)") as info:
        tree.split("blocks.*.moe.mlp.fc1", "compute", "out", 1, axis="tp", override=True).lower(job.parallel)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"fc1 1, gelu 2, fc2 2.* an MoE's expert ops take one tp degree"):
        tree.split("blocks.*.moe.mlp.fc1", "compute", "seq", 2, axis="tp", override=True).split(
            "blocks.*.moe.mlp.fc1", "compute", "out", 1, axis="tp", override=True).lower(job.parallel)
    with pytest.raises(ConfigError, match=r"router split.compute@tp='seq=2 out=2' is invalid: .*router splits "
                                          r"seq=2 over tp; .*or any split of its batch, seq whose parts divide 2"):
        tree.split("blocks.*.moe.router", "compute", "out", 2, axis="tp", override=True).lower(job.parallel)


@pytest.mark.parametrize(("tp", "sp"), [(2, True), (2, False), (4, True)])
def test_experts_at_tp_compile_to_the_plain_plans_tasks(tp: int, sp: bool) -> None:
    """A tree writing the experts over all tp ranks (Megatron's split) is the plain plan: no layer rebuilt, no
    expert gradient group, the same compiled tasks."""
    job, graph = _tiny(tp=tp, sp=sp)
    plan = _experts_over(job, graph, tp).lower(job.parallel)
    assert plan == default_plan(graph, job.parallel) and shape_layers(job, plan) is plan
    pricer = Pricer(Calibration())
    tree_tasks = compile_job(job, plan, pricer).tasks
    plain_tasks = compile_job(job, default_plan(graph, job.parallel), pricer).tasks
    assert [(t.name, t.duration_s, t.deps) for t in tree_tasks] == [(t.name, t.duration_s, t.deps) for t in plain_tasks]


def test_the_closed_form_prices_the_shaped_layers() -> None:
    """The analytical engine takes a tree's configs over tp (compile.shape_layers.shaped_graph): the graph's
    MoE block becomes the rebuilt one (its FLOPs, weights and collectives), every other layer stays, and the
    engine prices that graph; instances of a layer split differently, or a tree that places layers, are refused
    there (the simulator takes both)."""
    job, graph = _tiny()
    plan = _experts_over(job, graph, 1).lower(job.parallel)
    shaped = shaped_graph(job, graph, plan)
    assert shaped.layers[1] == shape_layers(job, plan).layers[1].layer and shaped.layers[1].param_count == 18560
    assert [layer for i, layer in enumerate(shaped.layers) if i != 1] == \
        [layer for i, layer in enumerate(graph.layers) if i != 1]
    estimator = AnalyticalEstimator(Pricer(Calibration()))
    assert estimator.estimate(job, graph, plan) == estimator.price(job, shaped).result()
    assert shaped_graph(job, graph, default_plan(graph, job.parallel)) is graph
    tree = StrategyTree.from_parallel(graph, job.parallel)
    for path in ("blocks.0.moe.mlp.fc1", "blocks.0.moe.mlp.act", "blocks.0.moe.mlp.fc2"):
        dim = "reduce" if path.endswith("fc2") else "out"
        tree = tree.split(path, "compute", "seq", 2, axis="tp", override=True).split(
            path, "compute", dim, 1, axis="tp", override=True)
    with pytest.raises(ConfigError, match=r"splits the instances of moe_block over tp differently"):
        shaped_graph(job, graph, tree.lower(job.parallel))
    with pytest.raises(ConfigError, match=r"a tree that sets any of those needs --engine sim"):
        shaped_graph(job, graph, _experts_over(job, graph, 1).recompute("blocks.0", "full").lower(job.parallel))


@pytest.mark.parametrize(("name", "tp", "expert_comms"), [
    ("mixtral-tp2-ep2-experts-whole.yaml", 2, []),
    ("mixtral-tp4-ep2-experts-tp2.yaml", 4, [("mlp.ag", 2), ("mlp.rs", 2), ("mlp.ag", 2), ("mlp.rs", 2)]),
])
def test_the_shipped_mixtral_trees(name: str, tp: int, expert_comms: list[tuple[str, int]]) -> None:
    """data/strategies/megatron/mixtral-*.yaml on Mixtral 8x7B's block (8 layers, micro-batch 1 x 4096 tokens,
    sp): experts whole at tp 2 (no expert tp collective), over pairs at tp 4 (gather and scatter over 2 ranks of
    4096 / 4 x 2 tokens x 2 x 4096 x 2 = 33554432 bytes, the gather's 4096 / 4 x 2 x 2 x 2 = 8192 more with
    the probabilities), the all-to-alls of the rank's own 4096 / tp tokens' 2 routed copies each (the dispatch's
    with their probabilities, 4096 / tp x 2 x 2 bytes more); every MoE block rebuilt alike."""
    root = Path(__file__).resolve().parents[3] / "data" / "strategies" / "megatron"
    spec = parse_model(yaml.safe_load((root / "models" / "mixtral-8x7b-l8.yaml").read_text()))
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 4096, "global_batch": 64, "tp": tp, "ep": 2, "sp": True})
    job = make_job(spec, a100_cluster(8), par)
    graph = build_transformer(spec, DeviceSlice.of(job.parallel))
    plan = shape_layers(job, load_tree_yaml(root / name, graph).lower(job.parallel))
    blocks = {id(a.layer) for a in plan.layers if a.layer.kind == "moe_block"}
    assert len(blocks) == 1
    block = plan.layers[1].layer
    assert [(c.name, c.ranks) for c in block.comms if c.name.startswith("mlp")] == expert_comms
    assert {c.buffer_bytes for c in block.comms if c.name.startswith("mlp")} <= {33554432.0, 33562624.0}
    routed = 4096 // tp * 2 * 4096 * 2.0
    with_probs = routed + 4096 // tp * 2 * 2.0
    assert [c.buffer_bytes for c in block.comms if c.axis == "ep"] == [with_probs, routed, routed, with_probs]
