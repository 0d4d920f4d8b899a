"""`trainsim validate RUNS`: predict measured runs with one or more engines and report the error per run,
source and metric (a runs.csv file, or a folder of runs written by `trainsim measure`)."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from trainsim.cli.errors import handles_errors
from trainsim.cli.stack_options import GIVEN_STACK, StackFlags, stack_options
from trainsim.estimate.engines import ENGINES
from trainsim.frontends.registry import FRONTENDS
from trainsim.report.validate import jobs_markdown, render_validate, validate_to_dict
from trainsim.strategy.stack import StackSpec, make_stack
from trainsim.validate.compare import by_job, compare, engine_choices, summaries
from trainsim.validate.measured import read_measured
from trainsim.validate.predict_runs import Restack
from trainsim.validate.runs import read_runs

FOLDER_DB = "profile.db"  # a measured folder's own profile database (trainsim measure --suite ... --profile-ops)


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
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="print every row, not only the summary")] = True,
    stack_flags: StackFlags = GIVEN_STACK,  # --stack NAME and the behaviour flags, over each row's stated stack
) -> None:
    """Predict every run; print predicted vs measured and the MAPE per engine, source and metric."""
    FRONTENDS.get(frontend)  # unknown names: one line listing the choices
    restack = _restack(stack_flags["stack"], dict(stack_flags["overrides"]))
    folder = runs_file.is_dir()
    runs = read_measured(runs_file) if folder else read_runs(runs_file)
    if db is None and folder and (runs_file / FOLDER_DB).is_file():
        db = runs_file / FOLDER_DB
    choices = engine_choices(engine or ("all" if folder else "analytical"),
                             costs or ("both" if db is not None else "roofline"))
    quiet = as_json or markdown or not sys.stderr.isatty()
    with Progress(console=Console(stderr=True), transient=True, disable=quiet) as bar:
        task = bar.add_task("predicting runs", total=len(runs) * len(choices))
        predictions = compare(runs, choices, db, progress=lambda: bar.advance(task), frontend=frontend,
                              restack=restack)
    summary = summaries(predictions)
    jobs = by_job(predictions) if folder else []
    if as_json:
        typer.echo(json.dumps(validate_to_dict(predictions, str(db) if db else None, summary, jobs), indent=1))
    elif markdown:
        typer.echo(jobs_markdown(jobs, list(predictions)))
    else:
        typer.echo(render_validate(predictions, summary, jobs, rows, terminal=sys.stdout.isatty()), nl=False)


def _restack(name: str | None, overrides: dict[str, object]) -> Restack | None:
    """--stack replaces every row's stack; the behaviour flags apply on top (the rows' attention kernels stay)."""
    if name is None and not overrides:
        return None
    chosen = make_stack(name, overrides) if name is not None else None

    def restack(stated: StackSpec) -> StackSpec:
        return chosen if chosen is not None else make_stack(stated, overrides)

    make_stack(name or "generic", overrides)  # bad names and values fail here, before any prediction
    return restack


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
