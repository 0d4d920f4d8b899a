"""Engines with their costs chosen: op times and step costs from the calibrated roofline ("roofline") or from a
profile database written by `trainsim profile` ("profiled"; the roofline answers what the database lacks)."""

from pathlib import Path
from typing import Any

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.comm.collectives import AlphaBetaComm
from trainsim.compile.context import TaskLevel
from trainsim.cost.compute import RooflineCosts
from trainsim.cost.profiled import ProfiledComm, ProfiledCosts, ProfiledStepCosts
from trainsim.cost.step import FittedStepCosts
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import ENGINES, Estimator

COST_MODELS = ("roofline", "profiled")


def make_estimator(costs: str, db: Path | None = None) -> AnalyticalEstimator:
    """The analytical (L0) engine with op times from `costs` (profiled: the database at `db`, default: the
    user's cache).

    With profiled costs, and for a device the database has measured, the Adam step and the framework overhead
    are measured too (ProfiledStepCosts), in place of the roofline step and the calibration's fitted
    per-iteration and per-micro-batch constants (fitted on GPU clusters' runs, not on this profile's device).
    """
    _check_costs(costs)
    if costs == "roofline":
        return AnalyticalEstimator()
    fitted = load_calibration()
    return AnalyticalEstimator(fitted, **profiled_costs(fitted, db))


def profiled_costs(cal: Calibration, db: Path | None = None) -> dict[str, Any]:
    """Op times, step costs and collective times from the database at `db` (default: the user's cache), with
    `cal`'s roofline, fitted overheads and alpha-beta model for what it lacks: the keyword arguments
    op_costs, step_costs and comm_costs of the analytical and simulation engines."""
    from trainsim.profile.database import default_db_path

    op_costs = ProfiledCosts(db or default_db_path(), fallback=RooflineCosts(cal))
    return {"op_costs": op_costs, "step_costs": ProfiledStepCosts(op_costs, FittedStepCosts(cal)),
            "comm_costs": ProfiledComm(op_costs, AlphaBetaComm(cal))}


def make_engine(engine: str, costs: str = "roofline", db: Path | None = None,
                task_level: TaskLevel = "layer") -> Estimator:
    """Any engine of the registry with the costs chosen (task_level: the simulator's task granularity)."""
    factory = ENGINES.get(engine)
    _check_costs(costs)
    if engine == "sim":
        from trainsim.estimate.simulation import SimEstimator, sim_calibration

        if costs == "roofline":
            return SimEstimator(task_level=task_level)
        cal = sim_calibration()
        return SimEstimator(cal, task_level=task_level, **profiled_costs(cal, db))
    if costs == "roofline":
        return factory()
    if engine == "analytical":
        return make_estimator(costs, db)
    if engine == "precision-aware":
        from trainsim.estimate.precision_aware import PrecisionAwareEstimator
        from trainsim.profile.database import default_db_path

        return PrecisionAwareEstimator(db=db or default_db_path())
    raise ConfigError("costs", costs, f"engine {engine!r} takes only roofline costs")


def _check_costs(costs: str) -> None:
    if costs not in COST_MODELS:
        raise ConfigError("costs", costs, "choose one of: " + ", ".join(COST_MODELS))
