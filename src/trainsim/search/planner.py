"""The planner: try every plan of a SearchSpace, count why the refused ones fail, rank the rest by throughput.

A plan is refused when make_job (or the estimator) raises a TrainsimError, counted under the error's field
(ConfigError) or reason (InfeasiblePlanError); a plan whose predicted peak memory exceeds the device is
counted as "out of memory". The feasible plans are ranked by tokens/s, ties broken by lower peak memory,
then by the enumeration order, so the ranking is deterministic.

A refused plan's error is kept without its traceback: the traceback's frames hold the dict the error is kept in
(and the whole grid of jobs and graphs beside it), a reference cycle that only the collector's full pass would
free, tens of thousands of objects a search.
"""

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainsim.collector import collector_paused
from trainsim.errors import ConfigError, InfeasiblePlanError, TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import Estimator
from trainsim.estimate.result import Result
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import GraphCache
from trainsim.search.space import PlanColumns, SearchSpace, plan_grid
from trainsim.strategy.front_end_splits import refuse_whole_model_cp, refuse_whole_model_tp
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec

if TYPE_CHECKING:  # NB: the grid engine loads numpy; `trainsim predict` loads the planner (api) but no numpy
    from trainsim.search.grid import GridEngine

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


@dataclass(frozen=True, slots=True)
class BuiltPlans:
    """The plans make_job accepts, with their graphs (what an engine prices), and what it raised for the others."""

    jobs: list[tuple[Job, OpGraph]]  # in the plans' order
    index: list[int]  # per built plan, its index among the plans
    refused: dict[int, TrainsimError]  # index among the plans -> what make_job (or the graph) raised


def build_plans(model: ModelSpec, cluster: ClusterSpec, plans: Sequence[ParallelSpec], stack: StackSpec | None,
                graphs: GraphCache | None = None, progress: Progress | None = None) -> BuiltPlans:
    """Each plan through make_job and its graph (from `graphs`, one per device slice), in order: the grid a search
    prices (Planner.search; the search benchmark and the grid engine's tests build theirs the same way).
    progress: called every PROGRESS_EVERY plans with (plans done, plans in total)."""
    graphs = graphs or GraphCache()
    jobs: list[tuple[Job, OpGraph]] = []
    index: list[int] = []
    refused: dict[int, TrainsimError] = {}
    total = len(plans)
    for at, parallel in enumerate(plans):
        if progress is not None and at % PROGRESS_EVERY == 0:
            progress(at, total)
        try:
            job = make_job(model, cluster, parallel, stack)
            graph = graphs.get(job)
            refuse_whole_model_tp(graph.frontend, job.parallel.tp)  # a search gives no tree to split its ops
            refuse_whole_model_cp(graph.frontend, job.parallel.cp, "a search")
            jobs.append((job, graph))
        except TrainsimError as exc:
            refused[at] = exc.with_traceback(None)  # NB: without its frames (module doc)
            continue
        index.append(at)
    return BuiltPlans(jobs, index, refused)


def refusal_reason(exc: TrainsimError) -> str:
    """The key a refused plan is counted under: a ConfigError's field, an InfeasiblePlanError's reason."""
    if isinstance(exc, ConfigError):
        return exc.field
    if isinstance(exc, InfeasiblePlanError):
        return exc.reason
    return type(exc).__name__


class Planner:
    """Runs searches with one estimator and one graph cache, so their caches (graphs, layer prices) serve every
    plan. With the analytical engine a search prices its whole grid at once (search.grid.GridEngine: the figures
    AnalyticalEstimator.price gives, plan by plan) and makes Results for the reported plans only."""

    def __init__(self, estimator: Estimator | None = None, graphs: GraphCache | None = None) -> None:
        self.estimator = estimator or AnalyticalEstimator()
        self.graphs = graphs or GraphCache()
        self._grid: GridEngine | None = None  # the analytical engine over whole grids, made on first use

    def search(self, model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, *, top_k: int = 10,
               progress: Progress | None = None) -> SearchReport:
        with collector_paused():  # NB: ~10% of a search was the collector walking its specs and jobs
            return self._search(model, cluster, space, top_k, progress)

    def _search(self, model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, top_k: int,
                progress: Progress | None) -> SearchReport:
        if top_k <= 0:
            raise ConfigError("top_k", top_k, "must be a positive integer")
        plans, columns = plan_grid(model, cluster, space)
        total = len(plans)
        grid = build_plans(model, cluster, plans, space.stack, self.graphs, progress)
        built, built_index, refused_by = grid.jobs, grid.index, dict(grid.refused)
        priced = self._price_all(built, refused_by, built_index, columns)
        if progress is not None:
            progress(total, total)
        # Min-heap of the best top_k: the root is the worst kept plan. Key: higher tokens/s, then lower peak
        # memory, then earlier in the enumeration.
        best: list[tuple[float, float, int, int]] = []
        refused: Counter[str] = Counter()
        feasible = 0
        priced_plans: list[PricedPlan] = []
        at = 0  # the next built plan
        for index in range(total):
            exc = refused_by.get(index)
            if exc is not None:
                refused[refusal_reason(exc)] += 1
                if at < len(built_index) and built_index[at] == index:
                    at += 1
                continue
            job = built[at][0]
            tokens, peak, oom = priced[at]
            at += 1
            priced_plans.append(PricedPlan(job.parallel, tokens, peak, oom))
            if oom:
                refused[OUT_OF_MEMORY] += 1
                continue
            feasible += 1
            entry = (tokens, -peak, -index, at - 1)
            if len(best) < top_k:
                heapq.heappush(best, entry)
            elif entry[:3] > best[0][:3]:
                heapq.heapreplace(best, entry)
        ranked = sorted(best, key=lambda entry: entry[:3], reverse=True)
        return SearchReport(
            plans=[RankedStrategy(rank, built[at][0], self._result(*built[at]))
                   for rank, (*_, at) in enumerate(ranked, start=1)],
            tried=total, feasible=feasible, infeasible=dict(refused.most_common()), priced=priced_plans,
        )

    def _price_all(self, built: list[tuple[Job, OpGraph]], refused_by: dict[int, TrainsimError],
                   built_index: list[int], columns: PlanColumns) -> list[tuple[float, float, bool]]:
        """(tokens/s, peak memory, out of memory) of every built plan; the plans the engine refuses go into
        refused_by. The analytical engine prices the whole grid at once (GridEngine, with the enumeration's
        columns of the built plans), any other estimator plan by plan."""
        if isinstance(self.estimator, AnalyticalEstimator):
            if self._grid is None or self._grid.estimator is not self.estimator:
                from trainsim.search.grid import GridEngine  # numpy: loaded by a search, not by every predict

                self._grid = GridEngine(self.estimator)
            prices = self._grid.price(built, columns.take(built_index))
            for at, exc in prices.errors.items():
                refused_by[built_index[at]] = exc
            return list(zip(prices.tokens_per_s.tolist(), prices.peak_memory_bytes.tolist(), prices.oom.tolist(),
                            strict=True))
        out: list[tuple[float, float, bool]] = []
        for at, (job, graph) in enumerate(built):
            try:
                result = self.estimator.estimate(job, graph)
            except TrainsimError as exc:
                refused_by[built_index[at]] = exc.with_traceback(None)  # NB: see build_plans
                out.append((0.0, 0.0, True))
                continue
            out.append((result.tokens_per_s, result.peak_memory_bytes, result.oom))
        return out

    def _result(self, job: Job, graph: OpGraph) -> Result:
        """The Result of a reported plan: the analytical engine's full price, or any other estimator's estimate
        (again: an estimator's Results are not kept for the thousands of plans a search does not report)."""
        if isinstance(self.estimator, AnalyticalEstimator):
            return self.estimator.price(job, graph).result()
        return self.estimator.estimate(job, graph)
