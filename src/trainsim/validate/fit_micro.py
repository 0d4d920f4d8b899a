"""Fit the compute and communication cost models on the microbenchmarks (gemm.csv, collectives.csv)."""

import csv
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.catalog.files import DATA_DIR, read_mapping
from trainsim.catalog.loader import load_cluster, load_device
from trainsim.comm.collectives import collective_time_s
from trainsim.cost.calibration import Calibration, CommParams
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


def fit_matmul_curve(gemm_csv: Path, max_eff: dict[str, dict[str, float]]) -> tuple[float, float]:
    """Fit half_work (per TFLOP/s of peak) and exponent of eff(W) = max / (1 + (half / W)^exponent) on the
    per-shape XLA rows, in log space."""
    from scipy.optimize import least_squares

    names = name_map()
    samples: list[tuple[float, float, float, float]] = []  # work, peak, max efficiency, measured efficiency
    for row in _read_csv(gemm_csv):
        if "matmul_interpolator" not in row["source"]:
            continue
        dtype: DType | None = names["gemm_dtype"].get(row["dtype"])
        devices = names["gemm_gpu"].get(row["gpu"], [])
        if dtype is None or not devices:
            continue
        device = load_device(devices[0])
        work = 2.0 * float(row["batch"]) * float(row["M"]) * float(row["N"]) * float(row["K"])
        peak = device.peak_for(dtype)
        samples.append((work, peak, max_eff[device.name][dtype], float(row["tflops"]) * 1e12 / peak))
    data = np.array(samples)

    def residuals(theta: np.ndarray) -> np.ndarray:
        half = math.exp(theta[0]) * data[:, 1] / 1e12
        model = data[:, 2] / (1.0 + (half / data[:, 0]) ** theta[1])
        return np.log(model) - np.log(data[:, 3])

    fit = least_squares(residuals, x0=np.array([math.log(2e7), 1.0]), bounds=([0.0, 0.2], [40.0, 4.0]))
    return float(math.exp(fit.x[0])), float(fit.x[1])


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


def fit_collectives(collectives_csv: Path) -> dict[str, CommParams]:
    """Per collective: extra latency per algorithm step and achieved / link bandwidth, fitted in log space
    over every single-node measurement of every system."""
    from scipy.optimize import least_squares

    fitted: dict[str, CommParams] = {}
    for collective, samples in sorted(_collective_samples(collectives_csv).items()):

        def residuals(theta: np.ndarray, samples: list[tuple[Any, int, float, float]] = samples,
                      collective: str = collective) -> np.ndarray:
            cal = Calibration(comm={collective: CommParams(latency_s=math.exp(theta[0]),
                                                           bw_efficiency=float(theta[1]))})
            predicted = [collective_time_s(collective, size, cluster.group_layout(ranks, 1), cluster, cal)
                         for cluster, ranks, size, _ in samples]
            return np.log(np.array(predicted)) - np.log(np.array([s[3] for s in samples]))

        fit = least_squares(residuals, x0=np.array([math.log(5e-6), 0.8]),
                            bounds=([math.log(1e-8), 0.05], [math.log(1e-3), 1.5]))
        fitted[collective] = CommParams(latency_s=float(math.exp(fit.x[0])), bw_efficiency=float(fit.x[1]))
    return fitted
