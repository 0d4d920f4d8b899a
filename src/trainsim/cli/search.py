"""`trainsim search`: try every plain strategy for a model, a cluster size and a global batch; show the best.

A thin layer over trainsim.api.search: flags -> api.search -> a rich table, one JSON object (its to_dict())
or the HTML report.
"""

import json
import sys
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainsim import api
from trainsim.api.objectives import OBJECTIVES
from trainsim.catalog import load_cluster
from trainsim.catalog.calibration import CALIBRATION_HELP
from trainsim.cli.errors import handles_errors
from trainsim.cli.stack_options import GIVEN_STACK, StackFlags, stack_options
from trainsim.cli.strategy_options import GIVEN, StrategyFlags, strategy_options
from trainsim.errors import ConfigError
from trainsim.frontends.registry import FRONTENDS, MODEL_HELP, ModelSource
from trainsim.jobfile import DEFAULT_CLUSTER, DEFAULT_MODEL
from trainsim.report.html import require_plotly
from trainsim.report.output import check_output_file, csv_text, write_text_atomic
from trainsim.report.search import render_search_data
from trainsim.search.stage_search import STAGE_COSTS, StageSearchSettings, stage_search
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import PRECISIONS, Precision

HELP = """Search every plain strategy and rank the feasible ones by throughput (tokens/s).

Tried: tp (divisors of the GPUs per node that divide num_heads), pp (divisors of num_layers; and the other
divisors of GPUs / tp up to num_layers, split unevenly as Megatron-Core accepts: the embedding and the loss counted
as layers, or the first and last stages' layers fixed), dp inferred (GPUs / (tp x pp)), vpp (1 with 1f1b; for
pp > 1 the v <= 8 with num_layers % (pp x v) == 0, or with an uneven split, with interleaved-1f1b), micro-batch
(divisors of global_batch / dp up to --max-micro-batch), recompute (none, selective, full), ZeRO 0-3, sequence
parallelism (off; on when tp > 1), expert parallelism (1 for a dense model; for a model with experts the powers
of two dividing num_experts and dp). Context parallelism stays at cp=1. Plans that cannot run are counted by
reason; plans that do not fit in memory count as "out of memory"."""


def _run(show_progress: bool, **arguments: Any) -> api.SearchResult:
    if not show_progress:
        return api.search(**arguments)
    columns = (TextColumn("searching plans"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("search", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return api.search(**arguments, progress=advance)


# The strategy fields the search holds fixed (it tries every value of the others: HELP); their flags are predict's.
SEARCH_FIELDS = ("global_batch", "seq_len", "precision", "attention", "optimizer_impl")


@handles_errors
@strategy_options(SEARCH_FIELDS, notes={"global_batch": "required here, > 0"}, defaults={"global_batch": "none"})
@stack_options()
def search(
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = DEFAULT_MODEL,
    frontend: Annotated[str, typer.Option(help="front-end that reads --model: " + " | ".join(FRONTENDS.names()))
                        ] = "catalog",
    cluster: Annotated[str, typer.Option(help="cluster preset or YAML file")] = DEFAULT_CLUSTER,
    num_gpus: Annotated[int | None, typer.Option(help="scale the cluster to this many GPUs")] = None,
    strategy_flags: StrategyFlags = GIVEN,  # SEARCH_FIELDS: what the search holds fixed
    stack_flags: StackFlags = GIVEN_STACK,  # --stack NAME and one flag per stack behaviour
    top_k: Annotated[int, typer.Option(help="how many of the best plans to show")] = 10,
    max_micro_batch: Annotated[int, typer.Option(help="largest micro-batch tried")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object, no progress bar")] = False,
    all_plans: Annotated[bool, typer.Option("--all", help="with --json: list every plan priced (tokens/s, peak "
                                            "memory, on the Pareto front)")] = False,
    html: Annotated[Path | None, typer.Option(help="write a self-contained HTML report: throughput against "
                                              "memory of every plan, the Pareto front, why plans were refused")
                    ] = None,
    csv: Annotated[Path | None, typer.Option(help="write the best plans as CSV (with --all: every plan priced)")
                   ] = None,
    objective: Annotated[str, typer.Option(help="rank by: " + " | ".join(OBJECTIVES) + " (for a fixed number of "
                                           "GPUs, time-to-train, cost and energy rank as throughput and add their "
                                           "numbers)")] = "throughput",
    tokens: Annotated[float | None, typer.Option(help="tokens to train: adds the time (with a price the cost; "
                                                 "with the device's catalog power the energy at max power) to "
                                                 "train them to every plan")] = None,
    price_per_gpu_hour: Annotated[float | None, typer.Option(help="price of one GPU for one hour, in any "
                                                             "currency (with --tokens: the cost to train)")
                                  ] = None,
    min_headroom: Annotated[float | None, typer.Option(help="refuse plans that leave less than this many GiB "
                                                       "free on the fullest GPU")] = None,
    calibration: Annotated[Path | None, typer.Option(help=CALIBRATION_HELP)] = None,
    planner: Annotated[str, typer.Option(help="uniform: the grid above (with --stage-costs: Megatron's even "
                                         "splits under those stage costs); stage: Alpa's DP over uneven stages "
                                         "and submeshes (MPE's holistic DP for --stage-costs mpe)")] = "uniform",
    stage_costs: Annotated[str | None, typer.Option(help="stage latency and memory from: " +
                                                    " | ".join(STAGE_COSTS) + " (measured, mpe and predtop run "
                                                    "stages on this machine's ranks)")] = None,
    num_micro_batches: Annotated[int, typer.Option(help="pipeline micro-batches per iteration (stage planner)")
                                 ] = 8,
    stage_db: Annotated[Path | None, typer.Option(help="profile database for measured stages and profiled costs "
                                                  "(default: the user's cache)")] = None,
    predtop_fraction: Annotated[float, typer.Option(help="predtop: fraction of each mesh's stages measured to "
                                                    "train its predictor")] = 0.3,
    predtop_layers: Annotated[str, typer.Option(help="predtop: its stages are ranges of alpa (Alpa's clustered "
                                                "layers, the paper's: the embedding joins the first block) or "
                                                "of units")] = "alpa",
    predtop_sampler: Annotated[str, typer.Option(help="predtop: sized (each kind alone, then both ends and the "
                                                 "interior in turn, sizes spread evenly), covering (sizes at "
                                                 "random) or random")] = "sized",
    equal_meshes: Annotated[bool, typer.Option("--equal-meshes", help="stage planner: every stage on one submesh "
                                               "shape with one intra plan, layer ranges uneven (what one "
                                               "ParallelSpec expresses, so `trainsim measure --stage-layers` runs "
                                               "it)")] = False,
    stage_tp: Annotated[int | None, typer.Option("--stage-tp", help="stage planners: only intra plans of this "
                                                 "tensor-parallel degree (1: data parallel inside every stage)")]
    = None,
    every_stage: Annotated[bool, typer.Option("--every-stage", help="stage planner: evaluate (measure, for "
                                              "measured costs) every stage on every submesh, as Alpa's full "
                                              "profiling, also those no plan on exactly these devices holds")]
    = False,
) -> None:
    if planner != "uniform" or stage_costs is not None:
        _stage_search(ModelSource(model, frontend), cluster, num_gpus, strategy_flags, planner,
                      stage_costs or "analytical", num_micro_batches, stage_db,
                      {"predtop_fraction": predtop_fraction, "predtop_layers": predtop_layers,
                       "predtop_sampler": predtop_sampler}, as_json, equal_meshes, stage_tp, every_stage)
        return
    if equal_meshes or stage_tp is not None or every_stage:
        name, value = (("equal_meshes", True) if equal_meshes else ("stage_tp", stage_tp) if stage_tp is not None
                       else ("every_stage", True))
        raise ConfigError(name, value, "applies to the stage planners: add --planner stage or --stage-costs")
    if html is not None:
        check_output_file(html, "html")  # before the search: its work is not thrown away
        require_plotly()
    if csv is not None:
        check_output_file(csv, "csv")
    show_progress = not as_json and sys.stderr.isatty()
    found = _run(show_progress, model=model, cluster=cluster, num_gpus=num_gpus, frontend=frontend, top_k=top_k,
                 max_micro_batch=max_micro_batch, all_plans=all_plans or html is not None, objective=objective,
                 tokens=tokens, price_per_gpu_hour=price_per_gpu_hour, min_headroom_gib=min_headroom,
                 calibration=calibration, stack=stack_flags["stack"],
                 stack_overrides=stack_flags["overrides"], **strategy_flags)
    if as_json:
        data = found.to_dict()
        if not all_plans:
            data.pop("all_plans", None)
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(render_search_data(found.to_dict(), terminal=sys.stdout.isatty()), nl=False)
    if html is not None:
        found.write_html(html)
        typer.echo(f"report: {html} (open it in a browser; it needs no network)", err=True)
    if csv is not None:
        data = found.to_dict()
        write_text_atomic(csv, csv_text(data["all_plans"] if all_plans else data["plans"]))
        typer.echo(f"table: {csv}", err=True)


def _stage_search(source: ModelSource, cluster: str, num_gpus: int | None, given: StrategyFlags, planner: str,
                  stage_costs: str, num_micro_batches: int, db: Path | None, predtop: dict[str, Any],
                  as_json: bool, equal_meshes: bool, stage_tp: int | None, every_stage: bool) -> None:
    global_batch = given.get("global_batch")
    if global_batch is None:
        raise ConfigError("global_batch", None, "pass --global-batch N (sequences per optimizer step)")
    if num_gpus is not None and num_gpus <= 0:
        raise ConfigError("num_gpus", num_gpus, "must be a positive integer")
    cluster_spec = load_cluster(cluster)
    if num_gpus is not None:
        cluster_spec = cluster_spec.with_num_gpus(num_gpus)
    runs_here = stage_costs in ("measured", "mpe", "predtop")
    if runs_here:
        cluster_spec = cluster_spec.on_one_node()  # the ranks are processes of this host
    precision = given.get("precision") or ("fp32" if runs_here else ParallelSpec().precision)
    if precision not in PRECISIONS:
        raise ConfigError("precision", precision, "choose one of: " + ", ".join(PRECISIONS))
    settings = StageSearchSettings(planner=planner, stage_costs=stage_costs, global_batch=global_batch,
                                   num_micro_batches=num_micro_batches, seq_len=given.get("seq_len") or 2048,
                                   precision=cast(Precision, precision), db=db, equal_meshes=equal_meshes,
                                   stage_tp=stage_tp, every_stage=every_stage, **predtop)
    report = stage_search(source.model_spec(), cluster_spec, settings)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    plan = report.search.plan
    typer.echo(f"{planner} planner, {stage_costs} stage costs: {len(plan.stages)} stages, iteration "
               f"{plan.iteration_s:.6g} s by eq. 4 ({num_micro_batches} micro-batches)")
    for stage, estimate in zip(plan.stages, plan.estimates, strict=True):
        typer.echo(f"  {stage.describe()}: {estimate.latency_s:.6g} s per micro-batch")
    typer.echo(f"stage evaluations {report.search.stage_evaluations}, profiled configurations "
               f"{report.profiled_configurations}, search time {report.search_time_s:.3g} s")
    sim = "-" if report.sim_iteration_s is None else f"{report.sim_iteration_s:.6g} s"
    typer.echo(f"simulator: {sim} ({report.sim_note})")


def register(app: typer.Typer) -> None:
    # One line per paragraph: the help formatter wraps paragraphs itself but keeps single newlines.
    paragraphs = "\n\n".join(" ".join(paragraph.split()) for paragraph in HELP.split("\n\n"))
    app.command("search", help=paragraphs)(search)
