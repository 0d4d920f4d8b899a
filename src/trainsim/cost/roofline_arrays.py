"""The calibrated roofline (cost/compute.py's op_time_s) over many ops at once: the search's grid engine prices
every op of its graphs in one pass (Pricer.add_op_times) instead of one Python call per op.

Each op's seconds equal compute.op_time_s's for the same op, device and calibration exactly: the same operations
on the same float64 values in the same order, numpy elementwise. The two powers are taken by Python's `**` on
each value (numpy's power of an exponent 2.0 squares, which can differ from pow() in the last bit).
tests/unit/cost/test_roofline_arrays.py holds them equal (==). The plain engine never imports this module
(numpy stays out of `trainsim predict`'s start-up).
"""

from collections.abc import Sequence

import numpy as np

from trainsim.catalog.calibration import Calibration
from trainsim.cost.compute import _floor, attention_efficiency, key_loop_efficiency
from trainsim.hardware.device import DeviceSpec, DType
from trainsim.ir.graph import Op

GEMM_KINDS = ("matmul", "attention", "conv")


def op_times_s(ops: Sequence[Op], device: DeviceSpec, cal: Calibration) -> list[float]:
    """compute.op_time_s(op, device, cal) of every op, in order."""
    params = cal.compute
    memory = np.array([op.bytes_moved for op in ops], dtype=np.float64) / \
        (device.hbm_bw_bytes_per_s * params.memory_efficiency)
    out = memory + params.kernel_overhead_s
    gemm = [index for index, op in enumerate(ops) if op.kind in GEMM_KINDS]
    if not gemm:
        return out.tolist()
    gemms = [ops[index] for index in gemm]
    # per (dtype, kernel): the peak, the best efficiency and the attention kernel's factor (1 for a GEMM)
    constants: dict[tuple[DType, str, bool], tuple[float, float, float]] = {}
    keys: list[tuple[DType, str, bool]] = [(op.dtype, op.kernel, op.kind == "attention") for op in gemms]
    for key in keys:
        if key not in constants:
            dtype, kernel, attends = key
            constants[key] = (device.peak_for(dtype), cal.max_efficiency(device.name, dtype),
                              attention_efficiency(kernel, device, cal) if attends else 1.0)
    peak, max_eff, attention = (np.array(column, dtype=np.float64) for column in
                                zip(*map(constants.__getitem__, keys), strict=True))
    flops = np.array([op.flops for op in gemms], dtype=np.float64)
    min_dim = [float(min(op.shape[1:])) if op.kind != "conv" and len(op.shape) == 4 else 0.0 for op in gemms]
    is_attention = np.array([op.kind == "attention" for op in gemms], dtype=np.bool_)
    key_loop = np.array([key_loop_efficiency(op, cal) if op.kind == "attention" else 1.0 for op in gemms],
                        dtype=np.float64)

    # compute.matmul_efficiency
    exponent = params.matmul_exponent
    half_work = params.matmul_half_work_flop_per_tflops * peak / 1e12
    work = np.maximum(flops, 1.0)
    floors = {value: _floor(value, value, exponent) for value in set(half_work.tolist())}
    floored = np.maximum(work, np.array([floors[value] for value in half_work.tolist()], dtype=np.float64))
    scaled_time = floored * (1.0 + np.array([ratio ** exponent for ratio in (half_work / floored).tolist()],
                                            dtype=np.float64))
    if any(dim > 0 for dim in min_dim):
        skinny = np.array([(params.matmul_half_dim / dim) ** params.matmul_dim_exponent if dim > 0 else 0.0
                           for dim in min_dim], dtype=np.float64)
        scaled_time = np.where(np.array(min_dim) > 0, scaled_time + work * skinny, scaled_time)
    eff = max_eff * work / scaled_time * cal.training_factor(device.name)
    eff = np.where(is_attention, np.minimum(eff * attention * key_loop, max_eff), eff)
    compute = flops / (peak * eff)
    out[gemm] = np.maximum(compute, memory[gemm]) + params.kernel_overhead_s
    return out.tolist()
