"""`trainsim search`: try every plain strategy for a model, a cluster size and a global batch; show the best.

parse (flags -> model, cluster, SearchSpace) -> compute (Planner.search) -> render (rich table or one JSON
object).
"""

import json
import sys
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainsim.catalog import load_cluster
from trainsim.cli.errors import handles_errors
from trainsim.cli.strategy_options import GIVEN, StrategyFlags, strategy_options
from trainsim.errors import ConfigError
from trainsim.frontends.registry import FRONTENDS, MODEL_HELP, ModelSource
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec
from trainsim.jobfile import DEFAULT_CLUSTER, DEFAULT_MODEL
from trainsim.pipeline import GraphCache
from trainsim.report.search import render_search, search_to_dict
from trainsim.search.planner import Planner, SearchReport
from trainsim.search.space import SearchSpace
from trainsim.search.stage_search import STAGE_COSTS, StageSearchSettings, stage_search
from trainsim.strategy.parallel import (
    ATTENTION_KERNELS,
    OPTIMIZER_IMPLS,
    AttentionKernel,
    OptimizerImpl,
    ParallelSpec,
)
from trainsim.strategy.precision import PRECISIONS, Precision

HELP = """Search every plain strategy and rank the feasible ones by throughput (tokens/s).

Tried: tp (divisors of the GPUs per node that divide num_heads), pp (divisors of num_layers), dp
inferred (GPUs / (tp x pp)), vpp (1 with 1f1b; for pp > 1 the v <= 8 with num_layers % (pp x v) == 0, with
interleaved-1f1b), micro-batch (divisors of global_batch / dp up to --max-micro-batch), recompute (none,
selective, full), ZeRO 0-3, sequence parallelism (off; on when tp > 1). Context and expert parallelism stay
at cp=1, ep=1.
Plans that cannot run are counted by reason; plans that do not fit in memory count as "out of memory"."""


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(name, value, "must be a positive integer")


def _parse(source: ModelSource, cluster: str, num_gpus: int | None, global_batch: int | None,
           seq_len: int | None, precision: str | None, attention: str | None, optimizer_impl: str | None,
           max_micro_batch: int, top_k: int) -> tuple[ModelSpec, ClusterSpec, SearchSpace]:
    if global_batch is None:
        raise ConfigError("global_batch", None, "pass --global-batch N (sequences per optimizer step)")
    for name, value in (("num_gpus", num_gpus), ("global_batch", global_batch), ("seq_len", seq_len),
                        ("max_micro_batch", max_micro_batch), ("top_k", top_k)):
        _check_positive(name, value)
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError("precision", precision, "choose one of: " + ", ".join(PRECISIONS))
    for name, value, choices in (("attention", attention, ATTENTION_KERNELS),
                                 ("optimizer_impl", optimizer_impl, OPTIMIZER_IMPLS)):
        if value is not None and value not in choices:
            raise ConfigError(name, value, "choose one of: " + ", ".join(choices))
    model_spec = source.model_spec()
    cluster_spec = load_cluster(cluster)
    if num_gpus is not None:
        cluster_spec = cluster_spec.with_num_gpus(num_gpus)
    defaults = ParallelSpec()
    prec = cast(Precision, precision) if precision is not None else defaults.precision
    kernel = cast(AttentionKernel, attention) if attention is not None else defaults.attention
    impl = cast(OptimizerImpl, optimizer_impl) if optimizer_impl is not None else defaults.optimizer_impl
    space = SearchSpace(global_batch=global_batch, seq_len=seq_len or defaults.seq_len, precision=prec,
                        attention=kernel, optimizer_impl=impl, max_micro_batch=max_micro_batch)
    return model_spec, cluster_spec, space


def _run(source: ModelSource, model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, top_k: int,
         show_progress: bool) -> SearchReport:
    planner = Planner(graphs=GraphCache(source.frontend, source.source))
    if not show_progress:
        return planner.search(model, cluster, space, top_k=top_k)
    columns = (TextColumn("searching plans"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("search", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return planner.search(model, cluster, space, top_k=top_k, progress=advance)


# The strategy fields the search holds fixed (it tries every value of the others: HELP); their flags are predict's.
SEARCH_FIELDS = ("global_batch", "seq_len", "precision", "attention", "optimizer_impl")


@handles_errors
@strategy_options(SEARCH_FIELDS, notes={"global_batch": "required here, > 0"}, defaults={"global_batch": "none"})
def search(
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = DEFAULT_MODEL,
    frontend: Annotated[str, typer.Option(help="front-end that reads --model: " + " | ".join(FRONTENDS.names()))
                        ] = "catalog",
    cluster: Annotated[str, typer.Option(help="cluster preset or YAML file")] = DEFAULT_CLUSTER,
    num_gpus: Annotated[int | None, typer.Option(help="scale the cluster to this many GPUs")] = None,
    strategy_flags: StrategyFlags = GIVEN,  # SEARCH_FIELDS: what the search holds fixed
    top_k: Annotated[int, typer.Option(help="how many of the best plans to show")] = 10,
    max_micro_batch: Annotated[int, typer.Option(help="largest micro-batch tried")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object, no progress bar")] = False,
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
) -> None:
    source = ModelSource(model, frontend)
    given = strategy_flags
    if planner != "uniform" or stage_costs is not None:
        _stage_search(source, cluster, num_gpus, given, planner, stage_costs or "analytical", num_micro_batches,
                      stage_db, predtop_fraction, as_json)
        return
    model_spec, cluster_spec, space = _parse(source, cluster, num_gpus, given.get("global_batch"),
                                             given.get("seq_len"), given.get("precision"), given.get("attention"),
                                             given.get("optimizer_impl"), max_micro_batch, top_k)
    show_progress = not as_json and sys.stderr.isatty()
    report = _run(source, model_spec, cluster_spec, space, top_k, show_progress)
    if as_json:
        typer.echo(json.dumps(search_to_dict(report), indent=2))
    else:
        typer.echo(render_search(report, model_spec, cluster_spec, space, terminal=sys.stdout.isatty()), nl=False)


def _stage_search(source: ModelSource, cluster: str, num_gpus: int | None, given: StrategyFlags, planner: str,
                  stage_costs: str, num_micro_batches: int, db: Path | None, predtop_fraction: float,
                  as_json: bool) -> None:
    global_batch = given.get("global_batch")
    if global_batch is None:
        raise ConfigError("global_batch", None, "pass --global-batch N (sequences per optimizer step)")
    _check_positive("num_gpus", num_gpus)
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
                                   precision=cast(Precision, precision), db=db, predtop_fraction=predtop_fraction)
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
