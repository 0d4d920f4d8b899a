"""`trainsim models` and `trainsim hardware`: the catalogs as tables (200 columns) or one JSON document."""

from typing import Any

from rich.table import Table

from trainsim.hardware.cluster import ClusterSpec, LinkSpec
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.report.rich_text import to_text
from trainsim.units import format_bytes_gib, format_count

CATALOG_WIDTH = 200  # the tables are wider than a terminal's 80 columns; wrap them less


def models_to_list(models: list[ModelSpec], params: list[float]) -> list[dict[str, Any]]:
    """Each model's fields and its parameter count (params[i] belongs to models[i])."""
    return [{**m.model_dump(), "params": p} for m, p in zip(models, params, strict=True)]


def render_models(models: list[ModelSpec], params: list[float], terminal: bool = False) -> str:
    table = Table("name", "kind", "arch", "layers", "hidden", "heads/kv", "experts", "params", "description")
    for m, p in zip(models, params, strict=True):
        if isinstance(m, TransformerSpec):
            shape = (m.arch, str(m.num_layers), str(m.hidden), f"{m.num_heads}/{m.kv_heads}",
                     f"{m.num_experts}x top{m.top_k}" if m.is_moe else "")
        else:
            shape = ("", str(len(getattr(m, "layers", ()))), "", "", "")
        table.add_row(m.name, m.kind, *shape, format_count(p), m.description[:50])
    return to_text(table, width=CATALOG_WIDTH, terminal=terminal)


def hardware_to_dict(devices: list[DeviceSpec], links: list[LinkSpec],
                     clusters: list[ClusterSpec]) -> dict[str, Any]:
    """GPUs and links in full; a cluster names its device and links rather than repeating them."""
    return {"devices": [d.model_dump() for d in devices],
            "links": [link.model_dump() for link in links],
            "clusters": [c.model_dump(exclude={"device", "intra_node", "inter_node"})
                         | {"device": c.device.name, "intra_node": c.intra_node.name,
                            "inter_node": c.inter_node.name} for c in clusters]}


def render_hardware(devices: list[DeviceSpec], links: list[LinkSpec], clusters: list[ClusterSpec],
                    terminal: bool = False) -> str:
    return to_text(devices_table(devices), links_table(links), clusters_table(clusters), width=CATALOG_WIDTH,
                   terminal=terminal)


def devices_table(devices: list[DeviceSpec]) -> Table:
    table = Table("device", "fp32", "tf32", "fp16", "bf16", "fp8", "HBM", "HBM GB/s", title="GPUs (dense TFLOP/s)")
    for d in devices:
        peaks = [f"{d.peak_flops_per_s[k] / 1e12:.0f}" if k in d.peak_flops_per_s else "-"
                 for k in ("fp32", "tf32", "fp16", "bf16", "fp8")]
        table.add_row(d.name, *peaks, format_bytes_gib(d.hbm_bytes), f"{d.hbm_bw_bytes_per_s / 1e9:.0f}")
    return table


def links_table(links: list[LinkSpec]) -> Table:
    table = Table("link", "kind", "GB/s per direction", "latency us", title="links")
    for link in links:
        table.add_row(link.name, link.kind, f"{link.bw_bytes_per_s / 1e9:.1f}", f"{link.latency_s * 1e6:.1f}")
    return table


def clusters_table(clusters: list[ClusterSpec]) -> Table:
    table = Table("cluster", "device", "GPUs/node", "nodes", "intra-node", "inter-node", "NICs/node",
                  title="clusters")
    for c in clusters:
        table.add_row(c.name, c.device.name, str(c.gpus_per_node), str(c.num_nodes), c.intra_node.name,
                      c.inter_node.name, str(c.nics_per_node))
    return table
