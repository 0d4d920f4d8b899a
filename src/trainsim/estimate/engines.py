"""The registry of estimators (the fidelity ladder). Each entry builds an object with estimate(job) -> Result."""

from collections.abc import Callable
from typing import Protocol

from trainsim.estimate.result import Result
from trainsim.job import Job
from trainsim.registry import Registry


class Estimator(Protocol):
    name: str

    def estimate(self, job: Job) -> Result: ...


ENGINES: Registry[Callable[[], Estimator]] = Registry("engine")


def _analytical() -> Estimator:
    from trainsim.estimate.analytical import AnalyticalEstimator

    return AnalyticalEstimator()


def _sim() -> Estimator:
    from trainsim.estimate.simulation import SimEstimator

    return SimEstimator()


def _precision_aware() -> Estimator:
    from trainsim.estimate.precision_aware import PrecisionAwareEstimator

    return PrecisionAwareEstimator()


ENGINES.add("analytical", _analytical)
ENGINES.add("precision-aware", _precision_aware)
ENGINES.add("sim", _sim)
