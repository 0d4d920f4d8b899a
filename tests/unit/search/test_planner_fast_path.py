"""The search's fast path gives every plan the Result the plain engine gives it.

The search prices plans with AnalyticalEstimator.price on one estimator, whose pricing caches (group layouts,
collectives, layer, stage and memory prices, partitions) serve every plan, and builds Results only for the plans
it reports. Differential: for every plan of small grids, and for hand-picked plans the grid does not reach
(cp, ep, gpipe, zb-h1, fp8, foreach and loop optimizers, a CPU cluster that shares its cores), the Result of the
shared, warm estimator equals, field by field and to the last bit, the Result of a fresh estimator on a freshly
built graph; and the memory of a cached partition equals cost.memory.estimate_memory on fresh stages.
"""

from dataclasses import fields

import pytest

from trainsim.catalog.loader import load_cluster, load_model
from trainsim.catalog.model_files import parse_model
from trainsim.cost.memory import estimate_memory
from trainsim.errors import TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.result import Result
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import GraphCache, graph_for
from trainsim.search import Planner, SearchSpace, enumerate_plans
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stages import partition_stages


def tiny_model(num_layers: int = 8, num_heads: int = 8) -> ModelSpec:
    return parse_model({"name": f"tiny-{num_layers}x{num_heads}", "num_layers": num_layers,
                        "hidden": 16 * num_heads, "ffn_hidden": 64 * num_heads, "num_heads": num_heads,
                        "vocab": 1000})


def assert_same(fast: Result, plain: Result) -> None:
    for f in fields(Result):
        assert getattr(fast, f.name) == getattr(plain, f.name), f.name
    assert list(fast.breakdown) == list(plain.breakdown)
    assert list(fast.memory_breakdown) == list(plain.memory_breakdown)


def jobs_of(model: ModelSpec, cluster: ClusterSpec, plans: list[ParallelSpec]) -> list[Job]:
    jobs = []
    for parallel in plans:
        try:
            jobs.append(make_job(model, cluster, parallel))
        except TrainsimError:
            continue
    return jobs


def check_plans(jobs: list[Job]) -> None:
    shared, graphs = AnalyticalEstimator(), GraphCache()
    for job in jobs:
        fast = shared.price(job, graphs.get(job))
        plain = AnalyticalEstimator().estimate(job, graph_for(job))
        assert fast.tokens_per_s == plain.tokens_per_s
        assert (fast.peak_memory_bytes, fast.oom) == (plain.peak_memory_bytes, plain.oom)
        assert_same(fast.result(), plain)
        assert_same(shared.estimate(job, graphs.get(job)), plain)


@pytest.mark.parametrize("num_gpus, global_batch", [(8, 32), (16, 64)])
def test_every_plan_of_a_grid(num_gpus: int, global_batch: int) -> None:
    model = tiny_model()
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(num_gpus)
    plans = list(enumerate_plans(model, cluster, SearchSpace(global_batch=global_batch, seq_len=256,
                                                             max_micro_batch=4)))
    jobs = jobs_of(model, cluster, plans)
    assert len(jobs) > 300
    check_plans(jobs)


def test_plans_outside_the_grid() -> None:
    dense, moe = tiny_model(), load_model("mixtral-8x7b")
    a100 = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    h100 = load_cluster("dgx-h100-80gb").with_num_gpus(64)
    dense_plans = [ParallelSpec(tp=2, pp=2, cp=2, zero=z, recompute=r, schedule=s, global_batch=64,
                                seq_len=256)
                   for z in (0, 1, 3) for r in ("none", "full") for s in ("gpipe", "1f1b", "zb-h1")]
    dense_plans += [ParallelSpec(tp=2, pp=4, vpp=2, schedule="interleaved-1f1b", precision=p, optimizer_impl=o,
                                 attention=a, global_batch=64, seq_len=256)
                    for p in ("bf16", "fp8", "fp32") for o in ("fused", "foreach", "loop") for a in ("flash3", "math")]
    moe_plans = [ParallelSpec(tp=2, pp=4, ep=e, zero=z, sp=True, global_batch=64, seq_len=1024)
                 for e in (1, 2, 8) for z in (1, 3)]
    jobs = jobs_of(dense, a100, dense_plans) + jobs_of(moe, h100, moe_plans)
    assert len(jobs) == len(dense_plans) + len(moe_plans)
    check_plans(jobs)


def test_a_cpu_cluster_that_shares_its_cores() -> None:
    """No overlap of collectives with compute (gloo), and ranks taking turns on the cores (core_sharing)."""
    local = load_cluster("local-cpu").with_num_gpus(8)
    cpu = local.model_copy(update={"device": local.device.model_copy(update={"compute_share": 0.5})})
    model = tiny_model(4, 4)
    jobs = jobs_of(model, cpu, list(enumerate_plans(model, cpu, SearchSpace(global_batch=16, seq_len=128))))
    assert jobs
    check_plans(jobs)


def test_cached_partition_memory_is_the_formula() -> None:
    model = tiny_model()
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    engine, graphs = AnalyticalEstimator(), GraphCache()
    for job in jobs_of(model, cluster, list(enumerate_plans(model, cluster, SearchSpace(global_batch=64)))):
        graph = graphs.get(job)
        cached = engine.pricer.memory(engine.pricer.partition(graph, job.parallel.pp).stages, job)
        assert cached == estimate_memory(partition_stages(graph, job.parallel.pp), job.parallel, job.cluster.device)


def test_planner_reports_the_plain_results() -> None:
    model = tiny_model()
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    report = Planner().search(model, cluster, SearchSpace(global_batch=64, seq_len=256), top_k=20)
    assert len(report.plans) == 20
    for plan in report.plans:
        assert_same(plan.result, AnalyticalEstimator().estimate(plan.job, graph_for(plan.job)))
