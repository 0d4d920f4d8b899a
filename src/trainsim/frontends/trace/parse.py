"""Parse a PyTorch execution trace (torch.profiler.ExecutionTraceObserver JSON, Chakra schema 1.x) into a
RankTrace: ops with tensors and roles, repaired parent/child structure, phases and c10d collectives. No torch.

Node ids follow program order within a thread (an id is taken when the op starts). Tensors are recorded as
[tensor_id, storage_id, offset, numel, itemsize, device]. Two quirks of the traces are handled here:

- An asynchronous collective's record function (gloo:all_reduce, nccl:all_reduce) opens on the calling thread
  and closes on the communication thread, so the trace nests the ops that follow under it (and can leave the
  caller's stack one level deep). Such records are transparent: their children move to their parent; with
  Kineto times, a child that does not lie inside its parent's time span moves up to the nearest ancestor that
  contains it.
- c10d ops do not name their process group in the trace (the group is an opaque object); a record_param_comms
  child (NCCL) carries it when present, else the trace's only process group is assumed.
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainsim.catalog.files import parse_text, read_text, shown_path
from trainsim.errors import ConfigError, InputFileError
from trainsim.frontends.trace.rank_trace import (
    Collective,
    OpRole,
    ProcessGroup,
    RankTrace,
    TensorRef,
    TraceOp,
    TracePhase,
)

_COLLECTIVES: dict[str, str] = {
    "allreduce_": "all-reduce", "allreduce_coalesced_": "all-reduce", "all_reduce": "all-reduce",
    "all_reduce_coalesced": "all-reduce", "allgather_": "all-gather", "_allgather_base_": "all-gather",
    "allgather_coalesced_": "all-gather", "allgather_into_tensor_coalesced_": "all-gather",
    "all_gather_into_tensor": "all-gather", "all_gather_into_tensor_coalesced": "all-gather",
    "reduce_scatter_": "reduce-scatter", "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter", "reduce_scatter_tensor": "reduce-scatter",
    "alltoall_": "all-to-all", "alltoall_base_": "all-to-all", "all_to_all_single": "all-to-all",
    "broadcast_": "broadcast", "broadcast": "broadcast", "reduce_": "reduce", "gather_": "gather",
    "scatter_": "scatter", "send": "send", "recv_": "recv", "recv_any_source_": "recv", "barrier": "barrier",
    "monitored_barrier_": "barrier",
}
_COMM_EXEC = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):")
_CONTAINER_PREFIXES = ("[pytorch|profiler|execution_trace", "ProfilerStep#", "## ",
                       "autograd::engine::evaluate_function")
_USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: record_function annotations
_BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION
_DTYPE = re.compile(r"Tensor\(([^)]*)\)")
_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
           "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
           "unsigned char": "uint8", "bool": "bool", "c10::Float8_e4m3fn": "float8_e4m3fn",
           "c10::Float8_e5m2": "float8_e5m2", "c10::complex<float>": "complex64"}


# An execution trace or Kineto trace of one iteration is a few MiB for a small model and tens to a few hundred
# MiB for a large one; parsed, JSON takes about ten times its size in memory.
MAX_TRACE_FILE_BYTES = 512 * 2**20
# Ids, sizes and counts a trace records are 64-bit integers; larger is not a trace.
_MAX_TRACE_INT = 2**63 - 1


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from a .json or .json.gz file: read through the capped reader (a regular file of at most
    MAX_TRACE_FILE_BYTES, decompressed too; UTF-8; no NaN or Infinity; nesting bounded)."""
    path = Path(path)
    name = shown_path(path)
    text = read_text(path, MAX_TRACE_FILE_BYTES, gunzip=path.suffix == ".gz")
    data = parse_text(text, is_json=True, name=f"trace {name}")
    if not isinstance(data, dict):
        raise InputFileError(f"trace {name} is not a JSON object")
    return data


def trace_int(value: Any, field: str, low: int = 0, high: int = _MAX_TRACE_INT) -> int:
    """An integer a trace records, checked: an int (not a bool, not a float or a string) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(field, value, f"an integer from {low} to {high}")
    return value


def parse_execution_trace(data: dict[str, Any], *, rank: int, path: str = "") -> RankTrace:
    """A RankTrace from an execution-trace JSON object (no times yet: see exec_trace_kineto). A node the parser
    cannot read is an InputFileError naming the file, the node and the field."""
    name = shown_path(path) if path else "trace"
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise InputFileError(f"{name} has no 'nodes' list: not a PyTorch execution trace")
    ops: dict[int, TraceOp] = {}
    groups: dict[str, ProcessGroup] = {}
    for index, node in enumerate(nodes):
        try:
            if not isinstance(node, dict):
                raise ConfigError("node", node, "a JSON object")
            op = _op(node)
            if op.node_id in ops:
                raise ConfigError("id", op.node_id, "an id no other node has")
            if op.name == "## process_group:init ##":
                groups.update(_process_groups(node))
        except ConfigError as exc:
            raise InputFileError(f"{name}: nodes[{index}]: {exc}") from None
        ops[op.node_id] = op
    ops = dict(sorted(ops.items()))
    for op in ops.values():
        if op.parent == op.node_id or op.parent not in ops:
            op.parent = -1
    _refuse_cycles(ops, name)
    trace = RankTrace(rank, path, ops, groups)
    step = [op.node_id for op in ops.values() if op.name.startswith("ProfilerStep#")]
    trace.step = step[-1] if step else -1
    return trace


def _refuse_cycles(ops: dict[int, TraceOp], name: str) -> None:
    """ctrl_deps must form a forest: a node that is its own ancestor would make every walk up the tree endless."""
    done: set[int] = set()
    for op in ops.values():
        chain: list[int] = []
        node = op.node_id
        while node >= 0 and node not in done:
            if node in chain:
                raise InputFileError(f"{name}: ctrl_deps form a cycle through node {node}: the parent links of a "
                                     "trace must form a tree")
            chain.append(node)
            node = ops[node].parent
        done.update(chain)


_ATTR_BOUNDS = {"scope": (0, _MAX_TRACE_INT), "tid": (0, _MAX_TRACE_INT), "rf_id": (-1, _MAX_TRACE_INT),
                "seq_id": (-1, _MAX_TRACE_INT)}


def _op(node: dict[str, Any]) -> TraceOp:
    attrs = _attrs(node.get("attrs", []))
    name = node.get("name")
    if not isinstance(name, str):
        raise ConfigError("name", name, "a string (the op's name)")
    ints = {key: trace_int(attrs.get(key, default), f"attrs.{key}", *_ATTR_BOUNDS[key])
            for key, default in (("scope", 0), ("tid", 0), ("rf_id", -1), ("seq_id", -1))}
    node_id = trace_int(node.get("id"), "id")
    parent = trace_int(node.get("ctrl_deps", -1), "ctrl_deps", -1)
    inputs, in_scalars = _arguments(node.get("inputs", {}), "inputs")
    outputs, _ = _arguments(node.get("outputs", {}), "outputs")
    return TraceOp(node_id=node_id, name=name, role=_role(name, ints["scope"]), parent=parent, thread=ints["tid"],
                   rf_id=ints["rf_id"], seq_id=ints["seq_id"], scope=ints["scope"], inputs=tuple(inputs),
                   outputs=tuple(outputs), scalars=tuple(in_scalars))


def _attrs(attrs: Any) -> dict[str, Any]:
    if not isinstance(attrs, list):
        raise ConfigError("attrs", attrs, "a list of {name, value} objects")
    out: dict[str, Any] = {}
    for attr in attrs:
        if not isinstance(attr, dict) or not isinstance(attr.get("name"), str) or "value" not in attr:
            raise ConfigError("attrs", attr, "a {name, value} object with a string name")
        out[attr["name"]] = attr["value"]
    return out


def _role(name: str, scope: int) -> OpRole:
    if _COMM_EXEC.match(name):
        return "comm_exec"
    if collective_kind(name) is not None:
        return "collective"
    if name.startswith(_CONTAINER_PREFIXES) or scope == _USER_SCOPE:
        return "container"
    return "op"


def collective_kind(name: str) -> str | None:
    """The collective of a c10d op name (c10d::allreduce_, _c10d_functional::all_reduce), else None."""
    namespace, _, op = name.partition("::")
    if namespace not in ("c10d", "_c10d_functional", "c10d_functional"):
        return None
    return _COLLECTIVES.get(op)


def _arguments(block: Any, field: str) -> tuple[list[TensorRef], list[object]]:
    """Tensors (with dtype and shape) and the other values of an inputs/outputs block, in order."""
    if not isinstance(block, dict):
        raise ConfigError(field, block, "an object of values, shapes and types lists")
    tensors: list[TensorRef] = []
    scalars: list[object] = []
    values, shapes, types = (block.get(key, []) for key in ("values", "shapes", "types"))
    for key, items in (("values", values), ("shapes", shapes), ("types", types)):
        if not isinstance(items, list):
            raise ConfigError(f"{field}.{key}", items, "a list")
    for index, value in enumerate(values):
        kind = str(types[index]) if index < len(types) else ""
        shape = shapes[index] if index < len(shapes) else []
        if "Tensor" not in kind:
            scalars.append(value)
            continue
        dtypes: list[str] = [_DTYPES.get(d) or d for d in _DTYPE.findall(kind)]
        refs = list(_tensor_values(value, shape))
        for position, (raw, dims) in enumerate(refs):
            dtype = dtypes[min(position, len(dtypes) - 1)] if dtypes else ""
            tensors.append(_tensor(raw, dims, dtype, f"{field}.values[{index}]"))
    return tensors, scalars


def _tensor_values(value: Any, shape: Any) -> Iterator[tuple[list[Any], list[int]]]:
    """(tensor record, shape) pairs of a Tensor value or a (nested) list of them (the reader bounds nesting)."""
    if _is_tensor_record(value):
        yield value, shape if isinstance(shape, list) else []
    elif isinstance(value, list):
        shapes = shape if isinstance(shape, list) and len(shape) == len(value) else [[]] * len(value)
        for item, dims in zip(value, shapes, strict=True):
            yield from _tensor_values(item, dims)


def _is_tensor_record(value: Any) -> bool:
    return (isinstance(value, list) and len(value) in (5, 6)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value[:5]))


# A tensor dimension: torch sizes are int64; a trace's shapes are real tensors, far below this.
_MAX_DIM = 2**40


def _tensor(raw: list[Any], dims: list[Any], dtype: str, field: str) -> TensorRef:
    """[tensor_id, storage_id, offset, numel, itemsize(, device)] and its shape; an int of the shape past
    _MAX_DIM or below 0 is refused (a FLOP count from it would be meaningless), other entries are skipped."""
    tensor_id, storage_id, offset, numel, itemsize = (
        trace_int(v, f"{field} tensor record", 0) for v in raw[:5])
    shape = tuple(trace_int(d, f"{field} shape", 0, _MAX_DIM) for d in dims
                  if isinstance(d, int) and not isinstance(d, bool))
    device = str(raw[5])[:64] if len(raw) > 5 else ""
    return TensorRef(tensor_id, storage_id, offset, numel, itemsize, device, dtype, shape)


def _process_groups(node: dict[str, Any]) -> dict[str, ProcessGroup]:
    """The process groups a process_group:init node lists (a JSON string or a list of {pg_name, ranks, ...})."""
    out: dict[str, ProcessGroup] = {}
    for value in node.get("inputs", {}).get("values", []):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                continue
        for entry in value if isinstance(value, list) else []:
            if isinstance(entry, dict) and "pg_name" in entry:
                ranks_value = entry.get("ranks", [])
                if not isinstance(ranks_value, list):
                    raise ConfigError("process group ranks", ranks_value, "a list of ranks")
                ranks = tuple(trace_int(r, "process group ranks") for r in ranks_value)
                name = str(entry["pg_name"])[:200]
                size = trace_int(entry.get("group_size", len(ranks)), "process group group_size", 1)
                out[name] = ProcessGroup(name, str(entry.get("pg_desc", ""))[:200], ranks, size)
    return out


# ---- structure --------------------------------------------------------------------------------------------
def link(trace: RankTrace) -> None:
    """Repair the parent links (transparent comm records, time containment), fill children and phases."""
    ops = trace.ops
    for op in ops.values():
        while op.parent >= 0 and ops[op.parent].role == "comm_exec" and op.role != "comm_exec":
            op.parent = ops[op.parent].parent
    if trace.measured:
        for op in ops.values():
            if not op.measured or op.role == "comm_exec":
                continue
            while op.parent >= 0 and ops[op.parent].measured and not _inside(op, ops[op.parent]):
                op.parent = ops[op.parent].parent
    for op in ops.values():
        op.children.clear()
    for op in ops.values():
        if op.parent >= 0:
            ops[op.parent].children.append(op.node_id)
    _assign_phases(trace)


def _inside(child: TraceOp, parent: TraceOp, slack_s: float = 1e-6) -> bool:
    return parent.start_s - slack_s <= child.start_s and child.end_s <= parent.end_s + slack_s


def _assign_phases(trace: RankTrace) -> None:
    """Phase of every op. A top-level op inside a backward function or an autograd evaluate_function is "bwd",
    inside Optimizer.* "optimizer"; one with an autograd sequence number and no such ancestor is a forward op;
    any other takes the phase of the op before it (NB: the trace nests some DDP and collective ops wrongly, so
    their ancestors say nothing). Ops inside a top-level op share its phase."""
    previous: TracePhase = "fwd"
    for op in trace.top_level():
        phase = _evidence(trace, op) or ("fwd" if op.seq_id >= 0 else previous)
        op.phase = previous = phase
        for node in trace.descendants(op):
            node.phase = phase
    for op in trace.ops.values():
        if op.role in ("container", "comm_exec"):
            op.phase = _evidence(trace, op) or "fwd"


def _evidence(trace: RankTrace, op: TraceOp) -> TracePhase | None:
    node: TraceOp | None = op
    while node is not None:
        if (node.scope == _BACKWARD_SCOPE or node.name.startswith("autograd::engine::evaluate_function")
                or "ddp.reducer" in node.name or "distributed::reducer" in node.name):
            return "bwd"
        if node.name.startswith("Optimizer."):
            return "optimizer"
        node = trace.ops.get(node.parent) if node.parent >= 0 else None
    return None


def attach_collectives(trace: RankTrace) -> None:
    """Give every c10d op its Collective: kind, process group, per-group sequence number, bytes, peer, and the
    asynchronous execution record it launched (matched by tensor ids, else the next record by rf_id)."""
    ops = trace.ops
    default_pg = next(iter(trace.process_groups)) if len(trace.process_groups) == 1 else "default"
    execs = [op for op in ops.values() if op.role == "comm_exec"]
    used: set[int] = set()
    counters: dict[str, int] = {}
    for op in ops.values():
        if op.role != "collective" or _inside_collective(trace, op):
            continue
        kind = collective_kind(op.name) or "unknown"
        pg = _pg_from_children(trace, op) or default_pg
        nbytes = _collective_bytes(kind, op)
        peer = _peer(op) if kind in ("send", "recv") else None
        if peer is not None:  # point-to-point: messages are counted per direction, so both sides agree
            src, dst = (trace.rank, peer) if kind == "send" else (peer, trace.rank)
            pg = f"{pg}:{src}->{dst}"
        seq = counters.get(pg, 0)
        counters[pg] = seq + 1
        op.collective = Collective(kind, pg, seq, nbytes, peer)
        record = _exec_record(op, execs, used)
        if record is not None:
            used.add(record.node_id)
            op.collective.exec_node = record.node_id
            op.collective.exec_start_s = record.start_s
            op.collective.exec_duration_s = record.duration_s


def _collective_bytes(kind: str, op: TraceOp) -> float:
    """The collective's message: the larger of its tensor inputs and outputs, summed; for an all-to-all the
    larger of the rank's send and receive buffers (c10d's alltoall_base_ takes both as inputs; Lin et al. Sec.
    III-C size an all-to-all by the largest data a rank sends or receives)."""
    if kind == "all-to-all":
        return float(max((t.nbytes for t in (*op.inputs, *op.outputs)), default=0))
    return float(max(sum(t.nbytes for t in op.inputs), sum(t.nbytes for t in op.outputs)))


def _inside_collective(trace: RankTrace, op: TraceOp) -> bool:
    parent = op.parent
    while parent >= 0:
        if trace.ops[parent].role == "collective":
            return True
        parent = trace.ops[parent].parent
    return False


def _pg_from_children(trace: RankTrace, op: TraceOp) -> str | None:
    """record_param_comms logs (seq, (pg_name, pg_desc), rank, collective, ...) as its first inputs."""
    for child in trace.descendants(op):
        if child.name == "record_param_comms" and len(child.scalars) > 1:
            pg = child.scalars[1]
            if isinstance(pg, list) and pg:
                return str(pg[0])
            if isinstance(pg, str):
                return pg
    return None


def _peer(op: TraceOp) -> int | None:
    ints = [v for v in op.scalars if isinstance(v, int) and not isinstance(v, bool)]
    return ints[0] if ints else None


def _exec_record(op: TraceOp, execs: list[TraceOp], used: set[int]) -> TraceOp | None:
    ids = {t.tensor_id for t in op.inputs} | {t.tensor_id for t in op.outputs}
    for record in execs:
        if record.node_id not in used and ids & {t.tensor_id for t in record.inputs}:
            return record
    # records that name no tensors: the first one opened after the call
    later = [r for r in execs if r.node_id not in used and r.rf_id > op.rf_id and not r.inputs]
    return min(later, key=lambda r: r.rf_id) if later else None


def infer_rank(path: str, kineto: dict[str, Any] | None, index: int) -> int:
    """The rank of a trace: Kineto's distributedInfo, else "rank<N>" in the file name, else its position."""
    info = (kineto or {}).get("distributedInfo") or {}
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    match = re.search(r"rank[_-]?(\d+)", Path(path).name)
    return int(match.group(1)) if match else index

