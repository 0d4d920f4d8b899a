"""`trainsim predict`: one job, one Result, as a readable summary or one JSON object."""

import json
from pathlib import Path
from typing import Annotated

import typer

from trainsim.cli.errors import handles_errors
from trainsim.cli.strategy_options import GIVEN, StrategyFlags, strategy_options
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES, Estimator
from trainsim.estimate.result import Result
from trainsim.job import Job
from trainsim.jobfile import job_from_settings, read_job_file
from trainsim.report.text import render_result


@handles_errors
@strategy_options()
def predict(
    job_file: Annotated[Path | None, typer.Argument(help="YAML/JSON job file; flags override it")] = None,
    model: Annotated[str | None, typer.Option(help="catalog name, model YAML, or HF config.json")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster preset or YAML file")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="scale the cluster to this many GPUs")] = None,
    strategy_flags: StrategyFlags = GIVEN,  # --tp, --pp, ... --optimizer-impl: every ParallelSpec field
    engine: Annotated[str, typer.Option(help="estimator: " + ", ".join(ENGINES.names()))] = "analytical",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome/Perfetto trace (needs --engine sim)")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="critical path and exposed communication "
                                          "(needs --engine sim)")] = False,
    tree: Annotated[Path | None, typer.Option(help="strategy-tree YAML with per-layer placement and recompute "
                                              "(needs --engine sim; docs/strategy-tree.md)")] = None,
    task_level: Annotated[str, typer.Option(help="simulated task granularity: layer | op")] = "layer",
    costs: Annotated[str, typer.Option(help="op costs: roofline | profiled (trainsim profile)")] = "roofline",
    db: Annotated[Path | None, typer.Option(help="profile database for --costs profiled")] = None,
) -> None:
    """Predict iteration time, throughput, MFU and peak memory of one training job."""
    flags = dict(model=model, cluster=cluster, num_gpus=num_gpus, **strategy_flags)
    settings = read_job_file(job_file)
    settings.update({key: value for key, value in flags.items() if value is not None})
    if (trace or explain or tree) and engine != "sim":
        raise ConfigError("engine", engine, "--trace, --explain and --tree need --engine sim")
    job = job_from_settings(settings)
    if engine == "sim":
        estimator, result = _simulate(job, tree, task_level, costs, db)
    else:
        estimator = _estimator(engine, costs, db)
        result = estimator.estimate(job)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render_result(result))
    if trace or explain:
        _simulated_extras(estimator, trace, explain and not as_json)


def _estimator(engine: str, costs: str, db: Path | None) -> Estimator:
    """The engine, with op times from the roofline or from a profile database."""
    from trainsim.estimate.costs import make_engine

    return make_engine(engine, costs, db)


def _simulate(job: Job, tree: Path | None, task_level: str, costs: str, db: Path | None) -> tuple[object, Result]:
    from trainsim.estimate.costs import make_engine
    from trainsim.estimate.simulation import SimEstimator
    from trainsim.strategy.tree_yaml import load_tree_yaml

    estimator = make_engine("sim", costs, db, task_level)  # type: ignore[arg-type]  # SimEstimator checks it
    assert isinstance(estimator, SimEstimator)
    plan = None
    if tree is not None:
        plan = load_tree_yaml(tree, estimator.analytical.graph(job)).lower(job.parallel)
    return estimator, estimator.estimate(job, plan)


def _simulated_extras(estimator: object, trace: Path | None, explain: bool) -> None:
    from trainsim.estimate.simulation import SimEstimator
    from trainsim.report.explain import render_explain
    from trainsim.report.trace import write_chrome_trace

    assert isinstance(estimator, SimEstimator) and estimator.last is not None
    run = estimator.last
    if trace:
        names = [f"stage {d.stage} ({d.ranks} ranks)" for d in run.graph.devices]
        written = write_chrome_trace(run.graph, run.outcome, trace, names)
        typer.echo(f"trace: {written} ({len(run.graph.tasks)} tasks; open in ui.perfetto.dev or chrome://tracing)",
                   err=True)
    if explain:
        typer.echo(render_explain(run.graph, run.outcome))
