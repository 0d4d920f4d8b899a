"""How the work is split and scheduled: the plan family.

What the user asks for: ParallelSpec (one strategy for the whole model: the flags and job-file keys, parallel.py)
and StrategyTree (per-module overrides of it, tree.py / tree_yaml.py). What the compiler consumes: LoweredPlan
(stage, chunk and recompute per layer, lowered.py). What the search returns: search.planner.RankedStrategy (a
strategy with its Result). DeviceSlice (device_slice.py) is what one device computes under a strategy.
"""

from trainsim.strategy.parallel import ParallelSpec, Precision, Recompute, Schedule

__all__ = ["ParallelSpec", "Precision", "Recompute", "Schedule"]
