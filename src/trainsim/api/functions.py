"""The Python API: predict, simulate, search and validate, with the command line's names.

Every function takes what its command takes, by the flag's name with underscores (`--micro-batch 2` is
`micro_batch=2`), and also objects (a ModelSpec, a ClusterSpec, a ParallelSpec). The commands are thin layers
over these functions: `trainsim predict ... --json` prints `predict(...).to_dict()`.
"""

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

from trainsim.api.objectives import check_energy, check_objective, plan_extras, rerank
from trainsim.api.results import PlanPoint, PlanRow, Prediction, SearchResult, ValidationResult
from trainsim.catalog import load_cluster
from trainsim.catalog.calibration import Calibration, read_calibration
from trainsim.catalog.files import key_lines, shown_path
from trainsim.cost.compute import RooflineCosts
from trainsim.cost.profiled import ProfiledCosts
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES, make_engine
from trainsim.frontends.registry import FRONTENDS, ModelSource
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.jobfile import (
    DEFAULT_CLUSTER,
    DEFAULT_MODEL,
    MODEL_SPEC_TYPES,
    job_from_settings,
    model_source,
    read_job_file,
)
from trainsim.pipeline import GraphCache, graph_for
from trainsim.profile.database import default_db_path
from trainsim.report.search import plan_to_dict
from trainsim.report.validate import validate_to_dict
from trainsim.search.pareto import pareto_front
from trainsim.search.planner import Planner, SearchReport
from trainsim.search.space import SearchSpace
from trainsim.strategy.parallel import (
    ATTENTION_KERNELS,
    OPTIMIZER_IMPLS,
    AttentionKernel,
    OptimizerImpl,
    ParallelSpec,
    Recompute,
    Schedule,
)
from trainsim.strategy.precision import PRECISIONS, Precision
from trainsim.strategy.stack import StackSpec, make_stack

StackArg = str | Mapping[str, Any] | StackSpec | None  # a preset name, {preset: NAME, behaviour: value}, a spec

if TYPE_CHECKING:  # NB: the compiler loads with the engines that simulate, not with every prediction
    from trainsim.compile.context import TaskLevel
    from trainsim.validate.predict_runs import Restack

ModelArg = str | Path | ModelSpec
ClusterArg = str | Path | ClusterSpec
FOLDER_DB = "profile.db"  # a measured folder's own profile database (trainsim measure --suite ... --profile-ops)


class Strategy(TypedDict, total=False):
    """The strategy keywords: ParallelSpec's fields, the `--tp`, `--micro-batch` ... flags of the command line
    (a test checks that they are the same names)."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    sp: bool
    zero: int
    recompute: Recompute
    micro_batch: int
    global_batch: int
    seq_len: int
    precision: Precision
    schedule: Schedule
    attention: AttentionKernel
    optimizer_impl: OptimizerImpl
    first_stage_layers: int
    last_stage_layers: int
    embedding_in_split: bool
    loss_in_split: bool
    stage_layers: list[int]


def predict(model: ModelArg | None = None, cluster: ClusterArg | None = None, num_gpus: int | None = None, *,
            job_file: str | Path | None = None, strategy: ParallelSpec | Mapping[str, Any] | None = None,
            frontend: str | None = None, engine: str = "analytical", costs: str = "roofline",
            db: str | Path | None = None, task_level: "TaskLevel" = "layer", tree: str | Path | None = None,
            calibration: str | Path | None = None, stack: "StackArg" = None,
            stack_overrides: Mapping[str, Any] | None = None, **flags: Unpack[Strategy]) -> Prediction:
    """Predict one training job: iteration time, throughput, MFU, peak memory and where the time goes.

    model: a catalog name, a model YAML, a Hugging Face config.json or folder (or FILE.py:factory and traces with
    their front-end), or a ModelSpec; cluster: a preset name, a cluster YAML or a ClusterSpec; num_gpus scales
    the cluster. job_file: a job YAML whose keys the other arguments override. strategy: a ParallelSpec or a
    mapping of its fields; `flags` (tp=2, micro_batch=4, ...) override it. engine: analytical, sim,
    precision-aware, replay; costs: roofline or profiled (with db, a `trainsim profile` database);
    tree: a strategy-tree YAML (engine sim); calibration: a file written by `trainsim calibrate --output` (default:
    the job file's `calibration:`, else the package's fit); stack: the training stack (a preset name such as
    megatron-core or fsdp2, a mapping {preset: NAME, behaviour: value ...}, or a StackSpec; default: the job
    file's, else generic), stack_overrides: behaviour -> value on top of it. Defaults are the command line's:
    gpt3-1.3b on dgx-a100-80gb.

    >>> import trainsim
    >>> r = trainsim.predict(model="gpt3-125m", num_gpus=8, tp=2, global_batch=64, seq_len=1024)
    >>> r.engine, r.oom, r.iteration_time_s > 0
    ('analytical', False, True)
    >>> round(sum(r.breakdown.values()) / r.iteration_time_s, 9)
    1.0
    """
    entry = ENGINES.get(engine)
    if tree is not None and not entry.takes_plan:
        raise ConfigError("engine", engine, "a strategy tree needs engine sim")
    settings = read_job_file(Path(job_file) if job_file is not None else None)
    settings.update(_strategy_settings(strategy))
    given: dict[str, Any] = {"model": model, "frontend": frontend, "cluster": cluster, "num_gpus": num_gpus,
                             **flags}
    settings.update({key: (str(value) if isinstance(value, Path) else value)
                     for key, value in given.items() if value is not None})
    if stack is not None:
        settings["stack"] = stack
    settings["stack_overrides"] = dict(stack_overrides or {})
    job = _job_naming_lines(settings, job_file, given)
    cal = read_calibration(Path(calibration) if calibration is not None else settings.get("calibration"))
    estimator = make_engine(engine, costs, Path(db) if db is not None else None, task_level, cal)
    source = None if isinstance(settings.get("model"), MODEL_SPEC_TYPES) else model_source(settings)
    graph = graph_for(job, source)
    plan = None
    if tree is not None:
        from trainsim.strategy.tree_yaml import load_tree_yaml  # NB: loaded for a tree only (start-up)

        plan = load_tree_yaml(Path(tree), graph).lower(job.parallel)
    result = estimator.estimate(job, graph, plan)
    if costs == "profiled" and not entry.replays_traces:
        result = replace(result, notes=[*result.notes, *profile_coverage_notes(job, graph, db, cal)])
    return Prediction.of(result, job)


def _job_naming_lines(settings: dict[str, Any], job_file: str | Path | None, given: Mapping[str, Any]) -> Job:
    """job_from_settings; a bad value that came from the job file names the file and its line."""
    try:
        return job_from_settings(settings)
    except ConfigError as exc:
        if job_file is None or given.get(exc.field) is not None:
            raise
        line = key_lines(Path(job_file)).get(exc.field)
        if line is None:
            raise
        raise ConfigError(f"{shown_path(job_file)} line {line}: {exc.field}", exc.value, exc.allowed) from None


def profile_coverage_notes(job: Job, graph: OpGraph, db: str | Path | None, cal: Calibration) -> list[str]:
    """How much of the job's op time the profile database measured (cost.profiled.Coverage), and a warning
    with the command that measures the job's own shapes when most of it is scaled or on the roofline."""
    costs = ProfiledCosts(Path(db) if db is not None else default_db_path(), fallback=RooflineCosts(cal))
    coverage = costs.coverage(graph, job.cluster.device)
    notes = [coverage.describe()]
    if coverage.unmeasured_dominates:
        par = job.parallel
        db_flag = f" --db {db}" if db is not None else ""
        notes.append(f"warning: {coverage.share('scaled', 'fallback'):.0%} of the op time is not measured (the "
                     f"profile misses this job's shapes): trainsim profile --model {job.model.name} --precision "
                     f"{par.precision} --micro-batch {par.micro_batch} --seq-len {par.seq_len} --tp {par.tp}"
                     f"{db_flag}")
    return notes


def simulate(model: ModelArg | None = None, cluster: ClusterArg | None = None, num_gpus: int | None = None, *,
             job_file: str | Path | None = None, strategy: ParallelSpec | Mapping[str, Any] | None = None,
             frontend: str | None = None, costs: str = "roofline", db: str | Path | None = None,
             task_level: "TaskLevel" = "layer", tree: str | Path | None = None,
             calibration: str | Path | None = None, stack: "StackArg" = None,
             stack_overrides: Mapping[str, Any] | None = None, **flags: Unpack[Strategy]) -> Prediction:
    """predict(..., engine="sim"): the event simulation of one iteration, whose Prediction carries the timeline
    (per stage and stream), the memory over the iteration, a Chrome/Perfetto trace (write_trace) and the
    critical path (explain).

    >>> import trainsim
    >>> r = trainsim.simulate(model="gpt3-125m", num_gpus=8, pp=2, global_batch=16)
    >>> len(r.timeline["devices"]), r.breakdown["bubble"] > 0
    (2, True)
    """
    return predict(model, cluster, num_gpus, job_file=job_file, strategy=strategy, frontend=frontend,
                   engine="sim", costs=costs, db=db, task_level=task_level, tree=tree, calibration=calibration,
                   stack=stack, stack_overrides=stack_overrides, **flags)


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


def _strategy_settings(strategy: ParallelSpec | Mapping[str, Any] | None) -> dict[str, Any]:
    if strategy is None:
        return {}
    if isinstance(strategy, ParallelSpec):
        # the fields the object was given; dp and global_batch 0 mean "inferred", as when left out
        data = strategy.model_dump(include=strategy.model_fields_set)
        return {key: value for key, value in data.items() if not (key in ("dp", "global_batch") and value == 0)}
    unknown = set(strategy) - set(ParallelSpec.model_fields)
    if unknown:
        allowed = ", ".join(ParallelSpec.model_fields)
        raise ConfigError("strategy", sorted(unknown)[0], f"unknown key; allowed: {allowed}")
    return dict(strategy)


def _points(report: SearchReport) -> list[PlanPoint]:
    feasible = [i for i, plan in enumerate(report.priced) if not plan.oom]
    front = pareto_front([(report.priced[i].tokens_per_s, report.priced[i].peak_memory_bytes) for i in feasible])
    on_front = {feasible[i] for i in front}
    return [PlanPoint(description=plan.parallel.describe(), strategy=plan.parallel.model_dump(),
                      tokens_per_s=plan.tokens_per_s, peak_memory_gib=plan.peak_memory_bytes / 2**30, oom=plan.oom,
                      pareto=index in on_front)
            for index, plan in enumerate(report.priced)]
