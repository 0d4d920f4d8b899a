"""The one-device job `trainsim graph` inspects: the source's model, no model parallelism, no cluster priced."""

from typing import Protocol

from trainsim.catalog import load_cluster
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision


class _Builds(Protocol):
    def model_spec(self, source: str) -> ModelSpec: ...

    def graph(self, source: str, job: Job) -> OpGraph: ...


def one_device_job(model: ModelSpec, micro_batch: int, seq_len: int, precision: Precision) -> Job:
    """NB: built without make_job's checks, as `trainsim graph` always was (it shows a graph, prices nothing)."""
    parallel = ParallelSpec(dp=1, micro_batch=micro_batch, global_batch=micro_batch, seq_len=seq_len,
                            precision=precision)
    return Job(model, load_cluster("local-cpu"), parallel)


def one_device_graph(frontend: _Builds, source: str, micro_batch: int, seq_len: int,
                     precision: Precision) -> OpGraph:
    return frontend.graph(source, one_device_job(frontend.model_spec(source), micro_batch, seq_len, precision))
