"""Fit the compute and communication cost models on the microbenchmarks (gemm.csv, collectives.csv)."""

import csv
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.catalog.calibration import Calibration, CommParams, ComputeParams
from trainsim.catalog.files import DATA_DIR, read_mapping
from trainsim.catalog.loader import load_cluster, load_device
from trainsim.comm.collectives import collective_time_s
from trainsim.cost.compute import matmul_efficiency
from trainsim.errors import TrainsimError
from trainsim.hardware.device import DType


@cache
def name_map() -> dict[str, Any]:
    return read_mapping(DATA_DIR / "calibration" / "name_map.yaml")


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def fit_matmul_max_efficiency(gemm_csv: Path) -> dict[str, dict[str, float]]:
    """Best achieved / dense peak per device and dtype: the MAMF rows (a shape search's best GEMM) and the
    best XLA-table shape, whichever is higher."""
    names = name_map()
    best: dict[str, dict[str, float]] = {}
    for row in _read_csv(gemm_csv):
        devices = names["gemm_gpu"].get(row["gpu"], [])
        dtype = names["gemm_dtype"].get(row["dtype"])
        if not devices or dtype is None:
            continue
        for name in devices:
            efficiency = float(row["tflops"]) * 1e12 / load_device(name).peak_for(dtype)
            per_dtype = best.setdefault(name, {})
            per_dtype[dtype] = round(max(per_dtype.get(dtype, 0.0), min(efficiency, 1.0)), 4)
    return best


def fit_matmul_curve(gemm_csv: Path, max_eff: dict[str, dict[str, float]]) -> dict[str, float]:
    """Fit the GEMM efficiency curve (compute.matmul_efficiency: half work per TFLOP/s of peak and its
    exponent, half smallest-dimension and its exponent) on the per-shape XLA rows, in log space."""
    from scipy.optimize import least_squares

    names = name_map()
    samples: list[tuple[float, float, float, float, float]] = []  # work, peak, max eff, min dim, measured eff
    for row in _read_csv(gemm_csv):
        if "matmul_interpolator" not in row["source"]:
            continue
        dtype: DType | None = names["gemm_dtype"].get(row["dtype"])
        devices = names["gemm_gpu"].get(row["gpu"], [])
        if dtype is None or not devices:
            continue
        device = load_device(devices[0])
        dims = [float(row["M"]), float(row["N"]), float(row["K"])]
        work = 2.0 * float(row["batch"]) * dims[0] * dims[1] * dims[2]
        peak = device.peak_for(dtype)
        samples.append((work, peak, max_eff[device.name][dtype], min(dims), float(row["tflops"]) * 1e12 / peak))
    data = np.array(samples)

    def residuals(theta: np.ndarray) -> np.ndarray:
        cal = Calibration(compute=ComputeParams(
            matmul_half_work_flop_per_tflops=math.exp(theta[0]), matmul_exponent=float(theta[1]),
            matmul_half_dim=math.exp(theta[2]), matmul_dim_exponent=float(theta[3])))
        model = np.array([matmul_efficiency(work, peak, max_eff, cal, 1.0, dim)
                          for work, peak, max_eff, dim, _ in samples])
        return np.log(model) - np.log(data[:, 4])

    fit = least_squares(residuals, x0=np.array([math.log(2e7), 0.9, math.log(16.0), 0.9]),
                        bounds=([0.0, 0.2, 0.0, 0.2], [40.0, 4.0, 10.0, 1.0]))
    return {"matmul_half_work_flop_per_tflops": float(math.exp(fit.x[0])), "matmul_exponent": float(fit.x[1]),
            "matmul_half_dim": float(math.exp(fit.x[2])), "matmul_dim_exponent": float(fit.x[3])}


def _collective_samples(collectives_csv: Path) -> dict[str, list[tuple[Any, int, float, float]]]:
    names = name_map()
    samples: dict[str, list[tuple[Any, int, float, float]]] = {}
    for row in _read_csv(collectives_csv):
        system = names["collective_system"].get(row["gpu"])
        collective = names["collective_name"].get(row["collective"])
        if system is None or collective is None or row["num_nodes"] not in ("", "1") or not row["time_us"]:
            continue
        try:
            cluster = load_cluster(system)
        except TrainsimError:
            continue
        ranks = int(row["num_gpus"] or 2)
        if ranks > cluster.gpus_per_node:
            continue
        samples.setdefault(collective, []).append(
            (cluster.with_num_gpus(ranks), ranks, float(row["message_size_bytes"]), float(row["time_us"]) * 1e-6))
    return samples


def _fit_one(collective: str, samples: list[tuple[Any, int, float, float]]) -> CommParams:
    """Least squares in log space of the alpha-beta model over one collective's measurements."""
    from scipy.optimize import least_squares

    def residuals(theta: np.ndarray) -> np.ndarray:
        cal = Calibration(comm={collective: CommParams(latency_s=math.exp(theta[0]), bw_efficiency=float(theta[1]))})
        predicted = [collective_time_s(collective, size, cluster.group_layout(ranks, 1), cluster, cal)
                     for cluster, ranks, size, _ in samples]
        return np.log(np.array(predicted)) - np.log(np.array([s[3] for s in samples]))

    fit = least_squares(residuals, x0=np.array([math.log(5e-6), 0.8]),
                        bounds=([math.log(1e-8), 0.05], [math.log(1e-3), 1.5]))
    return CommParams(latency_s=float(math.exp(fit.x[0])), bw_efficiency=float(fit.x[1]))


def fit_collectives(collectives_csv: Path) -> tuple[dict[str, CommParams], dict[str, dict[str, CommParams]]]:
    """Per collective: extra latency per algorithm step and achieved / link bandwidth, fitted in log space
    over the single-node measurements, once over every system (the fallback) and once per GPU generation."""
    generation_of = name_map()["device_generation"]
    overall: dict[str, CommParams] = {}
    by_generation: dict[str, dict[str, CommParams]] = {}
    for collective, samples in sorted(_collective_samples(collectives_csv).items()):
        overall[collective] = _fit_one(collective, samples)
        groups: dict[str, list[tuple[Any, int, float, float]]] = {}
        for sample in samples:
            groups.setdefault(generation_of.get(sample[0].device.name, ""), []).append(sample)
        for generation, group in sorted(groups.items()):
            if generation:
                by_generation.setdefault(generation, {})[collective] = _fit_one(collective, group)
    return overall, by_generation
