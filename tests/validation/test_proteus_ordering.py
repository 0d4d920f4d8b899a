"""Proteus, Table V: predicted rank order of GPT-2 strategies against the measured order.

Measured with the analytical engine: Kendall tau 0.733 on HC1 and 0.810 on HC2 (README). The bound 0.6 keeps
the ordering clearly right while allowing one more swapped pair than today. HC1's true best (4x2x1) wins
through the QPI links between its two CPU sockets (the paper's explanation), a NUMA effect trainsim's
two-level topology does not model: it ranks 4x2x1 second, so the check is that the true best is in the
predicted top two.
"""

import pytest

from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.validate.proteus_table5 import PLATFORMS, Platform, rank_platform


@pytest.mark.parametrize("platform", PLATFORMS, ids=lambda p: p.name)
def test_analytical_ranks_table5_strategies(platform: Platform) -> None:
    ranked = rank_platform(platform, AnalyticalEstimator())
    assert ranked.tau >= 0.6, (ranked.labels, ranked.true_rank, ranked.predicted_rank)
    true_best = ranked.true_rank.index(1)
    assert ranked.predicted_rank[true_best] <= 2
