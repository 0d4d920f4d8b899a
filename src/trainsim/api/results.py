"""What the Python API returns: pydantic models of the commands' JSON objects.

Each is exactly the object its command prints with --json (`Prediction.to_dict()` is `trainsim predict --json`),
tagged with `schema` (name and version) and described by a JSON Schema in docs/schema/ (`write_schemas`).
Unknown keys are kept (extra="allow"): a newer Result field (an uncertainty band) travels through a saved file.
"""

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from trainsim.catalog.files import parse_text, read_text, shown_path
from trainsim.errors import ConfigError
from trainsim.estimate.result import BREAKDOWN_KEYS, Result
from trainsim.job import Job
from trainsim.report import html as html_report
from trainsim.report.output import check_output_file, write_text_atomic
from trainsim.units import format_duration

SCHEMA_VERSION = 1


def _no_notes() -> list[str]:
    """NB: a Python function, not the builtin `list`: pydantic reads a default factory's signature
    (pydantic/_internal/_fields.py takes_validated_data_argument, pydantic 2.x), and a builtin's is parsed from
    its text by tokenize, whose patterns take ~5 ms to compile, once per process (a twentieth of predict's own)."""
    return []


class SchemaTag(BaseModel):
    """Which object a JSON file holds and the version of its layout (bumped when a key changes meaning or goes)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    name: str
    version: int = SCHEMA_VERSION


class _Output(BaseModel):
    """What every result shares: the schema tag, dict/JSON round trips, the HTML report."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True, defer_build=True)
    SCHEMA_NAME: ClassVar[str] = ""
    schema_tag: SchemaTag = Field(alias="schema", description="the object's name and layout version")

    def to_dict(self) -> dict[str, Any]:
        """The command's --json object (keys as the command line writes them; absent parts left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_html(self) -> str:
        """The self-contained HTML report (needs the `report` extra: plotly)."""
        raise NotImplementedError

    def write_html(self, path: str | Path) -> Path:
        """Write the HTML report to `path` atomically; the folder must exist."""
        target = check_output_file(Path(path), "html")
        html_report.require_plotly()
        return write_text_atomic(target, self.to_html())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Any":
        tag = data.get("schema")
        name = tag.get("name") if isinstance(tag, dict) else None
        if name != cls.SCHEMA_NAME:
            raise ConfigError("schema", name, f"expected a {cls.SCHEMA_NAME} object (its --json output)")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(cls.SCHEMA_NAME, f"{exc.error_count()} problem(s)", problems) from None

    @classmethod
    def _tag(cls) -> SchemaTag:
        return SchemaTag(name=cls.SCHEMA_NAME)


class Prediction(_Output):
    """One job's predicted performance (`trainsim predict --json`). Times in seconds, memory in bytes.

    timeline: the simulated iteration (engines that simulate: sim, replay), as report.timeline lays it out;
    absent for closed-form engines. `result` is the engine's Result when the prediction was made in this
    process (None for one read back from JSON); it carries the trace and the critical path.
    """

    SCHEMA_NAME: ClassVar[str] = "trainsim.prediction"
    engine: str
    job: str
    iteration_time_s: float
    tokens_per_s: float
    samples_per_s: float
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_flops_per_gpu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    oom: bool
    breakdown: dict[str, float]
    memory_breakdown: dict[str, float]
    notes: list[str] = Field(default_factory=_no_notes)
    peak_memory_gib: float
    memory_capacity_gib: float
    memory_breakdown_gib: dict[str, float]
    mfu_formula: str
    model: str | None = Field(default=None, description="the model's name")
    model_kind: str | None = Field(default=None, description="transformer | cnn | dlrm | opaque")
    cluster: str | None = Field(default=None, description="the cluster's name")
    num_gpus: int | None = None
    strategy: dict[str, Any] | None = Field(default=None, description="the plan, as make_job resolved it")
    timeline: dict[str, Any] | None = None
    _result: Result | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, result: Result, job: Job | None = None) -> "Prediction":
        """The Prediction of an engine's Result (its to_dict(), the schema tag, the timeline when simulated)
        for `job` (its model, cluster and resolved plan, when given)."""
        data: dict[str, Any] = {"schema": cls._tag().model_dump(), **result.to_dict()}
        # the same keys from every engine, in BREAKDOWN_KEYS order (0 where the engine has no such time)
        data["breakdown"] = {key: result.breakdown.get(key, 0.0) for key in BREAKDOWN_KEYS}
        if job is not None:
            data.update(model=job.model.name, model_kind=job.model.kind, cluster=job.cluster.name,
                        num_gpus=job.num_gpus, strategy=job.parallel.model_dump())
        if result.timeline is not None:
            from trainsim.report.timeline import timeline_to_dict

            data["timeline"] = timeline_to_dict(result.timeline)
        prediction = cls.model_validate(data)
        prediction._result = result
        return prediction

    @property
    def result(self) -> Result | None:
        return self._result

    def to_html(self) -> str:
        return html_report.prediction_page(self.to_dict())

    def write_trace(self, path: str | Path) -> Path:
        """The Chrome/Perfetto trace of the simulated iteration (engines sim and replay, in this process)."""
        target = check_output_file(Path(path), "trace")
        timeline = self._result.timeline if self._result is not None else None
        if timeline is None:
            raise ConfigError("engine", self.engine, "a trace needs a simulated iteration: engine='sim' (or replay)")
        from trainsim.report.trace import write_chrome_trace

        return write_chrome_trace(timeline.exec_graph, timeline.outcome, target, list(timeline.device_names))

    def explain(self) -> str:
        """The critical path and the exposed communication of the simulated iteration."""
        timeline = self._result.timeline if self._result is not None else None
        if timeline is None:
            raise ConfigError("engine", self.engine, "explain needs a simulated iteration: engine='sim' (or replay)")
        from trainsim.report.explain import render_explain

        return render_explain(timeline.exec_graph, timeline.outcome)

    def __repr__(self) -> str:
        parts = ", ".join(f"{key} {value / self.iteration_time_s:.0%}" for key, value in self.breakdown.items()
                          if value > 0.005 * self.iteration_time_s)
        oom = " OUT OF MEMORY" if self.oom else ""
        return (f"Prediction({self.job}; engine {self.engine})\n"
                f"  iteration {format_duration(self.iteration_time_s)}, {self.tokens_per_s:,.0f} tokens/s, "
                f"{self.samples_per_s:,.2f} samples/s, MFU {self.mfu:.1%}\n"
                f"  peak memory {self.peak_memory_gib:.2f} of {self.memory_capacity_gib:.1f} GiB{oom}\n"
                f"  time: {parts}")

    def _repr_html_(self) -> str:
        return (f"<b>{_escape(self.job)}</b> (engine {_escape(self.engine)})"
                + html_report.prediction_summary(self.to_dict()))


class PlanRow(BaseModel):
    """One of the best plans of a search."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)
    rank: int
    strategy: dict[str, Any]
    description: str
    iteration_time_s: float
    tokens_per_s: float
    samples_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_memory_gib: float
    memory_capacity_gib: float
    breakdown: dict[str, float]
    headroom_gib: float = Field(description="memory left free on the fullest GPU")
    time_to_train_s: float | None = Field(default=None, description="with tokens: tokens / tokens_per_s")
    cost_to_train: float | None = Field(default=None, description="with tokens and a price per GPU-hour")
    energy_to_train_kwh: float | None = Field(
        default=None, description="with tokens, where the device states its power: GPUs x max power x time")


class PlanPoint(BaseModel):
    """A plan the search priced (feasible or out of memory): throughput, peak memory, on the Pareto front."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    description: str
    strategy: dict[str, Any]
    tokens_per_s: float
    peak_memory_gib: float
    oom: bool
    pareto: bool = Field(description="no feasible plan has at least its tokens/s with at most its memory")


class SearchResult(_Output):
    """A search (`trainsim search --json`; `--all` adds all_plans, every plan priced)."""

    SCHEMA_NAME: ClassVar[str] = "trainsim.search"
    title: str
    model: str
    cluster: str
    num_gpus: int
    objective: str = "throughput"
    memory_capacity_gib: float
    plans: list[PlanRow]
    tried: int
    feasible: int
    infeasible: dict[str, int]
    all_plans: list[PlanPoint] | None = None

    @property
    def best(self) -> PlanRow | None:
        return self.plans[0] if self.plans else None

    def to_html(self) -> str:
        return html_report.search_page(self.to_dict())

    def __repr__(self) -> str:
        lines = [f"SearchResult({self.title}): {self.tried} plans tried, {self.feasible} feasible"]
        lines += [f"  #{p.rank} {p.description}: {format_duration(p.iteration_time_s)}, "
                  f"{p.tokens_per_s:,.0f} tokens/s, {p.peak_memory_gib:.1f} GiB" for p in self.plans[:5]]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return html_report.search_summary(self.to_dict())


class RunPrediction(BaseModel):
    """One measured run's metric, predicted by one engine (predicted None: skipped, for the reason given)."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    run_id: str
    source: str
    metric: str
    measured: float
    predicted: float | None
    engine: str
    skipped: str | None


class ValidationResult(_Output):
    """A validation (`trainsim validate --json`): every run, the MAPE per engine, source and metric."""

    SCHEMA_NAME: ClassVar[str] = "trainsim.validation"
    engines: list[str]
    db: str | None
    runs: list[RunPrediction]
    summary: list[dict[str, Any]]
    jobs: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        # NB: db and a run's predicted/skipped are null, not left out, where absent (the command's layout)
        return self.model_dump(by_alias=True, mode="json")

    def mape_pct(self, engine: str | None = None, metric: str = "iteration_time_s", source: str = "ALL") -> float:
        """The MAPE (percent) of one engine (default: the first) over one source (default: all) and metric."""
        label = engine or self.engines[0]
        for entry in self.summary:
            if (entry.get("engine"), entry.get("source"), entry.get("metric")) == (label, source, metric):
                value = entry.get("mape_pct")
                return float("nan") if value is None else float(value)
        raise ConfigError("metric", f"{label}/{source}/{metric}",
                          "no such engine, source and metric in this validation")

    def to_html(self) -> str:
        return html_report.validation_page(self.to_dict())

    def __repr__(self) -> str:
        rows = [e for e in self.summary if e.get("source") == "ALL"]
        lines = [f"ValidationResult({len(self.runs)} predictions; engines {', '.join(self.engines)})"]
        lines += [f"  {e['engine']} {e['metric']}: MAPE {_pct(e.get('mape_pct'))} over {e.get('n')} runs" for e in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return html_report.validation_summary(self.to_dict())


OUTPUTS: dict[str, type[_Output]] = {cls.SCHEMA_NAME: cls for cls in (Prediction, SearchResult, ValidationResult)}


def _outputs() -> dict[str, type[_Output]]:
    """Every result with a schema, the comparison included (it is built on Prediction, so it registers late)."""
    from trainsim.api.comparison import Comparison

    return {**OUTPUTS, Comparison.SCHEMA_NAME: Comparison}
Kind = Literal["trainsim.prediction", "trainsim.search", "trainsim.validation"]


# A saved result is a few KiB; a validation's, a row per run, a few MiB.
MAX_RESULT_FILE_BYTES = 64 * 2**20


def load(path: str | Path) -> Any:
    """A result saved with --json (or to_json()), as its model (Prediction, SearchResult, ValidationResult or
    Comparison): the `schema` tag says which."""
    file = Path(path)
    data = parse_text(read_text(file, MAX_RESULT_FILE_BYTES), is_json=True, name=shown_path(file))
    tag = data.get("schema") if isinstance(data, dict) else None
    name = tag.get("name") if isinstance(tag, dict) else None
    outputs = _outputs()
    if name not in outputs:
        raise ConfigError(f"{file}: schema", name, "expected the --json output of trainsim predict, search, "
                          "validate or compare (schema " + ", ".join(outputs) + ")")
    return outputs[name].from_dict(data)


def write_schemas(folder: str | Path) -> list[Path]:
    """Write the JSON Schema of every result to FOLDER/NAME.schema.json (docs/schema/ holds the committed ones)."""
    written = []
    for name, cls in _outputs().items():
        target = Path(folder) / f"{name.removeprefix('trainsim.')}.schema.json"
        schema = cls.model_json_schema(by_alias=True)
        written.append(write_text_atomic(target, json.dumps(schema, indent=2, sort_keys=True) + "\n"))
    return written


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def _escape(text: str) -> str:
    import html

    return html.escape(text)
