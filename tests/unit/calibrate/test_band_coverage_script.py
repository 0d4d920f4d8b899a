"""scripts/band_coverage.py's pieces on hand-made held-out predictions: the random-effects interval (measured, not
in use) on exact cases, and the honest tally's coverage and median width."""

import math
from types import ModuleType

import pytest

from conftest import module_from_file
from trainsim.calibrate.bands import HeldOut
from trainsim.catalog.uncertainty import GROUPS, BandRatios, Uncertainty

T1_90 = math.tan(0.4 * math.pi)  # Student's t with 1 degree of freedom is Cauchy: its 90% point is tan(0.4 pi)


@pytest.fixture(scope="module")
def script() -> ModuleType:
    module = module_from_file("scripts/band_coverage.py")
    return module


def _records(log_errors_by_source: dict[str, list[float]]) -> list[HeldOut]:
    return [HeldOut("leave-one-source-out", "x", f"{source}-{i}", source, 8, error, "unknown-stack/inside-scale")
            for source, errors in log_errors_by_source.items() for i, error in enumerate(errors)]


def test_random_effects_interval_without_spread_between_sources(script: ModuleType) -> None:
    # means 0.1, 0.2, 0.3; within-source variance (3 x 0.02) / 3 = 0.02; weights 2 / 0.02 = 100; Q = 100 x 0.02
    # = 2 = k - 1, so tau^2 = 0; mu = 0.2, se(mu)^2 = 1/300; t with k - 2 = 1 degree of freedom
    low, high = script.random_effects_interval(_records({"a": [0.0, 0.2], "b": [0.1, 0.3], "c": [0.2, 0.4]}))
    half = T1_90 * math.sqrt(1 / 300 + 0.02)
    assert (low, high) == pytest.approx((0.2 - half, 0.2 + half), rel=1e-12)


def test_random_effects_interval_widens_with_the_spread_between_sources(script: ModuleType) -> None:
    # means 0.1, 0.6, 1.1: Q = 100 x 0.5 = 50, tau^2 = (50 - 2) / (300 - 100) = 0.24; random-effects weights
    # 1 / (0.01 + 0.24) = 4 each, se(mu)^2 = 1/12
    low, high = script.random_effects_interval(_records({"a": [0.0, 0.2], "b": [0.5, 0.7], "c": [1.0, 1.2]}))
    half = T1_90 * math.sqrt(0.24 + 1 / 12 + 0.02)
    assert (low, high) == pytest.approx((0.6 - half, 0.6 + half), rel=1e-12)


def test_random_effects_interval_needs_three_sources(script: ModuleType) -> None:
    assert script.random_effects_interval(_records({"a": [0.0, 0.2], "b": [0.1, 0.3]})) is None


def test_honest_tally_counts_coverage_and_width(script: ModuleType) -> None:
    # every group's band 0.8-1.25 (width 45% of the prediction); measured / predicted = exp(-log_error)
    band = BandRatios(low_ratio=0.8, high_ratio=1.25, residuals=10)
    fixed = Uncertainty(min_gpus=1, max_gpus=8, bands={group: band for group in GROUPS})
    records = _records({"a": [0.0, 0.5], "b": [0.1, -0.1, 0.3]})  # exp(-0.5) and exp(-0.3) fall below 0.8
    tally = script.honest(records, lambda rest: fixed)
    assert (tally["a"].inside, len(tally["a"].widths)) == (1, 2)
    assert (tally["b"].inside, len(tally["b"].widths)) == (2, 3)
    assert tally["ALL"].pct() == "60.0%"
    assert tally["ALL"].median_width() == "45.0%"
