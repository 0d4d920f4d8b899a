"""The pipeline, end to end: front-end -> OpGraph -> plan (strategy) -> engine(job, graph, plan) -> Result.

    source = ModelSource("path/to/config.json", frontend="torch")   # default: the catalog front-end
    job = make_job(source.model_spec(), cluster, parallel)
    result = predict(job, engine="sim", source=source)
    graphs = GraphCache("torch", "path/to/config.json")  # for many jobs: a graph per (model, device slice)
    result = make_engine("analytical").estimate(job, graphs.get(job))

Front-ends (frontends.registry) turn a model into the per-device OpGraph of a job's strategy; engines price it
through the pricing service (cost.pricing) and compose the prices into a Result. Nothing below this module
builds a graph for an engine.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainsim.estimate.engines import Estimator, make_engine
from trainsim.estimate.result import Result
from trainsim.frontends.catalog.build import build_graph
from trainsim.frontends.registry import FRONTENDS, ModelSource
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice

if TYPE_CHECKING:
    from trainsim.catalog.calibration import Calibration
    from trainsim.compile.context import TaskLevel
    from trainsim.strategy.lowered import LoweredPlan


@dataclass(slots=True)
class GraphCache:
    """The per-device OpGraphs of the jobs of one run, built once per (model, device slice): a search over
    thousands of plans of one model builds one graph per distinct tp/sp/cp/ep/micro-batch slice.
    frontend: the front-end that builds them; source: what it reads (default: each job's own model, by name)."""

    frontend: str = "catalog"
    source: str | None = None
    # NB: keyed by the model's id; each entry keeps its model alive, so no other model can take that id.
    _graphs: dict[tuple[object, ...], tuple[ModelSpec, OpGraph]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        FRONTENDS.get(self.frontend)  # unknown names: one line listing the choices

    def get(self, job: Job) -> OpGraph:
        dev = DeviceSlice.of(job.parallel, job.stack)
        key = (job.model.name, id(job.model), dev)
        entry = self._graphs.get(key)
        if entry is None:
            source = ModelSource(self.source or job.model.name, self.frontend)
            entry = self._graphs[key] = (job.model, source.graph(job))
        return entry[1]


def graph_for(job: Job, source: ModelSource | None = None) -> OpGraph:
    """The job's per-device OpGraph from `source`'s front-end (default: the catalog builders over job.model;
    uncached)."""
    if source is None:
        return build_graph(job.model, DeviceSlice.of(job.parallel, job.stack))
    return source.graph(job)


def predict(job: Job, engine: str | Estimator = "analytical", *, costs: str = "roofline", db: Path | None = None,
            task_level: "TaskLevel" = "layer", source: ModelSource | None = None, graph: OpGraph | None = None,
            plan: "LoweredPlan | None" = None, graphs: GraphCache | None = None,
            calibration: "Calibration | None" = None) -> Result:
    """One job through the pipeline. engine: a registered name (built with costs, db, task_level and
    calibration: default the package's fit, or a user's read with catalog.calibration.read_calibration) or an
    estimator; source: the front-end and model it reads (default: the catalog front-end over job.model);
    graph: the job's OpGraph if a front-end made it already (else from `graphs` when given, else built);
    plan: a lowered plan (a strategy tree's) for the engines that place layers."""
    estimator = make_engine(engine, costs, db, task_level, calibration) if isinstance(engine, str) else engine
    if graph is None:
        graph = graphs.get(job) if graphs is not None else graph_for(job, source)
    return estimator.estimate(job, graph, plan)
