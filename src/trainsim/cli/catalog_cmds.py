"""`trainsim models` and `trainsim hardware`: what the catalogs hold."""

import json
import sys
from typing import Annotated

import typer

from trainsim.catalog import list_clusters, list_devices, list_links, list_models
from trainsim.cli.errors import handles_errors
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.model_spec import ModelSpec
from trainsim.report.catalog import hardware_to_dict, models_to_list, render_hardware, render_models
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for


def _params(model: ModelSpec) -> float:
    graph = build_graph(model, DeviceSlice(1, 8, policy_for("bf16")))
    return graph.param_count()


@handles_errors
def models(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    """List the catalog models (use a Hugging Face config.json path or a YAML file for others)."""
    entries = list_models()
    params = [_params(m) for m in entries]
    if as_json:
        typer.echo(json.dumps(models_to_list(entries, params), indent=1))
    else:
        typer.echo(render_models(entries, params, terminal=sys.stdout.isatty()), nl=False)


@handles_errors
def hardware(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    """List GPUs, links and cluster presets."""
    devices, links, clusters = list_devices(), list_links(), list_clusters()
    if as_json:
        typer.echo(json.dumps(hardware_to_dict(devices, links, clusters), indent=1))
    else:
        typer.echo(render_hardware(devices, links, clusters, terminal=sys.stdout.isatty()), nl=False)


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("hardware")(hardware)
