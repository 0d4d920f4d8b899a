"""Lower per-rank execution traces to an ExecGraph for the trace-replay rung (L3), after Lin et al.
("Towards Performance Modeling of Multi-GPU Training"): measured per-rank op durations, intra-rank program order,
inter-rank synchronisation at collectives.

One simulated device per rank. Per rank, in program order:

- each top-level op is a compute task on the compute stream with its measured (Kineto) duration, depending on
  the task before it (program order);
- the host time between two ops (Python, framework, dispatch) is an "overhead" task where the trace shows it:
  the gap from the later of the previous op's end and the end of the collectives the op waits for, to the op's
  start, so that time spent waiting for a collective is left to the simulation and not counted twice;
- a c10d op whose backend runs it asynchronously (a gloo:/nccl: execution record) is a comm task on the gradient
  stream (feature stream outside the backward pass) plus its call on the compute stream, split where the
  execution record started (the comm task waits for the first part only); a synchronous one is a comm task on
  the compute stream. Comm tasks of one collective share a sync_key (process group + sequence number) and so
  start together on every rank;
- an op that reads a tensor (storage) a collective wrote depends on that comm task (data dependency by tensor
  id): that is where the rank waits for the collective;
- a collective's duration is the transfer alone, without the time ranks wait for each other: where the ranks'
  clocks agree (comm_timing="overlap"; "auto" picks it when every Kineto trace names the same host), from the
  last rank's start to the first rank's end (NB: a rank that finishes late was held up by its own host, not
  by the transfer); otherwise ("min") the shortest duration any rank measured, since the rank that arrives
  last waits for nobody;
- with start_offsets="measured" each rank starts at its measured offset from the earliest rank (an offset task),
  which keeps the skew the trace shows; "zero" starts every rank together.
"""

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from trainsim.errors import ConfigError
from trainsim.frontends.trace.rank_trace import RankTrace, TraceOp
from trainsim.ir.exec_graph import ExecGraph, Phase, SimDevice, Stream, Task

StartOffsets = Literal["measured", "zero"]
CommTiming = Literal["auto", "overlap", "min"]


def to_exec_graph(rank_traces: Sequence[RankTrace], *, start_offsets: StartOffsets = "measured",
                  cpu_gaps: bool = True, comm_timing: CommTiming = "auto", blocking_waits: bool = False) -> ExecGraph:
    """The ExecGraph of one iteration of the traced ranks (device i is rank_traces[i]). blocking_waits: an op
    also waits for every collective whose execution ended between the previous op's end and its start (the rank
    was blocked in a wait the trace records no op for: work.wait(), a synchronous collective's wait in gloo),
    so that the wait is left to the simulation and not counted as a host gap."""
    if start_offsets not in ("measured", "zero"):
        raise ConfigError("start_offsets", start_offsets, "choose one of: measured, zero")
    if comm_timing not in ("auto", "overlap", "min"):
        raise ConfigError("comm_timing", comm_timing, "choose one of: auto, overlap, min")
    if not rank_traces:
        raise ConfigError("rank_traces", [], "give at least one rank's execution trace")
    graph = ExecGraph(devices=[SimDevice(index=i, stage=0, ranks=1, capacity_bytes=math.inf, static_bytes=0.0)
                               for i in range(len(rank_traces))], tasks=[])
    starts = [trace.step_window_s()[0] for trace in rank_traces]
    origin = min((s for s in starts if not math.isnan(s)), default=math.nan)
    measured_comm: dict[int, tuple[float, float]] = {}
    for device, trace in enumerate(rank_traces):
        offset = starts[device] - origin if start_offsets == "measured" and not math.isnan(origin) else 0.0
        _RankLowering(graph, device, trace, cpu_gaps, measured_comm, blocking_waits).lower(offset)
    hosts = {trace.host for trace in rank_traces}
    shared_clock = comm_timing == "overlap" or (comm_timing == "auto" and len(hosts) == 1 and "" not in hosts)
    _set_collective_durations(graph, measured_comm, shared_clock)
    return graph


class _RankLowering:
    """Adds one rank's tasks to the graph; see the module docstring."""

    def __init__(self, graph: ExecGraph, device: int, trace: RankTrace, cpu_gaps: bool,
                 measured_comm: dict[int, tuple[float, float]], blocking_waits: bool = False) -> None:
        self.graph, self.device, self.trace, self.cpu_gaps = graph, device, trace, cpu_gaps
        self.blocking_waits = blocking_waits
        self.measured_comm = measured_comm  # comm tid -> (start, duration) measured on this rank
        self.cursor = -1  # the last task on the compute stream (program order)
        self.comm_writer: dict[int, int] = {}  # storage id -> the comm task that last wrote it
        self.comm_end: dict[int, float] = {}  # comm tid -> measured end on this rank (Kineto clock)
        self.ends_sorted: list[tuple[float, int]] = []  # (end, comm tid) of comm_end, ascending: blocked() bisects
        self.comms: list[int] = []

    def lower(self, offset_s: float) -> None:
        start, end = self.trace.step_window_s()
        if offset_s > 0.0:
            self._chain(f"r{self.trace.rank}:start offset", offset_s, "overhead", "fwd", ())
        prev_end = start
        for op in self.trace.top_level():
            waits = self._waits(op)
            if self.blocking_waits and op.measured and not math.isnan(prev_end):
                waits = tuple(sorted({*waits, *self.blocked(prev_end, op.start_s)}))
            if op.measured and not math.isnan(prev_end):
                ready = max([prev_end, *(self.comm_end.get(t, -math.inf) for t in waits)])
                gap = op.start_s - ready
                if self.cpu_gaps and gap > 0.0:
                    self._chain(f"r{self.trace.rank}:host gap before {op.name}", gap, "overhead",
                                op.phase, waits)
                    waits = ()
            self._lower_op(op, waits)
            if op.measured:
                prev_end = op.end_s if math.isnan(prev_end) else max(prev_end, op.end_s)
        if self.cpu_gaps and not math.isnan(end) and not math.isnan(prev_end):
            ready = max([prev_end, *(self.comm_end.get(t, -math.inf) for t in self.comms)])
            if end - ready > 0.0:
                self._chain(f"r{self.trace.rank}:step tail", end - ready, "overhead", "optimizer",
                            tuple(self.comms))

    def blocked(self, after_s: float, until_s: float) -> list[int]:
        """The comm tasks whose measured execution ended in (after_s, until_s]: two bisections of the ends in
        order, O(log collectives) per op where a scan of every collective was O(collectives)."""
        lo = bisect.bisect_right(self.ends_sorted, (after_s, math.inf))
        hi = bisect.bisect_right(self.ends_sorted, (until_s, math.inf))
        return [tid for _, tid in self.ends_sorted[lo:hi]]

    def _waits(self, op: TraceOp) -> tuple[int, ...]:
        """The comm tasks whose output this op (or any op inside it) reads."""
        storages = {t.storage_id for node in (op, *self.trace.descendants(op)) for t in node.inputs}
        return tuple(sorted({self.comm_writer[s] for s in storages if s in self.comm_writer}))

    def _lower_op(self, op: TraceOp, waits: tuple[int, ...]) -> None:
        duration = op.duration_s if op.measured else 0.0
        name = f"r{self.trace.rank}:{op.name}#{op.node_id}"
        collective = op.collective
        if collective is None:
            category = "optimizer" if op.phase == "optimizer" else "compute"
            self._chain(name, duration, category, op.phase, waits)
            for node in (op, *self.trace.descendants(op)):
                for tensor in node.outputs:
                    self.comm_writer.pop(tensor.storage_id, None)
            return
        gradient = op.phase == "bwd"
        category = "dp_comm" if gradient else "comm"
        if collective.is_async:
            # The backend takes the collective while the call is still returning: the comm task waits for the
            # part of the call before the execution record started, the rest of the call follows it.
            lead = duration
            if op.measured and not math.isnan(collective.exec_start_s):
                lead = min(duration, max(0.0, collective.exec_start_s - op.start_s))
            launch = self._chain(name + " launch", lead, "overhead", op.phase, waits)
            stream: Stream = "gradient" if gradient else "feature"
            comm = self.graph.add(name=name, device=self.device, stream=stream, kind="comm", duration_s=0.0,
                                  deps=(launch.tid,), sync_key=collective.sync_key, phase="comm",
                                  category=category)
            if duration > lead:
                self._chain(name + " return", duration - lead, "overhead", op.phase, ())
            measured = (collective.exec_start_s, collective.exec_duration_s)
        else:
            comm = self._chain(name, 0.0, category, "comm", waits, kind="comm", sync_key=collective.sync_key)
            measured = (op.start_s, op.duration_s)
        self.measured_comm[comm.tid] = measured
        end = measured[0] + measured[1]
        if not math.isnan(end):
            self.comm_end[comm.tid] = end
            bisect.insort(self.ends_sorted, (end, comm.tid))
        self.comms.append(comm.tid)
        for tensor in (*op.inputs, *op.outputs):
            self.comm_writer[tensor.storage_id] = comm.tid

    def _chain(self, name: str, duration_s: float, category: str, phase: Phase, waits: Sequence[int], *,
               kind: str = "compute", sync_key: str = "") -> Task:
        """A task on the compute stream after the previous one, also waiting for `waits`."""
        deps = tuple(sorted({*([self.cursor] if self.cursor >= 0 else []), *waits}))
        task = self.graph.add(name=name, device=self.device, stream="compute", kind=kind, duration_s=duration_s,
                              deps=deps, sync_key=sync_key, phase=phase, category=category)
        self.cursor = task.tid
        return task


def _set_collective_durations(graph: ExecGraph, measured: dict[int, tuple[float, float]],
                              shared_clock: bool) -> None:
    """Every member of a collective takes its transfer time (see the module docstring); 0 if unmeasured."""
    members: dict[str, list[int]] = defaultdict(list)
    for tid in measured:
        members[graph.tasks[tid].sync_key].append(tid)
    for tids in members.values():
        times = [measured[t] for t in tids if not math.isnan(measured[t][1])]
        duration = collective_duration(times, shared_clock) if times else 0.0
        for tid in tids:
            graph.tasks[tid].duration_s = duration


def collective_duration(times: Sequence[tuple[float, float]], shared_clock: bool) -> float:
    """Transfer time of one collective from each rank's measured (start, duration)."""
    shortest = max(0.0, min(duration for _, duration in times))
    if not shared_clock or len(times) < 2:
        return shortest
    overlap = min(start + duration for start, duration in times) - max(start for start, _ in times)
    return overlap if 0.0 < overlap <= shortest else shortest


def collective_groups(rank_traces: Sequence[RankTrace]) -> dict[str, list[tuple[int, TraceOp]]]:
    """sync_key -> [(rank, c10d op)] over all ranks, for checking that collectives match."""
    groups: dict[str, list[tuple[int, TraceOp]]] = defaultdict(list)
    for trace in rank_traces:
        for op in trace.collectives():
            assert op.collective is not None
            groups[op.collective.sync_key].append((trace.rank, op))
    return dict(groups)


def check_collectives(rank_traces: Sequence[RankTrace]) -> list[str]:
    """Problems in matching collectives across ranks: a collective missing on a member rank, or ranks that
    disagree on its kind or size. Empty when every collective lines up."""
    problems: list[str] = []
    ranks = {trace.rank for trace in rank_traces}
    for key, members in collective_groups(rank_traces).items():
        op = members[0][1]
        assert op.collective is not None
        group = _group_ranks(rank_traces[0], op.collective.pg_name, ranks)
        present = sorted(rank for rank, _ in members)
        expected = sorted(group & ranks) if op.collective.kind not in ("send", "recv") else present
        if op.collective.kind in ("send", "recv") and len(present) != 2:
            problems.append(f"{key}: point-to-point seen on ranks {present}, expected a sender and a receiver")
        elif present != expected:
            problems.append(f"{key} ({op.collective.kind}): on ranks {present}, expected {expected}")
        kinds = {(o.collective.kind, o.collective.nbytes) for _, o in members if o.collective is not None}
        if op.collective.kind not in ("send", "recv") and len(kinds) > 1:
            problems.append(f"{key}: ranks disagree on kind and bytes: {sorted(kinds)}")
    return problems


def _group_ranks(trace: RankTrace, pg_name: str, traced: set[int]) -> set[int]:
    group = trace.process_groups.get(pg_name)
    return set(group.ranks) if group is not None and group.ranks else set(traced)
