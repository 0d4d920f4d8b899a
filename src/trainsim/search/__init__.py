"""Search: enumerate strategies, refuse the invalid, estimate the rest, rank them by throughput."""

from trainsim.search.planner import OUT_OF_MEMORY, Planner, RankedStrategy, SearchReport
from trainsim.search.space import SearchSpace, enumerate_plans

__all__ = ["OUT_OF_MEMORY", "Planner", "RankedStrategy", "SearchReport", "SearchSpace", "enumerate_plans"]
