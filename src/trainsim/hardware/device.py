"""One accelerator's spec-sheet numbers (dense peaks per dtype, HBM), loaded from catalog/data/devices."""

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainsim.specbase import Spec
from trainsim.units import parse_bandwidth, parse_bytes, parse_flops

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
DTYPES: tuple[DType, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")


class DeviceSpec(Spec):
    """Dense (no sparsity) peak FLOP/s per dtype; a dtype the device lacks falls back to the next wider one."""

    name: str
    description: str = ""
    vendor: str = "nvidia"
    peak_flops_per_s: dict[DType, float]
    hbm_bytes: float = Field(gt=0)
    hbm_bw_bytes_per_s: float = Field(gt=0)
    # Memory the runtime keeps for itself (CUDA context, allocator fragmentation, NCCL buffers).
    runtime_reserved_bytes: float = Field(default=2.0 * 2**30, ge=0)
    # Whether collectives progress while the device computes (GPUs: DMA engines and NCCL's own SMs). False for
    # a CPU running gloo: its reductions and copies take the cores the ranks compute on.
    comm_overlaps_compute: bool = True
    aliases: tuple[str, ...] = ()
    # Board power at which the peaks above hold, and the cap a power-limited part runs under (both or neither).
    rated_power_w: float | None = Field(default=None, gt=0)
    power_limit_w: float | None = Field(default=None, gt=0)

    @field_validator("peak_flops_per_s", mode="before")
    @classmethod
    def _parse_peaks(cls, value: object) -> object:
        if isinstance(value, dict):
            return {key: parse_flops(v, f"peak_flops_per_s.{key}") for key, v in value.items()}
        return value

    @field_validator("hbm_bytes", "runtime_reserved_bytes", mode="before")
    @classmethod
    def _parse_bytes(cls, value: object) -> object:
        return parse_bytes(value) if isinstance(value, str) else value

    @field_validator("hbm_bw_bytes_per_s", mode="before")
    @classmethod
    def _parse_bw(cls, value: object) -> object:
        return parse_bandwidth(value) if isinstance(value, str) else value

    @property
    def compute_clock_fraction(self) -> float:
        """Share of the peak FLOP rate a power-capped part sustains (1 without a cap below the rated power).

        NB: dynamic CMOS power is P ~ C V^2 f, and DVFS lowers the supply voltage about in proportion to the
        clock, so P ~ f^3 and a cap P_cap < P_rated holds the tensor-core clock at (P_cap / P_rated)^(1/3)
        of its rated value (Hennessy & Patterson, Computer Architecture, 6th ed., sec. 1.5). HBM bandwidth
        does not follow the core clock and is left alone.
        """
        if self.rated_power_w is None or self.power_limit_w is None:
            return 1.0
        return min(1.0, self.power_limit_w / self.rated_power_w) ** (1.0 / 3.0)

    def peak_for(self, dtype: DType) -> float:
        """Dense peak for a dtype; fp8 falls back to fp16/bf16 and tf32 to fp32 on devices without them."""
        fallbacks: dict[DType, tuple[DType, ...]] = {
            "fp8": ("fp8", "bf16", "fp16", "fp32"),
            "bf16": ("bf16", "fp16", "fp32"),
            "fp16": ("fp16", "bf16", "fp32"),
            "tf32": ("tf32", "fp32"),
            "fp32": ("fp32",),
        }
        for candidate in fallbacks[dtype]:
            if candidate in self.peak_flops_per_s:
                return self.peak_flops_per_s[candidate]
        raise AssertionError(f"device {self.name} has no fp32 peak")

    @model_validator(mode="after")
    def _power_pair(self) -> "DeviceSpec":
        if (self.rated_power_w is None) != (self.power_limit_w is None):
            raise ValueError(f"give both rated_power_w and power_limit_w or neither (rated_power_w="
                             f"{self.rated_power_w}, power_limit_w={self.power_limit_w})")
        return self

    @field_validator("peak_flops_per_s")
    @classmethod
    def _needs_fp32(cls, value: dict[DType, float]) -> dict[DType, float]:
        if "fp32" not in value:
            raise ValueError("must give at least the fp32 peak")
        if any(v <= 0 for v in value.values()):
            raise ValueError("peaks must be positive")
        return value
