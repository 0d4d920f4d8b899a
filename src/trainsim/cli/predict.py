"""`trainsim predict`: one job, one Result, as a readable summary or one JSON object: a thin layer over
trainsim.api.predict (the JSON is `api.predict(...).to_dict()`)."""

from pathlib import Path
from typing import Annotated

import typer

from trainsim import api
from trainsim.catalog.calibration import CALIBRATION_HELP
from trainsim.cli.errors import handles_errors
from trainsim.cli.stack_options import GIVEN_STACK, StackFlags, stack_options
from trainsim.cli.strategy_options import GIVEN, StrategyFlags, strategy_options
from trainsim.cost.pricing import COSTS
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES
from trainsim.frontends.registry import FRONTENDS, MODEL_HELP
from trainsim.jobfile import DEFAULT_CLUSTER, DEFAULT_MODEL
from trainsim.report.html import require_plotly
from trainsim.report.output import check_output_file
from trainsim.report.text import render_result


@handles_errors
@strategy_options()
@stack_options()
def predict(
    job_file: Annotated[Path | None, typer.Argument(help="YAML/JSON job file; flags override it")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP + f" (default {DEFAULT_MODEL})")] = None,
    frontend: Annotated[str | None, typer.Option(help="front-end that reads --model: "
                                                 + " | ".join(FRONTENDS.names()) + " (default catalog)")] = None,
    cluster: Annotated[str | None, typer.Option(help=f"cluster preset or YAML file (default {DEFAULT_CLUSTER})")
                       ] = None,
    num_gpus: Annotated[int | None, typer.Option(help="scale the cluster to this many GPUs (default: the "
                                                 "cluster's own)")] = None,
    strategy_flags: StrategyFlags = GIVEN,  # --tp, --pp, ... --optimizer-impl: every ParallelSpec field
    stack_flags: StackFlags = GIVEN_STACK,  # --stack NAME and one flag per stack behaviour
    engine: Annotated[str, typer.Option(help="estimator: " + ", ".join(ENGINES.names()))] = "analytical",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome/Perfetto trace (needs an engine that "
                                               "simulates the iteration: sim, replay)")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="the MFU formula, and with sim or replay the critical "
                                          "path and exposed communication")] = False,
    tree: Annotated[Path | None, typer.Option(help="strategy-tree YAML with per-layer placement and recompute "
                                              "(--engine sim; analytical: its ops' tp configs only; "
                                              "docs/strategy-tree.md)")] = None,
    task_level: Annotated[str, typer.Option(help="simulated task granularity: layer | op")] = "layer",
    costs: Annotated[str, typer.Option(help="op costs: " + " | ".join(COSTS.names()) + " (profiled: trainsim "
                                       "profile)")] = "roofline",
    db: Annotated[Path | None, typer.Option(help="profile database for --costs profiled (default "
                                            "$XDG_CACHE_HOME/trainsim/profile.sqlite, else ~/.cache/...)")] = None,
    html: Annotated[Path | None, typer.Option(help="write a self-contained HTML report (charts of the time and "
                                              "memory; with --engine sim the timeline): needs the report extra "
                                              "(default: none)")
                    ] = None,
    calibration: Annotated[Path | None, typer.Option(help=CALIBRATION_HELP)] = None,
    sharder: Annotated[str | None, typer.Option(help="DLRM: shard the embedding tables with this sharder of Lin "
                                                "et al. Table III (naive, random, size-greedy, lookup-greedy, "
                                                "norm-lookup-greedy, size-lookup-greedy); engines analytical, sim")
                       ] = None,
    sharding: Annotated[Path | None, typer.Option(help="DLRM: a sharding file placing every table (docs/"
                                                  "recommendation.md)")] = None,
    lookup: Annotated[str, typer.Option(help="DLRM with --sharder/--sharding: embedding-lookup model, roofline "
                                        "or a JSON of `trainsim profile-embedding --fit`")] = "roofline",
    dense_host: Annotated[Path | None, typer.Option(help="with --sharder/--sharding: the dense part's host cost "
                                                    "per op, a JSON fitted from measured traces (scripts/"
                                                    "recsys_quiet.py fit-host; default: not priced)")] = None,
    lookup_in_situ: Annotated[Path | None, typer.Option(help="with --sharder/--sharding: the lookups' in-situ "
                                                        "factors on the --lookup model, a JSON fitted from "
                                                        "measured traces (scripts/recsys_quiet.py fit-lookup)")
                              ] = None,
) -> None:
    """Predict iteration time, throughput, MFU and peak memory of one training job."""
    entry = ENGINES.get(engine)
    if trace and not entry.timeline:
        raise ConfigError("engine", engine, "--trace needs --engine sim (or replay, for traces)")
    if tree and not entry.takes_plan:
        raise ConfigError("engine", engine, "--tree needs --engine sim (or analytical, for a tree's tp configs)")
    for flag, path in (("trace", trace), ("html", html)):
        if path is not None:
            check_output_file(path, flag)  # before any work: a simulation is not run to be thrown away
    if html is not None:
        require_plotly()
    if sharder is not None or sharding is not None:
        from trainsim.catalog.calibration import read_calibration
        from trainsim.cli.shard import predict_sharded  # a DLRM with sharded tables (both engines)
        from trainsim.cost.pricing import make_pricer

        for flag, value in (("tree", tree), ("task_level", None if task_level == "layer" else task_level),
                            ("stack", stack_flags.get("stack") or stack_flags.get("overrides") or None)):
            if value is not None:
                raise ConfigError(flag, str(value), "does not apply to a sharded DLRM (--sharder/--sharding)")
        given = {"model": model, "frontend": frontend, "cluster": cluster, "num_gpus": num_gpus, **strategy_flags}
        pricer = make_pricer(costs, db, read_calibration(calibration))  # the dense ops' and collectives' prices
        prediction = predict_sharded(job_file, given, engine, sharder, sharding, lookup, dense_host=dense_host,
                                     pricer=pricer, lookup_in_situ=lookup_in_situ)
    else:
        for flag, given_path in (("dense_host", dense_host), ("lookup_in_situ", lookup_in_situ)):
            if given_path is not None:
                raise ConfigError(flag, str(given_path), "applies to a sharded DLRM (--sharder/--sharding)")
        prediction = api.predict(model, cluster, num_gpus, job_file=job_file, frontend=frontend, engine=engine,
                                 costs=costs, db=db, task_level=task_level, tree=tree,  # type: ignore[arg-type]
                                 calibration=calibration, stack=stack_flags["stack"],
                                 stack_overrides=stack_flags["overrides"], **strategy_flags)  # type: ignore[misc]
    if as_json:
        typer.echo(prediction.to_json())
    else:
        assert prediction.result is not None
        typer.echo(render_result(prediction.result, prediction.model_kind, explain=explain))
    if trace is not None:
        prediction.write_trace(trace)
        tasks = len(prediction.timeline["tasks"]) if prediction.timeline else 0
        typer.echo(f"trace: {trace} ({tasks} tasks; open in ui.perfetto.dev or chrome://tracing)", err=True)
    if explain and not as_json and prediction.timeline is not None:
        typer.echo(prediction.explain())
    if html is not None:
        prediction.write_html(html)
        typer.echo(f"report: {html} (open it in a browser; it needs no network)", err=True)
