"""`trainsim validate RUNS`: predict measured runs with one or more engines and report the error per run,
source and metric (a runs.csv file, or a folder of runs written by `trainsim measure`). A thin layer over
trainsim.api.validate: the JSON is `api.validate(...).to_dict()`."""

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from trainsim import api
from trainsim.api.functions import FOLDER_DB
from trainsim.catalog.calibration import CALIBRATION_HELP
from trainsim.cli.errors import handles_errors
from trainsim.cli.stack_options import GIVEN_STACK, StackFlags, stack_options
from trainsim.estimate.engines import ENGINES
from trainsim.frontends.registry import FRONTENDS
from trainsim.report.html import require_plotly
from trainsim.report.output import check_output_file, csv_text, write_text_atomic
from trainsim.report.validate import jobs_markdown, render_validate_data


@handles_errors
@stack_options("training stack of every run (default: the one each row's source states, row_defaults.yaml)")
def validate(
    runs_file: Annotated[Path, typer.Argument(help="CSV in the schema of shared/data/calibration/runs.csv, or a "
                                              "folder of runs measured by `trainsim measure`")],
    engine: Annotated[str | None, typer.Option(help="estimators, comma-separated, or all: "
                                               + ", ".join(ENGINES.names())
                                               + " (default: all for a folder, analytical for a CSV)")] = None,
    costs: Annotated[str | None, typer.Option(help="op costs: roofline | profiled | both (default: both when a "
                                              f"profile database is at hand - --db or FOLDER/{FOLDER_DB} - else "
                                              "roofline)")] = None,
    db: Annotated[Path | None, typer.Option(help="profile database for profiled costs")] = None,
    frontend: Annotated[str, typer.Option(help="front-end that builds each run's graph from its model: "
                                          + " | ".join(FRONTENDS.names()))] = "catalog",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the per-job table as Markdown")] = False,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="also print every run, not only the summary")
                    ] = False,
    html: Annotated[Path | None, typer.Option(help="write a self-contained HTML report: predicted against "
                                              "measured per metric, a color per source")] = None,
    csv: Annotated[Path | None, typer.Option(help="write every run's prediction as CSV")] = None,
    calibration: Annotated[Path | None, typer.Option(help=CALIBRATION_HELP)] = None,
    stack_flags: StackFlags = GIVEN_STACK,  # --stack NAME and the behaviour flags, over each row's stated stack
) -> None:
    """Predict every run; print the MAPE per engine, source and metric (--rows: every run too)."""
    if html is not None:
        check_output_file(html, "html")  # before the predictions: their work is not thrown away
        require_plotly()
    if csv is not None:
        check_output_file(csv, "csv")
    quiet = as_json or markdown or not sys.stderr.isatty()
    with Progress(console=Console(stderr=True), transient=True, disable=quiet) as bar:
        task = bar.add_task("predicting runs", total=None)
        found = api.validate(runs_file, engine=engine, costs=costs, db=db, frontend=frontend, calibration=calibration,
                             stack=stack_flags["stack"], stack_overrides=stack_flags["overrides"],
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
    data = found.to_dict()
    if as_json:
        typer.echo(found.to_json(indent=1))
    elif markdown:
        typer.echo(jobs_markdown(data["jobs"], data["engines"]))
    else:
        typer.echo(render_validate_data(data, rows, terminal=sys.stdout.isatty()), nl=False)
    if html is not None:
        found.write_html(html)
        typer.echo(f"report: {html} (open it in a browser; it needs no network)", err=True)
    if csv is not None:
        write_text_atomic(csv, csv_text(data["runs"]))
        typer.echo(f"table: {csv}", err=True)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
