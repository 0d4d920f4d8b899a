"""`trainsim graph`: what a front-end made of a model, as tables of layers and op kinds or one JSON object."""

import io
from collections import Counter
from typing import Any

from rich.console import Console

from trainsim.ir.graph import OpGraph
from trainsim.report.rich_text import compact_table, fold
from trainsim.strategy.precision import Precision, policy_for
from trainsim.units import format_count


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


GRAPH_WIDTH = 140  # piped output: wide enough that no row wraps


def render_graph(summary: dict[str, Any], terminal: bool = False) -> str:
    """The layers and the op kinds as tables, then the totals: on a terminal as wide as it is (cells wrap, none
    is cut), piped plain text GRAPH_WIDTH columns wide."""
    console = Console(width=None if terminal else GRAPH_WIDTH, record=True, file=io.StringIO())
    layers = compact_table("layer", "kind", "count", "fwd ops", "bwd ops", "params", "fwd GFLOP", "bwd GFLOP",
                   "act MB", title=f"{summary['model']} via {summary['frontend']} ({summary['precision']}, "
                                   f"{summary['tokens_per_micro_batch']} tokens per micro-batch)")
    for layer in summary["layers"]:
        layers.add_row(layer["name"], layer["kind"], str(layer["count"]), str(layer["fwd_ops"]),
                       str(layer["bwd_ops"]), format_count(layer["parameters"]),
                       f"{layer['forward_flops'] / 1e9:.3f}", f"{layer['backward_flops'] / 1e9:.3f}",
                       f"{layer['activation_bytes'] / 1e6:.2f}")
    console.print(fold(layers))
    kinds = compact_table("op kind", "ops", title="ops by kind (x layer count)")
    for kind, count in summary["ops_by_kind"].items():
        kinds.add_row(kind, str(count))
    console.print(fold(kinds))
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
