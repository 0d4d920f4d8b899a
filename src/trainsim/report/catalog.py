"""`trainsim models` and `trainsim hardware`: the catalogs as tables or one JSON document. On a terminal the
tables fit its width (cells wrap, none is cut); piped, they are plain text CATALOG_WIDTH columns wide, so every
row stays on one line for grep."""

from typing import Any

from rich.console import Console
from rich.table import Table

from trainsim.hardware.cluster import ClusterSpec, LinkSpec
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.report.rich_text import compact_table, to_text
from trainsim.units import format_bytes_gib, format_count

CATALOG_WIDTH = 200  # piped output: wide enough that no row wraps
NARROW = 120  # a terminal narrower than this drops the models' description column (the rest stays whole)


def models_to_list(models: list[ModelSpec], params: list[float]) -> list[dict[str, Any]]:
    """Each model's fields and its parameter count (params[i] belongs to models[i])."""
    return [{**m.model_dump(), "params": p} for m, p in zip(models, params, strict=True)]


def render_models(models: list[ModelSpec], params: list[float], terminal: bool = False) -> str:
    """One row per model (kind: a transformer's architecture, else the model's kind); on a terminal narrower
    than NARROW columns without the description."""
    described = not terminal or Console().width >= NARROW
    table = compact_table("name", "kind", "layers", "hidden", "heads/kv", "experts", "params",
                  *(["description"] if described else []))
    for m, p in zip(models, params, strict=True):
        if isinstance(m, TransformerSpec):
            shape = (m.arch, str(m.num_layers), str(m.hidden), f"{m.num_heads}/{m.kv_heads}",
                     f"{m.num_experts}x top{m.top_k}" if m.is_moe else "")
        else:
            shape = (m.kind, str(len(getattr(m, "layers", ()))), "", "", "")
        table.add_row(m.name, *shape, format_count(p), *([m.description[:50]] if described else []))
    return to_text(table, width=None if terminal else CATALOG_WIDTH, terminal=terminal)


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
    return to_text(devices_table(devices), links_table(links), clusters_table(clusters),
                   width=None if terminal else CATALOG_WIDTH, terminal=terminal)


def devices_table(devices: list[DeviceSpec]) -> Table:
    table = compact_table("device", "fp32", "tf32", "fp16", "bf16", "fp8", "HBM", "HBM GB/s", "max W",
                  title="GPUs (dense TFLOP/s)")
    for d in devices:
        peaks = [_tflops(d.peak_flops_per_s[k]) if k in d.peak_flops_per_s else "-"
                 for k in ("fp32", "tf32", "fp16", "bf16", "fp8")]
        table.add_row(d.name, *peaks, format_bytes_gib(d.hbm_bytes), f"{d.hbm_bw_bytes_per_s / 1e9:.0f}",
                      f"{d.max_power_w:.0f}" if d.max_power_w is not None else "-")
    return table


def _tflops(flops_per_s: float) -> str:
    """Whole TFLOP/s, with significant digits below 10 (a CPU's 0.3 is not 0)."""
    tflops = flops_per_s / 1e12
    return f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.2g}"


def links_table(links: list[LinkSpec]) -> Table:
    table = compact_table("link", "kind", "GB/s per direction", "latency us", title="links")
    for link in links:
        table.add_row(link.name, link.kind, f"{link.bw_bytes_per_s / 1e9:.1f}", f"{link.latency_s * 1e6:.1f}")
    return table


def clusters_table(clusters: list[ClusterSpec]) -> Table:
    table = compact_table("cluster", "device", "GPUs", "nodes", "intra-node", "inter-node", "NICs",
                  title="clusters (GPUs and NICs per node)")
    for c in clusters:
        table.add_row(c.name, c.device.name, str(c.gpus_per_node), str(c.num_nodes), c.intra_node.name,
                      c.inter_node.name, str(c.nics_per_node))
    return table
