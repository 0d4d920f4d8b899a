"""`trainsim calibrate`: refit the cost models on the calibration data; optionally cross-validate."""

import json
from pathlib import Path
from typing import Annotated

import typer

from trainsim.catalog.calibration import FITTED_PATH
from trainsim.cli.errors import handles_errors


@handles_errors
def calibrate(
    data: Annotated[Path | None, typer.Option(help="folder with runs.csv, gemm.csv, collectives.csv")] = None,
    output: Annotated[Path, typer.Option(help="where to write the fitted parameters")] = FITTED_PATH,
    cross_validate: Annotated[bool, typer.Option("--cross-validate", help="k-fold and leave-one-source-out "
                                                  "iteration-time MAPE instead of writing a fit")] = False,
    folds: Annotated[int, typer.Option(help="folds for --cross-validate")] = 5,
    sim: Annotated[bool, typer.Option("--sim/--no-sim", help="also fit the simulator's runtime behaviours "
                                      "(overlap slow-down; about 6 more minutes)")] = True,
) -> None:
    """Fit GEMM efficiency, collective alpha-beta and framework parameters on measured data."""
    from trainsim.calibrate import fit

    data_dir = data or fit.find_calibration_dir()
    if cross_validate:
        typer.echo(json.dumps(fit.cross_validate(data_dir, folds=folds), indent=2))
        return
    typer.echo(f"fitting on {data_dir} ...", err=True)
    fitted = fit.calibrate(data_dir, sim=sim)
    fit.write_calibration(fitted, output)
    typer.echo(f"wrote {output}: training-set iteration-time MAPE {fitted.fit_report['train_mape_pct']:.2f}% "
               f"over {fitted.fit_report['runs']:.0f} runs")


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
