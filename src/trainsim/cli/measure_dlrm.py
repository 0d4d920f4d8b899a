"""`trainsim measure --sharder NAME | --sharding FILE`: a DLRM with sharded embedding tables trained for real on
local gloo ranks (measure.dlrm: plain torch collectives, the index and pooled-embedding all-to-alls and the
dense-gradient all-reduce, in the order compile.lower_sharded_dlrm models), Lin et al. Sec. IV's ground truth.

Parse (the job file and flags as `trainsim predict --sharder/--sharding` takes them -> the DLRM, its ranks and
plan; what a DLRM run cannot honour is refused in one line) -> compute (measure.dlrm.measure_dlrm) -> render
(a summary, or the run's JSON). The run file OUT/RUN_ID.json holds the iteration (median, p10, p90), the per-rank
spans of the median iteration with their thread CPU times (the per-rank trace estimate.trace_predict reads),
the host's load average, and the plan in the sharding-file form, so `trainsim predict --sharding OUT/RUN_ID.json`
predicts the same plan.
"""

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import typer

from trainsim.catalog import load_cluster
from trainsim.embedding.sharding import ShardingPlan
from trainsim.errors import MAX_NAME_CHARS, ConfigError, check_name
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import DlrmSpec
from trainsim.job import Job

LOCAL_CLUSTER = "local-cpu"
PRECISION = "fp32"  # measure.dlrm_rank trains the dense part and the tables in fp32 (torch's default)


def refuse_unsupported(options: dict[str, Any], what: str = "a sharded DLRM run (--sharder/--sharding)") -> None:
    """options: the measure flags a DLRM run does not take, by name, with the value given (None or False = not
    given)."""
    for name, value in options.items():
        if value not in (None, False, 0.0):
            raise ConfigError(name, value, f"does not apply to {what}")


def measure_sharded(job_file: Path | None, given: dict[str, Any], sharder: str | None, sharding: Path | None, *,
                    iterations: int, warmup: int, timeout_s: float, out: Path, run_id: str | None,
                    as_json: bool, seed: int = 0, allocator: str | None = None, phase_normalise: bool = False) -> None:
    """phase_normalise: the reference probe timed around every iteration on every rank (measure.dlrm_phase);
    the run file then holds the phase-normalised iteration beside the raw one."""
    from trainsim.cli.shard import sharded_plan
    from trainsim.embedding.plan_file import plan_to_mapping
    from trainsim.measure.allocator import DEFAULT_POLICY, check_policy
    from trainsim.measure.dlrm import DlrmConfig, check_dense, measure_dlrm, measurement_to_dict
    from trainsim.measure.launch import MAX_ITERATIONS, MAX_TIMEOUT_S

    if not 1 <= iterations <= MAX_ITERATIONS or not 0 <= warmup <= MAX_ITERATIONS:
        raise ConfigError("iterations/warmup", (iterations, warmup),
                          f"need iterations 1 to {MAX_ITERATIONS} and warmup 0 to {MAX_ITERATIONS}")
    if not 0.0 < timeout_s <= MAX_TIMEOUT_S:  # NB: also refuses NaN
        raise ConfigError("timeout_s", timeout_s, f"must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}")
    if run_id is not None and (problem := check_name("run_id", run_id)) is not None:
        raise problem
    policy = check_policy(allocator if allocator is not None else DEFAULT_POLICY)
    given = dict(given)
    given["cluster"] = _local_cluster(given.get("cluster"), given.pop("num_gpus", None))
    if given.get("precision") not in (None, PRECISION):
        raise ConfigError("precision", given["precision"], f"a DLRM run trains in {PRECISION} (give fp32 or none)")
    given["precision"] = PRECISION
    job, plan = sharded_plan(job_file, given, sharder, sharding, seed)
    model = cast(DlrmSpec, job.model)
    dense = {"dense_features": model.dense_features, "bottom_mlp": list(model.bottom_mlp),
             "top_mlp": list(model.top_mlp)}
    check_dense(plan, dense)
    _check_memory(job, plan)
    config = DlrmConfig(model.name, plan, job.parallel.micro_batch, dense, seed=seed)
    if not as_json and sys.stderr.isatty():
        print(f"measuring {model.name} ({plan.sharder}) on {plan.num_ranks} gloo ranks ...", file=sys.stderr)
    measured = measure_dlrm([config], iterations=iterations, warmup=warmup, timeout_s=timeout_s, allocator=policy,
                            probes=("reference",) if phase_normalise else ())[0]
    default = f"dlrm-{model.name}-{plan.sharder}-r{plan.num_ranks}-b{config.local_batch}"
    name = run_id or re.sub(r"[^A-Za-z0-9._\-+=@]", "_", default).lstrip(".")[:MAX_NAME_CHARS]
    record = {"kind": "sharded-dlrm", "run_id": name, "model": model.name, "cluster": job.cluster.name,
              "iterations": iterations, "warmup": warmup, "seed": seed, **measurement_to_dict(measured),
              **plan_to_mapping(plan)}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(record, indent=1))
    if as_json:
        typer.echo(json.dumps(record, indent=1))
        return
    from trainsim.report.dlrm_run import render_dlrm_run

    typer.echo(render_dlrm_run(record), nl=False)
    typer.echo(f"result: {path}", err=True)


def _local_cluster(name: object, num_gpus: object) -> ClusterSpec:
    """The local CPU with `num_gpus` ranks on one node (every rank a process of this host)."""
    cluster = load_cluster(str(name) if name is not None else LOCAL_CLUSTER)
    if not cluster.device.name.startswith("cpu"):
        raise ConfigError("cluster", name, f"DLRM runs are measured on local gloo CPU ranks: use {LOCAL_CLUSTER}")
    if num_gpus is None:
        raise ConfigError("num_gpus", None, "give the ranks of the DLRM run (--num-gpus, at least 2)")
    if not isinstance(num_gpus, int) or num_gpus < 2:
        raise ConfigError("num_gpus", num_gpus, "a sharded DLRM run needs at least 2 ranks")
    return cluster.with_num_gpus(num_gpus).on_one_node()


def _check_memory(job: Job, plan: ShardingPlan) -> None:
    """The fullest rank's predicted memory (tables with their optimizer state, dense part, activations) times
    the ranks against the host's available memory, before any rank starts."""
    from trainsim.cost.embedding_lookup import RooflineLookup
    from trainsim.cost.pricing import Pricer
    from trainsim.cost.sharded_dlrm import price_sharded_iteration
    from trainsim.frontends.catalog.sharded_dlrm import sharded_job
    from trainsim.measure.capacity import check_fits

    sjob = sharded_job(cast(DlrmSpec, job.model), plan, job.cluster, job.parallel.micro_batch, precision=PRECISION)
    iteration = price_sharded_iteration(sjob.graph, plan, sjob.job, Pricer(), RooflineLookup(job.cluster.device))
    check_fits(max(m.total_bytes for m in iteration.memory), plan.num_ranks, "cpu")



@dataclass(frozen=True, slots=True)
class CampaignFlags:
    """The flags of `trainsim measure --generated N | --dlrm-tasks FILE`, as given (None: not given)."""

    tasks_file: Path | None
    generated: int | None
    task_kind: str | None
    batch: str | None
    ranks: str | None
    sharder: str | None
    iterations: int
    warmup: int
    timeout_s: float
    allocator: str | None
    interleave: bool
    execution_trace: bool
    phase_normalise: bool
    traced_iterations: int | None = None


CAMPAIGN_CSV = "dlrm_campaign.csv"
CAMPAIGN_TRACES = "dlrm_campaign_traces.jsonl"
CAMPAIGN_ET_DIR = "traces"  # OUT/traces/<config>/rank<R>.{et,kineto}.json.gz with --execution-trace


def parse_campaign(flags: CampaignFlags) -> Any:
    """The measure.dlrm_campaign.Campaign of the flags; every refusal names its flag."""
    from trainsim.measure.allocator import DEFAULT_POLICY, check_policy
    from trainsim.measure.dlrm_campaign import (
        Campaign,
        generated_tasks,
        parse_int_list,
        read_task_file,
        sharders_from,
    )
    from trainsim.measure.dlrm_phase import PROBES
    from trainsim.measure.launch import MAX_ITERATIONS, MAX_TIMEOUT_S

    if (flags.tasks_file is None) == (flags.generated is None):
        raise ConfigError("generated", flags.generated, "give one of --generated N and --dlrm-tasks FILE, not both")
    if flags.tasks_file is not None:
        if flags.task_kind is not None:
            raise ConfigError("task_kind", flags.task_kind, "applies to --generated only (the file names each kind)")
        tasks = read_task_file(flags.tasks_file)
    else:
        tasks = generated_tasks(cast(int, flags.generated), flags.task_kind or "mixed")
    if not 1 <= flags.iterations <= MAX_ITERATIONS or not 0 <= flags.warmup <= MAX_ITERATIONS:
        raise ConfigError("iterations/warmup", (flags.iterations, flags.warmup),
                          f"need iterations 1 to {MAX_ITERATIONS} and warmup 0 to {MAX_ITERATIONS}")
    if flags.traced_iterations is not None and not flags.execution_trace:
        raise ConfigError("traced_iterations", flags.traced_iterations, "applies with --execution-trace only")
    if not 0.0 < flags.timeout_s <= MAX_TIMEOUT_S:  # NB: also refuses NaN
        raise ConfigError("timeout_s", flags.timeout_s, f"must be a positive number of seconds, at most "
                          f"{MAX_TIMEOUT_S:g}")
    return Campaign(tuple(tasks), batches=parse_int_list("batch", flags.batch or "32,128"),
                    ranks=parse_int_list("ranks", flags.ranks or "2,4"),
                    sharders=sharders_from(flags.sharder or "size-lookup-greedy"), iterations=flags.iterations,
                    warmup=flags.warmup, allocator=check_policy(flags.allocator or DEFAULT_POLICY),
                    probes=PROBES if flags.phase_normalise else (), interleave=flags.interleave,
                    experiment="sharding" if flags.sharder == "all" else "e2e", timeout_s=flags.timeout_s,
                    traced_iterations=1 if flags.traced_iterations is None else flags.traced_iterations)


def measure_campaign(flags: CampaignFlags, out: Path, as_json: bool) -> None:
    """Parse the flags -> run the campaign (measure.dlrm_campaign, resumable: configs already in OUT's CSV are
    skipped) with a progress bar -> render what OUT's CSV holds for the campaign's configs."""
    from trainsim.cli.measure import measure_progress
    from trainsim.measure.dlrm_campaign import CampaignFiles, campaign_keys, campaign_size, row_key, run_campaign

    campaign = parse_campaign(flags)
    out.mkdir(parents=True, exist_ok=True)
    files = CampaignFiles.open(out / CAMPAIGN_CSV, out / CAMPAIGN_TRACES)
    total, keys = campaign_size(campaign), campaign_keys(campaign)
    kept = total - len(keys - files.done())
    with measure_progress(as_json, total) as bar:
        task = bar.add_task(f"DLRM campaign: {kept} of {total} configs already in {out / CAMPAIGN_CSV}",
                            total=total, completed=kept)

        def advanced(what: str, measured: int) -> None:
            bar.update(task, completed=kept + measured, description=f"DLRM campaign: {what}")

        run_campaign(campaign, files, trace_root=out / CAMPAIGN_ET_DIR if flags.execution_trace else None,
                     progress=advanced)
    rows = [row for row in files.rows if row_key(row) in keys]
    if as_json:
        typer.echo(json.dumps({"csv": str(out / CAMPAIGN_CSV), "traces": str(out / CAMPAIGN_TRACES),
                               "rows": rows}, indent=1))
        return
    from trainsim.report.dlrm_run import render_campaign

    typer.echo(render_campaign(rows), nl=False)
    typer.echo(f"results: {out / CAMPAIGN_CSV} (per-rank spans: {out / CAMPAIGN_TRACES})", err=True)

