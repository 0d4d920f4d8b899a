"""The execution-trace front-end: PyTorch execution traces (torch.profiler.ExecutionTraceObserver JSON, one per
rank), optionally with the matching Kineto traces, become per-rank IR (RankTrace: ops, tensors, parent/child
structure, phases, c10d collectives with process group and sequence number, measured durations) and an
ExecGraph for the trace-replay rung (to_exec_graph), or an OpGraph of one rank (graph_from_trace_files).

Reading the JSON needs no torch. Files may be gzip-compressed (.json.gz). The pieces:
exec_trace_model (the IR), exec_trace_parse (ET JSON), exec_trace_kineto (measured times), exec_trace_graph
(ExecGraph lowering), exec_trace_ir (OpGraph).
"""

import re
from collections.abc import Sequence
from pathlib import Path

from trainsim.catalog.files import shown_path
from trainsim.errors import ConfigError
from trainsim.frontends.trace.kineto import KinetoMatch, attach_kineto, check_kineto
from trainsim.frontends.trace.parse import attach_collectives, infer_rank, link, parse_execution_trace, read_json
from trainsim.frontends.trace.rank_trace import Collective, ProcessGroup, RankTrace, TensorRef, TraceOp
from trainsim.frontends.trace.to_exec_graph import check_collectives, collective_groups, to_exec_graph
from trainsim.frontends.trace.to_op_graph import trace_op_graph
from trainsim.ir.graph import OpGraph

__all__ = ["Collective", "KinetoMatch", "ProcessGroup", "RankTrace", "TensorRef", "TraceOp", "check_collectives",
           "collective_groups", "find_trace_files", "graph_from_trace_files", "load_execution_traces",
           "load_trace_directory", "to_exec_graph"]

_ET_NAME = re.compile(r"(.*?)\.?(et|execution_trace)\.json(\.gz)?$")


def load_execution_traces(paths: Sequence[str | Path],
                          kineto_paths: Sequence[str | Path | None] | None = None) -> list[RankTrace]:
    """One RankTrace per execution trace, sorted by rank. kineto_paths[i] (optional) is the Kineto trace of
    the same iteration on the same rank as paths[i]; without it the ops have no measured times."""
    if not paths:
        raise ConfigError("paths", [], "give at least one execution trace file")
    if kineto_paths is not None and len(kineto_paths) != len(paths):
        raise ConfigError("kineto_paths", len(kineto_paths), f"must give one per execution trace ({len(paths)})")
    traces: list[RankTrace] = []
    for index, path in enumerate(paths):
        kineto_path = kineto_paths[index] if kineto_paths is not None else None
        kineto = read_json(kineto_path) if kineto_path is not None else None
        if kineto is not None:
            check_kineto(kineto, f"trace {shown_path(Path(kineto_path))}")  # type: ignore[arg-type]
        rank = infer_rank(str(path), kineto, index)
        trace = parse_execution_trace(read_json(path), rank=rank, path=str(path))
        if kineto is not None:
            attach_kineto(trace, kineto)
            trace.kineto_path = str(kineto_path)
            trace.host = str(kineto.get("host_name", ""))
            info = kineto.get("distributedInfo") or {}
            trace.world_size = int(info.get("world_size", 0)) if isinstance(info, dict) else 0
        link(trace)
        attach_collectives(trace)
        traces.append(trace)
    traces.sort(key=lambda t: t.rank)
    ranks = [t.rank for t in traces]
    if len(set(ranks)) != len(ranks):
        raise ConfigError("paths", [str(p) for p in paths], f"give one trace per rank; ranks found: {ranks}")
    for trace in traces:
        trace.world_size = trace.world_size or len(traces)
    return traces


def find_trace_files(directory: str | Path) -> tuple[list[Path], list[Path | None]]:
    """Execution traces in a directory (*.et.json[.gz] or *execution_trace.json[.gz]) and, for each, the Kineto
    trace beside it with the same stem (<stem>.kineto.json[.gz]) when there is one."""
    folder = Path(directory)
    traces = sorted(p for p in folder.iterdir() if _ET_NAME.match(p.name))
    if not traces:
        raise ConfigError("trace directory", str(folder), "holds no *.et.json or *execution_trace.json files")
    kinetos: list[Path | None] = []
    for path in traces:
        match = _ET_NAME.match(path.name)
        assert match is not None
        stem = match.group(1)
        candidates = [folder / f"{stem}.kineto.json", folder / f"{stem}.kineto.json.gz"]
        kinetos.append(next((c for c in candidates if c.exists()), None))
    return traces, kinetos


def load_trace_directory(directory: str | Path) -> list[RankTrace]:
    traces, kinetos = find_trace_files(directory)
    with_kineto = all(k is not None for k in kinetos)
    return load_execution_traces(traces, kinetos if with_kineto else None)


def graph_from_trace_files(model: str, *, rank: int | None = None) -> OpGraph:
    """OpGraph of one rank (the lowest unless `rank` is given) from an execution-trace file or a directory of
    them (`trainsim graph --frontend trace --model DIR_OR_FILE`)."""
    path = Path(model)
    if not path.exists():
        raise ConfigError("model", model, "the trace front-end takes an execution-trace file or a directory of them")
    traces = load_trace_directory(path) if path.is_dir() else load_execution_traces([path])
    chosen = traces[0] if rank is None else next((t for t in traces if t.rank == rank), None)
    if chosen is None:
        raise ConfigError("rank", rank, f"choose one of the traced ranks: {[t.rank for t in traces]}")
    return trace_op_graph(chosen, name=f"{path.name} rank {chosen.rank}")
