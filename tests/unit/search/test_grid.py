"""The grid engine (search.grid.GridEngine) gives every plan the figures of the plain analytical engine.

Differential: for grids of plans (a dense and a mixture-of-experts model, several training stacks, ZeRO 0-3,
pp and interleaved vpp, every recompute mode) and hand-picked plans the search never makes (cp, ep, gpipe,
zb-h1, fp8, foreach and loop optimizers, uneven pipeline splits, a cluster that shares its cores, a mix of
clusters and stacks in one call), each plan's iteration time, tokens/s, peak memory and out-of-memory verdict
equal, to 1e-9 relative, what a fresh AnalyticalEstimator.price gives on a freshly built graph (graph_for, once
per model and device slice: the catalog builders read nothing else, build_graph(model, DeviceSlice)); so do random
plans (ZeRO 0-3, groups within one node and across nodes, stacks with and without overlapped gradient
reduction and parameter gathers, many buckets and one), and grids under op costs other than the roofline and on a
CUDA-graphs stack; and the planner's ranking, counts and priced plans equal the ranking of the plain engine's
figures.
"""

import gc
import heapq
import random

import numpy as np
import pytest

from conftest import ConstantCosts
from trainsim.catalog.loader import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.cost.pricing import Pricer, StageCost
from trainsim.cost.stack_effects import bucket_queue
from trainsim.errors import TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import GraphCache, graph_for
from trainsim.search import Planner, SearchSpace, enumerate_plans
from trainsim.search.grid import GridEngine, GridPrices, _Batch, _Queues, _rows
from trainsim.search.planner import OUT_OF_MEMORY, build_plans, refusal_reason
from trainsim.search.space import PlanColumns, plan_grid
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision
from trainsim.strategy.stack import StackSpec, load_stack, make_stack
from trainsim.strategy.stages import StagePart

REL = 1e-9
DENSE = parse_model({"name": "tiny-dense", "num_layers": 8, "hidden": 128, "ffn_hidden": 512, "num_heads": 8,
                     "vocab": 1000})
MOE = TransformerSpec(name="tiny-moe", arch="gpt", num_layers=8, hidden=128, ffn_hidden=256, num_heads=8,
                      vocab=1000, max_seq_len=2048, num_experts=4, top_k=2, moe_every=2)
STACKS = ("generic", "megatron-core", "deepspeed-zero", "fsdp2", "colossalai")


def built(model: ModelSpec, cluster: ClusterSpec, plans: list[ParallelSpec],
          stack: StackSpec | None = None) -> list[tuple[Job, OpGraph]]:
    return build_plans(model, cluster, plans, stack).jobs


def fresh_graph(job: Job, built: dict[tuple[int, DeviceSlice], OpGraph]) -> OpGraph:
    """graph_for(job), built once per model and device slice (what graph_for builds from) into `built`, never
    taken from the graphs the grid engine is given."""
    key = (id(job.model), DeviceSlice.of(job.parallel, job.stack))
    if key not in built:
        built[key] = graph_for(job)
    return built[key]


def check_grid(plans: list[tuple[Job, OpGraph]], engine: GridEngine | None = None) -> None:
    engine = engine or GridEngine()
    prices = engine.price(plans)
    assert not prices.errors
    graphs: dict[tuple[int, DeviceSlice], OpGraph] = {}
    for index, (job, _) in enumerate(plans):
        plain = AnalyticalEstimator().price(job, fresh_graph(job, graphs))
        assert prices.iteration_time_s[index] == pytest.approx(plain.iteration_time_s, rel=REL, abs=0.0)
        assert prices.tokens_per_s[index] == pytest.approx(plain.tokens_per_s, rel=REL, abs=0.0)
        assert prices.peak_memory_bytes[index] == pytest.approx(plain.peak_memory_bytes, rel=REL, abs=0.0)
        assert bool(prices.oom[index]) == plain.oom


def grid_of(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace) -> list[tuple[Job, OpGraph]]:
    return built(model, cluster, list(enumerate_plans(model, cluster, space)), space.stack)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_every_plan_of_a_grid(model: ModelSpec, stack: str) -> None:
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=4, stack=load_stack(stack))
    plans = grid_of(model, cluster, space)
    assert len(plans) > 200
    assert {job.parallel.zero for job, _ in plans} == {0, 1, 2, 3}
    assert {job.parallel.vpp for job, _ in plans} >= {1, 2, 4}
    check_grid(plans)


@pytest.mark.parametrize("stack", STACKS)
def test_expert_parallel_plans_on_the_fast_path(stack: str) -> None:
    """Every plan of a tiny MoE grid at ep > 1 is priced by the grid's arrays, none left to the plain engine: the
    expert data-parallel groups (dp / ep ranks) of its gradient buckets, its optimizer step and its peak memory
    are the arrays' (cost.memory.stage_expert_params, Pricer.gradient_queues' grouped buckets), each plan's
    figures equal to the plain engine's."""
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=4, stack=load_stack(stack))
    plans = [plan for plan in grid_of(MOE, cluster, space) if plan[0].parallel.ep > 1]
    assert {job.parallel.ep for job, _ in plans} == {2, 4}
    assert {job.parallel.zero for job, _ in plans} == {0, 1, 2, 3}
    fast, slow = _Batch(GridEngine(), plans, None).split()
    assert not slow
    assert fast is not None and len(fast.index) == len(plans)
    check_grid(plans)


def test_a_model_whose_dense_blocks_lead() -> None:
    """DeepSeek's shape (dense blocks first, then MoE blocks; 8 blocks): every plan on the grid's arrays (pp 1: one
    stage holding every layer, no bubble; pp > 1: its split is uneven, the dense blocks on the first stages, its
    bubble estimate.analytical.uneven_bubble_s, interleaved with its chunks' shares of the stages' times and
    activations), each equal to the plain engine's figures."""
    model = TransformerSpec(name="tiny-deepseek", arch="llama", num_layers=8, hidden=128, ffn_hidden=256,
                            num_heads=8, vocab=1000, max_seq_len=2048, num_experts=4, top_k=2, moe_every=1,
                            leading_dense_layers=2)
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    plans = grid_of(model, cluster, SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2,
                                                stack=load_stack("megatron-core")))
    chunked = [index for index, (job, _) in enumerate(plans) if job.parallel.vpp > 1]
    assert {plans[index][0].parallel.pp for index in range(len(plans))} == {1, 2, 4, 8}
    assert chunked and {job.parallel.ep for job, _ in plans} == {1, 2, 4}
    fast, slow = _Batch(GridEngine(), plans, None).split()
    assert not slow
    assert fast is not None and len(fast.index) == len(plans)
    check_grid(plans)


UNEVEN_SPLITS = {
    # 13 blocks: pp 2 counts the loss; pp 4 puts 2 and 3 blocks on the first and last stages, 4 on each middle one
    13: {(1, 1, 0, 0, False, False), (2, 1, 0, 0, False, True), (4, 1, 2, 3, False, False)},
    # 14 blocks: pp 4 and 8 count the embedding and the loss (16 layers), in one chunk per stage or two; pp 4 x vpp
    # 2 holds 1 + 2 blocks on its first stage's chunks, 2 + 1 on its last's, 2 + 2 on the middle ones
    14: {(1, 1, 0, 0, False, False), (2, 1, 0, 0, False, False), (4, 1, 0, 0, True, True), (4, 2, 0, 0, True, True),
         (8, 1, 0, 0, True, True), (8, 2, 0, 0, True, True)},
}


@pytest.mark.parametrize("stack", ["megatron-core", "deepspeed-zero"])
@pytest.mark.parametrize("layers", sorted(UNEVEN_SPLITS))
def test_the_searchs_uneven_splits_on_the_fast_path(stack: str, layers: int) -> None:
    """The pp the search adds to the even ones on 16 GPUs (UNEVEN_SPLITS); every plan on the grid's arrays, equal
    to the plain engine's (the uneven bubble with its chunks' shares, each stage's memory with its chunks'
    activations, the gradient reduction)."""
    model = parse_model({"name": f"tiny-{layers}", "num_layers": layers, "hidden": 128, "ffn_hidden": 512,
                         "num_heads": 8, "vocab": 1000})
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=2, stack=load_stack(stack))
    plans = grid_of(model, cluster, space)
    splits = {(job.parallel.pp, job.parallel.vpp, job.parallel.first_stage_layers, job.parallel.last_stage_layers,
               job.parallel.embedding_in_split, job.parallel.loss_in_split) for job, _ in plans}
    assert splits == UNEVEN_SPLITS[layers]
    fast, slow = _Batch(GridEngine(), plans, None).split()
    assert not slow
    assert fast is not None and len(fast.index) == len(plans)
    check_grid(plans)


def test_overlapped_expert_all_to_alls_over_the_grid() -> None:
    """ep_comm_overlap's share of paired passes reads the micro-batches, pp, vpp and the recompute (0 under full
    recompute): each group of plans has a combo for its plans without full recompute and one for those with it,
    each under its share; every plan on the grid's arrays (a second global batch on the same engine: other
    micro-batches, another share), priced as the plain engine prices it, and faster for it where it applies
    (pp 1, or interleaved; not full recompute)."""
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    engine = GridEngine()
    for global_batch in (64, 32):
        moe = [ParallelSpec(tp=2, pp=p, vpp=v, ep=e, micro_batch=m, recompute=r, zero=z, sp=True,
                            global_batch=global_batch, seq_len=512, schedule="interleaved-1f1b" if v > 1 else "1f1b")
               for p, v in ((1, 1), (2, 1), (2, 2)) for e in (1, 2) for m in (1, 2)
               for r in ("none", "selective", "full") for z in (1, 3)]
        on = built(MOE, cluster, moe, make_stack("megatron-core", {"ep_comm_overlap": True}))
        fast, slow = _Batch(GridEngine(), on, None).split()
        assert not slow and fast is not None and len(fast.index) == len(on)
        check_grid(on, engine)
        on_s = engine.price(on).iteration_time_s
        # NB: the plain engine's figures without the overlap
        off_s = [AnalyticalEstimator().price(*plan).iteration_time_s
                 for plan in built(MOE, cluster, moe, load_stack("megatron-core"))]
        for index, plan in enumerate(moe):
            applies = plan.ep > 1 and plan.recompute != "full" and (plan.pp == 1 or plan.vpp > 1)
            if applies:
                assert on_s[index] < off_s[index]
            else:
                assert on_s[index] == pytest.approx(off_s[index], rel=REL, abs=0.0)


def test_zero3_gradient_buckets_over_the_grid() -> None:
    """DeepSpeed ZeRO-3 with buckets of two to three blocks of a model whose gathers and reduce-scatters outlast
    its compute (every op 1 us): the backward pass's stream (Pricer.fsdp_bucketed_backward_s) then reads the
    recompute, which the grid's stage rows do not: every plan (every recompute mode) as the plain engine prices
    it, and the recompute changes the ZeRO-3 exposure."""
    model = parse_model({"name": "wide-dense", "num_layers": 8, "hidden": 1024, "ffn_hidden": 4096,
                         "num_heads": 16, "vocab": 1000})
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    stack = load_stack("deepspeed-zero").model_copy(update={"fsdp_bucket_params": 3e7})
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=2, stack=stack)
    plans = [plan for plan in grid_of(model, cluster, space) if plan[0].parallel.zero == 3]
    assert {job.parallel.recompute for job, _ in plans} == {"none", "selective", "full"}
    pricer = Pricer(op_costs=ConstantCosts(1e-6))
    prices = GridEngine(AnalyticalEstimator(pricer)).price(plans)
    assert not prices.errors
    for index, (job, graph) in enumerate(plans):
        plain = AnalyticalEstimator(Pricer(op_costs=pricer.op_costs)).price(job, graph)
        assert prices.iteration_time_s[index] == pytest.approx(plain.iteration_time_s, rel=REL, abs=0.0)
    job, graph = next(plan for plan in plans if plan[0].parallel.pp == 1)
    stage = pricer.partition(graph, 1).stages[0]
    by_mode = {mode: pricer.fsdp_bucketed_backward_s(stage, job, mode) for mode in ("none", "full")}
    assert by_mode["full"] < by_mode["none"] * 0.999, by_mode  # the recompute hides some reduce-scatter


def same_prices(a: GridPrices, b: GridPrices) -> None:
    assert a.iteration_time_s.tolist() == b.iteration_time_s.tolist()
    assert a.tokens_per_s.tolist() == b.tokens_per_s.tolist()
    assert a.peak_memory_bytes.tolist() == b.peak_memory_bytes.tolist()
    assert a.oom.tolist() == b.oom.tolist()
    assert {index: str(exc) for index, exc in a.errors.items()} == {index: str(exc) for index, exc in b.errors.items()}


@pytest.mark.parametrize("stack", STACKS)
def test_the_enumerations_columns_give_the_same_prices(stack: str) -> None:
    """GridEngine.price handed the enumeration's columns (search.space.plan_grid, as Planner.search hands them)
    gives every plan exactly (==) what it gives reading each plan's spec (held to the plain engine above), with
    the plans make_job refuses left out, and with plans of another cluster among them (the plain engine's)."""
    a100 = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    h100 = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    for model in (DENSE, MOE):
        space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=4, stack=load_stack(stack))
        plans, columns = plan_grid(model, a100, space)
        grid = build_plans(model, a100, plans, space.stack)
        jobs = grid.jobs
        assert len(grid.index) < len(plans)  # make_job refuses some
        taken = columns.take(grid.index)
        same_prices(GridEngine().price(jobs, taken), GridEngine().price(jobs))
        others = [(make_job(model, h100, job.parallel, space.stack), graph) for job, graph in jobs[:40]]
        mixed = jobs[:60] + others + jobs[60:]
        mixed_columns = PlanColumns(taken.base[:60] + taken.base[:40] + taken.base[60:],
                                    taken.variant[:60] + taken.variant[:40] + taken.variant[60:], taken.variants)
        same_prices(GridEngine().price(mixed, mixed_columns), GridEngine().price(mixed))


def test_columns_of_other_plans_are_refused_or_not_read() -> None:
    """Columns of another number of plans are refused; columns whose bases hold plans of other graphs are not
    read (every plan's spec is)."""
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2)
    plans, columns = plan_grid(DENSE, cluster, space)
    jobs = built(DENSE, cluster, plans)
    with pytest.raises(ValueError, match="columns"):
        GridEngine().price(jobs, columns)  # make_job refused some plans: their columns were not taken out
    assert len({id(graph) for _, graph in jobs}) > 1
    one_base = PlanColumns([0] * len(jobs), [0] * len(jobs), columns.variants)
    same_prices(GridEngine().price(jobs, one_base), GridEngine().price(jobs))


def test_a_second_grid_on_the_kept_stage_rows() -> None:
    """Another global batch and precision on the same engine: the rows kept from the first call serve it."""
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    engine, graphs = GridEngine(), GraphCache()
    settings: list[tuple[int, Precision]] = [(64, "bf16"), (128, "bf16"), (128, "fp8")]
    for global_batch, precision in settings:
        space = SearchSpace(global_batch=global_batch, seq_len=512, max_micro_batch=2, precision=precision)
        check_grid(build_plans(DENSE, cluster, list(enumerate_plans(DENSE, cluster, space)), space.stack,
                               graphs).jobs, engine)


def test_plans_outside_the_grid() -> None:
    """Plans the fast path prices (cp, ep, gpipe, zb-h1, fp8, optimizers, uneven splits of one chunk per stage, a
    stage list) or leaves to the plain engine (uneven interleaved splits, non-fused optimizers of an MoE), several
    clusters and stacks in one call."""
    a100 = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    h100 = load_cluster("dgx-h100-80gb").with_num_gpus(32)
    dense = [ParallelSpec(tp=2, pp=2, cp=2, zero=z, recompute=r, schedule=s, global_batch=64, seq_len=512)
             for z in (0, 1, 3) for r in ("none", "selective", "full") for s in ("gpipe", "1f1b", "zb-h1")]
    dense += [ParallelSpec(tp=2, pp=4, vpp=2, schedule="interleaved-1f1b", precision=p, optimizer_impl=o,
                           attention=a, global_batch=64, seq_len=512)
              for p in ("bf16", "fp8", "fp32") for o in ("fused", "foreach", "loop") for a in ("flash3", "math")]
    uneven = [ParallelSpec(pp=2, vpp=3, schedule="interleaved-1f1b", global_batch=64, seq_len=512, recompute=r)
              for r in ("none", "full")]
    uneven += [ParallelSpec(pp=2, loss_in_split=True, schedule=s, global_batch=64, seq_len=512, zero=z)
               for s in ("gpipe", "zb-h1") for z in (0, 3)]
    uneven += [ParallelSpec(pp=2, first_stage_layers=3, global_batch=64, seq_len=512),
               ParallelSpec(pp=4, vpp=2, schedule="interleaved-1f1b", embedding_in_split=True, loss_in_split=True,
                            global_batch=64, seq_len=512),
               ParallelSpec(pp=2, stage_layers=(5, 3), zero=3, global_batch=64, seq_len=512)]
    moe = [ParallelSpec(tp=2, pp=2, ep=e, zero=z, sp=True, recompute=r, global_batch=64, seq_len=512)
           for e in (1, 2, 4) for z in (1, 3) for r in ("none", "full")]
    moe += [ParallelSpec(tp=2, pp=2, cp=2, ep=e, zero=z, sp=True, optimizer_impl=o, global_batch=64, seq_len=512)
            for e in (2, 4) for z in (0, 2) for o in ("fused", "foreach")]  # ep groups over cp; step temporaries
    plans = (built(DENSE, a100, dense) + built(DENSE, a100, uneven, load_stack("megatron-core"))
             + built(MOE, h100, moe, load_stack("deepspeed-zero")) + built(DENSE, a100, dense[:9]))
    assert len(plans) == len(dense) + len(uneven) + len(moe) + 9
    check_grid(plans)


def test_a_cpu_cluster_that_shares_its_cores() -> None:
    """No overlap of collectives with compute (gloo), and ranks taking turns on the cores (core_sharing)."""
    local = load_cluster("local-cpu").with_num_gpus(8)
    cpu = local.model_copy(update={"device": local.device.model_copy(update={"compute_share": 0.5})})
    plans = grid_of(DENSE, cpu, SearchSpace(global_batch=16, seq_len=128))
    assert plans
    check_grid(plans)


def test_a_plan_the_engine_refuses_is_reported_not_priced() -> None:
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(8)
    good = built(DENSE, cluster, [ParallelSpec(tp=2, global_batch=64, seq_len=512)])
    prices = GridEngine().price([*good, (good[0][0], OpGraph("empty", (), 1, 1))])
    assert list(prices.errors) == [1]
    assert prices.iteration_time_s[0] == pytest.approx(
        AnalyticalEstimator().price(*good[0]).iteration_time_s, rel=REL, abs=0.0)


def plain_search(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace,
                 top_k: int) -> tuple[list[ParallelSpec], dict[str, int], list[tuple[float, float, bool]]]:
    """The planner's ranking rule over the plain engine's figures, plan by plan."""
    ranked: list[tuple[float, float, int, ParallelSpec]] = []
    refused: dict[str, int] = {}
    priced = []
    graphs: dict[tuple[int, DeviceSlice], OpGraph] = {}
    for index, parallel in enumerate(enumerate_plans(model, cluster, space)):
        try:
            job = make_job(model, cluster, parallel, space.stack)
            price = AnalyticalEstimator().price(job, fresh_graph(job, graphs))
        except TrainsimError as exc:
            refused[refusal_reason(exc)] = refused.get(refusal_reason(exc), 0) + 1
            continue
        priced.append((price.tokens_per_s, price.peak_memory_bytes, price.oom))
        if price.oom:
            refused[OUT_OF_MEMORY] = refused.get(OUT_OF_MEMORY, 0) + 1
            continue
        ranked.append((price.tokens_per_s, -price.peak_memory_bytes, -index, job.parallel))
    best = heapq.nlargest(top_k, ranked, key=lambda entry: entry[:3])
    return [entry[3] for entry in best], refused, priced


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_the_planner_ranks_as_the_plain_engine(model: ModelSpec) -> None:
    a100 = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    # 2.06 GiB a GPU (2 GiB of it the runtime's): about half of the plans of these tiny models do not fit
    cluster = a100.model_copy(update={"device": a100.device.model_copy(update={"hbm_bytes": 2.06 * 2**30})})
    space = SearchSpace(global_batch=64, seq_len=2048, max_micro_batch=4, stack=load_stack("megatron-core"))
    report = Planner().search(model, cluster, space, top_k=25)
    order, refused, priced = plain_search(model, cluster, space, 25)
    assert [plan.parallel for plan in report.plans] == order
    assert report.infeasible == refused
    assert OUT_OF_MEMORY in refused  # the grid reaches plans that do not fit
    assert len(report.priced) == len(priced)
    for fast, (tokens, peak, oom) in zip(report.priced, priced, strict=True):
        assert fast.tokens_per_s == pytest.approx(tokens, rel=REL, abs=0.0)
        assert fast.peak_memory_bytes == pytest.approx(peak, rel=REL, abs=0.0)
        assert fast.oom == oom
    for plan in report.plans:
        assert plan.result == AnalyticalEstimator().estimate(plan.job, graph_for(plan.job))


BUCKET_STACKS = {
    "megatron-core": load_stack("megatron-core"),  # both overlaps, 134M-parameter buckets
    "generic": load_stack("generic"),  # one buffer after backward, gathers after the step
    # many buckets (a tiny block holds ~0.3M parameters): one overlap on, the other off, and the reverse
    "reduce-overlapped": StackSpec(grad_bucket_params=2e5, grad_reduce_overlap=True, param_gather_overlap=False),
    "gather-overlapped": StackSpec(grad_bucket_params=1e6, grad_reduce_overlap=False, param_gather_overlap=True),
}


def random_plans(seed: int, count: int, num_gpus: int) -> list[ParallelSpec]:
    """Plans drawn at random over tp, cp, pp, vpp, schedule, ZeRO 0-3, recompute and the micro-batch; dp fills
    the cluster (groups spanning nodes)."""
    rng = random.Random(seed)
    plans: list[ParallelSpec] = []
    while len(plans) < count:
        tp, cp, pp = rng.choice((1, 2, 4, 8)), rng.choice((1, 1, 2)), rng.choice((1, 2, 4, 8))
        if num_gpus % (tp * cp * pp):
            continue
        vpp = rng.choice((1, 2)) if pp > 1 else 1
        schedule = "interleaved-1f1b" if vpp > 1 else rng.choice(("1f1b", "gpipe", "zb-h1"))
        plans.append(ParallelSpec(tp=tp, cp=cp, pp=pp, vpp=vpp, schedule=schedule, zero=rng.choice((0, 1, 2, 3)),
                                  recompute=rng.choice(("none", "selective", "full")), sp=tp > 1 and rng.random() < 0.5,
                                  micro_batch=rng.choice((1, 2)), global_batch=64, seq_len=512))
    return plans


@pytest.mark.parametrize("stack", list(BUCKET_STACKS))
def test_random_plans_on_groups_across_nodes(stack: str) -> None:
    """The gradient reduction's bucket queues over arrays: random plans, ZeRO 0-3, data-parallel groups of one
    node and of several (8 GPUs a node), with and without overlapped reduction and gathers."""
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(32)
    plans = built(DENSE, cluster, random_plans(len(stack), 120, 32), BUCKET_STACKS[stack])
    assert len(plans) > 80
    assert {job.parallel.zero for job, _ in plans} == {0, 1, 2, 3}
    assert {job.parallel.dp * job.parallel.cp * job.parallel.tp > 8 for job, _ in plans} == {True, False}
    check_grid(plans)


def test_random_plans_of_every_stack_in_one_call() -> None:
    """Plans of several stacks and of a mixture-of-experts model in one call, on one engine kept across calls."""
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(32)
    engine = GridEngine()
    for seed in range(2):
        plans = []
        for number, stack in enumerate(BUCKET_STACKS.values()):
            plans += built(MOE if number % 2 else DENSE, cluster, random_plans(seed * 10 + number, 30, 32), stack)
        assert len(plans) > 80
        check_grid(plans, engine)


def test_another_op_cost_model_and_a_stack_of_cuda_graphs() -> None:
    """Op costs other than the roofline (the grid engine asks them op by op, as the plain engine does, not
    cost.roofline_arrays) and a stack whose CUDA graphs take the per-micro-batch host overhead away; pipeline
    sends overlapped (megatron-core's pp_comm_overlap) in the same call."""
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=4)
    graphed = load_stack("megatron-core").model_copy(update={"cuda_graphs": True})
    graphed_plans = built(DENSE, cluster, random_plans(7, 60, 16), graphed)
    assert len(graphed_plans) > 40 and {job.parallel.vpp for job, _ in graphed_plans} == {1, 2}
    for plans in (grid_of(DENSE, cluster, space)[::3], graphed_plans):  # each on the fast path (its first stack)
        for pricer in (Pricer(op_costs=ConstantCosts(1e-4)), Pricer()):
            prices = GridEngine(AnalyticalEstimator(pricer)).price(plans)
            assert not prices.errors
            for index, (job, _) in enumerate(plans):
                plain = AnalyticalEstimator(Pricer(op_costs=pricer.op_costs)).price(job, graph_for(job))
                assert prices.iteration_time_s[index] == pytest.approx(plain.iteration_time_s, rel=REL, abs=0.0)
                assert prices.peak_memory_bytes[index] == pytest.approx(plain.peak_memory_bytes, rel=REL, abs=0.0)


@pytest.mark.parametrize("collecting", [True, False])
def test_the_collector_is_left_as_it_was(collecting: bool) -> None:
    """price pauses the cyclic garbage collector while it works (speed only): the caller's setting comes back,
    after a refusal too, and the figures are those of a run with the collector on."""
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(8)
    good = built(DENSE, cluster, [ParallelSpec(tp=2, global_batch=64, seq_len=512)])
    reference = GridEngine().price(good)
    if not collecting:
        gc.disable()
    try:
        prices = GridEngine().price([*good, (good[0][0], OpGraph("empty", (), 1, 1))])
        assert gc.isenabled() is collecting
    finally:
        gc.enable()
    assert list(prices.errors) == [1]
    assert prices.iteration_time_s[0] == reference.iteration_time_s[0]
    assert prices.peak_memory_bytes[0] == reference.peak_memory_bytes[0]


def test_the_flat_row_tables_are_numpys_nested_ones() -> None:
    """grid._rows (one flat pass over the rows' entries) == np.array of the nested rows, for float tables with
    integer and fractional entries, integer tables, and the ZeRO-3 pairs' padded rows (3-d after reshape)."""
    rng = random.Random(7)
    floats = [tuple(rng.choice((0, 3, 1e-9, 2.5, rng.random() * 1e12, -np.inf)) for _ in range(21)) for _ in range(40)]
    ints = [tuple(rng.randrange(-1, 1000) for _ in range(16)) for _ in range(40)]
    for rows, width, dtype in ((floats, 21, np.float64), (ints, 16, np.int64), ([], 5, np.float64)):
        table = _rows(rows, width, dtype)
        expected = np.array(rows, dtype=dtype).reshape(len(rows), width)
        assert table.dtype == expected.dtype and table.shape == expected.shape
        assert table.tobytes() == expected.tobytes()
    pairs = [[(rng.random(), rng.random()) for _ in range(rng.randrange(1, 6))] for _ in range(30)]
    nested = np.array([(row + [(0.0, 0.0)] * 5)[:5] for row in pairs], dtype=np.float64)
    flat = _rows([([value for pair in row for value in pair] + [0.0, 0.0] * 5)[:10] for row in pairs], 10,
                 np.float64).reshape(len(pairs), 5, 2)
    assert flat.tobytes() == nested.tobytes()


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_the_layers_op_sums_over_arrays_are_the_pricers(model: ModelSpec) -> None:
    """grid._Batch._sum_ops (per layer its forward, backward, selective-recompute and weight-gradient seconds as
    column adds over its ops' roofline times) == the Pricer's LayerCost of each layer of the grid's graphs (its
    op times summed one by one: pricing.ordered_sum), bit for bit, on a stack that fuses every op."""
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=64, seq_len=512, max_micro_batch=2, max_vpp=2)
    plans = grid_of(model, cluster, space)
    batch = _Batch(GridEngine(), plans, None)
    batch._price_ops([graph for _, graph in plans])
    layers = {id(layer): (layer, job) for job, graph in plans for layer in graph.layers}
    assert len(batch.op_sum_of) == len(layers) > 10
    for key, (layer, job) in layers.items():
        assert batch.pricer.fuses_every_op(job)
        cost = Pricer().new_layer_cost(layer, job)
        sums = batch.op_sums[batch.op_sum_of[key]].tolist()
        assert sums == [cost.fwd_s, cost.bwd_s, cost.selective_s, cost.wgrad_s], layer.name


def test_the_queue_tables_are_bucket_queues_terms() -> None:
    """grid._Queues (the queues' terms over arrays, made from their runs of buckets) == stack_effects.bucket_queue
    of each queue, bit for bit: count, total, peaks and lags in order, the padding -inf and 0; for empty queues,
    one run, and up to 60 runs of up to 40 equal buckets (the running sums made in bucket_queue's order)."""
    rng = random.Random(11)
    for _ in range(200):
        runs = [[(rng.choice((rng.random() * 10.0 ** rng.randint(-6, 2), 1e-3, 0.1 + 0.2)), rng.randint(1, 40))
                 for _ in range(rng.randint(0, 60))] for _ in range(rng.randint(1, 12))]
        table = _Queues(runs)
        for number, queue_runs in enumerate(runs):
            queue = bucket_queue(queue_runs)
            width = len(queue.peaks_s)
            assert (table.count[number], table.total_s[number]) == (queue.count, queue.total_s)
            assert table.peaks_s[:width, number].tolist() == list(queue.peaks_s)
            assert table.lags[:width, number].tolist() == [float(lag) for lag in queue.lags]
            assert (table.peaks_s[width:, number] == -np.inf).all() and (table.lags[width:, number] == 0.0).all()


def test_interleaved_plans_whose_one_chunk_window_exposes_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pricer._gradient_sync_s's interleaved case: the larger of the reduction over pp micro-batches' windows and
    of the first chunk's one window / vpp. On a network 1,000x slower than an H100 server's, with many small
    buckets, the one-chunk term is the larger for some plans (counted below through the plain engine); the grid
    (which prices it for the interleaved plans' entries only) gives every plan's figures as the plain engine."""
    base = load_cluster("dgx-h100-80gb").with_num_gpus(32)
    slow_nic = base.inter_node.model_copy(update={"bw_bytes_per_s": base.inter_node.bw_bytes_per_s * 1e-3})
    cluster = base.model_copy(update={"inter_node": slow_nic})
    plans = built(DENSE, cluster, [
        ParallelSpec(tp=tp, pp=pp, vpp=vpp, schedule="interleaved-1f1b", zero=zero, recompute=recompute,
                     global_batch=64, seq_len=512)
        for tp in (1, 2) for pp, vpp in ((2, 2), (2, 4), (4, 2)) for zero in (0, 1, 2) for recompute in ("none", "full")
    ], BUCKET_STACKS["reduce-overlapped"])
    assert len(plans) == 36
    one_chunk_wins: list[bool] = []
    sync_s, windows_s = Pricer._gradient_sync_s, Pricer.gradient_sync_windows_s
    calls: list[float] = []

    def windows_spy(pricer: Pricer, stage: list[StagePart], backward_s: float, forward_s: float, job: Job) -> float:
        calls.append(windows_s(pricer, stage, backward_s, forward_s, job))
        return calls[-1]

    def sync_spy(pricer: Pricer, stage: list[StagePart], cost: StageCost, job: Job) -> float:
        calls.clear()
        seconds = sync_s(pricer, stage, cost, job)
        if len(calls) == 2:  # interleaved: the pp micro-batches' windows, then the one chunk's (before / vpp)
            one_chunk_wins.append(calls[1] / job.parallel.vpp > calls[0])
        return seconds

    check_grid(plans)
    monkeypatch.setattr(Pricer, "gradient_sync_windows_s", windows_spy)
    monkeypatch.setattr(Pricer, "_gradient_sync_s", sync_spy)
    for job, graph in plans:
        AnalyticalEstimator().price(job, graph)
    assert any(one_chunk_wins)
