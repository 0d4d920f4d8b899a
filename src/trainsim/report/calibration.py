"""`trainsim calibrate --cross-validate`: held-out MAPE per scheme and source, the bands and their coverage."""

import math
from typing import Any

from rich.table import Table

from trainsim.report.rich_text import to_text

SCHEME_TEXT = {
    "k-fold": "k-fold",
    "leave-one-source-out": "source held out",
    "scale-extrapolation": "scale (fit <= 64 GPUs, predict 128-256)",
}


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}%"


def render_cross_validation(report: dict[str, Any], terminal: bool = False) -> str:
    """The held-out MAPE (a row per source, a column per scheme), the bands, their coverage."""
    mape: dict[str, dict[str, float]] = report["mape_pct"]
    sources = sorted({s for per in mape.values() for s in per if s != "ALL"})
    errors = Table(title="held-out iteration-time MAPE (runs)")
    errors.add_column("source")
    for scheme in mape:
        errors.add_column(SCHEME_TEXT.get(scheme, scheme), justify="right")
    for source in [*sources, "ALL"]:
        errors.add_row(source, *(_pct(per.get(source)) for per in mape.values()))
    errors.add_row("held-out runs", *(str(report["runs"][scheme]) for scheme in mape))
    items: list[Any] = [errors]
    if "bands" in report:
        rule = report.get("band_rule", "10%-90% quantiles, every run once")
        bands = Table(title=f"80% bands of measured / predicted over the held-out runs ({rule})")
        for name, justify in (("group", "left"), ("low", "right"), ("high", "right"), ("runs", "right"),
                              ("basis", "left"), ("coverage", "right")):
            bands.add_column(name, justify=justify)  # type: ignore[arg-type]
        for group, ratios in report["bands"].items():
            bands.add_row(group, f"{ratios['low_ratio']:.3f}", f"{ratios['high_ratio']:.3f}",
                          str(ratios["residuals"]), ratios["basis"], _pct(report["coverage_pct"].get(group)))
        cover = report["coverage_pct"]
        new_source = report["coverage_new_source_pct"]
        lines = ["coverage of the 80% band (held-out runs inside their group's band): "
                 + ", ".join(f"{SCHEME_TEXT.get(k, k)} {_pct(v)}" for k, v in cover.items() if k in SCHEME_TEXT)
                 + f"; all {_pct(cover['ALL'])}",
                 "coverage on a source the bands did not see (bands from the other sources' held-out runs): "
                 + ", ".join(f"{k} {_pct(v)}" for k, v in new_source.items())]
        items += [bands, *lines]
    return to_text(*items, terminal=terminal)


def json_safe(value: Any) -> Any:
    """The --json object; NaN (a scheme without runs of a source) becomes null."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
