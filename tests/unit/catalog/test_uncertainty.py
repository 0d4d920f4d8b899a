"""The band groups and the uncertainty section of a calibration file."""

import pytest

from trainsim.catalog.uncertainty import GROUPS, BandRatios, Uncertainty, band_group
from trainsim.errors import ConfigError


def _uncertainty(bands: dict[str, BandRatios] | None = None) -> Uncertainty:
    default = BandRatios(low_ratio=0.9, high_ratio=1.1, residuals=50)
    return Uncertainty(calibrated_stacks=["megatron-core"], min_gpus=8, max_gpus=128,
                       bands={group: (bands or {}).get(group, default) for group in GROUPS})


@pytest.mark.parametrize(("stack", "gpus", "group"), [
    ("megatron-core", 8, "known-stack/inside-scale"),
    ("megatron-core", 128, "known-stack/inside-scale"),
    ("megatron-core", 256, "known-stack/outside-scale"),
    ("megatron-core", 4, "known-stack/outside-scale"),
    ("fsdp2", 64, "unknown-stack/inside-scale"),
    (None, 64, "unknown-stack/inside-scale"),
    (None, 1024, "unknown-stack/outside-scale"),
])
def test_band_group(stack: str | None, gpus: int, group: str) -> None:
    assert band_group(stack, gpus, {"megatron-core", "deepspeed"}, 8, 128) == group
    assert _uncertainty().group_of(stack, gpus) == group


def test_band_always_holds_the_point() -> None:
    biased = BandRatios(low_ratio=1.05, high_ratio=1.3, residuals=40)
    uncertainty = _uncertainty({"unknown-stack/outside-scale": biased})
    assert uncertainty.band_ratios("unknown-stack/outside-scale") == (1.0, 1.3)
    assert uncertainty.band_ratios("known-stack/inside-scale") == (0.9, 1.1)


@pytest.mark.parametrize(("data", "message"), [
    ({"low_ratio": 1.2, "high_ratio": 1.1, "residuals": 3}, "exceeds high_ratio"),
    ({"low_ratio": 0.0, "high_ratio": 1.1, "residuals": 3}, "low_ratio"),
    ({"low_ratio": 0.9, "high_ratio": float("inf"), "residuals": 3}, "high_ratio"),
    ({"low_ratio": 0.9, "high_ratio": 1.1, "residuals": -1}, "residuals"),
    ({"low_ratio": 0.9, "high_ratio": 1.1, "residuals": 3, "basis": "guess"}, "basis"),
])
def test_bad_band_ratios(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BandRatios.parse(data)


def test_every_group_is_required_and_no_other() -> None:
    ratios = {"low_ratio": 0.9, "high_ratio": 1.1, "residuals": 30}
    with pytest.raises(ConfigError, match="lacks the groups unknown-stack/outside-scale"):
        Uncertainty.parse({"min_gpus": 1, "max_gpus": 8, "bands": {g: ratios for g in GROUPS[:3]}})
    with pytest.raises(ConfigError, match="unknown groups"):
        Uncertainty.parse({"min_gpus": 1, "max_gpus": 8, "bands": {**{g: ratios for g in GROUPS}, "x": ratios}})
    with pytest.raises(ConfigError, match="min_gpus=16 exceeds max_gpus=8"):
        Uncertainty.parse({"min_gpus": 16, "max_gpus": 8, "bands": {g: ratios for g in GROUPS}})
