"""`trainsim validate FILE.csv`: predict measured runs and report the error per source and metric."""

import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from trainsim.cli.errors import handles_errors
from trainsim.estimate.engines import ENGINES
from trainsim.validate.measured import read_measured
from trainsim.validate.predict_runs import RowPrediction, predict_rows, summarize
from trainsim.validate.runs import read_runs


@handles_errors
def validate(
    runs_file: Annotated[Path, typer.Argument(help="CSV in the schema of shared/data/calibration/runs.csv, or a "
                                              "folder of runs measured by `trainsim measure`")],
    engine: Annotated[str, typer.Option(help="estimator: " + ", ".join(ENGINES.names()))] = "analytical",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="print every row, not only the summary")] = True,
) -> None:
    """Predict every run of a runs file; print predicted vs measured and the MAPE per source and metric."""
    runs = read_measured(runs_file) if runs_file.is_dir() else read_runs(runs_file)
    estimator = ENGINES.get(engine)()
    with Progress(console=Console(stderr=True), transient=True, disable=as_json or not sys.stderr.isatty()) as bar:
        task = bar.add_task("predicting runs", total=len(runs))
        predictions = predict_rows(runs, estimator, progress=lambda: bar.advance(task))
    summary = summarize(predictions)
    if as_json:
        typer.echo(json.dumps({"engine": engine, "runs": [p.to_dict() for p in predictions],
                               "summary": _json_safe(summary)}, indent=1))
        return
    console = Console()
    if rows:
        console.print(_rows_table(predictions))
    console.print(_summary_table(summary, engine))


def _json_safe(summary: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in s.items()} for s in summary]


def _rows_table(predictions: list[RowPrediction]) -> Table:
    table = Table("run_id", "metric", "measured", "predicted", "error %", "skipped", title="runs")
    for p in predictions:
        error = "" if p.predicted is None else f"{(p.predicted - p.measured) / p.measured * 100:+.1f}"
        predicted = "" if p.predicted is None else f"{p.predicted:.4g}"
        table.add_row(p.run_id, p.metric, f"{p.measured:.4g}", predicted, error, p.skipped or "")
    return table


def _summary_table(summary: list[dict[str, object]], engine: str) -> Table:
    table = Table("source", "metric", "runs", "skipped", "MAPE %", title=f"MAPE per source and metric ({engine})")
    for s in summary:
        value = s["mape_pct"]
        shown = "" if isinstance(value, float) and math.isnan(value) else f"{value:.2f}"
        table.add_row(str(s["source"])[:60], str(s["metric"]), str(s["n"]), str(s["skipped"]), shown)
    return table


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
