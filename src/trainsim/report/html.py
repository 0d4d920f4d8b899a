"""The HTML report: one self-contained file of plotly charts for a prediction, a search or a validation.

Every page inlines plotly.js (about 4.8 MB, from the plotly package) once in its <head>, so it opens with no
network: a report is something people mail and archive. Charts are drawn from the commands' JSON objects
(`predict --json`, `search --json`, `validate --json`), so `trainsim report RESULT.json --html` draws what
`trainsim predict --html` drew. plotly is the optional `report` extra, imported only when a page is made.

Element ids, for tests and browsers: every chart is a <div class="chart" id="fig-NAME">; NAME is one of
time-breakdown, memory-breakdown, band, timeline, memory-timeline (prediction), throughput-memory, refusals
(search), scatter-METRIC (validation), compare-time, compare-memory (comparison of two plans).
"""

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainsim.errors import ConfigError
from trainsim.units import format_duration

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

GIB = 2**30
# A color per breakdown key and task category, stable across charts (plotly's qualitative "Plotly" palette
# order, then greys for waiting).
COLORS = {"compute": "#636EFA", "fwd": "#636EFA", "bwd": "#19D3F3", "recompute": "#AB63FA", "optimizer": "#FFA15A",
          "tp_comm": "#EF553B", "cp_comm": "#FF6692", "ep_comm": "#B6E880", "pp_comm": "#00CC96", "dp_comm": "#FECB52",
          "comm": "#FF97FF", "bubble": "#BBBBBB", "overhead": "#888888", "core_sharing": "#555555"}
# Memory components: optimizer states in the optimizer's color, the rest apart from the time colors.
MEMORY_COLORS = {"weights": "#3366CC", "gradients": "#DC3912", "optimizer": "#FFA15A", "activations": "#109618",
                 "temporary": "#990099", "optimizer_step": "#0099C6", "runtime_reserved": "#BBBBBB"}
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def _escape(text: str) -> str:
    """html.escape; NB: the html package loads its table of 2,000 entities, so only when a page is made (every
    command imports this module for require_plotly)."""
    from html import escape

    return escape(text)


def require_plotly(flag: str = "html") -> None:
    """One line, before any work, when the report extra is not installed."""
    try:
        import plotly  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError(flag, "plotly", "the HTML report needs plotly: pip install 'trainsim[report]'") from None


# --- pages ---


def prediction_page(data: dict[str, Any]) -> str:
    """The report of one prediction (the object of `predict --json`)."""
    figures: list[tuple[str, str, Figure | str]] = [
        ("time-breakdown", "Where the iteration time goes", time_breakdown_figure(data)),
        ("memory-breakdown", "Peak memory per GPU against its capacity", memory_breakdown_figure(data)),
        ("band", "Iteration time and its uncertainty band", band_figure(data)),
    ]
    timeline = data.get("timeline")
    if timeline:
        figures.append(("timeline", "The simulated iteration, per pipeline stage and stream",
                        timeline_figure(timeline)))
        figures.append(("memory-timeline", "Allocated memory over the iteration, per pipeline stage",
                        memory_timeline_figure(timeline)))
    else:
        message = (f"The {data.get('engine', '')} engine does not simulate the iteration: rerun with "
                   "--engine sim for the timeline and the memory over time.")
        figures.append(("timeline", "The simulated iteration", message))
    return _page(f"trainsim: {data.get('job', 'prediction')}", prediction_summary(data), figures)


def search_page(data: dict[str, Any]) -> str:
    """The report of a search (the object of `search --json --all`)."""
    figures: list[tuple[str, str, Figure | str]] = [
        ("throughput-memory", "Throughput against peak memory, every plan priced (Pareto front marked)",
         throughput_memory_figure(data)),
        ("refusals", "Why plans were refused", refusals_figure(data)),
    ]
    return _page(f"trainsim search: {data.get('title', '')}", search_summary(data), figures)


def validation_page(data: dict[str, Any]) -> str:
    """The report of a validation (the object of `validate --json`): predicted against measured per metric."""
    runs = [run for run in data.get("runs", []) if run.get("predicted") is not None]
    metrics = list(dict.fromkeys(run["metric"] for run in runs))
    figures: list[tuple[str, str, Figure | str]] = [
        (f"scatter-{metric}", f"Predicted against measured: {metric}", scatter_figure(runs, metric))
        for metric in metrics]
    if not figures:
        figures.append(("scatter-none", "Predicted against measured", "No run was predicted."))
    return _page("trainsim validate", validation_summary(data), figures)


def comparison_page(data: dict[str, Any]) -> str:
    """The report of two plans compared (the object of `compare --json`): each term of the iteration time and
    of the peak memory in A and in B, side by side, and the explanation."""
    figures: list[tuple[str, str, Figure | str]] = [
        ("compare-time", "Iteration time, term by term: A against B", comparison_time_figure(data)),
        ("compare-memory", "Peak memory per GPU, term by term: A against B", comparison_memory_figure(data)),
    ]
    return _page("trainsim compare: A against B", comparison_summary(data), figures)


# --- figures ---


def time_breakdown_figure(data: dict[str, Any]) -> "Figure":
    go = _go()
    parts = [(key, value) for key, value in data["breakdown"].items() if value > 0]
    total = data["iteration_time_s"]
    fig = go.Figure()
    for key, value in parts:
        fig.add_trace(go.Bar(name=key, y=["iteration"], x=[value * 1e3], orientation="h",
                             marker_color=COLORS.get(key), text=[f"{key} {value / total:.0%}"],
                             textposition="inside", hovertemplate=f"{key}: %{{x:.3f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack", height=220, xaxis_title="milliseconds per iteration",
                      legend={"orientation": "h", "y": -0.5, "traceorder": "normal"})
    return fig


def memory_breakdown_figure(data: dict[str, Any]) -> "Figure":
    """Stacked memory at the peak, per pipeline stage when the iteration was simulated, with the capacity."""
    go = _go()
    timeline = data.get("timeline")
    if timeline:
        columns = [(device["name"], device["breakdown_at_peak"]) for device in timeline["devices"]]
    else:
        columns = [("peak GPU", data["memory_breakdown"])]
    keys = list(dict.fromkeys(key for _, breakdown in columns for key in breakdown))
    fig = go.Figure()
    for key in keys:
        fig.add_trace(go.Bar(name=key, x=[name for name, _ in columns],
                             y=[breakdown.get(key, 0.0) / GIB for _, breakdown in columns],
                             marker_color=MEMORY_COLORS.get(key),
                             hovertemplate=f"{key}: %{{y:.2f}} GiB<extra></extra>"))
    fig.update_layout(barmode="stack", height=380, yaxis_title="GiB", legend_traceorder="reversed")
    _capacity_line(fig, data["memory_capacity_bytes"] / GIB, data["peak_memory_bytes"] / GIB)
    return fig


def comparison_time_figure(data: dict[str, Any]) -> "Figure":
    """A and B as two stacked bars of their time terms (milliseconds), in breakdown order."""
    go = _go()
    a, b = data["a"]["breakdown"], data["b"]["breakdown"]
    fig = go.Figure()
    for key in dict.fromkeys([*a, *b]):
        values = [a.get(key, 0.0), b.get(key, 0.0)]
        if max(values) <= 0:
            continue
        fig.add_trace(go.Bar(name=key, x=["A", "B"], y=[v * 1e3 for v in values], marker_color=COLORS.get(key),
                             hovertemplate=f"{key}: %{{y:.3f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack", height=380, yaxis_title="milliseconds per iteration",
                      legend_traceorder="reversed")
    return fig


def comparison_memory_figure(data: dict[str, Any]) -> "Figure":
    """A and B as two stacked bars of their memory at the peak (GiB), with the capacity."""
    go = _go()
    a, b = data["a"]["memory_breakdown"], data["b"]["memory_breakdown"]
    fig = go.Figure()
    for key in dict.fromkeys([*a, *b]):
        fig.add_trace(go.Bar(name=key, x=["A", "B"], y=[a.get(key, 0.0) / GIB, b.get(key, 0.0) / GIB],
                             marker_color=MEMORY_COLORS.get(key),
                             hovertemplate=f"{key}: %{{y:.2f}} GiB<extra></extra>"))
    fig.update_layout(barmode="stack", height=380, yaxis_title="GiB", legend_traceorder="reversed")
    capacity = max(data["a"]["memory_capacity_bytes"], data["b"]["memory_capacity_bytes"]) / GIB
    peak = max(data["a"]["peak_memory_bytes"], data["b"]["peak_memory_bytes"]) / GIB
    _capacity_line(fig, capacity, peak)
    return fig


def _capacity_line(fig: "Figure", capacity_gib: float, peak_gib: float, axis: str = "y") -> None:
    """The device's capacity as a dashed line on the memory axis; when the peak uses under a quarter of it, the
    axis stops above the peak (the data stays readable) and the capacity is written in the corner instead."""
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    if peak_gib >= 0.25 * capacity_gib:
        line = fig.add_hline if axis == "y" else fig.add_vline
        line(capacity_gib, line_dash="dash", line_color="#d62728", annotation_text=f"capacity {capacity_gib:.1f} GiB",
             annotation_position="top left" if axis == "y" else "top right")
        update(range=[0, max(capacity_gib, peak_gib) * 1.1])
    else:
        update(range=[0, peak_gib * 1.3])
        fig.add_annotation(text=f"capacity {capacity_gib:.1f} GiB (off the scale: peak {peak_gib / capacity_gib:.0%})",
                           xref="paper", yref="paper", x=0, y=1.06, showarrow=False, xanchor="left",
                           font_color="#d62728")


def band_of(data: dict[str, Any]) -> tuple[float, float] | None:
    """The (low, high) iteration time of the prediction's uncertainty band, where the Result carries one:
    `iteration_time_band_s` ([low, high] or {"low", "high"}), `iteration_time_low_s` with
    `iteration_time_high_s`, or `band`/`uncertainty` holding `iteration_time_s` in either form."""
    candidates: list[Any] = [data.get("iteration_time_band_s")]
    if "iteration_time_low_s" in data and "iteration_time_high_s" in data:
        candidates.append([data["iteration_time_low_s"], data["iteration_time_high_s"]])
    for key in ("band", "uncertainty"):
        nested = data.get(key)
        if isinstance(nested, dict):
            candidates.append(nested.get("iteration_time_s"))
    for candidate in candidates:
        pair = _pair(candidate)
        if pair is not None:
            return pair
    return None


def band_figure(data: dict[str, Any]) -> "Figure | str":
    band = band_of(data)
    if band is None:
        return ("This prediction carries no uncertainty band (the engine and calibration in use give a point "
                f"estimate): {format_duration(data['iteration_time_s'])} per iteration.")
    go = _go()
    low, high = band
    point = data["iteration_time_s"] * 1e3
    fig = go.Figure(go.Scatter(
        x=[point], y=["iteration time"], mode="markers", marker_size=12, name="prediction",
        error_x={"type": "data", "symmetric": False, "array": [high * 1e3 - point],
                 "arrayminus": [point - low * 1e3], "thickness": 3, "width": 12},
        hovertemplate=f"%{{x:.3f}} ms (band {low * 1e3:.3f} - {high * 1e3:.3f} ms)<extra></extra>"))
    fig.update_layout(height=200, xaxis_title="milliseconds per iteration", showlegend=False)
    return fig


def timeline_figure(timeline: dict[str, Any]) -> "Figure":
    """A Gantt chart: a row per (simulated device, stream), a bar per task colored by what it is."""
    go = _go()
    names = {device["index"]: device["name"] for device in timeline["devices"]}
    rows: dict[str, dict[str, list[Any]]] = {}
    for task in timeline["tasks"]:
        if task["end_s"] <= task["start_s"]:
            continue  # nothing to draw (a collective of one rank)
        label = task["phase"] if task["category"] == "compute" else task["category"]
        series = rows.setdefault(label, {"y": [], "base": [], "x": [], "text": []})
        series["y"].append(f"{names[task['device']]} · {task['stream']}")
        series["base"].append(task["start_s"] * 1e3)
        series["x"].append((task["end_s"] - task["start_s"]) * 1e3)
        micro_batch = task["micro_batch"]
        micro = f" mb {micro_batch}" if micro_batch is not None and micro_batch >= 0 else ""
        series["text"].append(f"{task['name']}{micro}" + (" (critical path)" if task["critical"] else ""))
    order = [f"{names[d['index']]} · {s}" for d in timeline["devices"] for s in ("compute", "feature", "gradient")]
    used = {y for series in rows.values() for y in series["y"]}
    order = [row for row in order if row in used]
    fig = go.Figure()
    for label, series in rows.items():
        fig.add_trace(go.Bar(name=label, orientation="h", y=series["y"], base=series["base"], x=series["x"],
                             marker_color=COLORS.get(label), marker_line_width=0, customdata=series["text"],
                             hovertemplate="%{customdata}<br>%{base:.3f} ms + %{x:.3f} ms<extra></extra>"))
    fig.update_layout(barmode="overlay", height=120 + 34 * len(order), xaxis_title="milliseconds",
                      yaxis={"categoryorder": "array", "categoryarray": order[::-1]}, bargap=0.25)
    return fig


def memory_timeline_figure(timeline: dict[str, Any]) -> "Figure":
    go = _go()
    names = {device["index"]: device["name"] for device in timeline["devices"]}
    fig = go.Figure()
    for memory in timeline["memory"]:
        fig.add_trace(go.Scatter(name=names[memory["device"]], x=[t * 1e3 for t in memory["time_s"]],
                                 y=[b / GIB for b in memory["bytes"]], mode="lines", line_shape="hv",
                                 hovertemplate="%{x:.3f} ms: %{y:.2f} GiB<extra></extra>"))
    capacity = min(device["capacity_bytes"] for device in timeline["devices"]) / GIB
    peak = max((b for memory in timeline["memory"] for b in memory["bytes"]), default=0.0) / GIB
    fig.update_layout(height=380, xaxis_title="milliseconds", yaxis_title="allocated GiB")
    _capacity_line(fig, capacity, peak)
    return fig


def throughput_memory_figure(data: dict[str, Any]) -> "Figure | str":
    points = data.get("all_plans") or []
    if not points:
        return "No plan could be priced: every plan was refused (see below)."
    go = _go()
    fig = go.Figure()
    groups = (("fits", lambda p: not p["oom"] and not p["pareto"], "#636EFA"),
              ("out of memory", lambda p: p["oom"], "#BBBBBB"),
              ("Pareto front", lambda p: p["pareto"], "#EF553B"))
    for name, keep, color in groups:
        chosen = sorted((p for p in points if keep(p)), key=lambda p: p["peak_memory_gib"])
        if not chosen:
            continue
        fig.add_trace(go.Scatter(
            name=name, x=[p["peak_memory_gib"] for p in chosen], y=[p["tokens_per_s"] for p in chosen],
            mode="lines+markers" if name == "Pareto front" else "markers", marker_color=color,
            marker_size=9 if name == "Pareto front" else 6, customdata=[p["description"] for p in chosen],
            hovertemplate="%{customdata}<br>%{x:.1f} GiB, %{y:,.0f} tokens/s<extra></extra>"))
    fig.update_layout(height=460, xaxis_title="peak memory per GPU (GiB)", yaxis_title="tokens/s",
                      yaxis_rangemode="tozero")
    capacity = data.get("memory_capacity_gib")
    if capacity:
        _capacity_line(fig, capacity, max(p["peak_memory_gib"] for p in points), axis="x")
    return fig


def refusals_figure(data: dict[str, Any]) -> "Figure | str":
    refused = data.get("infeasible") or {}
    if not refused:
        return "No plan was refused."
    go = _go()
    reasons = list(refused)[::-1]
    fig = go.Figure(go.Bar(x=[refused[r] for r in reasons], y=reasons, orientation="h", marker_color="#888888",
                           hovertemplate="%{y}: %{x} plans<extra></extra>"))
    fig.update_layout(height=120 + 30 * len(reasons), xaxis_title="plans refused", showlegend=False,
                      yaxis_automargin=True)
    return fig


def scatter_figure(runs: Sequence[dict[str, Any]], metric: str) -> "Figure":
    """A point per run, a color per source (its publication or repository) and engine, the diagonal."""
    from plotly.colors import qualitative

    from trainsim.validate.runs import source_group

    go = _go()
    palette = qualitative.Plotly
    every = sorted({(source_group(run["source"]), run["engine"]) for run in runs})
    color = {key: palette[index % len(palette)] for index, key in enumerate(every)}  # the same on every chart
    chosen = [run for run in runs if run["metric"] == metric]
    fig = go.Figure()
    groups = dict.fromkeys((source_group(run["source"]), run["engine"]) for run in chosen)
    for source, engine in groups:
        group = [run for run in chosen if source_group(run["source"]) == source and run["engine"] == engine]
        fig.add_trace(go.Scatter(
            name=f"{source} ({engine}, {len(group)})", x=[run["measured"] for run in group],
            y=[run["predicted"] for run in group], mode="markers",
            marker={"size": 6, "opacity": 0.75, "color": color[(source, engine)]},
            customdata=[run["source"] for run in group],
            hovertemplate="%{customdata}<br>measured %{x:.4g}, predicted %{y:.4g}<extra></extra>"))
    values = [v for run in chosen for v in (run["measured"], run["predicted"]) if v and v > 0]
    if values:
        low, high = min(values), max(values)
        fig.add_trace(go.Scatter(name="predicted = measured", x=[low, high], y=[low, high], mode="lines",
                                 line={"dash": "dot", "color": "#444444"}, hoverinfo="skip"))
    log = bool(values) and max(values) / min(values) > 50
    axis: dict[str, Any] = {"type": "log" if log else "linear"}
    if values:  # the same range on both axes, so the diagonal is the diagonal
        low, high = min(values), max(values)
        axis["range"] = [math.log10(low / 1.3), math.log10(high * 1.3)] if log else [0, high * 1.08]
    fig.update_layout(height=520, width=760, xaxis={**axis, "title": f"measured {metric}"},
                      yaxis={**axis, "title": f"predicted {metric}"}, legend={"orientation": "h", "y": -0.2})
    return fig


# --- the page ---


def _page(title: str, summary: str, figures: Sequence[tuple[str, str, "Figure | str"]]) -> str:
    from plotly.offline import get_plotlyjs

    sections = []
    for name, heading, figure in figures:
        if isinstance(figure, str):
            body = f'<p class="note" id="fig-{name}">{_escape(figure)}</p>'
        else:
            figure.update_layout(margin={"l": 60, "r": 30, "t": 30, "b": 50}, template="plotly_white")
            body = figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}",
                                  config=PLOTLY_CONFIG)
            body = f'<div class="chart">{body}</div>'
        sections.append(f"<section><h2>{_escape(heading)}</h2>\n{body}</section>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>{_escape(title)}</title>\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<style>{_STYLE}</style>\n'
            f'<script type="text/javascript">{get_plotlyjs()}</script>\n</head><body>\n'
            f"<h1>{_escape(title)}</h1>\n{summary}\n" + "\n".join(sections) +
            '\n<footer>Made by trainsim; charts by plotly.js (inlined, no network needed).</footer>\n</body></html>\n')


_STYLE = """body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:24px auto;
padding:0 16px;color:#222}h1{font-size:1.35em;word-break:break-word}h2{font-size:1.1em;margin-top:28px}
table.summary{border-collapse:collapse;margin:8px 0}table.summary td,table.summary th{padding:3px 12px 3px 0;
text-align:left;font-variant-numeric:tabular-nums}table.summary th{font-weight:600;color:#555}
p.note{color:#555;font-style:italic}.notes li{color:#8a5300}.oom{color:#c00;font-weight:600}
footer{margin-top:32px;color:#888;font-size:.85em}"""


def _table(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{_escape(k)}</th><td>{_escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{cells}</table>'


def prediction_summary(data: dict[str, Any]) -> str:
    peak, capacity = data["peak_memory_bytes"] / GIB, data["memory_capacity_bytes"] / GIB
    tokens = [("tokens/s", f"{data['tokens_per_s']:,.0f}")] if data.get("model_kind") in (None, "transformer") else []
    rows = [("engine", str(data["engine"])), ("iteration time", format_duration(data["iteration_time_s"])),
            *tokens, ("samples/s", f"{data['samples_per_s']:,.2f}"),
            ("TFLOP/s per GPU", f"{data['tflops_per_gpu']:.1f}"), ("MFU", f"{data['mfu']:.1%}"),
            ("peak memory", f"{peak:.2f} GiB of {capacity:.1f} GiB" + (" (out of memory)" if data["oom"] else ""))]
    band = band_of(data)
    if band is not None:
        rows.insert(2, ("uncertainty band", f"{format_duration(band[0])} - {format_duration(band[1])}"))
    notes = "".join(f"<li>{_escape(note)}</li>" for note in data.get("notes", []))
    return _table(rows) + (f'<ul class="notes">{notes}</ul>' if notes else "")


def search_summary(data: dict[str, Any]) -> str:
    rows = [("plans tried", str(data["tried"])), ("feasible", str(data["feasible"])),
            ("refused", str(data["tried"] - data["feasible"]))]
    plans = data.get("plans", [])
    header = "<tr><th>#</th><th>plan</th><th>iteration</th><th>tokens/s</th><th>MFU</th><th>peak GiB</th></tr>"
    body = "".join(f"<tr><td>{p['rank']}</td><td>{_escape(p['description'])}</td>"
                   f"<td>{p['iteration_time_s'] * 1e3:.2f} ms</td><td>{p['tokens_per_s']:,.0f}</td>"
                   f"<td>{p['mfu']:.1%}</td><td>{p['peak_memory_gib']:.1f}</td></tr>" for p in plans)
    best = f'<h2>Best plans</h2><table class="summary">{header}{body}</table>' if plans else ""
    return _table(rows) + best


def comparison_summary(data: dict[str, Any]) -> str:
    """The explanation `trainsim compare` prints, then each time term in A and B with its change."""
    lines = "".join(f"<li>{_escape(line)}</li>" for line in data.get("explanation", []))
    header = "<tr><th>time term</th><th>A</th><th>B</th><th>B - A</th></tr>"
    body = "".join(f"<tr><td>{_escape(t['term'])}</td><td>{format_duration(t['a'])}</td>"
                   f"<td>{format_duration(t['b'])}</td><td>{'+' if t['change'] >= 0 else '-'}"
                   f"{format_duration(abs(t['change']))}</td></tr>"
                   for t in data.get("time_terms", []) if max(t["a"], t["b"]) > 0)
    return f'<ul class="explanation">{lines}</ul><table class="summary">{header}{body}</table>'


def validation_summary(data: dict[str, Any]) -> str:
    header = "<tr><th>engine</th><th>source</th><th>metric</th><th>runs</th><th>skipped</th><th>MAPE</th></tr>"
    body = ""
    for entry in data.get("summary", []):
        mape = entry.get("mape_pct")
        shown = "n/a" if mape is None or _nan(mape) else f"{mape:.2f}%"
        cells = [str(entry.get(key, "")) for key in ("engine", "source", "metric", "n", "skipped")] + [shown]
        body += "<tr>" + "".join(f"<td>{_escape(cell)}</td>" for cell in cells) + "</tr>"
    return f'<table class="summary">{header}{body}</table>'


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _pair(candidate: Any) -> tuple[float, float] | None:
    if isinstance(candidate, dict) and "low" in candidate and "high" in candidate:
        candidate = [candidate["low"], candidate["high"]]
    if isinstance(candidate, list | tuple) and len(candidate) == 2 and all(
            isinstance(v, int | float) and math.isfinite(v) for v in candidate):
        return float(candidate[0]), float(candidate[1])
    return None


def _go() -> Any:
    import plotly.graph_objects as go  # NB: the report extra, loaded when a page is made

    return go
