"""Score several engines (each with roofline or profiled costs) on the same runs, and group repeated
measurements of one job (run ids JOB.r1, JOB.r2, ... as `trainsim measure --suite` writes them)."""

import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.catalog.calibration import Calibration
from trainsim.cost.pricing import COSTS
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES, make_engine, shape_engines
from trainsim.pipeline import GraphCache
from trainsim.validate.predict_runs import Restack, RowPrediction, predict_rows, summarize
from trainsim.validate.runs import RunRow

_REPEAT = re.compile(r"\.r\d+$")


@dataclass(frozen=True, slots=True)
class EngineChoice:
    engine: str
    costs: str = "roofline"

    @property
    def label(self) -> str:
        return self.engine if self.costs == "roofline" else f"{self.engine}+{self.costs}"


def engine_choices(engines: str, costs: str) -> list[EngineChoice]:
    """`engines`: a comma-separated list of registered engines, or "all"; `costs`: roofline, profiled or both."""
    names = shape_engines() if engines == "all" else [e.strip() for e in engines.split(",") if e.strip()]
    for name in names:
        ENGINES.get(name)  # unknown names: one line listing the choices
    if not names:
        raise ConfigError("engine", engines, "one or more of " + ", ".join(ENGINES.names()) + ", or all")
    kinds = list(dict.fromkeys(["roofline", *COSTS.names()])) if costs == "both" else [costs]
    if any(kind not in COSTS for kind in kinds):
        raise ConfigError("costs", costs, "choose one of: " + ", ".join([*COSTS.names(), "both"]))
    return [EngineChoice(name, kind) for kind in kinds for name in names]


def compare(rows: Sequence[RunRow], choices: Sequence[EngineChoice], db: Path | None,
            progress: Callable[[], None] | None = None, frontend: str = "catalog",
            calibration: Calibration | None = None, restack: Restack | None = None
            ) -> dict[str, list[RowPrediction]]:
    """Every row predicted by every engine choice, by label; frontend: the front-end that builds each run's
    graph from its model (catalog builders, or torch tracing the model's Hugging Face family); calibration: the
    fit the engines price with (default: the package's); restack: the stack each row's job runs on, from the one
    its row states (default: that one)."""
    out: dict[str, list[RowPrediction]] = {}
    params_by_run: dict[str, float] = {}  # the same for every engine
    graphs = GraphCache(frontend)
    for choice in choices:
        estimator = make_engine(choice.engine, choice.costs, db, calibration=calibration)
        predictions = predict_rows(rows, estimator, progress, params_by_run, graphs, restack)
        out[choice.label] = [_relabel(p, choice.label) for p in predictions]
    return out


def _relabel(p: RowPrediction, label: str) -> RowPrediction:
    return RowPrediction(p.run_id, p.source, p.metric, p.measured, p.predicted, label, p.skipped)


def summaries(by_engine: dict[str, list[RowPrediction]]) -> list[dict[str, Any]]:
    """MAPE per engine, source and metric (NaN where nothing was predicted)."""
    return [{"engine": label, **entry} for label, predictions in by_engine.items()
            for entry in summarize(predictions)]


def job_name(run_id: str) -> str:
    """The job of a run id: without the repeat suffix .rN."""
    return _REPEAT.sub("", run_id)


def by_job(by_engine: dict[str, list[RowPrediction]], metric: str = "iteration_time_s") -> list[dict[str, Any]]:
    """One entry per job: its repeats, the mean of their measured values, their spread ((max - min) / mean, in
    percent) and, per engine, the mean prediction and its error against the mean measurement."""
    jobs: dict[str, dict[str, Any]] = {}
    for label, predictions in by_engine.items():
        for p in predictions:
            if p.metric != metric:
                continue
            entry = jobs.setdefault(job_name(p.run_id), {"job": job_name(p.run_id), "runs": {}, "predicted": {}})
            entry["runs"][p.run_id] = p.measured
            if p.predicted is not None:
                entry["predicted"].setdefault(label, []).append(p.predicted)
    table = []
    for entry in jobs.values():
        measured = list(entry["runs"].values())
        mean = statistics.fmean(measured)
        spread = (max(measured) - min(measured)) / mean * 100.0 if len(measured) > 1 else math.nan
        engines = {label: statistics.fmean(values) for label, values in entry["predicted"].items()}
        table.append({"job": entry["job"], "repeats": len(measured), "measured": mean, "spread_pct": spread,
                      "predicted": engines,
                      "error_pct": {label: (value - mean) / mean * 100.0 for label, value in engines.items()}})
    return table
