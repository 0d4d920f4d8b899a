"""The planner: try every plan of a SearchSpace, count why the refused ones fail, rank the rest by throughput.

A plan is refused when make_job (or the estimator) raises a TrainsimError, counted under the error's field
(ConfigError) or reason (InfeasiblePlanError); a plan whose predicted peak memory exceeds the device is
counted as "out of memory". The feasible plans are ranked by tokens/s, ties broken by lower peak memory,
then by the enumeration order, so the ranking is deterministic.
"""

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from trainsim.errors import ConfigError, InfeasiblePlanError, TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import Estimator
from trainsim.estimate.result import Result
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import GraphCache
from trainsim.search.space import SearchSpace, enumerate_plans
from trainsim.strategy.parallel import ParallelSpec

OUT_OF_MEMORY = "out of memory"
PROGRESS_EVERY = 256  # plans between progress callbacks: cheap enough not to show in the search time

Progress = Callable[[int, int], None]  # (plans done, plans in total)


@dataclass(frozen=True, slots=True)
class RankedStrategy:
    rank: int  # 1 = best
    job: Job
    result: Result

    @property
    def parallel(self) -> ParallelSpec:
        """The plan as make_job resolved it (dp filled in)."""
        return self.job.parallel


@dataclass(frozen=True, slots=True)
class PricedPlan:
    """A plan the estimator priced, feasible or out of memory: a point of the throughput-memory picture."""

    parallel: ParallelSpec
    tokens_per_s: float
    peak_memory_bytes: float
    oom: bool


@dataclass(frozen=True, slots=True)
class SearchReport:
    plans: list[RankedStrategy]  # the best top_k, best first
    tried: int
    feasible: int
    infeasible: dict[str, int]  # reason -> plans, most frequent first
    priced: list[PricedPlan] = field(default_factory=list)  # every plan priced, in enumeration order

    def __post_init__(self) -> None:
        assert self.tried == self.feasible + sum(self.infeasible.values()), "every plan is counted once"


def refusal_reason(exc: TrainsimError) -> str:
    """The key a refused plan is counted under: a ConfigError's field, an InfeasiblePlanError's reason."""
    if isinstance(exc, ConfigError):
        return exc.field
    if isinstance(exc, InfeasiblePlanError):
        return exc.reason
    return type(exc).__name__


class Priced(Protocol):
    """What the planner ranks a plan by, and its Result."""

    @property
    def tokens_per_s(self) -> float: ...

    @property
    def peak_memory_bytes(self) -> float: ...

    @property
    def oom(self) -> bool: ...

    def result(self) -> Result: ...


class Planner:
    """Runs searches with one estimator and one graph cache, so their caches (graphs, layer prices) serve every
    plan."""

    def __init__(self, estimator: Estimator | None = None, graphs: GraphCache | None = None) -> None:
        self.estimator = estimator or AnalyticalEstimator()
        self.graphs = graphs or GraphCache()

    def search(self, model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, *, top_k: int = 10,
               progress: Progress | None = None) -> SearchReport:
        if top_k <= 0:
            raise ConfigError("top_k", top_k, "must be a positive integer")
        plans = list(enumerate_plans(model, cluster, space))
        total = len(plans)
        refused: Counter[str] = Counter()
        # Min-heap of the best top_k: the root is the worst kept plan. Key: higher tokens/s, then lower peak
        # memory, then earlier in the enumeration.
        best: list[tuple[float, float, int, Job, Priced]] = []
        feasible = 0
        priced_plans: list[PricedPlan] = []
        price = self._pricing()
        for index, parallel in enumerate(plans):
            if progress is not None and index % PROGRESS_EVERY == 0:
                progress(index, total)
            try:
                job = make_job(model, cluster, parallel, space.stack)
                priced = price(job, self.graphs.get(job))
            except TrainsimError as exc:
                refused[refusal_reason(exc)] += 1
                continue
            priced_plans.append(PricedPlan(job.parallel, priced.tokens_per_s, priced.peak_memory_bytes, priced.oom))
            if priced.oom:
                refused[OUT_OF_MEMORY] += 1
                continue
            feasible += 1
            entry = (priced.tokens_per_s, -priced.peak_memory_bytes, -index, job, priced)
            if len(best) < top_k:
                heapq.heappush(best, entry)
            elif entry[:3] > best[0][:3]:
                heapq.heapreplace(best, entry)
        if progress is not None:
            progress(total, total)
        ranked = sorted(best, key=lambda entry: entry[:3], reverse=True)
        return SearchReport(
            plans=[RankedStrategy(rank, job, priced.result())
                   for rank, (*_, job, priced) in enumerate(ranked, start=1)],
            tried=total, feasible=feasible, infeasible=dict(refused.most_common()), priced=priced_plans,
        )

    def _pricing(self) -> Callable[[Job, OpGraph], Priced]:
        """The analytical engine's price (the Result made only for the plans reported), or any other
        estimator's estimate."""
        if isinstance(self.estimator, AnalyticalEstimator):
            return self.estimator.price
        estimate = self.estimator.estimate
        return lambda job, graph: _Estimated(estimate(job, graph))


@dataclass(frozen=True, slots=True)
class _Estimated:
    """A Result (of an estimator without a separate price step) as a priced plan."""

    done: Result

    @property
    def tokens_per_s(self) -> float:
        return self.done.tokens_per_s

    @property
    def peak_memory_bytes(self) -> float:
        return self.done.peak_memory_bytes

    @property
    def oom(self) -> bool:
        return self.done.oom

    def result(self) -> Result:
        return self.done
