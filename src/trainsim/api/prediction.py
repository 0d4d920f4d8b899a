"""The Python API's predict and simulate, with the command line's names.

Every function takes what its command takes, by the flag's name with underscores (`--micro-batch 2` is
`micro_batch=2`), and also objects (a ModelSpec, a ClusterSpec, a ParallelSpec). `trainsim predict ... --json`
prints `predict(...).to_dict()`. NB: a module of its own, apart from search and validate (api.functions), so that
`trainsim predict` does not load the planner, the search space and the validation tables.
"""

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from trainsim.api.results import Prediction
from trainsim.catalog.calibration import Calibration, read_calibration
from trainsim.catalog.files import key_lines, shown_path
from trainsim.cost.compute import RooflineCosts
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES, make_engine
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.jobfile import MODEL_SPEC_TYPES, job_from_settings, model_source, read_job_file
from trainsim.pipeline import graph_for
from trainsim.profile.paths import default_db_path
from trainsim.strategy.parallel import AttentionKernel, OptimizerImpl, ParallelSpec, Recompute, Schedule
from trainsim.strategy.precision import Precision
from trainsim.strategy.stack import StackSpec

StackArg = str | Mapping[str, Any] | StackSpec | None  # a preset name, {preset: NAME, behaviour: value}, a spec

if TYPE_CHECKING:  # NB: the compiler loads with the engines that simulate, not with every prediction
    from trainsim.compile.context import TaskLevel

ModelArg = str | Path | ModelSpec
ClusterArg = str | Path | ClusterSpec


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
    tree: a strategy-tree YAML (engine sim; analytical: its ops' tp configs only); calibration: a file written by
    `trainsim calibrate --output` (default: the job file's `calibration:`, else the package's fit); stack: the
    training stack (a preset name such as megatron-core or fsdp2, a mapping {preset: NAME, behaviour: value ...},
    or a StackSpec; default: the job file's, else generic), stack_overrides: behaviour -> value on top of it.
    Defaults are the command line's: gpt3-1.3b on dgx-a100-80gb.

    >>> import trainsim
    >>> r = trainsim.predict(model="gpt3-125m", num_gpus=8, tp=2, global_batch=64, seq_len=1024)
    >>> r.engine, r.oom, r.iteration_time_s > 0
    ('analytical', False, True)
    >>> round(sum(r.breakdown.values()) / r.iteration_time_s, 9)
    1.0
    """
    entry = ENGINES.get(engine)
    if tree is not None and not entry.takes_plan:
        takes = [name for name in ENGINES.names() if ENGINES.get(name).takes_plan]
        raise ConfigError("engine", engine, f"a strategy tree needs an engine that reads it: {', '.join(takes)}")
    settings = read_job_file(Path(job_file) if job_file is not None else None)
    settings.update(_strategy_settings(strategy))
    given: dict[str, Any] = {"model": model, "frontend": frontend, "cluster": cluster, "num_gpus": num_gpus,
                             **flags}
    settings.update({key: (str(value) if isinstance(value, Path) else value)
                     for key, value in given.items() if value is not None})
    if stack is not None:
        settings["stack"] = stack
    settings["stack_overrides"] = dict(stack_overrides or {})
    job = _job_naming_lines(settings, job_file, given, tree is not None)
    cal = read_calibration(Path(calibration) if calibration is not None else settings.get("calibration"))
    estimator = make_engine(engine, costs, Path(db) if db is not None else None, task_level, cal)
    source = None if isinstance(settings.get("model"), MODEL_SPEC_TYPES) else model_source(settings)
    graph = graph_for(job, source)
    plan = None
    if tree is not None:
        from trainsim.compile.stage_meshes import with_captures  # NB: loaded for a tree only (start-up)
        from trainsim.strategy.tree_yaml import load_tree_yaml

        plan = load_tree_yaml(Path(tree), graph).lower(job.parallel, num_gpus=job.num_gpus)
        plan = with_captures(job, plan, lambda mesh_job: graph_for(mesh_job, source))  # stages of a captured graph
    result = estimator.estimate(job, graph, plan)
    if costs == "profiled" and not entry.replays_traces:
        result = replace(result, notes=[*result.notes, *profile_coverage_notes(job, graph, db, cal)])
    return Prediction.of(result, job)


def _job_naming_lines(settings: dict[str, Any], job_file: str | Path | None, given: Mapping[str, Any],
                      tree_sizes_stages: bool = False) -> Job:
    """job_from_settings; a bad value that came from the job file names the file and its line."""
    try:
        return job_from_settings(settings, tree_sizes_stages=tree_sizes_stages)
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
    from trainsim.cost.profiled import ProfiledCosts  # NB: with --costs profiled only (start-up)

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
