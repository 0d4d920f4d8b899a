"""`trainsim graph`: what a front-end made of a model: layers, op counts, FLOPs, parameter and activation bytes.

The front-ends are trainsim.frontends.registry.FRONTENDS, the ones predict, search and validate use; the command
shows what a front-end's inspect() builds: one device, no model parallelism (a trace: the lowest rank as traced).
"""

import io
import json
from collections import Counter
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError
from trainsim.frontends.registry import FRONTENDS
from trainsim.ir.graph import OpGraph
from trainsim.jobfile import check_choice
from trainsim.strategy.precision import PRECISIONS, Precision, policy_for
from trainsim.units import format_count

MODEL_HELP = ("catalog name, model YAML, Hugging Face config.json or folder; FILE.py:factory (torch, jax); an "
              "execution-trace file or directory (trace)")


def summarize(graph: OpGraph, precision: Precision, frontend: str) -> dict[str, Any]:
    """Everything the command prints, as plain data (the --json object)."""
    policy = policy_for(precision)
    kinds: Counter[str] = Counter()
    dtypes: Counter[str] = Counter()
    for layer in graph.layers:
        for op in layer.fwd + layer.bwd:
            kinds[op.kind] += layer.count
            dtypes[op.dtype] += layer.count
    activation = {mode: sum(layer.count * layer.saved_bytes.get(mode, 0.0) for layer in graph.layers)
                  for mode in ("none", "selective", "full")}
    return {
        "model": graph.model_name, "frontend": frontend, "precision": precision,
        "tokens_per_micro_batch": graph.tokens_per_micro_batch,
        "samples_per_micro_batch": graph.samples_per_micro_batch,
        "num_ops": graph.num_ops, "forward_flops": graph.total_flops("fwd"),
        "backward_flops": graph.total_flops("bwd"), "parameters": graph.param_count(),
        "parameter_bytes": graph.param_count() * policy.weight_bytes,
        "activation_bytes": activation["none"], "activation_bytes_by_recompute": activation,
        "ops_by_kind": dict(sorted(kinds.items())), "ops_by_dtype": dict(sorted(dtypes.items())),
        "layers": [{"name": layer.name, "kind": layer.kind, "count": layer.count, "fwd_ops": len(layer.fwd),
                    "bwd_ops": len(layer.bwd), "parameters": layer.full_param_count,
                    "forward_flops": layer.flops("fwd"), "backward_flops": layer.flops("bwd"),
                    "activation_bytes": layer.saved_bytes.get("none", 0.0), "output_bytes": layer.output_bytes}
                   for layer in graph.layers],
    }


def render(summary: dict[str, Any]) -> str:
    console = Console(width=140, record=True, file=io.StringIO())
    layers = Table("layer", "kind", "count", "fwd ops", "bwd ops", "params", "fwd GFLOP", "bwd GFLOP",
                   "act MB", title=f"{summary['model']} via {summary['frontend']} ({summary['precision']}, "
                                   f"{summary['tokens_per_micro_batch']} tokens per micro-batch)")
    for layer in summary["layers"]:
        layers.add_row(layer["name"], layer["kind"], str(layer["count"]), str(layer["fwd_ops"]),
                       str(layer["bwd_ops"]), format_count(layer["parameters"]),
                       f"{layer['forward_flops'] / 1e9:.3f}", f"{layer['backward_flops'] / 1e9:.3f}",
                       f"{layer['activation_bytes'] / 1e6:.2f}")
    console.print(layers)
    kinds = Table("op kind", "ops", title="ops by kind (x layer count)")
    for kind, count in summary["ops_by_kind"].items():
        kinds.add_row(kind, str(count))
    console.print(kinds)
    act = summary["activation_bytes_by_recompute"]
    console.print(
        f"ops {summary['num_ops']}  by dtype: "
        + ", ".join(f"{k} {v}" for k, v in summary["ops_by_dtype"].items()) + "\n"
        f"forward {summary['forward_flops'] / 1e12:.4f} TFLOP  backward {summary['backward_flops'] / 1e12:.4f} TFLOP"
        f"  per micro-batch\n"
        f"parameters {format_count(summary['parameters'])}  = {summary['parameter_bytes'] / 1e9:.3f} GB of weights\n"
        f"activations kept for backward per micro-batch: {act['none'] / 1e9:.3f} GB (no recompute), "
        f"{act['selective'] / 1e9:.3f} GB (selective), {act['full'] / 1e9:.3f} GB (full)")
    return console.export_text()


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
    typer.echo(json.dumps(summary, indent=1) if as_json else render(summary))


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
