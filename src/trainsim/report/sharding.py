"""Render a ShardingReport: one row per sharder (predicted iteration, the fullest rank's memory, the plan), the
pick, and a JSON form."""

from typing import Any

from rich.table import Table as RichTable

from trainsim.search.sharding import ShardingReport


def render_sharding(report: ShardingReport, plans: bool = True) -> RichTable:
    best = report.best
    title = (f"{report.model}: {report.num_ranks} ranks x {report.local_batch} samples, engine {report.engine}, "
             f"cap {report.cap_bytes / 2**30:.2f} GiB per rank; picked: {best.sharder if best else 'none'} "
             f"({report.selection_s:.2f} s to plan and predict all)")
    table = RichTable(title=title)
    for column in ("sharder", "iteration ms", "vs best", "peak GiB", "OOM", "plan" if plans else "notes"):
        table.add_column(column)
    for outcome in report.outcomes:
        if outcome.result is None or outcome.plan is None:
            table.add_row(outcome.sharder, "-", "-", "-", "-", f"refused: {outcome.refused}")
            continue
        r = outcome.result
        ratio = f"{r.iteration_time_s / best.iteration_time_s:.3f}x" if best else "-"
        detail = outcome.plan.describe() if plans else "; ".join(outcome.plan.notes)
        table.add_row(outcome.sharder, f"{r.iteration_time_s * 1e3:.3f}", ratio, f"{r.peak_memory_gib:.3f}",
                      "yes" if r.oom else "no", detail)
    return table


def sharding_to_dict(report: ShardingReport) -> dict[str, Any]:
    best = report.best
    return {
        "model": report.model, "num_ranks": report.num_ranks, "local_batch": report.local_batch,
        "engine": report.engine, "cap_bytes": report.cap_bytes, "selection_s": report.selection_s,
        "best": best.sharder if best else None,
        "sharders": [{"sharder": o.sharder, "refused": o.refused or None,
                      "iteration_time_s": o.result.iteration_time_s if o.result else None,
                      "peak_memory_bytes": o.result.peak_memory_bytes if o.result else None,
                      "oom": o.result.oom if o.result else None,
                      "plan": o.plan.describe() if o.plan else None,
                      "notes": list(o.plan.notes) if o.plan else []} for o in report.outcomes],
    }
