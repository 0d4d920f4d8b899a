"""Predictive simulation of PyTorch execution traces (Lin et al. Sec. III-D, Algorithm 1) on any traced
workload, e.g. a transformer under DDP (Sec. IV-B2): the traced ranks' ExecGraph (to_exec_graph: program order,
data dependencies on collectives, inter-rank synchronization) keeps its structure, and every duration is
predicted: ops from per-op kernel models fitted on the ops of other collected traces, host gaps (Algorithm 1's
T1-T5: the host time between ops, a collective's launch and return) as their mean per op over the collected
traces, collectives from a collective model. estimate.trace_predict.iteration_s simulates the result; replay
(the trace's own durations) is to_exec_graph's graph as it is.
"""

import re
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.errors import ConfigError
from trainsim.frontends.trace.rank_trace import RankTrace, TraceOp
from trainsim.frontends.trace.to_exec_graph import to_exec_graph
from trainsim.frontends.trace.to_op_graph import op_cost
from trainsim.ir.exec_graph import ExecGraph

_TASK_NAME = re.compile(r"^r\d+:(?P<op>.*?)(?:#(?P<node>\d+))?(?P<part> launch| return)?$")


@dataclass(frozen=True, slots=True)
class OpSample:
    """One traced op: its name, its work (FLOPs, or bytes moved where it does no arithmetic) and duration."""

    name: str
    work: float
    seconds: float


def op_work(trace: RankTrace, op: TraceOp) -> float:
    flops, moved = op_cost(trace, op)
    return flops if flops > 0.0 else moved


def op_samples(traces: Sequence[RankTrace]) -> list[OpSample]:
    """The measured top-level ops (collectives aside) of every rank of every trace."""
    return [OpSample(op.name, op_work(trace, op), op.duration_s) for trace in traces for op in trace.top_level()
            if op.collective is None and op.measured and op.duration_s > 0.0]


@dataclass(frozen=True, slots=True)
class KernelModels:
    """Per op name, log time linear in log work (a power law; a constant where the samples show one work), fitted
    by least squares on collected ops; an op name never seen takes the median time of all samples. NB: the
    simplest learned kernel model (the paper trains MLPs on microbenchmarks); here the microbenchmarks are the
    ops of other traced runs of other sizes."""

    per_op: dict[str, tuple[float, float]]  # name -> (intercept, slope) of log seconds over log(work + 1)
    fallback_s: float

    @classmethod
    def fit(cls, samples: Sequence[OpSample]) -> "KernelModels":
        if not samples:
            raise ConfigError("samples", 0, "need traced ops to fit kernel models")
        by_name: dict[str, list[OpSample]] = defaultdict(list)
        for s in samples:
            by_name[s.name].append(s)
        per_op = {}
        for name, group in by_name.items():
            x = np.log([s.work + 1.0 for s in group])
            y = np.log([s.seconds for s in group])
            if np.ptp(x) > 1e-9:
                slope, intercept = np.polyfit(x, y, 1)
                per_op[name] = (float(intercept), float(slope))
            else:
                per_op[name] = (float(y.mean()), 0.0)
        return cls(per_op, float(np.median([s.seconds for s in samples])))

    def seconds(self, name: str, work: float) -> float:
        if name not in self.per_op:
            return self.fallback_s
        intercept, slope = self.per_op[name]
        return float(np.exp(intercept + slope * np.log(work + 1.0)))


def host_overheads(graphs: Sequence[ExecGraph]) -> dict[str, float]:
    """Mean duration of each kind of host span (gap before an op, a collective's launch or return, the step's
    tail) over the collected traces' graphs; the start offsets are left out (a barrier opens every iteration)."""
    spans: dict[str, list[float]] = defaultdict(list)
    for graph in graphs:
        for task in graph.tasks:
            key = _overhead_key(task.name)
            if task.category == "overhead" and key and key != "start offset":
                spans[key].append(task.duration_s)
    return {key: float(np.mean(v)) for key, v in spans.items()}


def _overhead_key(task_name: str) -> str:
    match = _TASK_NAME.match(task_name)
    if match is None:
        return ""
    return match["op"] + (match["part"] or "")


def recorded_per_op(trace: RankTrace) -> dict[int, int]:
    """Per top-level op (node id), the ops the profiler recorded for it: the op and every op nested under it."""
    top = {op.node_id for op in trace.top_level()}
    counts = dict.fromkeys(top, 0)
    for op in trace.ops.values():
        node: TraceOp | None = op
        while node is not None and node.node_id not in top:
            node = trace.ops.get(node.parent)
        if node is not None and op.measured:
            counts[node.node_id] += 1
    return counts


def profiler_op_s(runs: Sequence[tuple[Sequence[RankTrace], float]]) -> float:
    """The profiler's own cost per recorded op, from traced runs each with its iteration measured untraced: per
    rank, (the traced ProfilerStep - the untraced iteration) / the ops the profiler recorded under the step; the
    median over ranks and runs, 0 when negative. The traced iteration is the untraced one plus this cost per op
    (torch.profiler with record_shapes and the execution-trace observer; Lin et al. take kernel times from
    microbenchmarks, which carry no profiler, and the host overheads from traces, which do)."""
    ratios = []
    for traces, untraced_s in runs:
        for trace in traces:
            if trace.step < 0:
                continue
            recorded = sum(recorded_per_op(trace).values())
            if recorded:
                ratios.append((trace.ops[trace.step].duration_s - untraced_s) / recorded)
    if not ratios:
        raise ConfigError("traces", len(runs), "need traces with a ProfilerStep to measure the profiler's cost")
    return max(0.0, float(np.median(ratios)))


def deduct_profiler(graph: ExecGraph, traces: Sequence[RankTrace], op_s: float,
                    keep: Sequence[Collection[int]] | None = None) -> ExecGraph:
    """The graph of `traces` (to_exec_graph's, or predicted_trace_graph's) with each op task shortened by the
    profiler's cost of the ops recorded for it (profiler_op_s), down to 0 at most; in place, returned. keep: per
    rank, node ids left as they are (ops priced by a model of untraced runs, as predicted_trace_graph's
    op_seconds)."""
    recorded = [recorded_per_op(trace) for trace in traces]
    for task in graph.tasks:
        match = _TASK_NAME.match(task.name)
        if task.kind == "comm" or task.category == "overhead" or match is None or not match["node"]:
            continue
        if keep is not None and int(match["node"]) in keep[task.device]:
            continue
        count = recorded[task.device].get(int(match["node"]), 0)
        task.duration_s = max(0.0, task.duration_s - count * op_s)
    return graph


def dilate_traces(traces: Sequence[RankTrace], factor: float) -> None:
    """Stretch the traced ranks' time axis by `factor` about their earliest start, in place: every op's start and
    duration and every collective's execution record, on all ranks alike (so the ranks stay aligned on their
    shared clock). Puts a trace taken in one speed phase of the host at another (a reference probe's ratio,
    measure.phase; docs/recommendation.md, fourteenth session)."""
    if not factor > 0.0:
        raise ConfigError("factor", factor, "a positive time scale")
    ops = [op for trace in traces for op in trace.ops.values()]
    origin = min((op.start_s for op in ops if op.measured), default=0.0)
    for op in ops:
        op.start_s = origin + (op.start_s - origin) * factor
        op.duration_s *= factor
        if op.collective is not None:
            op.collective.exec_start_s = origin + (op.collective.exec_start_s - origin) * factor
            op.collective.exec_duration_s *= factor


CollectiveSeconds = Callable[[str, float, int], float]  # (kind, bytes, ranks) -> seconds


def predicted_trace_graph(traces: Sequence[RankTrace], kernels: KernelModels, overheads: dict[str, float],
                          collective_s: CollectiveSeconds,
                          op_seconds: Sequence[dict[int, float]] | None = None, *,
                          blocking_waits: bool = False) -> ExecGraph:
    """The traced ranks' ExecGraph (every rank starting together) with every duration predicted. op_seconds: per
    rank, node id -> seconds of the ops another model prices (a DLRM's lookups: frontends.trace.dlrm_predicted),
    in place of the kernel models. blocking_waits: as to_exec_graph's."""
    graph = to_exec_graph(traces, start_offsets="zero", blocking_waits=blocking_waits)
    ops = [{op.node_id: op for op in trace.ops.values()} for trace in traces]
    fallback = float(np.mean(list(overheads.values()))) if overheads else 0.0
    for task in graph.tasks:
        match = _TASK_NAME.match(task.name)
        node = int(match["node"]) if match is not None and match["node"] else -1
        op = ops[task.device].get(node)
        if task.kind == "comm" and op is not None and op.collective is not None:
            task.duration_s = collective_s(op.collective.kind, op.collective.nbytes, len(traces))
        elif task.category == "overhead":
            key = _overhead_key(task.name)
            task.duration_s = 0.0 if key == "start offset" else overheads.get(key, fallback)
        elif op is not None and op_seconds is not None and op.node_id in op_seconds[task.device]:
            task.duration_s = op_seconds[task.device][op.node_id]
        elif op is not None:
            task.duration_s = kernels.seconds(op.name, op_work(traces[task.device], op))
    _longest_member(graph)
    return graph


def _longest_member(graph: ExecGraph) -> None:
    """Every member of a collective (one sync key) takes the longest of the members' predicted times: ranks of
    an all-to-all send and receive different amounts, and the collective ends for all when the largest is
    moved (Lin et al. Sec. III-C price it by the largest)."""
    longest: dict[str, float] = {}
    for task in graph.tasks:
        if task.kind == "comm" and task.sync_key:
            longest[task.sync_key] = max(longest.get(task.sync_key, 0.0), task.duration_s)
    for task in graph.tasks:
        if task.kind == "comm" and task.sync_key:
            task.duration_s = longest[task.sync_key]

