"""`trainsim calibrate`: fit the cost models on measured runs and microbenchmarks; optionally cross-validate.

A user fit (`--runs MY.csv --output MY.yaml`) goes where --output says; the package's own fit
(catalog/data/calibration/fitted.yaml) is rewritten only with --update-package, never by default.
"""

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainsim.catalog.calibration import FITTED_PATH, MEASUREMENTS_DIR
from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError

if TYPE_CHECKING:  # NB: the fitting code loads when the command runs, not when help lists the commands
    from trainsim.calibrate.bands import HeldOut
    from trainsim.calibrate.fit import FitProgress

MAX_WORKERS = 64  # processes for the cross-validation splits (there are about a dozen splits)
RUNS_HELP = ("measured runs in the schema of runs.csv (the package's measurements/README.md); repeat for several "
             "files (default: the package's runs.csv and runs_multinode.csv)")


@handles_errors
def calibrate(
    runs: Annotated[list[Path] | None, typer.Option(help=RUNS_HELP)] = None,
    output: Annotated[Path | None, typer.Option(help="where to write the fit (a YAML file for --calibration)")
                      ] = None,
    update_package: Annotated[bool, typer.Option("--update-package", help="rewrite the package's own fit "
                                                 f"({FITTED_PATH.name}) instead of --output")] = False,
    data: Annotated[Path | None, typer.Option(help="folder with gemm.csv and collectives.csv (default: the "
                                              "package's measurements; --bands-from reads neither)")] = None,
    cross_validate: Annotated[bool, typer.Option("--cross-validate", help="k-fold, leave-one-source-out and scale-"
                                                 "extrapolation errors and band coverage instead of a fit")] = False,
    folds: Annotated[int, typer.Option(help="folds of the k-fold cross-validation")] = 5,
    sim: Annotated[bool, typer.Option("--sim/--no-sim", help="also fit the simulator's runtime behaviours "
                                      "(overlap slow-down) through the simulator")] = True,
    bands: Annotated[bool, typer.Option("--bands/--no-bands", help="cross-validate for the uncertainty bands of "
                                        "every prediction (a refit per fold, per source and for scale)")] = True,
    cold: Annotated[bool, typer.Option("--cold", help="fit each cross-validation split from the priors to the full "
                                       "tolerance, not from the fit on all runs to 0.1% (about ten times slower; the "
                                       "warm splits can be optimistic: README, Validation)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the cross-validation as one JSON object")] = False,
    report: Annotated[Path | None, typer.Option(help="also write the cross-validation report (JSON) here")] = None,
    held_out: Annotated[Path | None, typer.Option("--held-out", help="also write every held-out prediction (CSV: "
                                                  "split, run, log(predicted / measured), band group) here")
                        ] = None,
    bands_from: Annotated[Path | None, typer.Option("--bands-from", help="fit nothing: make the bands of the fit "
                                                    "at --output (or the package's, --update-package) again from "
                                                    "held-out predictions written by --held-out; its fitted "
                                                    "parameters stay as they are")] = None,
    start: Annotated[Path | None, typer.Option(help="an earlier fit (a calibration YAML) to start the run-level "
                                               "fit from: the same fit, sooner")] = None,
    tolerance: Annotated[float | None, typer.Option(help="the run-level fit and each cross-validation split stop "
                                                    "when an iteration changes the cost, parameters or gradient "
                                                    "by less than this, relative (default: 1e-8 for the fit, "
                                                    "0.1% for the warm splits)")] = None,
    workers: Annotated[int, typer.Option(help="processes: the fit's finite differences side by side, then the "
                                         "cross-validation splits (one process each)")] = 1,
) -> None:
    """Fit GEMM efficiency, collective alpha-beta and framework parameters on measured data."""
    from trainsim.calibrate import fit

    if folds < 2:
        raise ConfigError("folds", folds, "must be 2 or more")
    if tolerance is not None and not (math.isfinite(tolerance) and 1e-12 <= tolerance <= 1e-2):
        raise ConfigError("tolerance", tolerance, "must be between 1e-12 and 0.01")
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError("workers", workers, f"must be 1 to {MAX_WORKERS}")
    from trainsim.catalog.calibration import read_calibration

    start_cal = read_calibration(start) if start is not None else None
    data_dir = data if data is not None else MEASUREMENTS_DIR
    if cross_validate and bands_from is not None:
        raise ConfigError("bands_from", str(bands_from), "makes a fit's bands again; --cross-validate makes no fit")
    if bands_from is not None:  # NB: reads no microbenchmarks, so --data need not hold them
        target = _target(output, update_package)
        fit.write_calibration(fit.rebanded(target, bands_from, runs), target, writer="`trainsim calibrate "
                              "--bands-from`")
        typer.echo(f"wrote {target}: bands from the held-out predictions in {bands_from}", err=as_json)
        return
    fit.check_data_dir(data_dir)
    if cross_validate:
        with _progress() as hooks:
            validated = fit.cross_validate(data_dir, runs, folds=folds, cold=cold, progress=hooks,
                                           start=start_cal, workers=workers, tolerance=tolerance)
        _write_held_out(validated.records, held_out)
        _show(validated.summary, report, as_json)
        return
    target = _target(output, update_package)
    with _progress() as hooks:
        fitted = fit.calibrate(data_dir, runs, sim=sim, bands=bands, folds=folds, cold=cold, progress=hooks,
                               start=start_cal, workers=workers, tolerance=tolerance)
    fit.write_calibration(fitted.calibration, target)
    _write_held_out(fitted.records, held_out)
    figures = fitted.calibration.fit_report
    held = f", held-out {figures['held_out_mape_pct']:.2f}%" if "held_out_mape_pct" in figures else ""
    typer.echo(f"wrote {target}: iteration-time MAPE on the {figures['runs']:.0f} runs fitted "
               f"{figures['train_mape_pct']:.2f}%{held}", err=not as_json)
    if fitted.cross_validation is not None:
        _show(fitted.cross_validation, report, as_json)


def _show(summary: dict[str, object], report: Path | None, as_json: bool) -> None:
    from trainsim.calibrate.fit import write_text
    from trainsim.report.calibration import json_safe, render_cross_validation

    text = json.dumps(json_safe(summary), indent=2)
    if report is not None:
        write_text(report, text + "\n")
    typer.echo(text if as_json else render_cross_validation(summary), nl=as_json)


def _write_held_out(records: "list[HeldOut]", path: Path | None) -> None:
    from trainsim.calibrate.bands import held_out_csv
    from trainsim.calibrate.fit import write_text

    if path is not None:
        write_text(path, held_out_csv(records))


def _target(output: Path | None, update_package: bool) -> Path:
    """Where the fit goes; the package's own fit only when asked with --update-package."""
    if update_package and output is not None:
        raise ConfigError("output", str(output), "give --output or --update-package, not both")
    if update_package:
        return FITTED_PATH
    if output is None:
        raise ConfigError("output", None, "pass --output FILE.yaml for your fit (predict, search and validate read "
                          "it with --calibration FILE.yaml), or --update-package to rewrite the package's own fit")
    if output.resolve() == FITTED_PATH.resolve():
        raise ConfigError("output", str(output), "is the package's own fit: rewrite it with --update-package")
    if output.is_dir():
        raise ConfigError("output", str(output), "is a folder: name a YAML file")
    return output


@contextmanager
def _progress() -> "Iterator[FitProgress]":
    """A progress bar on stderr (when it is a terminal): the fit running, its number among all, evaluations."""
    from trainsim.calibrate.fit import FitProgress

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[evaluations]} evaluations"), TimeElapsedColumn())
    terminal = sys.stderr.isatty()
    with Progress(*columns, console=Console(stderr=True), transient=True, disable=not terminal) as bar:
        task = bar.add_task("calibrating", total=None, evaluations=0)
        count = [0]

        def stage(name: str, index: int, total: int) -> None:
            bar.update(task, description=name, completed=index, total=total)
            if not terminal:  # a log: one line per fit
                typer.echo(f"[{index + 1}/{total}] {name} (after {count[0]} evaluations)", err=True)

        def evaluation() -> None:
            count[0] += 1
            bar.update(task, evaluations=count[0])

        yield FitProgress(stage=stage, evaluation=evaluation)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
