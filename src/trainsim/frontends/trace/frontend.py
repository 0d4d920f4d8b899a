"""The execution-trace front-end as a pipeline peer: a PyTorch execution-trace file or a directory of them (one
per rank, *.et.json[.gz], each with its <stem>.kineto.json[.gz] for measured durations).

graph(): the lowest rank's OpGraph (to_op_graph) with `measured` set: every rank lowered to one ExecGraph with
the measured durations, steps and start offsets (measured.py), what trace replay reads. A trace is the run it
recorded: the job must ask for that run (as many ranks as were traced, the traced micro-batch, no model
split); another strategy is refused, naming the field. tp, cp and ep are refused by the model description as
make_job refuses them, tp for what the trace lacks (NO_MODULE_PATHS): it holds each op's tensor shapes and ids,
not the module paths a strategy tree's splits address. The model
description is opaque (frontends.opaque), with the parameter count the trace shows."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import ConfigError
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, check_model_parallelism
from trainsim.strategy.precision import Precision

if TYPE_CHECKING:
    from trainsim.frontends.trace.rank_trace import RankTrace

# What a strategy tree's splits over tp need that an execution trace lacks (compile.shape_front_end shapes ops by
# kind and dims, which the trace has: every GEMM's operand shapes, and tensor ids to follow data dependencies).
# NB: torch.profiler.ExecutionTraceObserver records aten ops and record_function scopes, no nn.Module hierarchy.
NO_MODULE_PATHS = ("the trace front-end cannot split the traced run: its execution trace records no module paths "
                   "(each op is trace.<node id>, one layer) for a tree's tp splits to address; trace the run at "
                   "that tp")


@dataclass(frozen=True, slots=True)
class Traced:
    """A trace source as read: every rank's trace, and the lowest rank's OpGraph."""

    traces: "tuple[RankTrace, ...]"
    first_graph: OpGraph

    @property
    def world(self) -> int:
        return self.traces[0].world_size or len(self.traces)


def load_source(source: str) -> "list[RankTrace]":
    # NB: the trace readers load when a trace is read, not with every command (start-up)
    from trainsim.frontends.trace.load import load_execution_traces, load_trace_directory

    path = Path(source)
    if not path.exists():
        raise ConfigError("model", source, "the trace front-end takes an execution-trace file or a directory of them")
    return load_trace_directory(path) if path.is_dir() else load_execution_traces([path])


class TraceFrontend:
    """Reads each source once per version of its files (a prediction asks for the spec, the job defaults and
    the graph of one source)."""

    name = "trace"

    def __init__(self) -> None:
        self._read: dict[tuple[str, int], Traced] = {}

    def traced(self, source: str) -> Traced:
        from trainsim.frontends.trace.to_op_graph import trace_op_graph

        path = Path(source)
        key = (str(path.resolve()), path.stat().st_mtime_ns if path.exists() else -1)
        traced = self._read.get(key)
        if traced is None:
            traces = tuple(load_source(source))
            first = traces[0]
            graph = trace_op_graph(first, name=f"{path.name} rank {first.rank}")
            traced = self._read[key] = Traced(traces, graph)
        return traced

    def model_spec(self, source: str) -> ModelSpec:
        return opaque_spec(Path(source).name, "execution trace", self.traced(source).first_graph.param_count(),
                           no_tp_reason=NO_MODULE_PATHS)

    def job_defaults(self, source: str) -> dict[str, Any]:
        """The traced run: its ranks and its micro-batch."""
        traced = self.traced(source)
        return {"num_gpus": traced.world, "micro_batch": traced.first_graph.samples_per_micro_batch}

    def inspect(self, source: str, micro_batch: int, seq_len: int, precision: Precision) -> OpGraph:
        """The lowest rank's graph as traced: the trace fixes micro-batch, sequence and precision."""
        from trainsim.frontends.trace.load import graph_from_trace_files

        del micro_batch, seq_len, precision
        return graph_from_trace_files(source)

    def graph(self, source: str, job: Job) -> OpGraph:
        from trainsim.frontends.trace.measured import measured_trace

        traced = self.traced(source)
        par = job.parallel
        check_model_parallelism(self.model_spec(source), par)  # tp, cp, ep: the trace's spec refuses them
        graph, world = traced.first_graph, traced.world
        if job.num_gpus != world:
            raise ConfigError("num_gpus", job.num_gpus, f"the trace recorded a {world}-rank run; ask for {world}")
        if len(traced.traces) != world:
            raise ConfigError("model", source, f"holds {len(traced.traces)} of the {world} ranks' traces; replay "
                              "needs all")
        if par.micro_batch != graph.samples_per_micro_batch:
            raise ConfigError("micro_batch", par.micro_batch,
                              f"the trace ran {graph.samples_per_micro_batch} samples per micro-batch")
        return OpGraph(graph.model_name, graph.layers, graph.tokens_per_micro_batch, graph.samples_per_micro_batch,
                       measured=measured_trace(traced.traces, kineto_paths=[t.kineto_path for t in traced.traces]))
