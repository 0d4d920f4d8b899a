"""`trainsim measure`: run a job for real with torch.distributed on this machine and record what happened.

Parse (a job file and the flags of `predict` -> Job; the loop settings), compute (trainsim.measure: one process
per rank, warm-up, timed iterations, a result file per run), render (a summary table or one JSON object).
`--suite local` measures the local ground-truth suite instead of one job (resumable).
"""

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from trainsim.cli.errors import handles_errors
from trainsim.cli.strategy_options import ALL_FIELDS, GIVEN, StrategyFlags, strategy_options
from trainsim.errors import ConfigError
from trainsim.job import Job
from trainsim.jobfile import job_from_settings, read_job_file
from trainsim.report.measure import render_run, render_suite, render_suite_jobs, suite_to_dict

LOCAL_CLUSTER = "local-cpu"
DEFAULT_PRECISION = "amp-bf16"  # bf16 mixed precision as torch runs it (autocast over fp32 weights)
MEASURE_FIELDS = ALL_FIELDS  # the strategy fields measure takes: predict's flags
MEASURE_NOTES = {"attention": "measured: flash2 (torch SDPA, its fused kernel on a GPU) | math (Megatron's unfused "
                 "CoreAttention: scores through memory, attention dropout 0.1)",
                 "cp": "not measured", "ep": "not measured",
                 "zero": "measured as 0 DDP | 1 ZeroRedundancyOptimizer | 2, 3 FSDP2",
                 "precision": "measured: fp32 | amp-bf16 (tf32 on GPUs)"}
MEASURE_DEFAULTS = {"precision": DEFAULT_PRECISION,
                    "optimizer_impl": "torch's default for the device"}


@handles_errors
@strategy_options(MEASURE_FIELDS, notes=MEASURE_NOTES, defaults=MEASURE_DEFAULTS)
def measure(
    job_file: Annotated[Path | None, typer.Argument(help="YAML/JSON job file; flags override it")] = None,
    model: Annotated[str | None, typer.Option(help="catalog name, model YAML, or HF config.json")] = None,
    frontend: Annotated[str, typer.Option(help="whose model the ranks train: catalog (measure's transformer) or "
                                          "torch (the Hugging Face model the torch front-end captures; with "
                                          "--tree its tp configs as torch's tp styles)")] = "catalog",
    cluster: Annotated[str | None, typer.Option(help="cluster preset or YAML (default: local-cpu without GPUs)")]
    = None,
    num_gpus: Annotated[int | None, typer.Option(help="ranks (default: tp x pp x dp)")] = None,
    strategy_flags: StrategyFlags = GIVEN,  # MEASURE_FIELDS
    iterations: Annotated[int, typer.Option(help="timed iterations")] = 20,
    warmup: Annotated[int, typer.Option(help="untimed iterations first")] = 5,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="fail if a run takes longer (seconds)")] = 600.0,
    out: Annotated[Path, typer.Option(help="folder for the result files (RUN_ID.json)")] = Path("measured"),
    run_id: Annotated[str | None, typer.Option("--run-id", help="result file name (default: from the job)")]
    = None,
    threads: Annotated[int | None, typer.Option(help="intra-op threads per rank (default 1 on a CPU)")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="torch.profiler Chrome trace per rank")] = False,
    execution_trace: Annotated[bool, typer.Option("--execution-trace", help="PyTorch execution trace per rank")]
    = False,
    suite: Annotated[str | None, typer.Option(help="measure a suite of jobs instead: local")] = None,
    repeats: Annotated[int, typer.Option(help="with --suite: measure every job this many times")] = 1,
    list_suite: Annotated[bool, typer.Option("--list", help="with --suite: list its jobs, measure nothing")]
    = False,
    profile_ops: Annotated[bool, typer.Option("--profile-ops/--no-profile-ops",
                                              help="with --suite: after measuring, profile the jobs' ops and gloo "
                                              "collectives into OUT/profile.db (profiled costs for validate)")]
    = True,
    tree: Annotated[Path | None, typer.Option(help="strategy-tree YAML: run its computation configs (op splits "
                                              "with resharding collectives) on data-parallel ranks, or with "
                                              "--tp its per-op tp configs on the tp ranks; fp32")] = None,
    memory_cap_gib: Annotated[float, typer.Option("--memory-cap-gib", help="per-rank memory cap the harness "
                                                  "enforces (GiB above the rank's baseline); over it the run "
                                                  "records outcome oom (0: none)")] = 0.0,
    sharder: Annotated[str | None, typer.Option(help="DLRM: shard the embedding tables with this sharder of Lin "
                                                "et al. Table III and train it on --num-gpus gloo ranks (index and "
                                                "pooled all-to-alls, dense all-reduce; fp32)")] = None,
    sharding: Annotated[Path | None, typer.Option(help="DLRM: a sharding file placing every table (docs/"
                                                  "recommendation.md); as --sharder")] = None,
    seed: Annotated[int, typer.Option(help="DLRM: seed of the random sharder, the weights and the index batches")]
    = 0,
    allocator: Annotated[str | None, typer.Option(help="DLRM: the ranks' malloc policy: keep (freed memory stays "
                                                  "in the process, as a GPU's caching allocator; the default) | "
                                                  "system (the C library's defaults)")] = None,
    phase_normalise: Annotated[bool, typer.Option(
        "--phase-normalise", help="time a fixed reference workload (measure/phase.py) on every rank just before "
        "and after every timed step; the run records the probe timings and each step's CPU seconds, and reports "
        "its step time scaled to the machine's fast speed phase beside the raw one")] = False,
    dlrm_tasks: Annotated[Path | None, typer.Option("--dlrm-tasks", help="DLRM campaign: a YAML file of generated "
                                                    "tasks (tasks: [{kind: heavy|normal, seed: N}, ...])")] = None,
    generated: Annotated[int | None, typer.Option(help="DLRM campaign: this many generated tasks (Lin et al. Sec. "
                                                  "IV-B1; --task-kind)")] = None,
    task_kind: Annotated[str | None, typer.Option(help="DLRM campaign, with --generated: mixed (heavy and normal "
                                                  "alternated; the default) | heavy | normal")] = None,
    batch: Annotated[str | None, typer.Option(help="DLRM campaign: local batch sizes, comma-separated (default "
                                              "32,128)")] = None,
    ranks: Annotated[str | None, typer.Option(help="DLRM campaign: gloo rank counts, comma-separated (default "
                                              "2,4)")] = None,
    no_interleave: Annotated[bool, typer.Option("--no-interleave", help="DLRM campaign: a task's configs one after "
                                                "another (default: one iteration of each in turn)")] = False,
    traced_iterations: Annotated[int | None, typer.Option(help="DLRM campaign with --execution-trace: traced "
                                                          "iterations per config (default 1; more: OUT/traces/"
                                                          "<config>/t0, t1, ...)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Run a training job for real (torch.distributed: gloo on CPUs, NCCL on GPUs) and record its iteration
    time (median, p10, p90), peak memory per rank and throughput in OUT/RUN_ID.json. With --generated or
    --dlrm-tasks: a resumable DLRM campaign (tasks x --batch x --ranks x --sharder) into OUT/dlrm_campaign.csv."""
    flags = dict(model=model, cluster=cluster, num_gpus=num_gpus, **strategy_flags)
    from trainsim.measure.launch import MEASURED_FRONTENDS

    if frontend not in MEASURED_FRONTENDS:
        raise ConfigError("frontend", frontend, f"choose one of: {', '.join(MEASURED_FRONTENDS)}")
    if frontend != "catalog" and (dlrm_tasks is not None or generated is not None or sharder is not None
                                  or sharding is not None or suite is not None):
        raise ConfigError("frontend", frontend, "applies to one transformer run (not a suite or a DLRM)")
    if dlrm_tasks is not None or generated is not None:  # a DLRM campaign (cli.measure_dlrm)
        from trainsim.cli.measure_dlrm import CampaignFlags, measure_campaign, refuse_unsupported

        given = [f"--{k.replace('_', '-')}" for k, v in flags.items() if v is not None]
        if job_file is not None or given or run_id is not None or sharding is not None:
            raise ConfigError("generated" if generated is not None else "dlrm_tasks",
                              generated if generated is not None else str(dlrm_tasks),
                              "a campaign builds its own DLRMs; drop the job file, --sharding, --run-id and "
                              + (" ".join(given) or "the model flags"))
        refuse_campaign = {"suite": suite, "tree": tree, "threads": threads, "profile": profile,
                           "memory_cap_gib": memory_cap_gib, "list": list_suite,
                           "repeats": repeats if repeats != 1 else None}
        refuse_unsupported(refuse_campaign, "a DLRM campaign (--generated/--dlrm-tasks)")
        measure_campaign(CampaignFlags(dlrm_tasks, generated, task_kind, batch, ranks, sharder, iterations, warmup,
                                       timeout_s, allocator, not no_interleave, execution_trace, phase_normalise,
                                       traced_iterations),
                         out, as_json)
        return
    campaign_only = {"task_kind": task_kind, "batch": batch, "ranks": ranks, "no_interleave": no_interleave,
                     "traced_iterations": traced_iterations}
    for name, value in campaign_only.items():
        if value not in (None, False):
            raise ConfigError(name, value, "applies to a DLRM campaign (--generated/--dlrm-tasks) only")
    if sharder is not None or sharding is not None:  # a DLRM with sharded tables (cli.measure_dlrm)
        from trainsim.cli.measure_dlrm import measure_sharded, refuse_unsupported

        refuse_unsupported({"suite": suite, "tree": tree, "threads": threads, "profile": profile,
                            "execution_trace": execution_trace, "memory_cap_gib": memory_cap_gib,
                            "list": list_suite, "repeats": repeats if repeats != 1 else None})
        measure_sharded(job_file, flags, sharder, sharding, iterations=iterations, warmup=warmup,
                        timeout_s=timeout_s, out=out, run_id=run_id, as_json=as_json, seed=seed,
                        allocator=allocator, phase_normalise=phase_normalise)
        return
    if seed != 0 or allocator is not None:
        raise ConfigError("seed" if seed != 0 else "allocator", seed if seed != 0 else allocator,
                          "applies to --sharder/--sharding only")
    if suite is not None:
        if phase_normalise:
            raise ConfigError("phase_normalise", True, "applies to one run, not to --suite")
        given = [f"--{k.replace('_', '-')}" for k, v in flags.items() if v is not None]
        if job_file is not None or given or run_id is not None:
            raise ConfigError("suite", suite, f"measures its own jobs; drop the job file and {' '.join(given)}"
                              .rstrip())
        _measure_suite(suite, out, repeats, iterations, warmup, timeout_s, list_suite, as_json, profile_ops)
        return
    if repeats != 1 or list_suite:
        raise ConfigError("repeats" if repeats != 1 else "list", repeats if repeats != 1 else True,
                          "applies to --suite only")
    job = job_from_flags(job_file, {**flags, "frontend": frontend})
    if frontend == "torch":
        source = model if model is not None else read_job_file(job_file).get("model")
        extra = {**_front_end_run(tree, job, str(source or job.model.name)), "phase_probe": phase_normalise}
    else:
        extra = {**_split_run(tree, memory_cap_gib, model, job), "phase_probe": phase_normalise}
    _measure_one(job, out, run_id, iterations, warmup, timeout_s, threads, profile, execution_trace, as_json,
                 extra)


MAX_CAP_GIB = 1e6


def _split_run(tree: Path | None, memory_cap_gib: float, model: str | None, job: Job) -> dict[str, Any]:
    """make_spec's tree, its ops' computation configs, the CNN's dataflow and the memory cap from the flags."""
    if not 0.0 <= memory_cap_gib <= MAX_CAP_GIB:  # NB: also refuses NaN
        raise ConfigError("memory_cap_gib", memory_cap_gib, f"must be 0 (no cap) to {MAX_CAP_GIB:g} GiB")
    extra: dict[str, Any] = {"memory_cap_bytes": int(memory_cap_gib * 2**30)}
    if tree is None:
        return extra
    if not tree.is_file():
        raise ConfigError("tree", str(tree), "must be a strategy-tree YAML file")
    from trainsim.compile.splits import plan_splits
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.measure.split_model_files import dataflow_beside
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree_yaml import load_tree_yaml

    plan = load_tree_yaml(tree, build_graph(job.model, DeviceSlice.of(job.parallel))).lower(job.parallel)
    if plan.stage_meshes:
        raise ConfigError("tree", str(tree), "maps a stage to a mesh of its own (map tp / dp): `trainsim measure` "
                          "runs the job's one mesh; predict it with --engine sim")
    extra["tree_yaml"] = tree.read_text()
    if job.parallel.tp > 1:  # the tree's per-op tp configs, run by the job's tp Trainer (measure/op_parallel.py)
        extra["tp_degrees"], extra["tp_dims"] = _tp_layout(tree, plan, job)
        return extra
    configs = {f"{index}:{name}": [c.batch, c.seq, c.out, c.reduce]
               for index, split in plan_splits(plan, job.parallel.dp).items() for name, c in split.configs.items()}
    extra.update(dataflow=dataflow_beside(model) if model else None, op_configs=configs)
    return extra


def _front_end_run(tree: Path | None, job: Job, model: str) -> dict[str, Any]:
    """make_spec's front-end settings: with a tree, the tp style of each module it splits (measure.front_end_tp),
    after the compiler has shaped the captured graph's layers from its configs."""
    extra: dict[str, Any] = {"frontend": "torch"}
    if tree is None:
        return extra
    if not tree.is_file():
        raise ConfigError("tree", str(tree), "must be a strategy-tree YAML file")
    from trainsim.compile.shape_layers import shape_layers
    from trainsim.frontends.registry import ModelSource
    from trainsim.measure.front_end_tp import front_end_styles
    from trainsim.measure.launch import check_front_end
    from trainsim.pipeline import graph_for
    from trainsim.strategy.tree_yaml import load_tree_yaml

    check_front_end(job, tree=True)  # before the capture, which takes a while
    graph = graph_for(job, ModelSource(model, "torch"))
    plan = load_tree_yaml(tree, graph).lower(job.parallel)
    if plan.stage_meshes:
        raise ConfigError("tree", str(tree), "maps a stage to a mesh of its own (map tp / dp): `trainsim measure` "
                          "runs the job's one mesh; predict it with --engine sim")
    extra.update(tree_yaml=tree.read_text(), front_end_styles=front_end_styles(plan, shape_layers(job, plan),
                                                                                job.parallel.tp))
    return extra


def _tp_layout(tree: Path, plan: Any, job: Job) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, str]]]:
    """Each op's tp degree and split where the tree's configs are not Megatron's over tp (measure.tp_degrees),
    after the compiler's own checks of them (shape_layers: a tied table at one degree)."""
    from trainsim.compile.shape_layers import shape_layers
    from trainsim.measure.tp_degrees import plan_tp_layout

    if plan.op_splits:
        raise ConfigError("tree", str(tree), "splits ops over dp and over tp: `trainsim measure` runs one or the "
                          "other; predict it with --engine sim")
    shape_layers(job, plan)
    return plan_tp_layout(plan, job.parallel)


def job_from_flags(job_file: Path | None, flags: dict[str, Any]) -> Job:
    """Like predict's, with defaults for a local run: the local-cpu cluster when there is no GPU, as many
    ranks as tp x pp x dp x cp, amp-bf16 (torch.autocast) as the bf16 precision and torch.optim's default Adam
    step for the device; every rank on one node."""
    settings = read_job_file(job_file)
    settings.update({key: value for key, value in flags.items() if value is not None})
    if "cluster" not in settings and not _has_cuda():
        settings["cluster"] = LOCAL_CLUSTER
    if "num_gpus" not in settings:
        degree = 1
        for axis in ("tp", "pp", "cp", "dp"):
            value = settings.get(axis)
            degree *= value if isinstance(value, int) and value > 0 else 1
        settings["num_gpus"] = degree
    settings.setdefault("precision", DEFAULT_PRECISION)
    job = job_from_settings(settings)
    if "optimizer_impl" not in settings:  # torch's own default, recorded in the job
        from trainsim.measure.launch import device_kind, torch_default_optimizer

        impl = torch_default_optimizer(device_kind(job))
        job = replace(job, parallel=job.parallel.model_copy(update={"optimizer_impl": impl}))
    return replace(job, cluster=job.cluster.on_one_node())  # the launcher starts every rank on this host


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def measure_progress(as_json: bool, total: int | None) -> Progress:
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=total is None,
                    disable=as_json or not sys.stderr.isatty())


def _measure_one(job: Job, out: Path, run_id: str | None, iterations: int, warmup: int, timeout_s: float,
                 threads: int | None, profile: bool, execution_trace: bool, as_json: bool,
                 extra: dict[str, Any] | None = None) -> None:
    from trainsim.measure.launch import MeasureFailedError, launch, make_spec
    from trainsim.measure.results import load_run

    spec = make_spec(job, out, run_id=run_id, iterations=iterations, warmup=warmup, timeout_s=timeout_s,
                     threads=threads, profile=profile, execution_trace=execution_trace, **(extra or {}))
    _check_memory(job, spec.device)
    with measure_progress(as_json, None) as bar:
        task = bar.add_task(f"measuring {spec.run_id} on {job.num_gpus} rank(s) ({spec.device})", total=None)
        try:
            path = launch(spec, job.num_gpus, on_tick=lambda: bar.advance(task, 0))
        except MeasureFailedError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
    run = load_run(path)
    if as_json:
        typer.echo(json.dumps(run.to_dict(), indent=1))
        return
    typer.echo(render_run(run, terminal=sys.stdout.isatty()), nl=False)
    typer.echo(f"result: {path}", err=True)


def _check_memory(job: Job, device: str) -> None:
    """The analytical engine's peak per rank against this machine, before any rank starts."""
    from trainsim.measure.capacity import check_fits
    from trainsim.pipeline import predict

    check_fits(predict(job).peak_memory_bytes, job.num_gpus, device)


def _measure_suite(name: str, out: Path, repeats: int, iterations: int, warmup: int, timeout_s: float,
                   list_only: bool, as_json: bool, profile_ops: bool) -> None:
    from trainsim.measure.launch import MeasureFailedError
    from trainsim.measure.suite import SUITE_PROFILE_DB, describe_suite, run_suite, suite_jobs, summarize_suite
    from trainsim.profile.suite import profile_suite

    if repeats < 1:
        raise ConfigError("repeats", repeats, "must be at least 1")
    if list_only:
        typer.echo(render_suite_jobs(describe_suite(name)))
        return
    total = len(suite_jobs(name)) * repeats
    with measure_progress(as_json, total) as bar:
        task = bar.add_task(f"suite {name}", total=total)

        def advanced(rid: str, skipped: bool) -> None:
            bar.update(task, advance=1, description=f"suite {name}: {rid}{' (kept)' if skipped else ''}")

        try:
            runs = run_suite(name, out, repeats=repeats, iterations=iterations, warmup=warmup,
                             timeout_s=timeout_s, progress=advanced, tick=lambda: bar.advance(task, 0))
        except MeasureFailedError as exc:
            print(f"error: {exc} (rerun the same command to resume)", file=sys.stderr)
            raise typer.Exit(1) from None
        if profile_ops:
            ptask = bar.add_task("profiling ops and collectives", total=None)
            profile_suite(name, out / SUITE_PROFILE_DB,
                          progress=lambda what: bar.update(ptask, description=f"profiling {what}"))
    summary = summarize_suite(runs)
    if as_json:
        typer.echo(json.dumps(suite_to_dict(name, out, summary), indent=1))
        return
    typer.echo(render_suite(name, summary, terminal=sys.stdout.isatty()), nl=False)
    typer.echo(f"results in {out}; score the engines with: trainsim validate {out}", err=True)

def register(app: typer.Typer) -> None:
    app.command("measure")(measure)
