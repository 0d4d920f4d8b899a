"""The pipeline, end to end: front-end -> OpGraph -> plan (strategy) -> engine(job, graph, plan) -> Result.

    graphs = GraphCache()                               # one per run: a graph per (model, device slice)
    job = make_job(model, cluster, parallel)
    result = predict(job, engine="sim", graphs=graphs)  # or make_engine(...).estimate(job, graphs.get(job))

Front-ends turn a model into the per-device OpGraph of a job's strategy (catalog builders by default); engines
price it through the pricing service (cost.pricing) and compose the prices into a Result. Nothing below this
module builds a graph for an engine.
"""

from dataclasses import dataclass, field
from pathlib import Path

from trainsim.compile.context import TaskLevel
from trainsim.estimate.engines import Estimator, make_engine
from trainsim.estimate.result import Result
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan


@dataclass(slots=True)
class GraphCache:
    """The per-device OpGraphs of the jobs of one run, built once per (model, device slice): a search over
    thousands of plans of one model builds one graph per distinct tp/sp/cp/ep/micro-batch slice."""

    _graphs: dict[tuple[object, ...], OpGraph] = field(default_factory=dict)

    def get(self, job: Job) -> OpGraph:
        dev = DeviceSlice.of(job.parallel)
        key = (job.model.name, id(job.model), dev)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = build_graph(job.model, dev)
        return graph


def graph_for(job: Job) -> OpGraph:
    """The job's per-device OpGraph from the catalog front-end (uncached)."""
    return build_graph(job.model, DeviceSlice.of(job.parallel))


def predict(job: Job, engine: str | Estimator = "analytical", *, costs: str = "roofline", db: Path | None = None,
            task_level: TaskLevel = "layer", graph: OpGraph | None = None, plan: LoweredPlan | None = None,
            graphs: GraphCache | None = None) -> Result:
    """One job through the pipeline. engine: a registered name (built with costs, db, task_level) or an
    estimator; graph: the job's OpGraph if a front-end made it already (default: the catalog front-end's,
    from `graphs` when given); plan: a lowered plan (a strategy tree's) for the engines that place layers."""
    estimator = make_engine(engine, costs, db, task_level) if isinstance(engine, str) else engine
    if graph is None:
        graph = graphs.get(job) if graphs is not None else graph_for(job)
    return estimator.estimate(job, graph, plan)
