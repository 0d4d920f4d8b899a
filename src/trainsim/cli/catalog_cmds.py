"""`trainsim models` and `trainsim hardware`: what the catalogs hold."""

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from trainsim.catalog import list_clusters, list_devices, list_links, list_models
from trainsim.cli.errors import handles_errors
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for
from trainsim.units import format_bytes_gib, format_count


def _params(model: object) -> float:
    graph = build_graph(model, DeviceSlice(1, 8, policy_for("bf16")))  # type: ignore[arg-type]
    return graph.param_count()


@handles_errors
def models(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    """List the catalog models (use a Hugging Face config.json path or a YAML file for others)."""
    entries = list_models()
    if as_json:
        typer.echo(json.dumps([{**m.model_dump(), "params": _params(m)} for m in entries], indent=1))
        return
    table = Table("name", "kind", "arch", "layers", "hidden", "heads/kv", "experts", "params", "description")
    for m in entries:
        if isinstance(m, TransformerSpec):
            shape = (m.arch, str(m.num_layers), str(m.hidden), f"{m.num_heads}/{m.kv_heads}",
                     f"{m.num_experts}x top{m.top_k}" if m.is_moe else "")
        else:
            shape = ("", str(len(getattr(m, "layers", ()))), "", "", "")
        table.add_row(m.name, m.kind, *shape, format_count(_params(m)), m.description[:50])
    Console(width=200).print(table)


@handles_errors
def hardware(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    """List GPUs, links and cluster presets."""
    devices, links, clusters = list_devices(), list_links(), list_clusters()
    if as_json:
        typer.echo(json.dumps({"devices": [d.model_dump() for d in devices],
                               "links": [link.model_dump() for link in links],
                               "clusters": [c.model_dump(exclude={"device", "intra_node", "inter_node"})
                                            | {"device": c.device.name, "intra_node": c.intra_node.name,
                                               "inter_node": c.inter_node.name} for c in clusters]}, indent=1))
        return
    console = Console(width=200)
    dev = Table("device", "fp32", "tf32", "fp16", "bf16", "fp8", "HBM", "HBM GB/s", title="GPUs (dense TFLOP/s)")
    for d in devices:
        peaks = [f"{d.peak_flops_per_s[k] / 1e12:.0f}" if k in d.peak_flops_per_s else "-"
                 for k in ("fp32", "tf32", "fp16", "bf16", "fp8")]
        dev.add_row(d.name, *peaks, format_bytes_gib(d.hbm_bytes), f"{d.hbm_bw_bytes_per_s / 1e9:.0f}")
    console.print(dev)
    lnk = Table("link", "kind", "GB/s per direction", "latency us", title="links")
    for link in links:
        lnk.add_row(link.name, link.kind, f"{link.bw_bytes_per_s / 1e9:.1f}", f"{link.latency_s * 1e6:.1f}")
    console.print(lnk)
    cl = Table("cluster", "device", "GPUs/node", "nodes", "intra-node", "inter-node", "NICs/node", title="clusters")
    for c in clusters:
        cl.add_row(c.name, c.device.name, str(c.gpus_per_node), str(c.num_nodes), c.intra_node.name,
                   c.inter_node.name, str(c.nics_per_node))
    console.print(cl)


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("hardware")(hardware)
