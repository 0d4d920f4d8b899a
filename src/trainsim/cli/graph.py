"""`trainsim graph`: what a front-end made of a model: layers, op counts, FLOPs, parameter and activation bytes.

Front-ends are a registry (FRONTENDS): each takes a GraphRequest and returns the OpGraph. catalog builds the
analytic IR from a catalog name, a model YAML or a Hugging Face config.json; torch traces the model with the
PyTorch front-end (a Hugging Face config.json, or a catalog transformer mapped to its Hugging Face family). Add
another with FRONTENDS.add(name, build); a build imports its heavy dependencies itself.
"""

import io
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from trainsim.catalog import load_model
from trainsim.catalog.files import read_mapping
from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.jobfile import check_choice
from trainsim.registry import Registry
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import PRECISIONS, Precision, policy_for
from trainsim.units import format_count


@dataclass(frozen=True, slots=True)
class GraphRequest:
    model: str  # catalog name, model YAML/JSON, or Hugging Face config.json
    micro_batch: int
    seq_len: int
    precision: Precision


FRONTENDS: Registry[Callable[[GraphRequest], OpGraph]] = Registry("frontend")


@FRONTENDS.register("catalog")
def catalog_frontend(request: GraphRequest) -> OpGraph:
    spec = load_model(request.model)
    return build_graph(spec, DeviceSlice(request.micro_batch, request.seq_len, policy_for(request.precision)))


@FRONTENDS.register("torch")
def torch_frontend(request: GraphRequest) -> OpGraph:
    try:
        from trainsim.frontends.torch.hf import graph_from_hf_config, hf_config_from_spec
    except ModuleNotFoundError as exc:
        raise ConfigError("frontend", "torch", f"needs {exc.name} (pip install torch==2.13.0 transformers)") from None
    path = Path(request.model)
    if path.suffix == ".json" and path.exists():
        config: dict[str, Any] = read_mapping(path)
        name = str(config.get("_name_or_path") or path.stem)
    else:
        spec = load_model(request.model)
        if not isinstance(spec, TransformerSpec):
            raise ConfigError("model", request.model, f"is a {spec.kind}; the torch front-end takes transformers")
        config, name = hf_config_from_spec(spec), spec.name
    try:
        return graph_from_hf_config(config, micro_batch=request.micro_batch, seq_len=request.seq_len,
                                    precision=request.precision, name=name)
    except ModuleNotFoundError as exc:
        raise ConfigError("frontend", "torch", f"needs {exc.name} (pip install transformers)") from None


@FRONTENDS.register("jax")
def jax_frontend(request: GraphRequest) -> OpGraph:
    """--model FILE.py:factory or module:factory; the factory returns (train_step_fn, example_args)."""
    try:
        from trainsim.frontends.jax.capture import graph_from_jax_target
    except ModuleNotFoundError as exc:
        raise ConfigError("frontend", "jax", f"needs {exc.name} (pip install 'trainsim[jax]')") from None
    return graph_from_jax_target(request.model, micro_batch=request.micro_batch, seq_len=request.seq_len,
                                 precision=request.precision)


@FRONTENDS.register("trace")
def trace_frontend(request: GraphRequest) -> OpGraph:
    """--model: one PyTorch execution-trace file, or a directory of them (one per rank)."""
    from trainsim.frontends.trace.load import graph_from_trace_files

    return graph_from_trace_files(request.model)


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
    model: Annotated[str, typer.Option(help="catalog name, model YAML, or Hugging Face config.json")],
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
    build = FRONTENDS.get(frontend)
    request = GraphRequest(model, micro_batch, seq_len, cast(Precision, precision))
    summary = summarize(build(request), request.precision, frontend)
    typer.echo(json.dumps(summary, indent=1) if as_json else render(summary))


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
