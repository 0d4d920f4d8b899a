"""Predict every row of a runs file with one engine; collect predicted vs measured per metric."""

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from trainsim.cost.pricing import Pricer
from trainsim.errors import TrainsimError
from trainsim.estimate.engines import Estimator
from trainsim.estimate.result import Result
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.pipeline import GraphCache
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stack import StackSpec
from trainsim.validate.flops_conventions import in_convention
from trainsim.validate.layer_metrics import LAYER_METRICS, layer_time_ms
from trainsim.validate.metrics import mape
from trainsim.validate.runs import METRICS, RunJob, RunRow, flops_convention_of, job_from_row, source_group

Restack = Callable[[StackSpec], StackSpec]  # a row's stated stack -> the stack its job is predicted on


@dataclass(frozen=True, slots=True)
class RowPrediction:
    run_id: str
    source: str
    metric: str
    measured: float
    predicted: float | None
    engine: str
    skipped: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FLOP_METRICS = ("tflops_per_gpu", "mfu")  # counted under the source's FLOP convention


def metric_value(metric: str, job: Job, result: Result, params: float, convention: str | None = None) -> float:
    """The predicted value of `metric`; for FLOP_METRICS, with the model FLOPs counted under `convention`."""
    if metric == "iteration_time_s":
        return result.iteration_time_s
    if metric == "tokens_per_s_per_gpu":
        return result.tokens_per_s / job.num_gpus
    if metric == "peak_memory_gib":
        return result.peak_memory_gib
    if metric == "peak_allocated_gib":
        return (result.peak_memory_bytes - result.memory_breakdown.get("runtime_reserved", 0.0)) / 2**30
    assert metric in FLOP_METRICS and convention is not None, (metric, convention)
    published = in_convention(result, job, params, convention)
    return published.tflops_per_gpu if metric == "tflops_per_gpu" else published.mfu


def predict_rows(rows: Iterable[RunRow], estimator: Estimator, progress: Callable[[], None] | None = None,
                 params_by_run: dict[str, float] | None = None,
                 graphs: GraphCache | None = None, restack: Restack | None = None) -> list[RowPrediction]:
    """params_by_run: a run's parameter count by run id, to share between the engines that predict the same
    rows (filled here as needed); graphs: the jobs' OpGraphs, to share between engines likewise; restack: the
    stack each run's job runs on, from the stack its row states (validate --stack and behaviour flags)."""
    graphs = graphs or GraphCache()
    jobs: dict[str, RunJob] = {}
    results: dict[str, Result | str] = {}
    params_by_run = {} if params_by_run is None else params_by_run
    out: list[RowPrediction] = []
    for row in rows:
        if row.run_id not in jobs:
            run = RunJob(row.job, None) if row.job is not None else job_from_row(row.fields)
            if restack is not None and run.job is not None:
                run = RunJob(replace(run.job, stack=restack(run.job.stack)), None)
            jobs[row.run_id] = run
        run = jobs[row.run_id]
        skipped = run.skipped
        predicted = None
        if skipped is None and row.metric not in METRICS:
            skipped = f"metric {row.metric!r} is not predicted"
        convention = flops_convention_of(row.fields) if row.metric in FLOP_METRICS else None
        if skipped is None and run.job is not None and row.run_id not in results:
            results[row.run_id] = _estimated(estimator, run.job, graphs)
        result = results.get(row.run_id)
        if skipped is None and isinstance(result, str):  # this run's refusal; the other runs go on
            skipped = result
        if skipped is None and run.job is not None:
            assert isinstance(result, Result)
            if row.run_id not in params_by_run:  # every metric row of a run needs it: build the graph once
                params_by_run[row.run_id] = estimator_params(run.job.model)
            params = params_by_run[row.run_id]
            try:
                if row.metric in LAYER_METRICS:
                    predicted = _layer_metric(row.metric, run.job, graphs, estimator)
                else:
                    predicted = metric_value(row.metric, run.job, result, params, convention)
            except TrainsimError as exc:  # a FLOP convention that counts transformers only; no block
                skipped = str(exc)
        out.append(RowPrediction(row.run_id, row.source, row.metric, row.measured, predicted, estimator.name,
                                 skipped))
        if progress:
            progress()
    return out


def _estimated(estimator: Estimator, job: Job, graphs: GraphCache) -> Result | str:
    """The engine's result for a run's job, or its one-line refusal (a simulation past its size bound)."""
    try:
        return estimator.estimate(job, graphs.get(job))
    except TrainsimError as exc:
        return str(exc)


def _layer_metric(metric: str, job: Job, graphs: GraphCache, estimator: Estimator) -> float:
    pricer = getattr(estimator, "pricer", None)
    if not isinstance(pricer, Pricer):
        raise TrainsimError(f"metric {metric}: engine {estimator.name} prices no layers")
    return layer_time_ms(metric, job, graphs.get(job), pricer)


def estimator_params(model: ModelSpec) -> float:
    """Parameter count of a model from its op graph; of a mixture of experts, the active parameters (the experts a
    token is routed to), which the parameter-based FLOP conventions count."""
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.strategy.device_slice import DeviceSlice

    total = build_graph(model, DeviceSlice(1, 8, policy_for("bf16"))).param_count()
    return total - model.idle_expert_params if isinstance(model, TransformerSpec) else total


def summarize(predictions: list[RowPrediction]) -> list[dict[str, Any]]:
    """MAPE per (source, metric), plus per metric over all sources."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    skipped: dict[tuple[str, str], int] = {}
    for p in predictions:
        for key in ((source_group(p.source), p.metric), ("ALL", p.metric)):
            if p.predicted is None:
                skipped[key] = skipped.get(key, 0) + 1
            else:
                groups.setdefault(key, []).append((p.predicted, p.measured))
    keys = sorted(set(groups) | set(skipped), key=lambda k: (k[0] == "ALL", k[0], k[1]))
    return [{"source": source, "metric": metric, "n": len(groups.get((source, metric), [])),
             "skipped": skipped.get((source, metric), 0), "mape_pct": mape(groups.get((source, metric), []))}
            for source, metric in keys]


