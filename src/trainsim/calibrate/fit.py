"""`trainsim calibrate`: fit every cost-model parameter on shared/data/calibration and write fitted.yaml."""

import datetime
import math
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trainsim.calibrate.microbenchmarks import (
    fit_collectives,
    fit_matmul_curve,
    fit_matmul_max_efficiency,
    name_map,
)
from trainsim.calibrate.runs import FitSample, fit_runtime, fit_samples, fit_sim_runtime, log_errors
from trainsim.catalog.calibration import FITTED_PATH, Calibration, ComputeParams
from trainsim.errors import InputFileError
from trainsim.pipeline import GraphCache
from trainsim.validate.runs import read_runs

CALIBRATION_FILES = ("runs.csv", "gemm.csv", "collectives.csv")


def find_calibration_dir(start: Path | None = None) -> Path:
    """shared/data/calibration beside or above the working directory (where the project keeps it)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        for candidate in (folder / "shared" / "data" / "calibration", folder / "data" / "calibration"):
            if all((candidate / name).exists() for name in CALIBRATION_FILES):
                return candidate
    raise InputFileError("cannot find shared/data/calibration above the working directory; pass --data DIR")


def fit_micro(data_dir: Path) -> Calibration:
    max_eff = fit_matmul_max_efficiency(data_dir / "gemm.csv")
    curve = fit_matmul_curve(data_dir / "gemm.csv", max_eff)
    comm = fit_collectives(data_dir / "collectives.csv")
    return Calibration(
        source=f"trainsim calibrate on {data_dir.name}",
        compute=ComputeParams.model_validate(curve),
        matmul_max_efficiency=max_eff,
        comm=comm.comm,
        comm_by_generation=comm.comm_by_generation,
        comm_network=comm.comm_network,
        device_generation=dict(name_map()["device_generation"]),
    )


def calibrate(data_dir: Path, sim: bool = True) -> Calibration:
    """Microbenchmark fits, then the run-level fit through the analytical engine, then (sim=True) the
    simulator's runtime behaviours through the simulator."""
    base = fit_micro(data_dir)
    samples = fit_samples(read_runs(data_dir / "runs.csv"))
    fitted = fit_runtime(base, samples)
    if sim:
        fitted = fitted.model_copy(update={"sim_runtime": fit_sim_runtime(fitted, samples)})
    mape = _mape_of(fitted, samples)
    return fitted.model_copy(update={"fit_report": {"runs": float(len(samples)), "train_mape_pct": mape}})


def write_calibration(cal: Calibration, path: Path = FITTED_PATH) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    header = (f"# Written by `trainsim calibrate` on {datetime.date.today().isoformat()} from "
              "shared/data/calibration (runs.csv, gemm.csv, collectives.csv).\n# Do not edit by hand: rerun "
              "`trainsim calibrate` (or `make calibrate`).\n")
    body = yaml.safe_dump(_rounded(cal.model_dump()), sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fitted-", suffix=".yaml")
    with os.fdopen(handle, "w") as out:
        out.write(header + body)
    os.chmod(tmp, 0o644)  # mkstemp makes the file private; the fit is package data anyone may read
    os.replace(tmp, path)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _percent_errors(log_error: np.ndarray) -> list[float]:
    """|predicted / measured - 1| in percent, from log(predicted) - log(measured)."""
    return [abs(math.exp(e) - 1.0) * 100.0 for e in log_error]


def _mape_of(cal: Calibration, samples: list[FitSample]) -> float:
    errors = _percent_errors(log_errors(cal, samples, GraphCache()))
    return sum(errors) / len(errors)


def cross_validate(data_dir: Path, folds: int = 5, seed: int = 0) -> dict[str, dict[str, float]]:
    """Fit the run-level parameters on part of the runs and score iteration-time MAPE on the rest:
    k-fold over runs, and leave-one-source-out. The microbenchmark fits use no runs and are kept."""
    base = fit_micro(data_dir)
    samples = fit_samples(read_runs(data_dir / "runs.csv"))
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    report: dict[str, dict[str, float]] = {}
    held_out: list[tuple[FitSample, float]] = []
    for fold in range(folds):
        test = [samples[i] for i in order[fold::folds]]
        train = [samples[i] for i in order if i not in set(order[fold::folds])]
        fitted = fit_runtime(base, train)
        errors = log_errors(fitted, test, GraphCache())
        held_out += list(zip(test, _percent_errors(errors), strict=True))
    report["k-fold"] = _by_source(held_out)
    for source in sorted({s.source for s in samples}):
        train = [s for s in samples if s.source != source]
        test = [s for s in samples if s.source == source]
        fitted = fit_runtime(base, train)
        report.setdefault("leave-one-source-out", {})[source] = _mape_of(fitted, test)
    return report


def _by_source(pairs: list[tuple[FitSample, float]]) -> dict[str, float]:
    out: dict[str, list[float]] = {"ALL": []}
    for sample, error in pairs:
        out["ALL"].append(error)
        out.setdefault(sample.source, []).append(error)
    return {key: sum(values) / len(values) for key, values in out.items()}
