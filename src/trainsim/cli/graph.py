"""`trainsim graph`: what a front-end made of a model: layers, op counts, FLOPs, parameter and activation bytes.

Front-ends are a registry (FRONTENDS): each takes a GraphRequest and returns the OpGraph. catalog builds the
analytic IR from a catalog name, a model YAML or a Hugging Face config.json; torch traces the model with the
PyTorch front-end (a Hugging Face config.json, or a catalog transformer mapped to its Hugging Face family). Add
another with FRONTENDS.add(name, build); a build imports its heavy dependencies itself.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from trainsim.catalog import load_model
from trainsim.catalog.files import read_mapping
from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.jobfile import check_choice
from trainsim.registry import Registry
from trainsim.report.graph import render_graph, summarize
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import PRECISIONS, Precision, policy_for


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
    typer.echo(json.dumps(summary, indent=1) if as_json else render_graph(summary))


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
