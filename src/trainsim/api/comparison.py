"""Two plans side by side: which is faster and why, term by term (each part of the iteration time, each part
of the peak memory), and what differs between the plans."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from trainsim.api.prediction import predict
from trainsim.api.results import MAX_RESULT_FILE_BYTES, Prediction, _Output
from trainsim.catalog.files import parse_text, read_text, shown_path
from trainsim.report import html as html_report
from trainsim.units import format_duration

# What each breakdown key is, for the explanation (estimate.result.BREAKDOWN_KEYS).
TERMS = {"compute": "compute", "recompute": "recomputation", "tp_comm": "exposed tensor-parallel communication",
         "cp_comm": "exposed context-parallel communication", "ep_comm": "exposed expert-parallel communication",
         "pp_comm": "exposed pipeline transfers", "dp_comm": "exposed data-parallel communication",
         "comm": "exposed communication", "bubble": "pipeline bubble", "optimizer": "optimizer step",
         "overhead": "per-micro-batch overhead", "core_sharing": "waiting for shared CPU cores"}
SAME = 0.005  # iteration times within 0.5% are "the same"; terms under 0.5% of the slower iteration are not named

PlanArg = Prediction | str | Path | Mapping[str, Any]


class TermChange(BaseModel):
    """One term in both plans: seconds (time) or GiB (memory); change = b - a."""

    model_config = ConfigDict(frozen=True)
    term: str
    a: float
    b: float
    change: float


class Comparison(_Output):
    """`trainsim compare A B --json`: both predictions (without timelines), the faster plan, the plan changes,
    the time and memory terms ordered by how much they changed, and the explanation in words."""

    SCHEMA_NAME: ClassVar[str] = "trainsim.comparison"
    a: Prediction
    b: Prediction
    faster: Literal["a", "b", "same"]
    speedup: float  # the slower iteration time over the faster one
    plan_changes: dict[str, list[Any]]  # strategy field -> [a, b], where they differ
    time_terms: list[TermChange]
    memory_terms: list[TermChange]
    explanation: list[str]

    def to_html(self) -> str:
        return html_report.comparison_page(self.to_dict())

    def _repr_html_(self) -> str:
        return html_report.comparison_summary(self.to_dict())

    def __repr__(self) -> str:
        return "\n".join(self.explanation)


def compare(a: PlanArg, b: PlanArg, *, engine: str = "analytical", costs: str = "roofline",
            db: str | Path | None = None) -> Comparison:
    """Compare two plans. Each is a Prediction, a saved `predict --json` file, a job file (YAML/JSON), or a
    mapping of predict's keywords; job files and mappings are predicted with `engine`.

    >>> import trainsim
    >>> c = trainsim.compare({"model": "gpt3-125m", "num_gpus": 8, "global_batch": 64},
    ...                      {"model": "gpt3-125m", "num_gpus": 8, "global_batch": 64, "tp": 2})
    >>> c.faster, c.plan_changes["tp"], c.time_terms[0].term
    ('a', [1, 2], 'compute')
    """
    first, second = (_prediction(plan, engine, costs, db) for plan in (a, b))
    ta, tb = first.iteration_time_s, second.iteration_time_s
    faster: Literal["a", "b", "same"] = "same" if abs(ta - tb) <= SAME * max(ta, tb) else ("a" if ta < tb else "b")
    time_terms = _terms(first.breakdown, second.breakdown, 1.0)
    memory_terms = _terms(first.memory_breakdown, second.memory_breakdown, 1 / 2**30)
    changes = {key: [value, (second.strategy or {}).get(key)] for key, value in (first.strategy or {}).items()
               if _plain((second.strategy or {}).get(key)) != _plain(value)}
    for key in ("model", "cluster", "num_gpus"):
        if getattr(first, key) != getattr(second, key):
            changes[key] = [getattr(first, key), getattr(second, key)]
    data = {"schema": Comparison._tag().model_dump(), "a": _without_timeline(first),
            "b": _without_timeline(second), "faster": faster, "speedup": max(ta, tb) / min(ta, tb),
            "plan_changes": changes, "time_terms": time_terms, "memory_terms": memory_terms}
    data["explanation"] = _explain(first, second, data)
    return Comparison.model_validate(data)


def _prediction(plan: PlanArg, engine: str, costs: str, db: str | Path | None) -> Prediction:
    if isinstance(plan, Prediction):
        return plan
    if isinstance(plan, Mapping):
        keywords: dict[str, Any] = {"engine": engine, "costs": costs, "db": db, **plan}
        return predict(**keywords)
    path = Path(plan)
    if path.suffix == ".json" and path.is_file():
        data = parse_text(read_text(path, MAX_RESULT_FILE_BYTES), is_json=True, name=shown_path(path))
        if isinstance(data, dict) and "schema" in data:
            return Prediction.from_dict(data)  # a saved prediction
    return predict(job_file=path, engine=engine, costs=costs, db=db)


def _without_timeline(prediction: Prediction) -> dict[str, Any]:
    data = prediction.to_dict()
    data.pop("timeline", None)
    return data


def _terms(a: dict[str, float], b: dict[str, float], scale: float) -> list[dict[str, Any]]:
    keys = list(dict.fromkeys([*a, *b]))
    terms = [{"term": key, "a": a.get(key, 0.0) * scale, "b": b.get(key, 0.0) * scale,
              "change": (b.get(key, 0.0) - a.get(key, 0.0)) * scale} for key in keys]
    return sorted(terms, key=lambda term: -abs(term["change"]))


def _explain(a: Prediction, b: Prediction, data: dict[str, Any]) -> list[str]:
    ta, tb = a.iteration_time_s, b.iteration_time_s
    lines = [f"A: {a.job}", f"B: {b.job}"]
    if data["faster"] == "same":
        lines.append(f"A and B take the same time: {format_duration(ta)} against {format_duration(tb)} per iteration")
    else:
        fast, slow = ("A", "B") if data["faster"] == "a" else ("B", "A")
        lines.append(f"{fast} is {data['speedup']:.2f}x faster than {slow}: {format_duration(min(ta, tb))} "
                     f"against {format_duration(max(ta, tb))} per iteration")
    if data["plan_changes"]:
        lines.append("plan: " + ", ".join(f"{key} {old} -> {new}" for key, (old, new) in data["plan_changes"].items()))
    lines.append("time, term by term (A -> B):")
    floor = SAME * max(ta, tb)
    for term in data["time_terms"]:
        if max(term["a"], term["b"]) <= floor:
            continue
        sign = "+" if term["change"] >= 0 else "-"
        lines.append(f"  {TERMS.get(term['term'], term['term'])}: {_time(term['a'])} -> {_time(term['b'])} "
                     f"({sign}{_time(abs(term['change']))})")
    capacity = b.memory_capacity_gib
    lines.append(f"peak memory per GPU: {a.peak_memory_gib:.1f} -> {b.peak_memory_gib:.1f} GiB (capacity "
                 f"{a.memory_capacity_gib:.0f} / {capacity:.0f} GiB)" + _oom(a, b))
    for term in data["memory_terms"]:
        if abs(term["change"]) >= 0.05:
            lines.append(f"  {term['term']}: {term['a']:.1f} -> {term['b']:.1f} GiB ({term['change']:+.1f})")
    return lines


def _time(seconds: float) -> str:
    return "0" if seconds == 0 else format_duration(seconds)


def _oom(a: Prediction, b: Prediction) -> str:
    names = [name for name, p in (("A", a), ("B", b)) if p.oom]
    return f"; {' and '.join(names)} out of memory" if names else ""


def _plain(value: Any) -> Any:
    """A strategy value as JSON holds it (a tuple read back from a saved result is a list)."""
    return list(value) if isinstance(value, tuple) else value
