"""`trainsim validate RUNS`: predict measured runs with one or more engines and report the error per run,
source and metric (a runs.csv file, or a folder of runs written by `trainsim measure`)."""

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from trainsim.cli.errors import handles_errors
from trainsim.estimate.engines import ENGINES
from trainsim.validate.compare import by_job, compare, engine_choices, summaries
from trainsim.validate.measured import read_measured
from trainsim.validate.predict_runs import RowPrediction
from trainsim.validate.runs import read_runs

FOLDER_DB = "profile.db"  # a measured folder's own profile database (trainsim measure --suite ... --profile-ops)


@handles_errors
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
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the per-job table as Markdown")] = False,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="print every row, not only the summary")] = True,
) -> None:
    """Predict every run; print predicted vs measured and the MAPE per engine, source and metric."""
    folder = runs_file.is_dir()
    runs = read_measured(runs_file) if folder else read_runs(runs_file)
    if db is None and folder and (runs_file / FOLDER_DB).is_file():
        db = runs_file / FOLDER_DB
    choices = engine_choices(engine or ("all" if folder else "analytical"),
                             costs or ("both" if db is not None else "roofline"))
    quiet = as_json or markdown or not sys.stderr.isatty()
    with Progress(console=Console(stderr=True), transient=True, disable=quiet) as bar:
        task = bar.add_task("predicting runs", total=len(runs) * len(choices))
        predictions = compare(runs, choices, db, progress=lambda: bar.advance(task))
    summary = summaries(predictions)
    jobs = by_job(predictions) if folder else []
    if as_json:
        typer.echo(json.dumps(_json_safe({"engines": list(predictions), "db": str(db) if db else None,
                                          "runs": [p.to_dict() for ps in predictions.values() for p in ps],
                                          "summary": summary, "jobs": jobs}), indent=1))
        return
    if markdown:
        typer.echo(_jobs_markdown(jobs, list(predictions)))
        return
    console = Console()
    if rows:
        console.print(_rows_table(predictions))
    if jobs:
        console.print(_jobs_table(jobs, list(predictions)))
    console.print(_summary_table(summary, list(predictions)))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _error_pct(predicted: float | None, measured: float) -> str:
    return "" if predicted is None else f"{(predicted - measured) / measured * 100:+.1f}"


def _rows_table(predictions: dict[str, list[RowPrediction]]) -> Table:
    labels = list(predictions)
    table = Table("run_id", "metric", "measured", *(f"{label}\n(error %)" for label in labels), "skipped",
                  title="runs")
    for row in zip(*predictions.values(), strict=True):
        first = row[0]
        cells = ["" if p.predicted is None else f"{p.predicted:.4g} ({_error_pct(p.predicted, p.measured)})"
                 for p in row]
        table.add_row(first.run_id, first.metric, f"{first.measured:.4g}", *cells, first.skipped or "")
    return table


def _jobs_table(jobs: list[dict[str, Any]], labels: list[str]) -> Table:
    table = Table("job", "repeats", "measured s", "spread %", *(f"{label}\nerror %" for label in labels),
                  title="iteration time per job (mean of the repeats' medians)")
    for job in jobs:
        errors = [f"{job['error_pct'][label]:+.1f}" if label in job["error_pct"] else "" for label in labels]
        spread = "" if math.isnan(job["spread_pct"]) else f"{job['spread_pct']:.1f}"
        table.add_row(job["job"], str(job["repeats"]), f"{job['measured']:.4g}", spread, *errors)
    return table


def _jobs_markdown(jobs: list[dict[str, Any]], labels: list[str]) -> str:
    head = ["job", "measured s", "spread %", *(f"{label} s (error %)" for label in labels)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for job in jobs:
        spread = "" if math.isnan(job["spread_pct"]) else f"{job['spread_pct']:.1f}"
        cells = [f"{job['predicted'][label]:.4g} ({job['error_pct'][label]:+.1f})" if label in job["predicted"]
                 else "" for label in labels]
        lines.append("| " + " | ".join([job["job"], f"{job['measured']:.4g}", spread, *cells]) + " |")
    return "\n".join(lines)


def _summary_table(summary: list[dict[str, Any]], labels: list[str]) -> Table:
    table = Table("source", "metric", "runs", "skipped", *(f"{label}\nMAPE %" for label in labels),
                  title="MAPE per source and metric")
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for s in summary:
        key = (str(s["source"]), str(s["metric"]))
        entry = cells.setdefault(key, {"n": s["n"], "skipped": s["skipped"]})
        entry[str(s["engine"])] = s["mape_pct"]
    for (source, metric), entry in cells.items():
        shown = ["" if math.isnan(entry.get(label, math.nan)) else f"{entry[label]:.2f}" for label in labels]
        table.add_row(source[:60], metric, str(entry["n"]), str(entry["skipped"]), *shown)
    return table


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
