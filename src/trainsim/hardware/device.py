"""One accelerator's spec-sheet numbers (dense peaks per dtype, HBM), loaded from catalog/data/devices."""

from typing import Literal

from pydantic import Field, field_validator

from trainsim.specbase import Spec
from trainsim.units import parse_bandwidth, parse_bytes, parse_flops

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
BYTES_PER_DTYPE: dict[DType, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
DTYPES: tuple[DType, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
_PEAK_FALLBACKS: dict[DType, tuple[DType, ...]] = {
    "fp8": ("fp8", "bf16", "fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}


def core_share(cores: int, ranks_per_host: float, threads_per_rank: int = 1) -> float:
    """A CPU rank's share of a core (DeviceSpec.compute_share) when a host's ranks and their threads outnumber its
    usable cores: cores / (ranks x threads), at most 1 (the scheduler takes them in turns). 0 cores (unknown): 1."""
    if cores <= 0:
        return 1.0
    return min(1.0, float(cores) / (ranks_per_host * threads_per_rank))


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
    # Attention kernels built for this device beyond flash2 and math (strategy.parallel.AttentionKernel):
    # "flash3" on Hopper and later (FlashAttention-3 and cuDNN fused attention need their TMA and warpgroup MMA).
    # A job asking for a kernel the device lacks is costed as flash2.
    attention_kernels: tuple[str, ...] = ()
    # The share of this device one rank gets: 1 for a GPU; cores / (ranks x threads) when CPU ranks outnumber a
    # host's cores (measured runs record both). Every engine then holds a step to at least (iteration - bubble) /
    # compute_share (estimate.analytical.with_shared_cores).
    compute_share: float = Field(default=1.0, gt=0, le=1.0)
    # The board's maximum power (the datasheet's TDP / max power, watts; sources in the catalog YAML); None where
    # no datasheet states one. Energy estimates (api.objectives) take every GPU at this power for the whole run:
    # an upper bound on the GPUs' own draw, hosts, network and cooling left out.
    max_power_w: float | None = Field(default=None, gt=0, lt=1e5)
    aliases: tuple[str, ...] = ()

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

    def peak_for(self, dtype: DType) -> float:
        """Dense peak for a dtype; fp8 falls back to fp16/bf16 and tf32 to fp32 on devices without them."""
        return self.peak_flops_per_s[self.peak_dtype_for(dtype)]

    def peak_dtype_for(self, dtype: DType) -> DType:
        """The dtype whose peak a `dtype` op runs at: itself where the device has it, else the next wider one."""
        for candidate in _PEAK_FALLBACKS[dtype]:
            if candidate in self.peak_flops_per_s:
                return candidate
        raise AssertionError(f"device {self.name} has no fp32 peak")

    @field_validator("peak_flops_per_s")
    @classmethod
    def _needs_fp32(cls, value: dict[DType, float]) -> dict[DType, float]:
        if "fp32" not in value:
            raise ValueError("must give at least the fp32 peak")
        if any(v <= 0 for v in value.values()):
            raise ValueError("peaks must be positive")
        return value
