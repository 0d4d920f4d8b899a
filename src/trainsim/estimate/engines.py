"""The registry of estimators (the fidelity ladder). Every engine takes the same inputs - a job, its per-device
OpGraph from a front-end, and optionally a lowered plan - and returns the same Result; it is built from the same
choice of costs (cost.pricing.COSTS: roofline, or profiled from a profile database)."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainsim.catalog.calibration import Calibration
from trainsim.cost.pricing import COSTS, Pricer, make_pricer
from trainsim.estimate.result import Result
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.profile.paths import default_db_path
from trainsim.registry import Registry

if TYPE_CHECKING:  # NB: the compiler and lowered plans load with the simulator, not with every prediction
    from trainsim.compile.context import TaskLevel
    from trainsim.strategy.lowered import LoweredPlan


class Estimator(Protocol):
    name: str

    def estimate(self, job: Job, graph: OpGraph, plan: "LoweredPlan | None" = None) -> Result: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """costs: a name of cost.pricing.COSTS; db: the profile database of profiled costs (default: the user's
    cache); task_level: the simulator's task granularity (layer | op; other engines have no tasks); calibration:
    the fitted parameters (default: the package's fit; a user's from `trainsim calibrate --output`)."""

    costs: str = "roofline"
    db: Path | None = None
    task_level: "TaskLevel" = "layer"  # the simulator checks it
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        COSTS.get(self.costs)  # unknown names: one line listing the choices


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineEntry:
    """One rung of the ladder: how to build it and what it can do. timeline: its Results carry the simulated
    iteration (a trace, the critical path); takes_plan: it reads a lowered plan (a strategy tree: the simulators
    place layers by it, the analytical engine takes its ops' configs over tp, compile.shape_layers.shaped_graph);
    replays_traces: it predicts a traced run from the OpGraph's measured trace (the execution-trace front-end),
    not from a model's shapes alone; baseline: an ablation of another engine for the paper comparisons (Proteus
    Table IV and Fig. 9), left out of "every engine" (shape_engines)."""

    build: Callable[[EngineOptions], Estimator]
    timeline: bool = False
    takes_plan: bool = False
    replays_traces: bool = False
    baseline: bool = False


def _analytical(options: EngineOptions) -> Estimator:
    from trainsim.estimate.analytical import AnalyticalEstimator

    return AnalyticalEstimator(make_pricer(options.costs, options.db, options.calibration))


def _sim_pricer(options: EngineOptions) -> Pricer:
    """The costs of an engine that simulates: the options' own, over the simulator's calibration."""
    from trainsim.estimate.simulation import sim_calibration

    return make_pricer(options.costs, options.db, sim_calibration(options.calibration))


def _sim(options: EngineOptions) -> Estimator:
    from trainsim.estimate.simulation import SimEstimator

    return SimEstimator(_sim_pricer(options), task_level=options.task_level)


def _sim_plain(options: EngineOptions) -> Estimator:
    from trainsim.estimate.baselines import PlainSimEstimator

    return PlainSimEstimator(_sim_pricer(options), task_level=options.task_level)


def _flexflow_sim(options: EngineOptions) -> Estimator:
    from trainsim.estimate.baselines import FlexFlowSimEstimator

    return FlexFlowSimEstimator(_sim_pricer(options), task_level=options.task_level)


def _precision_aware(options: EngineOptions) -> Estimator:
    """Seed 001's predictor profiles every operator itself: profiled costs give it the database."""
    from trainsim.estimate.precision_aware import PrecisionAwareEstimator

    if options.costs == "roofline":
        return PrecisionAwareEstimator(options.calibration)
    return PrecisionAwareEstimator(options.calibration, db=options.db or default_db_path())


def _replay(options: EngineOptions) -> Estimator:
    """Measured durations need no costs; the costs price the memory of the traced shapes."""
    from trainsim.estimate.replay import ReplayEstimator

    return ReplayEstimator(make_pricer(options.costs, options.db, options.calibration))


# NB: each engine's module is imported when the engine is built, so a prediction loads its own engine only.
ENGINES: Registry[EngineEntry] = Registry("engine")
ENGINES.add("analytical", EngineEntry(build=_analytical, takes_plan=True))  # its ops' tp configs only
ENGINES.add("precision-aware", EngineEntry(build=_precision_aware))
ENGINES.add("sim", EngineEntry(build=_sim, timeline=True, takes_plan=True))
ENGINES.add("replay", EngineEntry(build=_replay, timeline=True, replays_traces=True))
ENGINES.add("sim-plain", EngineEntry(build=_sim_plain, timeline=True, takes_plan=True, baseline=True))
ENGINES.add("flexflow-sim", EngineEntry(build=_flexflow_sim, timeline=True, takes_plan=True, baseline=True))


def shape_engines() -> list[str]:
    """The engines that predict a job from its model's shapes (every one but trace replay and the simulator's
    baselines)."""
    return [name for name in ENGINES.names() if not ENGINES.get(name).replays_traces
            and not ENGINES.get(name).baseline]


def make_engine(engine: str, costs: str = "roofline", db: Path | None = None,
                task_level: "TaskLevel" = "layer", calibration: Calibration | None = None) -> Estimator:
    """Any engine of the registry with the costs chosen, over `calibration` (default: the package's fit)."""
    entry = ENGINES.get(engine)
    return entry.build(EngineOptions(costs=costs, db=db, task_level=task_level, calibration=calibration))
