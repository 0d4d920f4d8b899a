"""Error metrics over (predicted, measured) pairs."""

import math
from collections.abc import Sequence


def ape(predicted: float, measured: float) -> float:
    """Absolute percentage error, in percent."""
    return abs(predicted - measured) / abs(measured) * 100.0


def mape(pairs: Sequence[tuple[float, float]]) -> float:
    return sum(ape(p, m) for p, m in pairs) / len(pairs) if pairs else math.nan


def kendall_tau(first: Sequence[float], second: Sequence[float]) -> float:
    """Kendall's tau-a between two rankings of the same items (no tie correction)."""
    n = len(first)
    concordant = discordant = 0
    for i in range(n):
        for j in range(i + 1, n):
            sign = (first[i] - first[j]) * (second[i] - second[j])
            concordant += sign > 0
            discordant += sign < 0
    pairs = n * (n - 1) / 2
    return (concordant - discordant) / pairs if pairs else math.nan
