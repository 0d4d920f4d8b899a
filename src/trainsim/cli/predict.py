"""`trainsim predict`: one job, one Result, as a readable summary or one JSON object."""

import json
from pathlib import Path
from typing import Annotated

import typer

from trainsim.cli.errors import handles_errors
from trainsim.cli.stack_options import GIVEN_STACK, StackFlags, stack_options
from trainsim.cli.strategy_options import GIVEN, StrategyFlags, strategy_options
from trainsim.cost.pricing import COSTS
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES, make_engine
from trainsim.estimate.result import Timeline
from trainsim.frontends.registry import FRONTENDS, MODEL_HELP
from trainsim.jobfile import job_from_settings, model_source, read_job_file
from trainsim.pipeline import graph_for
from trainsim.report.text import render_result


@handles_errors
@strategy_options()
@stack_options()
def predict(
    job_file: Annotated[Path | None, typer.Argument(help="YAML/JSON job file; flags override it")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    frontend: Annotated[str | None, typer.Option(help="front-end that reads --model: "
                                                 + " | ".join(FRONTENDS.names()) + " (default catalog)")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster preset or YAML file")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="scale the cluster to this many GPUs")] = None,
    strategy_flags: StrategyFlags = GIVEN,  # --tp, --pp, ... --optimizer-impl: every ParallelSpec field
    stack_flags: StackFlags = GIVEN_STACK,  # --stack NAME and one flag per stack behaviour
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
    flags = dict(model=model, frontend=frontend, cluster=cluster, num_gpus=num_gpus, **strategy_flags)
    settings = read_job_file(job_file)
    settings.update({key: value for key, value in flags.items() if value is not None})
    if stack_flags["stack"] is not None:
        settings["stack"] = stack_flags["stack"]
    settings["stack_overrides"] = stack_flags["overrides"]
    entry = ENGINES.get(engine)
    if (trace or explain) and not entry.timeline:
        raise ConfigError("engine", engine, "--trace and --explain need --engine sim (or replay, for traces)")
    if tree and not entry.takes_plan:
        raise ConfigError("engine", engine, "--tree needs --engine sim")
    job = job_from_settings(settings)
    estimator = make_engine(engine, costs, db, task_level)  # type: ignore[arg-type]  # EngineOptions checks it
    graph = graph_for(job, model_source(settings))
    plan = None
    if tree is not None:
        from trainsim.strategy.tree_yaml import load_tree_yaml  # NB: loaded for --tree only (start-up)

        plan = load_tree_yaml(tree, graph).lower(job.parallel)
    result = estimator.estimate(job, graph, plan)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render_result(result))
    if result.timeline is not None and (trace or explain):
        _timeline_extras(result.timeline, trace, explain and not as_json)


def _timeline_extras(timeline: Timeline, trace: Path | None, explain: bool) -> None:
    # NB: the renderers load when asked for (start-up of every other prediction)
    from trainsim.report.explain import render_explain
    from trainsim.report.trace import write_chrome_trace

    if trace:
        written = write_chrome_trace(timeline.exec_graph, timeline.outcome, trace, list(timeline.device_names))
        typer.echo(f"trace: {written} ({len(timeline.exec_graph.tasks)} tasks; open in ui.perfetto.dev or "
                   "chrome://tracing)", err=True)
    if explain:
        typer.echo(render_explain(timeline.exec_graph, timeline.outcome))
