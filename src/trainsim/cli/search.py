"""`trainsim search`: try every plain strategy for a model, a cluster size and a global batch; show the best.

parse (flags -> model, cluster, SearchSpace) -> compute (Planner.search) -> render (rich table or one JSON
object).
"""

import json
import sys
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
from trainsim.job import default_seq_len
from trainsim.jobfile import DEFAULT_CLUSTER, DEFAULT_MODEL
from trainsim.pipeline import GraphCache
from trainsim.report.search import render_search, search_to_dict
from trainsim.search.planner import Planner, SearchReport
from trainsim.search.space import SearchSpace
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
    space = SearchSpace(global_batch=global_batch, seq_len=seq_len or default_seq_len(model_spec), precision=prec,
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
) -> None:
    source = ModelSource(model, frontend)
    given = strategy_flags
    model_spec, cluster_spec, space = _parse(source, cluster, num_gpus, given.get("global_batch"),
                                             given.get("seq_len"), given.get("precision"), given.get("attention"),
                                             given.get("optimizer_impl"), max_micro_batch, top_k)
    show_progress = not as_json and sys.stderr.isatty()
    report = _run(source, model_spec, cluster_spec, space, top_k, show_progress)
    if as_json:
        typer.echo(json.dumps(search_to_dict(report), indent=2))
    else:
        typer.echo(render_search(report, model_spec, cluster_spec, space, terminal=sys.stdout.isatty()), nl=False)


def register(app: typer.Typer) -> None:
    # One line per paragraph: the help formatter wraps paragraphs itself but keeps single newlines.
    paragraphs = "\n\n".join(" ".join(paragraph.split()) for paragraph in HELP.split("\n\n"))
    app.command("search", help=paragraphs)(search)
