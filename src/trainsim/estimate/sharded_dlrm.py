"""Both engines on a DLRM with sharded embedding tables: the iteration priced per rank
(cost.sharded_dlrm), then either the closed form of its dependencies (analytical) or the event simulation of
its per-rank ExecGraph (sim); the same Result as every engine. With the simulator's runtime effects off the two
agree exactly (tests hold them to it).

The Result's breakdown is the slowest rank's: its compute, its dense optimizer step, and the rest of the
iteration as `comm` (collectives not hidden behind its compute, and waiting for slower ranks at them).
Peak memory is the fullest rank's; OOM when any rank's tables, dense states, activations and runtime exceed
the device memory.
"""

from collections.abc import Callable
from dataclasses import replace

from trainsim.compile.lower_sharded_dlrm import closed_form_ends_s, lower_sharded_iteration, rank_compute_s
from trainsim.cost.embedding_lookup import RooflineLookup
from trainsim.cost.memory import MemoryEstimate
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import NO_HOST_COST, DenseHostCost, ShardedIteration, price_sharded_iteration
from trainsim.embedding.lookup_model import LookupCostModel
from trainsim.embedding.sharding import Optimizer, ShardingPlan
from trainsim.estimate.result import Result, Timeline, make_result
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.registry import Registry


def _memory(iteration: ShardedIteration) -> MemoryEstimate:
    fullest = max(range(len(iteration.memory)), key=lambda r: iteration.memory[r].total_bytes)
    mem = iteration.memory[fullest]
    return MemoryEstimate(mem.total_bytes, iteration.capacity_bytes, mem.breakdown(), fullest)


def _result(engine: str, job: Job, graph: OpGraph, iteration: ShardedIteration, ends_s: list[float],
            timeline: Timeline | None = None) -> Result:
    slowest = max(range(len(ends_s)), key=lambda r: (ends_s[r], -r))
    total = ends_s[slowest]
    compute = rank_compute_s(iteration, slowest)
    optimizer = iteration.ranks[slowest].optimizer_s
    breakdown = {"compute": compute, "optimizer": optimizer, "comm": max(0.0, total - compute - optimizer)}
    notes = [f"sharded embeddings: {iteration.plan.sharder} on {iteration.plan.num_ranks} ranks; "
             f"slowest rank {slowest}; rank ends (ms) " + ", ".join(f"{e * 1e3:.3f}" for e in ends_s)]
    gib = 2.0**30
    notes.append(f"per-rank memory (GiB of {iteration.capacity_bytes / gib:.3f}; tables+optimizer / total): "
                 + ", ".join(f"r{r} {m.tables_bytes / gib:.3f} / {m.total_bytes / gib:.3f}"
                             + (" OOM" if m.total_bytes > iteration.capacity_bytes else "")
                             for r, m in enumerate(iteration.memory)))
    if iteration.oom_ranks:
        notes.append(f"out of memory on ranks {iteration.oom_ranks}")
    return make_result(engine, job, graph, breakdown, _memory(iteration), notes=notes, timeline=timeline)


def _analytical(job: Job, graph: OpGraph, iteration: ShardedIteration) -> Result:
    return _result("analytical", job, graph, iteration, closed_form_ends_s(iteration))


def _simulated(job: Job, graph: OpGraph, iteration: ShardedIteration) -> Result:
    from trainsim.sim import SimOptions, simulate

    exec_graph = lower_sharded_iteration(iteration)
    outcome = simulate(exec_graph, SimOptions(memory_timeline=False))
    ends = [0.0] * len(exec_graph.devices)
    for task in exec_graph.tasks:
        ends[task.device] = max(ends[task.device], outcome.end_s[task.tid])
    names = tuple(f"rank {r}" for r in range(len(exec_graph.devices)))
    timeline = Timeline(exec_graph=exec_graph, outcome=outcome, device_names=names)
    return _result("sim", job, graph, iteration, ends, timeline)


SHARDED_ENGINES: Registry[Callable[[Job, OpGraph, ShardedIteration], Result]] = Registry("engine")
SHARDED_ENGINES.add("analytical", _analytical)
SHARDED_ENGINES.add("sim", _simulated)


def estimate_sharded(job: Job, graph: OpGraph, plan: ShardingPlan, engine: str = "analytical",
                     pricer: Pricer | None = None, lookups: LookupCostModel | None = None,
                     optimizer: Optimizer = "sgd", host: DenseHostCost = NO_HOST_COST) -> Result:
    """job: dp = the plan's ranks, micro_batch = samples per rank; graph: the catalog DLRM graph of one rank
    (frontends.catalog.sharded_dlrm.sharded_job makes both); host: the dense part's host cost per op
    (cost.sharded_dlrm.DenseHostCost, fitted by calibrate.dense_host), in both engines alike."""
    run = SHARDED_ENGINES.get(engine)
    pricer = pricer or Pricer()
    lookups = lookups or RooflineLookup(job.cluster.device)
    return run(job, graph, price_sharded_iteration(graph, plan, job, pricer, lookups, optimizer, host))


def traced_result(job: Job, graph: OpGraph, iteration: ShardedIteration, exec_graph: ExecGraph) -> Result:
    """The Result of a DLRM's per-rank trace graph (Lin et al. Algorithm 1: frontends.trace.predicted with the
    lookups from the lookup model, or the replay of the trace), simulated like the engines' graphs: the
    iteration is the last rank's end; the breakdown the slowest rank's compute-stream work (its optimizer-phase
    tasks as `optimizer`, the rest of its compute stream as `compute`) and the remainder as `comm` (exposed
    collectives, waiting at them); memory and OOM from the priced iteration (`iteration`: the plan's pieces on
    job's cluster), as the engines report them. No turns on shared cores are added (job's compute_share is
    taken as 1): the trace was recorded with these ranks on the host, so its durations, and the kernel models
    fitted on such traces, already hold them; a duration priced by an uncontended model takes its turns where
    it is priced (frontends.trace.dlrm_predicted.lookup_op_seconds's core_share)."""
    from trainsim.sim import SimOptions, simulate

    device = job.cluster.device
    if device.compute_share != 1.0:
        job = replace(job, cluster=job.cluster.replaced(device=device.replaced(compute_share=1.0)))

    outcome = simulate(exec_graph, SimOptions(memory_timeline=False))
    ends = [0.0] * len(exec_graph.devices)
    busy = [{"compute": 0.0, "optimizer": 0.0} for _ in exec_graph.devices]
    for task in exec_graph.tasks:
        ends[task.device] = max(ends[task.device], outcome.end_s[task.tid])
        if task.stream == "compute" and task.kind != "comm":
            busy[task.device]["optimizer" if task.category == "optimizer" else "compute"] += task.duration_s
    slowest = max(range(len(ends)), key=lambda r: (ends[r], -r))
    compute, optimizer = busy[slowest]["compute"], busy[slowest]["optimizer"]
    breakdown = {"compute": compute, "optimizer": optimizer,
                 "comm": max(0.0, ends[slowest] - compute - optimizer)}
    notes = [f"predictive trace simulation of {len(ends)} traced ranks ({iteration.plan.sharder}); slowest rank "
             f"{slowest}; rank ends (ms) " + ", ".join(f"{e * 1e3:.3f}" for e in ends)]
    timeline = Timeline(exec_graph=exec_graph, outcome=outcome,
                        device_names=tuple(f"rank {r}" for r in range(len(ends))))
    return make_result("trace", job, graph, breakdown, _memory(iteration), notes=notes, timeline=timeline)
