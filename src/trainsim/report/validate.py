"""`trainsim validate`: predicted vs measured per run, per job and per source and metric (tables, Markdown or
one JSON object)."""

import math
from typing import Any

from rich.table import Table

from trainsim.report.rich_text import to_text
from trainsim.validate.predict_runs import RowPrediction

Predictions = dict[str, list[RowPrediction]]  # engine label -> one prediction per run and metric


def validate_to_dict(predictions: Predictions, db: str | None, summary: list[dict[str, Any]],
                     jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The --json object; NaN (no prediction, or a single repeat's spread) becomes null."""
    return _json_safe({"engines": list(predictions), "db": db,
                       "runs": [p.to_dict() for ps in predictions.values() for p in ps],
                       "summary": summary, "jobs": jobs})


def render_validate(predictions: Predictions, summary: list[dict[str, Any]], jobs: list[dict[str, Any]],
                    rows: bool = True, terminal: bool = False) -> str:
    """The runs table (when rows), the per-job table (when there are jobs), then the MAPE table."""
    labels = list(predictions)
    tables = [*([rows_table(predictions)] if rows else []), *([jobs_table(jobs, labels)] if jobs else []),
              summary_table(summary, labels)]
    return to_text(*tables, terminal=terminal)


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


def rows_table(predictions: Predictions) -> Table:
    labels = list(predictions)
    table = Table("run_id", "metric", "measured", *(f"{label}\n(error %)" for label in labels), "skipped",
                  title="runs")
    for row in zip(*predictions.values(), strict=True):
        first = row[0]
        cells = ["" if p.predicted is None else f"{p.predicted:.4g} ({_error_pct(p.predicted, p.measured)})"
                 for p in row]
        table.add_row(first.run_id, first.metric, f"{first.measured:.4g}", *cells, first.skipped or "")
    return table


def _spread_cell(spread_pct: float | None) -> str:
    """Blank for a job measured once (its spread is NaN in memory and null in JSON)."""
    return "" if spread_pct is None or math.isnan(spread_pct) else f"{spread_pct:.1f}"


def jobs_table(jobs: list[dict[str, Any]], labels: list[str]) -> Table:
    table = Table("job", "repeats", "measured s", "spread %", *(f"{label}\nerror %" for label in labels),
                  title="iteration time per job (mean of the repeats' medians)")
    for job in jobs:
        errors = [f"{job['error_pct'][label]:+.1f}" if label in job["error_pct"] else "" for label in labels]
        spread = _spread_cell(job["spread_pct"])
        table.add_row(job["job"], str(job["repeats"]), f"{job['measured']:.4g}", spread, *errors)
    return table


def jobs_markdown(jobs: list[dict[str, Any]], labels: list[str]) -> str:
    head = ["job", "measured s", "spread %", *(f"{label} s (error %)" for label in labels)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for job in jobs:
        spread = _spread_cell(job["spread_pct"])
        cells = [f"{job['predicted'][label]:.4g} ({job['error_pct'][label]:+.1f})" if label in job["predicted"]
                 else "" for label in labels]
        lines.append("| " + " | ".join([job["job"], f"{job['measured']:.4g}", spread, *cells]) + " |")
    return "\n".join(lines)


def summary_table(summary: list[dict[str, Any]], labels: list[str]) -> Table:
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


def render_validate_data(data: dict[str, Any], rows: bool = False, terminal: bool = False) -> str:
    """render_validate of a validation's JSON object (trainsim.api.ValidationResult.to_dict(); null = NaN)."""
    predictions: Predictions = {label: [] for label in data["engines"]}
    for run in data["runs"]:
        predictions[run["engine"]].append(RowPrediction(run["run_id"], run["source"], run["metric"], run["measured"],
                                                        run["predicted"], run["engine"], run["skipped"]))
    return render_validate(predictions, _nan_for_null(data["summary"]), _nan_for_null(data["jobs"]), rows,
                           terminal=terminal)


def _nan_for_null(value: Any) -> Any:
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: _nan_for_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_for_null(v) for v in value]
    return value
