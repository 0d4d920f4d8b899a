"""Roofline op costs: time = max(FLOPs / achieved FLOP/s, bytes / achieved HBM bandwidth) + launch overhead."""

from typing import Protocol

from trainsim.catalog.calibration import Calibration
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import Op


def _floor(size: float, half: float, exponent: float) -> float:
    """The size below which 1 / (1 + (half / size)^exponent) would make a smaller GEMM slower: for exponent > 1,
    size * (1 + (half / size)^exponent) is smallest at half * (exponent - 1)^(1 / exponent). Below it a GEMM
    takes that minimum time (a launch floor), so time never grows as work shrinks."""
    return half * (exponent - 1.0) ** (1.0 / exponent) if exponent > 1.0 else 0.0


def matmul_efficiency(work_flop: float, peak_flops_per_s: float, max_efficiency: float,
                      cal: Calibration, training_factor: float = 1.0, min_dim: float = 0.0) -> float:
    """Achieved / peak for one GEMM, so that time = work / (peak * efficiency).

    time x peak x max_efficiency = W (1 + (half / W)^a) + W (half_dim / d)^b, with W floored (see _floor):
    NB: bigger devices need bigger GEMMs to fill, so the half-work point scales with the peak (Williams et al.
    roofline argument: fixed launch and tail cost per wave); a skinny GEMM (small smallest dimension d) loses
    more (tile quantization). Additive terms with b <= 1 keep a GEMM that is smaller in every dimension no
    slower than a larger one. min_dim=0: unknown shape (no skinny term)."""
    params = cal.compute
    half_work = params.matmul_half_work_flop_per_tflops * peak_flops_per_s / 1e12
    work = max(work_flop, 1.0)
    floored = max(work, _floor(half_work, half_work, params.matmul_exponent))
    scaled_time = floored * (1.0 + (half_work / floored) ** params.matmul_exponent)
    if min_dim > 0:
        scaled_time += work * (params.matmul_half_dim / min_dim) ** params.matmul_dim_exponent
    return max_efficiency * work / scaled_time * training_factor


def attention_efficiency(kernel: str, device: DeviceSpec, cal: Calibration) -> float:
    """Achieved / matmul efficiency of an attention kernel. math runs its two batched GEMMs as GEMMs (its score
    traffic is in the op's bytes); flash3 on a device without it runs as flash2."""
    if kernel == "math":
        return 1.0
    if kernel == "flash3" and "flash3" in device.attention_kernels:
        return cal.compute.flash3_attention_efficiency
    return cal.compute.attention_efficiency


def key_loop_efficiency(op: Op, cal: Calibration) -> float:
    """A fused attention kernel's rate at key length kv, as a share of its long-sequence rate: kv / (kv + half).

    NB: each thread block owns one query tile: it loads it, loops over the key and value tiles, then rescales and
    writes its output once (FlashAttention-2, Dao 2023, Algorithm 1 and section 3.2; FlashAttention-3 and cuDNN's
    fused attention likewise); that fixed cost per query tile, and the causal mask's diagonal tiles computed
    whole, are amortised over the key loop. Measured on an H100 (torch SDPA, causal, bf16, head dims 64-128,
    data/ground-truth/h100-kernels), FlashAttention-2's and cuDNN's forward + backward rates follow this form
    over 512-16,384 keys. half = cal.compute.attention_half_kv_tokens (0: no such cost). The unfused kernel
    (math) runs its GEMMs as GEMMs: 1."""
    half = cal.compute.attention_half_kv_tokens
    if op.kernel == "math" or half <= 0.0:
        return 1.0
    kv_tokens = float(op.shape[2])
    return kv_tokens / (kv_tokens + half)


def op_time_s(op: Op, device: DeviceSpec, cal: Calibration) -> float:
    params = cal.compute
    memory_s = op.bytes_moved / (device.hbm_bw_bytes_per_s * params.memory_efficiency)
    if op.kind in ("matmul", "attention", "conv"):
        peak = device.peak_for(op.dtype)
        min_dim = float(min(op.shape[1:])) if op.kind != "conv" and len(op.shape) == 4 else 0.0
        max_eff = cal.max_efficiency(device.name, op.dtype)
        eff = matmul_efficiency(op.flops, peak, max_eff, cal, cal.training_factor(device.name), min_dim)
        if op.kind == "attention":  # no kernel beats the device's best GEMM (its MAMF)
            eff = min(eff * attention_efficiency(op.kernel, device, cal) * key_loop_efficiency(op, cal), max_eff)
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
