"""The Python API's search and validate, with the command line's names (predict and simulate: api.prediction).

Every function takes what its command takes, by the flag's name with underscores (`--max-micro-batch 8` is
`max_micro_batch=8`), and also objects (a ModelSpec, a ClusterSpec). The commands are thin layers over these
functions: `trainsim search ... --json` prints `search(...).to_dict()`.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trainsim.api.objectives import check_energy, check_objective, plan_extras, rerank
from trainsim.api.prediction import ClusterArg, ModelArg, StackArg
from trainsim.api.results import PlanPoint, PlanRow, SearchResult, ValidationResult
from trainsim.catalog import load_cluster
from trainsim.catalog.calibration import read_calibration
from trainsim.errors import ConfigError
from trainsim.estimate.engines import make_engine
from trainsim.frontends.registry import FRONTENDS, ModelSource
from trainsim.hardware.cluster import ClusterSpec
from trainsim.jobfile import DEFAULT_CLUSTER, DEFAULT_MODEL
from trainsim.pipeline import GraphCache
from trainsim.report.search import plan_to_dict
from trainsim.report.validate import validate_to_dict
from trainsim.search.pareto import pareto_front
from trainsim.search.planner import Planner, SearchReport
from trainsim.search.space import SearchSpace
from trainsim.strategy.parallel import ATTENTION_KERNELS, OPTIMIZER_IMPLS, AttentionKernel, OptimizerImpl, ParallelSpec
from trainsim.strategy.precision import PRECISIONS, Precision
from trainsim.strategy.stack import StackSpec, make_stack

if TYPE_CHECKING:
    from trainsim.validate.predict_runs import Restack

FOLDER_DB = "profile.db"  # a measured folder's own profile database (trainsim measure --suite ... --profile-ops)


def search(model: ModelArg = DEFAULT_MODEL, cluster: ClusterArg = DEFAULT_CLUSTER, num_gpus: int | None = None, *,
           global_batch: int | None = None, seq_len: int | None = None, precision: str | None = None,
           attention: str | None = None, optimizer_impl: str | None = None, frontend: str = "catalog",
           top_k: int = 10, max_micro_batch: int = 16, all_plans: bool = False,
           objective: str = "throughput", tokens: float | None = None, price_per_gpu_hour: float | None = None,
           min_headroom_gib: float | None = None, progress: Callable[[int, int], None] | None = None,
           calibration: str | Path | None = None, stack: "StackArg" = None,
           stack_overrides: Mapping[str, Any] | None = None) -> SearchResult:
    """Try every plain strategy (tp, pp, dp, vpp, micro-batch, recompute, ZeRO, sp) for a model, a cluster size
    and a global batch; rank the feasible plans by tokens/s and count why the others were refused.

    all_plans: also return every plan priced (throughput, peak memory, on the Pareto front or not);
    objective: throughput | time-to-train | cost | energy | memory-headroom (api.objectives: for a fixed cluster
    size time, cost and energy rank as throughput, and add their numbers: tokens to train, price per GPU-hour;
    the energy at the device's catalog max_power_w);
    min_headroom_gib: refuse plans leaving less memory free; progress(done, total) is called as plans are tried;
    calibration: a file written by `trainsim calibrate --output` (default: the package's fit); stack and
    stack_overrides: the training stack every plan runs on, as predict takes them (its attention kernel is the
    default one).

    >>> import trainsim
    >>> s = trainsim.search(model="gpt3-125m", num_gpus=8, global_batch=32, seq_len=512, top_k=3)
    >>> len(s.plans), s.tried == s.feasible + sum(s.infeasible.values())
    (3, True)
    """
    if global_batch is None:
        raise ConfigError("global_batch", None, "pass --global-batch N (sequences per optimizer step)")
    check_objective(objective, tokens, price_per_gpu_hour, min_headroom_gib)
    for name, value in (("num_gpus", num_gpus), ("global_batch", global_batch), ("seq_len", seq_len),
                        ("max_micro_batch", max_micro_batch), ("top_k", top_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(name, value, "must be a positive integer")
    for name, value, choices in (("precision", precision, PRECISIONS), ("attention", attention, ATTENTION_KERNELS),
                                 ("optimizer_impl", optimizer_impl, OPTIMIZER_IMPLS)):
        if value is not None and value not in choices:
            raise ConfigError(name, value, "choose one of: " + ", ".join(choices))
    FRONTENDS.get(frontend)
    if isinstance(model, str | Path):
        source = ModelSource(str(model), frontend)
        model_spec, graphs = source.model_spec(), GraphCache(source.frontend, source.source)
    else:  # a model object: the catalog builders read it
        model_spec, graphs = model, GraphCache("catalog")
    cluster_spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(str(cluster))
    if num_gpus is not None:
        cluster_spec = cluster_spec.with_num_gpus(num_gpus)
    check_energy(objective, cluster_spec)
    defaults = ParallelSpec()
    stack_spec = make_stack(stack, dict(stack_overrides or {}))
    space = SearchSpace(global_batch=global_batch, seq_len=seq_len or defaults.seq_len,
                        precision=cast(Precision, precision or defaults.precision),
                        attention=cast(AttentionKernel, attention or stack_spec.attention),
                        optimizer_impl=cast(OptimizerImpl, optimizer_impl or defaults.optimizer_impl),
                        stack=stack_spec, max_micro_batch=max_micro_batch)
    planner = Planner(make_engine("analytical", calibration=read_calibration(
        Path(calibration) if calibration is not None else None)), graphs=graphs)
    report = planner.search(model_spec, cluster_spec, space, top_k=top_k, progress=progress)
    report = rerank(report, planner, model_spec, cluster_spec, objective, min_headroom_gib, top_k)
    by = "tokens/s" if objective == "throughput" else objective
    title = (f"{model_spec.name} on {cluster_spec.name} ({cluster_spec.num_gpus} GPUs), global batch "
             f"{space.global_batch} x {space.seq_len} tokens, {space.precision}: best {len(report.plans)} by {by}")
    capacity_gib = (report.plans[0].result.memory_capacity_bytes if report.plans
                    else cluster_spec.device.hbm_bytes) / 2**30
    rows = [plan_to_dict(plan) for plan in report.plans]
    rows = [{**row, **plan_extras(row, cluster_spec.num_gpus, capacity_gib, tokens, price_per_gpu_hour,
                                  cluster_spec.device.max_power_w)} for row in rows]
    return SearchResult.model_validate({
        "schema": SearchResult._tag().model_dump(), "title": title, "model": model_spec.name,
        "cluster": cluster_spec.name, "num_gpus": cluster_spec.num_gpus, "objective": objective,
        "memory_capacity_gib": capacity_gib,
        "plans": [PlanRow.model_validate(row) for row in rows], "tried": report.tried,
        "feasible": report.feasible, "infeasible": report.infeasible,
        "all_plans": _points(report) if all_plans else None,
    })


def validate(runs: str | Path, *, engine: str | None = None, costs: str | None = None, db: str | Path | None = None,
             frontend: str = "catalog", progress: Callable[[int, int], None] | None = None,
             calibration: str | Path | None = None, stack: "StackArg" = None,
             stack_overrides: Mapping[str, Any] | None = None) -> ValidationResult:
    """Predict measured runs (a runs.csv in the schema of shared/data/calibration/runs.csv, or a folder written
    by `trainsim measure`) with one or more engines; the error per run and the MAPE per engine, source and metric.

    engine: comma-separated engines or "all" (default: all for a folder, analytical for a CSV); costs:
    roofline | profiled | both (default: both with a profile database - db, or FOLDER/profile.db - else
    roofline). progress(done, total) is called after every prediction. calibration: a file written by
    `trainsim calibrate --output` (default: the package's fit). stack: replaces every run's stated stack;
    stack_overrides: behaviours set on top of each run's stack (the runs' attention kernels stay).
    """
    from trainsim.validate.compare import by_job, compare, engine_choices, summaries
    from trainsim.validate.measured import read_measured
    from trainsim.validate.runs import read_runs

    FRONTENDS.get(frontend)  # unknown names: one line listing the choices
    cal = read_calibration(Path(calibration) if calibration is not None else None)
    restack = _restack(stack, dict(stack_overrides or {}))
    path = Path(runs)
    folder = path.is_dir()
    rows = read_measured(path) if folder else read_runs(path)
    database = Path(db) if db is not None else None
    if database is None and folder and (path / FOLDER_DB).is_file():
        database = path / FOLDER_DB
    choices = engine_choices(engine or ("all" if folder else "analytical"),
                             costs or ("both" if database is not None else "roofline"))
    total, done = len(rows) * len(choices), [0]

    def advance() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    predictions = compare(rows, choices, database, progress=advance, frontend=frontend, calibration=cal,
                          restack=restack)
    summary = summaries(predictions)
    jobs = by_job(predictions) if folder else []
    data = validate_to_dict(predictions, str(database) if database else None, summary, jobs)
    return ValidationResult.model_validate({"schema": ValidationResult._tag().model_dump(), **data})


def _restack(stack: "StackArg", overrides: dict[str, Any]) -> "Restack | None":
    """A stack replaces every run's stack; the behaviour overrides apply on top (the runs' attention kernels
    stay). Bad names and values fail here, before any prediction."""
    if stack is None and not overrides:
        return None
    checked = make_stack(stack, overrides)  # bad names and values fail here, before any prediction
    chosen = checked if stack is not None else None

    def restack(stated: StackSpec) -> StackSpec:
        return chosen if chosen is not None else make_stack(stated, overrides)

    return restack


def _points(report: SearchReport) -> list[PlanPoint]:
    feasible = [i for i, plan in enumerate(report.priced) if not plan.oom]
    front = pareto_front([(report.priced[i].tokens_per_s, report.priced[i].peak_memory_bytes) for i in feasible])
    on_front = {feasible[i] for i in front}
    return [PlanPoint(description=plan.parallel.describe(), strategy=plan.parallel.model_dump(),
                      tokens_per_s=plan.tokens_per_s, peak_memory_gib=plan.peak_memory_bytes / 2**30, oom=plan.oom,
                      pareto=index in on_front)
            for index, plan in enumerate(report.priced)]
