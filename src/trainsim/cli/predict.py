"""`trainsim predict`: one job, one Result, as a readable summary or one JSON object."""

import json
from pathlib import Path
from typing import Annotated

import typer

from trainsim.cli.errors import handles_errors
from trainsim.cost.pricing import COSTS
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES, make_engine
from trainsim.estimate.result import Timeline
from trainsim.frontends.registry import FRONTENDS, MODEL_HELP
from trainsim.jobfile import job_from_settings, model_source, read_job_file
from trainsim.pipeline import graph_for
from trainsim.report.explain import render_explain
from trainsim.report.text import render_result
from trainsim.report.trace import write_chrome_trace
from trainsim.strategy.tree_yaml import load_tree_yaml


@handles_errors
def predict(
    job_file: Annotated[Path | None, typer.Argument(help="YAML/JSON job file; flags override it")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    frontend: Annotated[str | None, typer.Option(help="front-end that reads --model: "
                                                 + " | ".join(FRONTENDS.names()) + " (default catalog)")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster preset or YAML file")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="scale the cluster to this many GPUs")] = None,
    tp: Annotated[int | None, typer.Option(help="tensor-parallel degree")] = None,
    pp: Annotated[int | None, typer.Option(help="pipeline-parallel degree")] = None,
    dp: Annotated[int | None, typer.Option(help="data-parallel degree (default: inferred)")] = None,
    vpp: Annotated[int | None, typer.Option(help="virtual stages per pipeline rank")] = None,
    sp: Annotated[bool | None, typer.Option("--sp/--no-sp", help="sequence parallelism")] = None,
    cp: Annotated[int | None, typer.Option(help="context-parallel degree")] = None,
    ep: Annotated[int | None, typer.Option(help="expert-parallel degree")] = None,
    zero: Annotated[int | None, typer.Option(help="ZeRO stage 0-3 (1 = distributed optimizer)")] = None,
    recompute: Annotated[str | None, typer.Option(help="none | selective | full")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="sequences per micro-batch")] = None,
    global_batch: Annotated[int | None, typer.Option(help="sequences per optimizer step")] = None,
    seq_len: Annotated[int | None, typer.Option(help="tokens per sequence")] = None,
    precision: Annotated[str | None, typer.Option(help="fp32 tf32 fp16 bf16 amp-fp16 amp-bf16 fp8")] = None,
    schedule: Annotated[str | None, typer.Option(help="gpipe | 1f1b | interleaved-1f1b")] = None,
    attention: Annotated[str | None, typer.Option(help="attention kernel: flash2 (FlashAttention-2, torch SDPA; "
                                                  "default) | flash3 (Hopper+: FlashAttention-3, cuDNN as "
                                                  "TransformerEngine / Megatron-Core pick it) | math (unfused)")
                         ] = None,
    optimizer_impl: Annotated[str | None, typer.Option(help="Adam step: fused (default; Megatron, apex, TE, torch "
                                                       "fused=True) | foreach (torch's default on GPUs) | loop "
                                                       "(torch's default on CPUs)")] = None,
    engine: Annotated[str, typer.Option(help="estimator: " + ", ".join(ENGINES.names()))] = "analytical",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome/Perfetto trace (needs an engine that "
                                               "simulates the iteration: sim, replay)")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="critical path and exposed communication "
                                          "(needs sim or replay)")] = False,
    tree: Annotated[Path | None, typer.Option(help="strategy-tree YAML with per-layer placement and recompute "
                                              "(needs --engine sim; docs/strategy-tree.md)")] = None,
    task_level: Annotated[str, typer.Option(help="simulated task granularity: layer | op")] = "layer",
    costs: Annotated[str, typer.Option(help="op costs: " + " | ".join(COSTS.names()) + " (profiled: trainsim "
                                       "profile)")] = "roofline",
    db: Annotated[Path | None, typer.Option(help="profile database for --costs profiled")] = None,
) -> None:
    """Predict iteration time, throughput, MFU and peak memory of one training job."""
    flags = dict(model=model, frontend=frontend, cluster=cluster, num_gpus=num_gpus, tp=tp, pp=pp, dp=dp, vpp=vpp,
                 sp=sp, cp=cp, ep=ep, zero=zero, recompute=recompute, micro_batch=micro_batch, global_batch=global_batch,
                 seq_len=seq_len, precision=precision, schedule=schedule, attention=attention,
                 optimizer_impl=optimizer_impl)
    settings = read_job_file(job_file)
    settings.update({key: value for key, value in flags.items() if value is not None})
    entry = ENGINES.get(engine)
    if (trace or explain) and not entry.timeline:
        raise ConfigError("engine", engine, "--trace and --explain need --engine sim (or replay, for traces)")
    if tree and not entry.takes_plan:
        raise ConfigError("engine", engine, "--tree needs --engine sim")
    job = job_from_settings(settings)
    estimator = make_engine(engine, costs, db, task_level)  # type: ignore[arg-type]  # EngineOptions checks it
    graph = graph_for(job, model_source(settings))
    plan = load_tree_yaml(tree, graph).lower(job.parallel) if tree is not None else None
    result = estimator.estimate(job, graph, plan)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render_result(result))
    if result.timeline is not None:
        _timeline_extras(result.timeline, trace, explain and not as_json)


def _timeline_extras(timeline: Timeline, trace: Path | None, explain: bool) -> None:
    if trace:
        written = write_chrome_trace(timeline.exec_graph, timeline.outcome, trace, list(timeline.device_names))
        typer.echo(f"trace: {written} ({len(timeline.exec_graph.tasks)} tasks; open in ui.perfetto.dev or "
                   "chrome://tracing)", err=True)
    if explain:
        typer.echo(render_explain(timeline.exec_graph, timeline.outcome))
