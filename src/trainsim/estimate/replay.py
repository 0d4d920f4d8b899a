"""L3 trace replay: simulate the ExecGraph built from measured per-rank execution traces and compare the replayed
iteration with the measured one.

After Lin et al. (../shared/seeds/003_e7615fd9be41855d.txt): each rank's ops keep their measured durations and
program order, collectives synchronise the ranks (a collective starts when its last rank arrives), and the
iteration time is the critical path through that graph. The event simulator (trainsim.sim) computes it, so the
same options apply as for L2 (overlap slow-down, bandwidth sharing), though a faithful replay keeps them off:
measured durations already contain whatever slow-down the run saw.

replay_exec_graph takes the graph and the measured step times (no front-end import); replay_traces is the
convenience that reads the trace files through the execution-trace front-end.
"""

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph
from trainsim.sim import SimOptions, SimOutcome, simulate


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySummary:
    """The replayed iteration against the measured one.

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
                      options: SimOptions | None = None) -> tuple[SimOutcome, ReplaySummary]:
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
    summary = ReplaySummary(
        ranks=tuple(ranks) if ranks is not None else tuple(range(devices)), start_offset_s=offsets,
        measured_step_s=measured, replayed_step_s=replayed, measured_iteration_s=measured_iteration,
        replayed_iteration_s=replayed_iteration, error=error, critical_path_s=dict(path), tasks=len(graph.tasks),
        collectives=len({t.sync_key for t in graph.tasks if t.sync_key}))
    return outcome, summary


def replay_traces(paths: Sequence[str | Path], kineto_paths: Sequence[str | Path | None] | None = None,
                  options: SimOptions | None = None, *,
                  start_offsets: Literal["measured", "zero"] = "measured") -> tuple[SimOutcome, ReplaySummary]:
    """Replay execution traces (one per rank, with their Kineto traces for measured durations).

    start_offsets="measured" starts each rank where its step started relative to the earliest rank (the skew
    the trace shows); "zero" starts all ranks together.
    """
    # NB: the one place an estimator reads a front-end: the trace files are this rung's input.
    from trainsim.frontends.trace.load import load_execution_traces, to_exec_graph

    traces = load_execution_traces(paths, kineto_paths)
    windows = [trace.step_window_s() for trace in traces]
    if any(math.isnan(start) for start, _ in windows):
        raise ConfigError("kineto_paths", kineto_paths, "trace replay needs the Kineto trace of every rank "
                          "(measured durations)")
    origin = min(start for start, _ in windows)
    offsets = [start - origin if start_offsets == "measured" else 0.0 for start, _ in windows]
    graph = to_exec_graph(traces, start_offsets=start_offsets)
    return replay_exec_graph(graph, [end - start for start, end in windows], ranks=[t.rank for t in traces],
                             start_offset_s=offsets, options=options)
