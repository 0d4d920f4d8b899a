"""How far off a prediction may be: the band of iteration times a calibration's held-out errors allow.

`trainsim calibrate` predicts runs the fit did not see (cross-validation: k-fold, leave-one-source-out, and
fitting on small jobs to predict large ones) and keeps, per group of comparable jobs, the ratios of measured /
predicted iteration time between which quantiles[1] - quantiles[0] (80%) of those runs fell (calibrate.bands: a
band symmetric in log, exp(-q) to exp(q)). A job's group is whether its training stack was among the
calibrated runs' stacks, and whether its GPU count lies inside the calibrated runs' range of GPU counts
(band_group). A prediction's band is its point times those two ratios (band_ratios): 80% of the held-out runs of
the group fell inside it (the finite-sample conformal count: of n runs, the ceil((n + 1) x 0.8) closest).
"""

from collections.abc import Collection
from typing import Literal, Self

from pydantic import Field, model_validator

from trainsim.specbase import Spec

QUANTILES = (0.1, 0.9)
GROUPS = ("known-stack/inside-scale", "known-stack/outside-scale", "unknown-stack/inside-scale",
          "unknown-stack/outside-scale")
GROUP_TEXT = {
    "known-stack/inside-scale": "a calibrated stack, inside the calibrated GPU counts",
    "known-stack/outside-scale": "a calibrated stack, outside the calibrated GPU counts",
    "unknown-stack/inside-scale": "a stack without calibration runs, inside the calibrated GPU counts",
    "unknown-stack/outside-scale": "a stack without calibration runs, outside the calibrated GPU counts",
}


def band_group(stack_name: str | None, num_gpus: int, calibrated_stacks: Collection[str], min_gpus: int,
               max_gpus: int) -> str:
    """The group of comparable jobs (GROUPS) of a job on `stack_name` (None: not stated, so unknown) and
    `num_gpus`, under a calibration whose runs used `calibrated_stacks` on min_gpus to max_gpus GPUs."""
    stack = "known-stack" if stack_name is not None and stack_name in calibrated_stacks else "unknown-stack"
    scale = "inside-scale" if min_gpus <= num_gpus <= max_gpus else "outside-scale"
    return f"{stack}/{scale}"


class BandRatios(Spec):
    """The band of measured / predicted iteration time over held-out runs. residuals: how many held-out
    predictions they come from. basis: own (the group's held-out runs), scales-pooled (the group had too few, so
    those of its stack side, known or unknown, at either scale), pooled (still too few, so every group's
    together), package (the calibration had too few runs in all: the package fit's band)."""

    low_ratio: float = Field(gt=0, allow_inf_nan=False)
    high_ratio: float = Field(gt=0, allow_inf_nan=False)
    residuals: int = Field(ge=0)
    basis: Literal["own", "scales-pooled", "pooled", "package"] = "own"

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low_ratio > self.high_ratio:
            raise ValueError(f"low_ratio={self.low_ratio} exceeds high_ratio={self.high_ratio}")
        return self


class Uncertainty(Spec):
    """What a calibration knows of its own error: the runs' stacks and GPU range, and each group's ratios."""

    quantiles: tuple[float, float] = QUANTILES  # the band holds quantiles[1] - quantiles[0] of the held-out runs
    calibrated_stacks: list[str] = []
    min_gpus: int = Field(ge=1)
    max_gpus: int = Field(ge=1)
    bands: dict[str, BandRatios]

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.min_gpus > self.max_gpus:
            raise ValueError(f"min_gpus={self.min_gpus} exceeds max_gpus={self.max_gpus}")
        missing = [group for group in GROUPS if group not in self.bands]
        if missing:
            raise ValueError(f"bands lacks the groups {', '.join(missing)}")
        unknown = [group for group in self.bands if group not in GROUPS]
        if unknown:
            raise ValueError(f"bands has unknown groups {', '.join(unknown)}; allowed: {', '.join(GROUPS)}")
        return self

    def group_of(self, stack_name: str | None, num_gpus: int) -> str:
        return band_group(stack_name, num_gpus, self.calibrated_stacks, self.min_gpus, self.max_gpus)

    def band_ratios(self, group: str) -> tuple[float, float]:
        """(low, high) multipliers of a point prediction; the band always holds the point itself."""
        ratios = self.bands[group]
        return min(ratios.low_ratio, 1.0), max(ratios.high_ratio, 1.0)
