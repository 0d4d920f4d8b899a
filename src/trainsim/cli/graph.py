"""`trainsim graph`: what a front-end made of a model: layers, op counts, FLOPs, parameter and activation bytes.

The front-ends are trainsim.frontends.registry.FRONTENDS, the ones predict, search and validate use; the command
shows what a front-end's inspect() builds: one device, no model parallelism (a trace: the lowest rank as traced).
"""

import json
import sys
from typing import Annotated, cast

import typer

from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError
from trainsim.frontends.registry import FRONTENDS, MODEL_HELP
from trainsim.jobfile import check_choice
from trainsim.report.graph import render_graph, summarize
from trainsim.strategy.precision import PRECISIONS, Precision


@handles_errors
def graph(
    model: Annotated[str, typer.Option(help=MODEL_HELP)],
    frontend: Annotated[str, typer.Option(help="front-end: " + ", ".join(FRONTENDS.names()))] = "catalog",
    micro_batch: Annotated[int, typer.Option(help="sequences per micro-batch")] = 1,
    seq_len: Annotated[int, typer.Option(help="tokens per sequence")] = 2048,
    precision: Annotated[str, typer.Option(help=" ".join(PRECISIONS))] = "bf16",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Show the IR a front-end builds for a model: layers, op counts, FLOPs, parameter and activation bytes."""
    check_choice("precision", precision, PRECISIONS)
    for key, value in (("micro_batch", micro_batch), ("seq_len", seq_len)):
        if value <= 0:
            raise ConfigError(key, value, "must be a positive integer")
    chosen = FRONTENDS.get(frontend)
    typed = cast(Precision, precision)
    summary = summarize(chosen.inspect(model, micro_batch, seq_len, typed), typed, frontend)
    typer.echo(json.dumps(summary, indent=1) if as_json else render_graph(summary, terminal=sys.stdout.isatty()))


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
