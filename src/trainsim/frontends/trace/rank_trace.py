"""Per-rank IR of a PyTorch execution trace: ops with tensors, parent/child structure, collectives and measured
times (Kineto). Plain data, no torch: built by exec_trace_parse, lowered by exec_trace_graph."""

import math
from dataclasses import dataclass, field
from typing import Literal

# container: an annotation that only groups ops (ProfilerStep#, user scopes, autograd evaluate_function);
# op: a framework op (aten, backward function, DDP hook); collective: a c10d op; comm_exec: the asynchronous
# execution record of a collective on a communication thread (gloo:all_reduce, nccl:all_reduce).
OpRole = Literal["container", "op", "collective", "comm_exec"]
TracePhase = Literal["fwd", "bwd", "optimizer"]


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor argument as the execution trace records it (ids are unique within one trace)."""

    tensor_id: int
    storage_id: int
    offset: int
    numel: int
    itemsize: int
    device: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(slots=True)
class Collective:
    """What a c10d op communicates and where it belongs across ranks.

    seq: the collective's position among this rank's collectives on the same process group (or, for
    point-to-point, among messages between the same two ranks); ranks agree on it, so (pg_name, seq) names one
    collective on every member. exec_*: the asynchronous execution record, when the backend logs one.
    """

    kind: str  # all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, reduce, send, recv, barrier ...
    pg_name: str
    seq: int
    nbytes: float
    peer: int | None = None  # the other rank of a send / recv
    exec_node: int = -1
    exec_start_s: float = math.nan
    exec_duration_s: float = math.nan

    @property
    def sync_key(self) -> str:
        if self.kind in ("send", "recv"):
            return f"{self.pg_name}:p2p#{self.seq}"
        return f"{self.pg_name}#{self.seq}"

    @property
    def is_async(self) -> bool:
        return self.exec_node >= 0


@dataclass(slots=True)
class TraceOp:
    """One node of an execution trace, with its measured time when a Kineto trace was matched.

    parent: the effective parent (-1 for roots), after the repair of asynchronous record functions that the
    trace nests wrongly (see exec_trace_parse). start_s / duration_s: seconds on the Kineto clock (NaN when
    unmatched). device_duration_s: GPU kernels launched by the op, summed (0 on CPU).
    """

    node_id: int
    name: str
    role: OpRole
    parent: int
    thread: int
    rf_id: int
    seq_id: int
    scope: int
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorRef, ...]
    phase: TracePhase = "fwd"
    children: list[int] = field(default_factory=list)
    start_s: float = math.nan
    duration_s: float = math.nan
    device_duration_s: float = 0.0
    external_id: int = -1
    collective: Collective | None = None
    scalars: tuple[object, ...] = ()  # non-tensor argument values, in order

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def measured(self) -> bool:
        return not math.isnan(self.duration_s)

    def describe(self) -> str:
        shapes = ",".join("x".join(str(d) for d in t.shape) for t in self.inputs[:3])
        timing = f"{self.duration_s * 1e6:9.1f} us" if self.measured else "        - us"
        comm = f" [{self.collective.kind} {self.collective.sync_key}]" if self.collective else ""
        return f"{self.node_id:>6} {self.phase:<9} {timing} {self.name[:48]:<48} ({shapes}){comm}"


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    name: str
    description: str
    ranks: tuple[int, ...]
    size: int


@dataclass(slots=True)
class RankTrace:
    """One rank's execution trace. ops: every node by id (ids follow program order within a thread).
    step: the ProfilerStep# annotation (the measured iteration) when the trace has one."""

    rank: int
    path: str
    ops: dict[int, TraceOp]
    process_groups: dict[str, ProcessGroup]
    world_size: int = 0
    kineto_path: str = ""
    host: str = ""  # the Kineto trace's host_name: ranks on one host share a clock
    step: int = -1  # node id of the ProfilerStep# container, -1 if none

    def top_level(self) -> list[TraceOp]:
        """The ops right under containers: what a replay runs as tasks, in program order."""
        out: list[TraceOp] = []
        for op in self.ops.values():
            if op.role in ("op", "collective") and self._under_containers(op):
                out.append(op)
        if all(op.measured for op in out):
            out.sort(key=lambda op: (op.start_s, op.node_id))
        return out

    def _under_containers(self, op: TraceOp) -> bool:
        parent = op.parent
        while parent >= 0:
            node = self.ops[parent]
            if node.role != "container":
                return False
            parent = node.parent
        return True

    def collectives(self) -> list[TraceOp]:
        return [op for op in self.ops.values() if op.collective is not None]

    def descendants(self, op: TraceOp) -> list[TraceOp]:
        out: list[TraceOp] = []
        stack = list(reversed(op.children))
        while stack:
            node = self.ops[stack.pop()]
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    @property
    def measured(self) -> bool:
        return any(op.measured for op in self.ops.values())

    def step_window_s(self) -> tuple[float, float]:
        """(start, end) of the measured iteration: the ProfilerStep# annotation, else the top-level ops' span."""
        if self.step >= 0 and self.ops[self.step].measured:
            step = self.ops[self.step]
            return step.start_s, step.end_s
        timed = [op for op in self.top_level() if op.measured]
        if not timed:
            return math.nan, math.nan
        return min(op.start_s for op in timed), max(op.end_s for op in timed)

    def pretty(self, limit: int = 30) -> str:
        top = self.top_level()
        start, end = self.step_window_s()
        step = f", step {(end - start) * 1e3:.3f} ms" if not math.isnan(start) else ""
        lines = [f"RankTrace rank {self.rank}: {len(self.ops)} nodes, {len(top)} top-level ops, "
                 f"{len(self.collectives())} collectives{step}"]
        lines += [f"  {op.describe()}" for op in top[:limit]]
        if len(top) > limit:
            lines.append(f"  ... {len(top) - limit} more")
        return "\n".join(lines)
