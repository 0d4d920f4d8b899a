"""How the work is split and scheduled."""

from trainsim.strategy.parallel import ParallelSpec, Precision, Recompute, Schedule

__all__ = ["ParallelSpec", "Precision", "Recompute", "Schedule"]
