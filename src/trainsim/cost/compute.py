"""Roofline op costs: time = max(FLOPs / achieved FLOP/s, bytes / achieved HBM bandwidth) + launch overhead."""

from typing import Protocol

from trainsim.cost.calibration import Calibration
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import Op


def matmul_efficiency(work_flop: float, peak_flops_per_s: float, max_efficiency: float,
                      cal: Calibration, training_factor: float = 1.0, min_dim: float = 0.0) -> float:
    """Achieved / peak for one GEMM. NB: bigger devices need bigger GEMMs to fill, so the half-work point
    scales with the peak (Williams et al. roofline argument: fixed launch and tail cost per wave); a skinny
    GEMM (small smallest dimension) loses more (tile quantization). min_dim=0: unknown shape."""
    params = cal.compute
    half_work = params.matmul_half_work_flop_per_tflops * peak_flops_per_s / 1e12
    saturation = 1.0 / (1.0 + (half_work / max(work_flop, 1.0)) ** params.matmul_exponent)
    if min_dim > 0:
        saturation /= 1.0 + (params.matmul_half_dim / min_dim) ** params.matmul_dim_exponent
    return max_efficiency * saturation * training_factor


def op_time_s(op: Op, device: DeviceSpec, cal: Calibration) -> float:
    params = cal.compute
    memory_s = op.bytes_moved / (device.hbm_bw_bytes_per_s * params.memory_efficiency)
    if op.kind in ("matmul", "attention", "conv"):
        peak = device.peak_for(op.dtype)
        min_dim = float(min(op.shape[1:])) if op.kind != "conv" and len(op.shape) == 4 else 0.0
        eff = matmul_efficiency(op.flops, peak, cal.max_efficiency(device.name, op.dtype), cal,
                                cal.training_factor(device.name), min_dim)
        if op.kind == "attention":
            eff *= params.attention_efficiency
        compute_s = op.flops / (peak * eff)
        return max(compute_s, memory_s) + params.kernel_overhead_s
    return memory_s + params.kernel_overhead_s


def ops_time_s(ops: tuple[Op, ...], device: DeviceSpec, cal: Calibration) -> float:
    return sum(op_time_s(op, device, cal) for op in ops)


class OpCostModel(Protocol):
    """Seconds of one op on one device. The roofline below is the default; a profile database, a learned
    model or a chain of them can stand in (cost/profiled.py)."""

    name: str

    def op_time_s(self, op: Op, device: DeviceSpec) -> float: ...


class RooflineCosts:
    """The calibrated roofline as an OpCostModel."""

    name = "roofline"

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal

    def op_time_s(self, op: Op, device: DeviceSpec) -> float:
        return op_time_s(op, device, self.cal)
