"""Predictive trace simulation (Lin et al. Sec. III-D, Algorithm 1) of per-rank DLRM traces measured by
measure.dlrm: each rank's ops in the order its trace shows, each op's duration from the kernel models (the
priced iteration: lookups, MLPs, collectives) instead of the trace, plus the host-side overheads the kernel
models do not see, aggregated from collected traces; inter-rank synchronization at collectives and intra-rank
synchronization where an op waits for a collective's result. The simulator (trainsim.sim) runs the result, so
the iteration comes back as every engine's does. Replay (every duration taken from the trace) is its special
case (`replay=True`), which reproduces the traced iteration up to the barrier skew. Given each span's thread CPU
time (measure.dlrm_rank records it), the replay can take the host spans and the compute from it instead of the
wall clock (`cpu_s`): the traced iteration without the time other processes held the rank's core, collectives
still at their measured transfer times.

On a CPU the "kernels" run on the host thread, so a compute op occupies the rank's compute stream and its
host; an asynchronous collective (gloo's work queue) runs on the feature or gradient stream after its launch
(host work: packing indices, flattening gradients; an overhead op on the compute stream), and the op that
waits for it depends on it. NB: Algorithm 1's T1-T5 are a GPU's launch overheads; here the analogues are these
host spans (launch ops), taken as their mean over the collected traces (`overheads_from`), shared by all tasks.
"""

from collections import defaultdict
from collections.abc import Sequence

from trainsim.cost.sharded_dlrm import ShardedIteration
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, SimDevice

Span = tuple[str, float, float]  # (op, start_s, end_s) on the rank's clock
# Host-only spans of measure.dlrm_rank's trace: their durations are overheads, not kernels.
HOST_SPANS = ("index-a2a launch", "pooled-a2a-bwd launch", "grad-allreduce launch")
_ASYNC = {"index-a2a launch": ("index-a2a", "index-a2a wait", "feature"),
          "pooled-a2a-bwd launch": ("pooled-a2a-bwd", "pooled-a2a-bwd wait", "feature"),
          "grad-allreduce launch": ("grad-allreduce", "grad-allreduce wait", "gradient")}


def overheads_from(traces: Sequence[Sequence[Sequence[Span]]]) -> dict[str, float]:
    """Mean duration of every host span over all ranks of all traces."""
    sums: dict[str, list[float]] = defaultdict(list)
    for ranks in traces:
        for spans in ranks:
            for name, start, end in spans:
                if name in HOST_SPANS:
                    sums[name].append(end - start)
    return {name: sum(v) / len(v) for name, v in sums.items()}


def _kernel_s(iteration: ShardedIteration, rank: int, name: str) -> float:
    w = iteration.ranks[rank]
    return {"bottom_mlp fwd": w.bottom_fwd_s, "embeddings fwd": w.lookup_fwd_s, "top_mlp fwd": w.top_fwd_s,
            "top_mlp bwd": w.top_bwd_s, "bottom_mlp bwd": w.bottom_bwd_s, "embeddings bwd": w.lookup_bwd_s,
            "optimizer step": w.optimizer_s, "index-a2a": iteration.index_a2a_s,
            "pooled-a2a-fwd": iteration.pooled_fwd_a2a_s, "pooled-a2a-bwd": iteration.pooled_bwd_a2a_s,
            "grad-allreduce": iteration.grad_allreduce_s}[name]


def trace_exec_graph(rank_spans: Sequence[Sequence[Span]], iteration: ShardedIteration, overheads: dict[str, float],
                     *, replay: bool = False, cpu_s: Sequence[Sequence[float]] | None = None) -> ExecGraph:
    """The ExecGraph of the traced ranks (device i = rank i). replay: durations from the trace (async collectives
    get their wait's span end minus their launch's end, the shortest over ranks); with cpu_s (per rank, per span,
    as the spans) the host and compute spans take their thread CPU time instead of their wall time."""
    if cpu_s is not None and (not replay or [len(c) for c in cpu_s] != [len(s) for s in rank_spans]):
        raise ConfigError("cpu_s", [len(c) for c in cpu_s], "one CPU time per traced span, and only with replay")
    graph = ExecGraph(devices=[SimDevice(index=r, stage=0, ranks=1, capacity_bytes=iteration.capacity_bytes,
                                         static_bytes=0.0) for r in range(len(rank_spans))], tasks=[])
    measured_comm = _measured_comm(rank_spans) if replay else {}
    for rank, spans in enumerate(rank_spans):
        cursor: list[int] = []
        pending: dict[str, int] = {}  # wait span -> the comm task it waits for

        def chain(name: str, seconds: float, category: str, deps: tuple[int, ...] = (), *, kind: str = "compute",
                  sync: str = "", rank: int = rank, cursor: list[int] = cursor) -> int:
            tid = graph.add(name=f"r{rank}:{name}", device=rank, stream="compute", kind=kind, duration_s=seconds,
                            deps=(*cursor[-1:], *deps), sync_key=sync, category=category,
                            phase="comm" if kind == "comm" else "fwd").tid
            cursor.append(tid)
            return tid

        for index, (name, start, end) in enumerate(spans):
            measured = end - start if cpu_s is None else cpu_s[rank][index]
            if name in _ASYNC:
                comm, wait, stream = _ASYNC[name]
                launch = chain(name, measured if replay else overheads.get(name, 0.0), "overhead")
                seconds = measured_comm.get(comm, 0.0) if replay else _kernel_s(iteration, rank, comm)
                pending[wait] = graph.add(name=f"r{rank}:{comm}", device=rank, stream=stream, kind="comm",
                                          duration_s=seconds, deps=(launch,), sync_key=comm, phase="comm",
                                          category="dp_comm" if stream == "gradient" else "comm").tid
            elif name in pending:
                chain(name, 0.0, "comm", (pending.pop(name),))
            elif name == "pooled-a2a-fwd":  # synchronous: on the host's stream
                chain(name, measured_comm.get(name, 0.0) if replay else _kernel_s(iteration, rank, name), "comm",
                      kind="comm", sync=name)
            else:
                chain(name, measured if replay else _kernel_s(iteration, rank, name),
                      "optimizer" if name == "optimizer step" else "compute")
    return graph


def _measured_comm(rank_spans: Sequence[Sequence[Span]]) -> dict[str, float]:
    """Transfer time of each collective from the traces: the shortest over ranks of its span (synchronous) or of
    launch end -> wait end (asynchronous), the rank that arrives last waiting for nobody."""
    out: dict[str, float] = {}
    for launch, (comm, wait, _) in _ASYNC.items():
        times = []
        for spans in rank_spans:
            ends = {n: e for n, _, e in spans}
            if launch in ends and wait in ends:
                times.append(max(0.0, ends[wait] - ends[launch]))
        if times:
            out[comm] = min(times)
    sync = [e - s for spans in rank_spans for n, s, e in spans if n == "pooled-a2a-fwd"]
    if sync:
        out["pooled-a2a-fwd"] = min(sync)
    return out


def simulate_trace(rank_spans: Sequence[Sequence[Span]], iteration: ShardedIteration, overheads: dict[str, float],
                   *, replay: bool = False, cpu_s: Sequence[Sequence[float]] | None = None) -> float:
    """Predicted (or replayed) iteration time: the last rank's end."""
    from trainsim.sim import SimOptions, simulate

    graph = trace_exec_graph(rank_spans, iteration, overheads, replay=replay, cpu_s=cpu_s)
    outcome = simulate(graph, SimOptions(memory_timeline=False))
    return max(outcome.end_s[t.tid] for t in graph.tasks) if graph.tasks else 0.0


def iteration_s(graph: ExecGraph) -> float:
    """The simulated iteration of a graph (e.g. frontends.trace.predicted's): the last task's end."""
    from trainsim.sim import SimOptions, simulate

    outcome = simulate(graph, SimOptions(memory_timeline=False))
    return max(outcome.end_s[t.tid] for t in graph.tasks) if graph.tasks else 0.0
