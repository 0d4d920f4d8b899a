"""`trainsim calibrate`: fit every cost-model parameter on measured data and write a calibration file.

The measurements are the package's own copy (catalog/data/measurements, MEASUREMENTS_DIR) unless the user names
theirs: runs in the runs.csv schema (--runs, several allowed) and a folder with gemm.csv and collectives.csv
(--data). The fit is the microbenchmark fits, the run-level fit through the analytical engine, optionally the
simulator's runtime behaviours, and the cross-validation whose held-out errors become the bands every
prediction carries (crossval.py).
"""

import datetime
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trainsim.calibrate.bands import HeldOut, read_held_out, uncertainty_of
from trainsim.calibrate.crossval import Split, held_out, splits, summary
from trainsim.calibrate.jacobian import can_fork
from trainsim.calibrate.microbenchmarks import (
    fit_collectives,
    fit_matmul_curve,
    fit_matmul_max_efficiency,
    name_map,
)
from trainsim.calibrate.runs import FitSample, fit_runtime, fit_samples, fit_sim_runtime, log_errors
from trainsim.catalog.calibration import (
    DEFAULT_RUNS_FILES,
    FITTED_PATH,
    MEASUREMENTS_DIR,
    Calibration,
    ComputeParams,
    load_calibration,
    read_calibration,
)
from trainsim.catalog.files import write_atomic
from trainsim.errors import InputFileError
from trainsim.pipeline import GraphCache
from trainsim.validate.runs import read_runs

MICROBENCHMARK_FILES = ("gemm.csv", "collectives.csv")


def find_calibration_dir(start: Path | None = None) -> Path:
    """The folder of calibration measurements: the package's shipped copy (MEASUREMENTS_DIR), which equals the
    project's shared/data/calibration (scripts/sync_calibration_data.py). start: ignored (kept for callers of the
    former search above the working directory)."""
    return MEASUREMENTS_DIR


def default_runs_files(data_dir: Path = MEASUREMENTS_DIR) -> list[Path]:
    return [data_dir / name for name in DEFAULT_RUNS_FILES]


def _runs_or_default(runs_files: Sequence[Path] | None) -> list[Path]:
    """The runs files asked for, else the package's (default_runs_files)."""
    return list(runs_files) if runs_files is not None else default_runs_files()


def check_data_dir(data_dir: Path) -> None:
    missing = [name for name in MICROBENCHMARK_FILES if not (data_dir / name).is_file()]
    if missing:
        raise InputFileError(f"data={data_dir} lacks {', '.join(missing)}: the folder must hold the GEMM and "
                             "collective microbenchmarks (gemm.csv, collectives.csv)")


@dataclass(slots=True)
class FitProgress:
    """Hooks for a progress display: stage(name, index, count) as each fit starts, evaluation() per evaluation
    of a fit's residuals (each predicts every run once)."""

    stage: Callable[[str, int, int], None] = field(default=lambda name, index, count: None)
    evaluation: Callable[[], None] = field(default=lambda: None)


FULL_TOLERANCE = 1e-8  # the run-level fit's, unless --tolerance says otherwise (runs.fit_runtime's default)


def fit_micro(data_dir: Path) -> Calibration:
    check_data_dir(data_dir)
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
        comm_network_by_fabric=comm.comm_network_by_fabric,
        device_generation=dict(name_map()["device_generation"]),
    )


def read_samples(runs_files: Sequence[Path]) -> list[FitSample]:
    """Every run with a measured iteration time whose job can be built, from every file."""
    samples = [sample for path in runs_files for sample in fit_samples(read_runs(path))]
    if not samples:
        names = ", ".join(str(p) for p in runs_files)
        raise InputFileError(f"runs={names}: no run with a metric iteration_time_s whose job trainsim can build; "
                             "the fit needs at least one")
    return samples


@dataclass(frozen=True, slots=True)
class Fitted:
    """A fit and its cross-validation report (crossval.summary; None without bands) and held-out predictions."""

    calibration: Calibration
    cross_validation: dict[str, object] | None
    records: list[HeldOut] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CrossValidated:
    """The cross-validation report (crossval.summary) and the held-out predictions it comes from."""

    summary: dict[str, object]
    records: list[HeldOut]


def calibrate(data_dir: Path = MEASUREMENTS_DIR, runs_files: Sequence[Path] | None = None, *, sim: bool = True,
              bands: bool = True, folds: int = 5, cold: bool = False, progress: FitProgress | None = None,
              start: Calibration | None = None, workers: int = 1, tolerance: float | None = None) -> Fitted:
    """Microbenchmark fits, then the run-level fit through the analytical engine, then (bands=True) the
    cross-validation whose held-out errors give the uncertainty bands (each split's fit from the run-level fit's
    parameters; cold=True: from the priors), then (sim=True) the simulator's runtime behaviours through the
    simulator. runs_files: default the package's runs (DEFAULT_RUNS_FILES). start: an earlier fit whose
    parameters the run-level fit starts from (to the same tolerance: it ends where a fit from the priors would,
    sooner). workers: processes for the run-level fit's Jacobian columns, then for the cross-validation splits
    (each split's fit in a process of its own). tolerance: the run-level fit's and each split's (default: the
    full fit's 1e-8 and crossval.WARM_TOLERANCE)."""
    progress = progress or FitProgress()
    runs = _runs_or_default(runs_files)
    samples = read_samples(runs)  # NB: before the microbenchmark fits, so a bad runs file fails at once
    base = fit_micro(data_dir)
    plan = splits(samples, folds) if bands else []
    count = 1 + int(sim) + len(plan)
    progress.stage(f"run-level fit on {len(samples)} runs", 0, count)
    fitted = fit_runtime(base, samples, progress=progress.evaluation, start=start, workers=workers,
                         tolerance=FULL_TOLERANCE if tolerance is None else tolerance)
    records = _held_out_all(base, plan, progress, 1, count, None if cold else fitted, workers, tolerance)
    if sim:
        progress.stage("simulator runtime fit", count - 1, count)
        fitted = fitted.model_copy(update={"sim_runtime": fit_sim_runtime(fitted, samples, progress.evaluation)})
    uncertainty = uncertainty_of(records, samples, load_calibration().uncertainty) if bands else None
    report = {"runs": float(len(samples)), "train_mape_pct": _mape_of(fitted, samples)}
    if records:
        report["held_out_mape_pct"] = sum(r.percent_error for r in records) / len(records)
    cal = fitted.model_copy(update={"fit_report": report, "uncertainty": uncertainty,
                                    "source": _source_text(data_dir, runs)})
    return Fitted(cal, summary(records, samples, uncertainty) if records else None, records)


def cross_validate(data_dir: Path = MEASUREMENTS_DIR, runs_files: Sequence[Path] | None = None, folds: int = 5,
                   cold: bool = False, progress: FitProgress | None = None, start: Calibration | None = None,
                   workers: int = 1, tolerance: float | None = None) -> CrossValidated:
    """Held-out iteration-time MAPE per scheme and source (k-fold, leave-one-source-out, scale extrapolation),
    the bands they give and the bands' coverage (crossval.summary). Each split's fit starts from the fit on all
    runs (cold=True: from the priors, and no fit on all runs); start, workers and tolerance as in calibrate."""
    progress = progress or FitProgress()
    samples = read_samples(_runs_or_default(runs_files))
    base = fit_micro(data_dir)
    plan = splits(samples, folds)
    splits_start = None  # the fit on all runs that every split starts from (none when cold)
    if not cold:
        progress.stage(f"run-level fit on {len(samples)} runs (the splits' start)", 0, len(plan) + 1)
        splits_start = fit_runtime(base, samples, progress=progress.evaluation, start=start, workers=workers,
                                   tolerance=FULL_TOLERANCE if tolerance is None else tolerance)
    first = 0 if cold else 1
    records = _held_out_all(base, plan, progress, first, len(plan) + first, splits_start, workers, tolerance)
    return CrossValidated(summary(records, samples, uncertainty_of(records, samples)), records)


def rebanded(fit_path: Path, held_out_path: Path, runs_files: Sequence[Path] | None = None) -> Calibration:
    """The fit at `fit_path` with its uncertainty bands made again from stored held-out predictions
    (`--held-out` of an earlier calibrate or cross-validation) and the runs they came from (stacks and GPU range;
    default the package's): no fit runs, and every fitted parameter stays as it is."""
    records = read_held_out(held_out_path)
    current = read_calibration(fit_path)
    samples = read_samples(_runs_or_default(runs_files))
    uncertainty = uncertainty_of(records, samples, load_calibration().uncertainty)
    kept = [part for part in current.source.split("; ") if not part.startswith("bands made again")]
    source = "; ".join([*kept, f"bands made again on {datetime.date.today().isoformat()} from held-out predictions"])
    return current.model_copy(update={"uncertainty": uncertainty, "source": source})


def _held_out_all(base: Calibration, plan: Sequence[Split], progress: FitProgress, first: int, count: int,
                  start: Calibration | None, workers: int = 1, tolerance: float | None = None) -> list[HeldOut]:
    if workers > 1 and len(plan) > 1:
        return _held_out_parallel(base, plan, progress, first, count, start, workers, tolerance)
    records: list[HeldOut] = []
    for index, split in enumerate(plan, start=first):
        progress.stage(f"cross-validation: {split.scheme}, {split.name}", index, count)
        records += held_out(base, split, progress.evaluation, start, tolerance)
    return records


def _held_out_parallel(base: Calibration, plan: Sequence[Split], progress: FitProgress, first: int, count: int,
                       start: Calibration | None, workers: int, tolerance: float | None) -> list[HeldOut]:
    """The splits in `workers` processes; records in the plan's order, whatever order they finish in."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: dict[int, list[HeldOut]] = {}
    context = multiprocessing.get_context("fork" if can_fork() else None)
    with ProcessPoolExecutor(max_workers=min(workers, len(plan)), mp_context=context) as pool:
        futures = {pool.submit(held_out, base, split, None, start, tolerance): index
                   for index, split in enumerate(plan)}
        for done, future in enumerate(as_completed(futures), start=first):
            index = futures[future]
            results[index] = future.result()
            split = plan[index]
            progress.stage(f"cross-validation: {split.scheme}, {split.name} done", done, count)
    return [record for index in range(len(plan)) for record in results[index]]


def _source_text(data_dir: Path, runs: Sequence[Path]) -> str:
    shown = [p.name if p.parent == MEASUREMENTS_DIR else str(p) for p in runs]
    folder = "the package's measurements" if data_dir == MEASUREMENTS_DIR else str(data_dir)
    return f"trainsim calibrate on {', '.join(shown)} ({folder} for the microbenchmarks)"


def write_calibration(cal: Calibration, path: Path = FITTED_PATH, writer: str = "`trainsim calibrate`") -> None:
    header = (f"# Written by {writer} on {datetime.date.today().isoformat()}: {cal.source}.\n"
              "# Do not edit by hand: rerun `trainsim calibrate`.\n")
    write_text(path, header + yaml.safe_dump(_rounded(cal.model_dump(mode="json")), sort_keys=True))


def write_text(path: Path, text: str) -> None:
    """write_atomic, into the target's folder, made where missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _percent_errors(log_error: np.ndarray) -> list[float]:
    """|predicted / measured - 1| in percent, from log(predicted) - log(measured)."""
    return [abs(math.exp(e) - 1.0) * 100.0 for e in log_error]


def _mape_of(cal: Calibration, samples: list[FitSample]) -> float:
    errors = _percent_errors(log_errors(cal, samples, GraphCache()))
    return sum(errors) / len(errors)
