"""The calibrated roofline (cost/compute.py's op_time_s) over many ops at once: the search's grid engine prices
every op of its graphs in one pass (Pricer.add_op_times) instead of one Python call per op.

Each op's seconds equal compute.op_time_s's for the same op, device and calibration exactly: the same operations
on the same float64 values in the same order, numpy elementwise. The two powers are taken by Python's `**` on
each value (numpy's power of an exponent 2.0 squares, which can differ from pow() in the last bit).
tests/unit/cost/test_roofline_arrays.py holds them equal (==). The plain engine never imports this module
(numpy stays out of `trainsim predict`'s start-up).
"""

from collections.abc import Sequence
from itertools import compress
from operator import attrgetter

import numpy as np

from trainsim.catalog.calibration import Calibration
from trainsim.cost.compute import _floor, attention_efficiency
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import Op

GEMM_KINDS = ("matmul", "attention", "conv")


def op_times_s(ops: Sequence[Op], device: DeviceSpec, cal: Calibration) -> list[float]:
    """compute.op_time_s(op, device, cal) of every op, in order. NB: the ops' fields are read through map and
    attrgetter (one pass each at C speed); each power is taken once per distinct base (equal bases, equal
    powers)."""
    params = cal.compute
    count = len(ops)
    memory = np.fromiter(map(_BYTES, ops), np.float64, count) / (device.hbm_bw_bytes_per_s * params.memory_efficiency)
    out = memory + params.kernel_overhead_s
    gemm = list(compress(range(count), map(_GEMM_KINDS.__contains__, map(_KIND, ops))))
    if not gemm:
        return out.tolist()
    gemms = list(map(ops.__getitem__, gemm))
    # per (dtype, kernel, kind): the peak, the best efficiency and the attention kernel's factor (1 for a GEMM)
    constants: dict[tuple[str, str, str], tuple[float, float, float]] = {}
    keys = list(map(_CONSTANT_KEY, gemms))
    for key in set(keys):
        dtype, kernel, kind = key
        constants[key] = (device.peak_for(dtype), cal.max_efficiency(device.name, dtype),
                          attention_efficiency(kernel, device, cal) if kind == "attention" else 1.0)
    peak, max_eff, attention = (np.array(column, dtype=np.float64) for column in
                                zip(*map(constants.__getitem__, keys), strict=True))
    flops = np.fromiter(map(_FLOPS, gemms), np.float64, len(gemms))
    kinds = [key[2] for key in keys]
    min_dim = [float(min(shape[1:])) if len(shape) == 4 and kind != "conv" else 0.0
               for shape, kind in zip(map(_SHAPE, gemms), kinds, strict=True)]
    is_attention = np.array([kind == "attention" for kind in kinds], dtype=np.bool_)

    # compute.matmul_efficiency
    exponent = params.matmul_exponent
    half_work = params.matmul_half_work_flop_per_tflops * peak / 1e12
    work = np.maximum(flops, 1.0)
    floors = {value: _floor(value, value, exponent) for value in set(half_work.tolist())}
    floored = np.maximum(work, np.array([floors[value] for value in half_work.tolist()], dtype=np.float64))
    scaled_time = floored * (1.0 + np.array(_powers((half_work / floored).tolist(), exponent), dtype=np.float64))
    if any(dim > 0 for dim in min_dim):
        half_dim, dim_exponent = params.matmul_half_dim, params.matmul_dim_exponent
        skinny_of = {dim: (half_dim / dim) ** dim_exponent if dim > 0 else 0.0 for dim in set(min_dim)}
        skinny = np.array([skinny_of[dim] for dim in min_dim], dtype=np.float64)
        scaled_time = np.where(np.array(min_dim) > 0, scaled_time + work * skinny, scaled_time)
    eff = max_eff * work / scaled_time * cal.training_factor(device.name)
    eff = np.where(is_attention, np.minimum(eff * attention, max_eff), eff)
    compute = flops / (peak * eff)
    out[gemm] = np.maximum(compute, memory[gemm]) + params.kernel_overhead_s
    return out.tolist()


def _powers(bases: list[float], exponent: float) -> list[float]:
    """base ** exponent of each base (Python's pow, as compute.matmul_efficiency), once per distinct base."""
    power = {base: base ** exponent for base in set(bases)}
    return [power[base] for base in bases]


_BYTES = attrgetter("bytes_moved")
_FLOPS = attrgetter("flops")
_KIND = attrgetter("kind")
_SHAPE = attrgetter("shape")
_CONSTANT_KEY = attrgetter("dtype", "kernel", "kind")
_GEMM_KINDS = frozenset(GEMM_KINDS)
