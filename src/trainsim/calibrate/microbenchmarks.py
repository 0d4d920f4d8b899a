"""Fit the compute and communication cost models on the microbenchmarks (gemm.csv, collectives.csv)."""

import csv
import itertools
import math
import re
from dataclasses import dataclass
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
from trainsim.hardware.cluster import ClusterSpec, GroupLayout
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


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One measured collective of collectives.csv as trainsim prices it."""

    collective: str
    system: str  # the row's `system`
    cluster: ClusterSpec  # the measured machine, scaled to the GPUs the measurement used
    layout: GroupLayout
    size_bytes: float
    time_s: float
    generation: str

    @property
    def scope(self) -> str:
        """multi-node (across NVLink domains) | NVL72 rack (inside an NVLink domain of several trays) | single
        node."""
        if self.layout.num_domains > 1:
            return "multi-node"
        return "NVL72 rack" if self.cluster.domain_capacity_gpus > self.cluster.gpus_per_node else "single node"


_GROUPS = re.compile(r"(\d+) groups x (\d+) devices; total devices (\d+)")
_BUS_FACTOR = {"all-reduce": lambda n: 2.0 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
               "reduce-scatter": lambda n: (n - 1) / n}


def _measured_time_s(row: dict[str, str], collective: str, ranks: int, size: float) -> float | None:
    """time_us, or the time the row's bandwidth implies (README section 9: algbw = bytes / time, busbw = algbw x
    the nccl-tests bus factor)."""
    if row["time_us"]:
        return float(row["time_us"]) * 1e-6
    if row["algbw_GBps"]:
        return size / (float(row["algbw_GBps"]) * 1e9)
    if row["busbw_GBps"] and collective in _BUS_FACTOR:
        return _BUS_FACTOR[collective](ranks) * size / (float(row["busbw_GBps"]) * 1e9)
    return None


def _row_sample(row: dict[str, str], names: dict[str, Any],
                clusters: dict[str, ClusterSpec]) -> CollectiveSample | None:
    """clusters: the catalog clusters loaded so far, by name (thousands of rows name a dozen systems)."""
    system = names["collective_system_by_system"].get(row["system"]) or names["collective_system"].get(row["gpu"])
    collective = names["collective_name"].get(row["collective"])
    if system is None or collective is None:
        return None
    size = float(row["message_size_bytes"])
    ranks = int(row["num_gpus"] or 2)
    seconds = _measured_time_s(row, collective, ranks, size)
    if seconds is None or seconds <= 0 or size <= 0:
        return None
    base = clusters.get(system)
    if base is None:
        base = clusters[system] = load_cluster(system)
    groups = _GROUPS.search(row["notes"]) or _GROUPS.search(row["algorithm_or_variant"])
    total = int(groups.group(3)) if groups else ranks
    nodes = int(row["num_nodes"] or 1)
    if nodes > 1:
        total = max(total, nodes * base.gpus_per_node)
    cluster = base.with_num_gpus(total)
    return CollectiveSample(collective, row["system"], cluster, cluster.group_layout(ranks, 1), size, seconds,
                            names["device_generation"].get(cluster.device.name, ""))


def collective_samples(collectives_csv: Path) -> list[CollectiveSample]:
    """Every row of collectives.csv with a collective trainsim prices and a system in the catalog (name_map)."""
    names = name_map()
    samples = []
    clusters: dict[str, ClusterSpec] = {}
    for row in _read_csv(collectives_csv):
        try:
            sample = _row_sample(row, names, clusters)
        except TrainsimError:
            continue
        if sample is not None:
            samples.append(sample)
    return samples


def predict_sample(sample: CollectiveSample, cal: Calibration) -> float:
    return collective_time_s(sample.collective, sample.size_bytes, sample.layout, sample.cluster, cal)


def _fit_one(collective: str, samples: list[CollectiveSample], network: CommParams) -> CommParams:
    """Least squares in log space (soft_l1: a few first-call outliers in the sweeps) of the collective model over
    one collective's single-domain measurements: the start-up and per-step latency added to NCCL's per protocol
    (comm/nccl_tuning.py), the NVLink bandwidth efficiency, and the NVLS efficiency where the rows ran on a
    multicast NVSwitch."""
    from scipy.optimize import least_squares

    nvls = collective == "all-reduce" and any(s.cluster.intra_node.multicast and s.layout.size > 2 for s in samples)
    measured = np.log(np.array([s.time_s for s in samples]))

    def params(theta: np.ndarray) -> CommParams:
        return CommParams(base_latency_s=math.exp(theta[0]), latency_s=math.exp(theta[1]),
                          bw_efficiency=float(theta[2]),
                          nvls_bw_efficiency=float(theta[3]) if nvls else CommParams().nvls_bw_efficiency)

    def residuals(theta: np.ndarray) -> np.ndarray:
        cal = Calibration(comm={collective: params(theta)}, comm_network=network)
        return np.log(np.array([predict_sample(s, cal) for s in samples])) - measured

    x0 = [math.log(8e-6), math.log(1e-6), 0.8]
    low, high = [math.log(1e-8), math.log(1e-9), 0.05], [math.log(1e-3), math.log(1e-4), 1.5]
    if nvls:
        x0, low, high = [*x0, 0.6], [*low, 0.05], [*high, 1.5]
    fit = least_squares(residuals, x0=np.array(x0), bounds=(low, high), loss="soft_l1", f_scale=0.3)
    return params(fit.x)


def _fit_network(samples: list[CollectiveSample], base: Calibration) -> CommParams:
    """The scale-out network's extra latency per step (over NCCL's hwLatencies[NET] and the link's) and achieved /
    NIC bandwidth, on the measurements that cross NVLink domains, with the per-collective parameters fixed."""
    from scipy.optimize import least_squares

    measured = np.log(np.array([s.time_s for s in samples]))

    def residuals(theta: np.ndarray) -> np.ndarray:
        cal = base.model_copy(update={"comm_network": CommParams(latency_s=math.exp(theta[0]),
                                                                 bw_efficiency=float(theta[1]))})
        return np.log(np.array([predict_sample(s, cal) for s in samples])) - measured

    # NB: soft_l1 in log space: the two smallest 4-node rows (32 and 64 KiB, 6.3 and 3.2 ms against a 0.4 ms
    # floor for every other size up to 4 MiB) are first-call outliers that would otherwise set the latency.
    fit = least_squares(residuals, x0=np.array([math.log(5e-6), 0.8]), loss="soft_l1", f_scale=0.3,
                        bounds=([math.log(1e-8), 0.05], [math.log(1e-2), 1.5]))
    return CommParams(latency_s=float(math.exp(fit.x[0])), bw_efficiency=float(fit.x[1]))


# The network step latency of a fabric without measurements is NCCL's own (comm/nccl_tuning.py: hwLatencies[NET]
# per algorithm and protocol, e.g. 14 us a Simple ring step; NCCL 2.29.7 src/graph/tuning.cc) and the link's
# latency: no fitted extra on top.
NCCL_NET_EXTRA_STEP_LATENCY_S = 0.0


@dataclass(frozen=True)
class CommFit:
    comm: dict[str, CommParams]  # over every system: the fallback
    comm_by_generation: dict[str, dict[str, CommParams]]
    comm_network: CommParams  # a fabric without measurements
    comm_network_by_fabric: dict[str, CommParams]


def fit_networks(across: list[CollectiveSample], base: Calibration) -> tuple[CommParams, dict[str, CommParams]]:
    """The network's extra step latency (over NCCL's) and achieved / NIC bandwidth per fabric with measurements
    across NVLink domains; for any other fabric NCCL's own step latency (no extra) and the measured fabrics' mean
    bandwidth efficiency (the only measurement of how much of a NIC's line rate a ring reaches)."""
    by_fabric = {fabric: _fit_network([s for s in across if s.cluster.inter_node.kind == fabric], base)
                 for fabric in sorted({s.cluster.inter_node.kind for s in across})}
    efficiency = float(np.mean([p.bw_efficiency for p in by_fabric.values()])) if by_fabric \
        else CommParams().bw_efficiency
    return CommParams(latency_s=NCCL_NET_EXTRA_STEP_LATENCY_S, bw_efficiency=efficiency), by_fabric


def fit_collectives(collectives_csv: Path) -> CommFit:
    """Per collective: extra latency per algorithm step and achieved / link bandwidth (and NVLS efficiency),
    fitted in log space over the measurements inside one NVLink domain, once over every system (the fallback)
    and once per GPU generation; then the network's latency and efficiency over the rows across domains, per
    fabric (fit_networks)."""
    samples = collective_samples(collectives_csv)
    inside = [s for s in samples if s.layout.num_domains == 1]
    across = [s for s in samples if s.layout.num_domains > 1]
    prior = CommParams()
    overall: dict[str, CommParams] = {}
    by_generation: dict[str, dict[str, CommParams]] = {}
    for collective in sorted({s.collective for s in inside}):
        mine = [s for s in inside if s.collective == collective]
        overall[collective] = _fit_one(collective, mine, prior)
        for generation in sorted({s.generation for s in mine if s.generation}):
            group = [s for s in mine if s.generation == generation]
            by_generation.setdefault(generation, {})[collective] = _fit_one(collective, group, prior)
    base = Calibration(comm=overall, comm_by_generation=by_generation,
                       device_generation=dict(name_map()["device_generation"]))
    network, by_fabric = fit_networks(across, base)
    return CommFit(overall, by_generation, network, by_fabric)


SIZE_BANDS = (("< 1 MB", 0.0, 1e6), ("1-64 MB", 1e6, 64e6), ("> 64 MB", 64e6, math.inf))


def collective_mape(samples: list[CollectiveSample], cal: Calibration) -> dict[tuple[str, str, str], tuple[int, float]]:
    """Row count and MAPE (%) per (collective, scope, size band), with "all" rolled up on each key part."""
    errors: dict[tuple[str, str, str], list[float]] = {}
    for sample in samples:
        error = abs(predict_sample(sample, cal) / sample.time_s - 1.0) * 100.0
        band = next(name for name, low, high in SIZE_BANDS if low <= sample.size_bytes < high)
        for key in itertools.product((sample.collective, "all"), (sample.scope, "all"), (band, "all")):
            errors.setdefault(key, []).append(error)
    return {key: (len(values), sum(values) / len(values)) for key, values in errors.items()}
