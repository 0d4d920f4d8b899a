"""L3 trace replay: simulate the ExecGraph built from measured per-rank execution traces and compare the replayed
iteration with the measured one.

After Lin et al.'s multi-GPU model: each rank's ops keep their measured durations and
program order, collectives synchronise the ranks (a collective starts when its last rank arrives), and the
iteration time is the critical path through that graph. The event simulator (trainsim.sim) computes it, so the
same options apply as for L2 (overlap slow-down, bandwidth sharing), though a faithful replay keeps them off:
measured durations already contain whatever slow-down the run saw.

The execution-trace front-end (frontends.trace) reads the traces into the OpGraph's `measured` field
(MeasuredTrace: the per-rank ExecGraph with measured durations, step times and start offsets); the engine
"replay" (ReplayEstimator) replays it and answers with a Result like every other engine. ReplayComparison is the
per-rank comparison of the replayed iteration with the measured one, which the Result's notes summarise.
"""

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from trainsim.cost.memory import MemoryEstimate
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.result import Result, Timeline, make_result
from trainsim.estimate.simulation import sim_breakdown
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import MeasuredTrace, OpGraph
from trainsim.job import Job
from trainsim.sim import SimOptions, SimOutcome, simulate
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.stages import plan_stages


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayComparison:
    """The replayed iteration against the measured one (a validation record, not a prediction: the engine's
    prediction is the Result).

    measured_step_s / replayed_step_s: per rank (device order), from the rank's own start; replayed = the end
    of the rank's last task minus its start offset. iteration: the slowest rank. error: (replayed - measured) /
    measured of the iteration. critical_path_s: time on the critical path by task category.
    """

    ranks: tuple[int, ...]
    start_offset_s: tuple[float, ...]
    measured_step_s: tuple[float, ...]
    replayed_step_s: tuple[float, ...]
    measured_iteration_s: float
    replayed_iteration_s: float
    error: float
    critical_path_s: dict[str, float]
    tasks: int
    collectives: int

    def pretty(self) -> str:
        lines = [f"trace replay: {len(self.ranks)} ranks, {self.tasks} tasks, {self.collectives} collectives",
                 f"  iteration: measured {self.measured_iteration_s * 1e3:.3f} ms, replayed "
                 f"{self.replayed_iteration_s * 1e3:.3f} ms, error {self.error * 100:+.1f}%"]
        for rank, offset, measured, replayed in zip(self.ranks, self.start_offset_s, self.measured_step_s,
                                                     self.replayed_step_s, strict=True):
            lines.append(f"  rank {rank}: offset {offset * 1e3:.3f} ms, step measured {measured * 1e3:.3f} ms, "
                         f"replayed {replayed * 1e3:.3f} ms")
        path = ", ".join(f"{key} {value * 1e3:.3f} ms" for key, value in sorted(self.critical_path_s.items()))
        lines.append(f"  critical path: {path}")
        return "\n".join(lines)


def replay_exec_graph(graph: ExecGraph, measured_step_s: Sequence[float], *, ranks: Sequence[int] | None = None,
                      start_offset_s: Sequence[float] | None = None,
                      options: SimOptions | None = None) -> tuple[SimOutcome, ReplayComparison]:
    """Simulate a trace ExecGraph (device i = rank i of the lists) and compare with the measured steps."""
    devices = len(graph.devices)
    offsets = tuple(start_offset_s) if start_offset_s is not None else (0.0,) * devices
    if len(measured_step_s) != devices or len(offsets) != devices:
        raise ConfigError("measured_step_s", len(measured_step_s), f"must give one per simulated device ({devices})")
    outcome = simulate(graph, options or SimOptions(memory_timeline=False))
    last_end = [0.0] * devices
    for task in graph.tasks:
        last_end[task.device] = max(last_end[task.device], outcome.end_s[task.tid])
    replayed = tuple(max(0.0, end - offset) for end, offset in zip(last_end, offsets, strict=True))
    measured = tuple(float(m) for m in measured_step_s)
    measured_iteration = max(measured, default=math.nan)
    replayed_iteration = max(replayed, default=0.0)
    error = (replayed_iteration - measured_iteration) / measured_iteration if measured_iteration > 0 else math.nan
    path: dict[str, float] = defaultdict(float)
    seen: set[str] = set()
    for tid in outcome.critical_path:
        task = graph.tasks[tid]
        if task.sync_key and task.sync_key in seen:
            continue  # the ranks of a collective run at once: count it once
        seen.add(task.sync_key)
        path[task.category or "other"] += outcome.end_s[tid] - outcome.start_s[tid]
    summary = ReplayComparison(
        ranks=tuple(ranks) if ranks is not None else tuple(range(devices)), start_offset_s=offsets,
        measured_step_s=measured, replayed_step_s=replayed, measured_iteration_s=measured_iteration,
        replayed_iteration_s=replayed_iteration, error=error, critical_path_s=dict(path), tasks=len(graph.tasks),
        collectives=len({t.sync_key for t in graph.tasks if t.sync_key}))
    return outcome, summary


def replay_measured(measured: MeasuredTrace,
                    options: SimOptions | None = None) -> tuple[SimOutcome, ReplayComparison]:
    """Replay what a front-end read from execution traces."""
    return replay_exec_graph(measured.exec_graph, measured.measured_step_s, ranks=measured.ranks,
                             start_offset_s=measured.start_offset_s, options=options)


class ReplayEstimator:
    """Estimator "replay" (L3): the iteration time of the traced run, replayed from its measured per-rank op
    durations (graph.measured, which the execution-trace front-end fills in). options: the simulator's options
    (default: all runtime effects off, as a faithful replay keeps them); pricer: prices the peak memory of the
    graph's shapes (the traces hold no allocator record)."""

    name = "replay"

    def __init__(self, pricer: Pricer | None = None, options: SimOptions | None = None) -> None:
        self.pricer = pricer or Pricer()
        self.options = options or SimOptions()

    def estimate(self, job: Job, graph: OpGraph, plan: LoweredPlan | None = None) -> Result:
        """plan: ignored (the trace fixes what ran where)."""
        if graph.measured is None:
            raise ConfigError("frontend", graph.model_name, "the replay engine replays measured execution "
                              "traces: give --frontend trace and a trace file or directory as the model")
        outcome, comparison = replay_measured(graph.measured, self.options)
        breakdown = _replay_breakdown(graph.measured, outcome, comparison)
        memory, memory_notes = _memory(self.pricer, graph, job)
        note = (f"trace replay of {len(comparison.ranks)} ranks: measured {comparison.measured_iteration_s * 1e3:.3f}"
                f" ms, replayed {comparison.replayed_iteration_s * 1e3:.3f} ms ({comparison.error * 100:+.1f}%)")
        names = tuple(f"rank {rank}" for rank in comparison.ranks)
        timeline = Timeline(exec_graph=graph.measured.exec_graph, outcome=outcome, device_names=names)
        return make_result(self.name, job, graph, breakdown, memory, notes=[note, *memory_notes], timeline=timeline)


def _memory(pricer: Pricer, graph: OpGraph, job: Job) -> tuple[MemoryEstimate, list[str]]:
    """The memory model over the traced graph's shapes; where the trace recorded no activation sizes, the model
    states alone (and a note saying so)."""
    modes = ("none", "selective", "full")
    if all(mode in layer.saved_bytes for layer in graph.layers for mode in modes):
        return pricer.memory(plan_stages(graph, job.parallel), job), []
    states_only = replace(graph, layers=tuple(replace(layer, saved_bytes=dict.fromkeys(modes, 0.0))
                                              for layer in graph.layers), measured=None)
    return (pricer.memory(plan_stages(states_only, job.parallel), job),
            ["peak memory: model states only (the trace records no activation sizes)"])


def _replay_breakdown(measured: MeasuredTrace, outcome: SimOutcome, comparison: ReplayComparison) -> dict[str, float]:
    """Where the slowest rank's replayed step goes, as the simulator attributes a device's makespan; its start
    offset (time before its step began) is not part of its step."""
    exec_graph = measured.exec_graph
    if not exec_graph.devices:
        return {"compute": 0.0}
    device = max(range(len(comparison.replayed_step_s)), key=lambda d: (comparison.replayed_step_s[d], -d))
    parts = sim_breakdown(exec_graph, outcome, device)
    parts["overhead"] = max(0.0, parts.get("overhead", 0.0) - comparison.start_offset_s[device])
    used = sum(seconds for name, seconds in parts.items() if name != "bubble")
    parts["bubble"] = max(0.0, comparison.replayed_step_s[device] - used)
    return parts
