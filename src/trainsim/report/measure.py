"""`trainsim measure`: one measured run, or a suite's jobs over their repeats, as a table or one JSON object."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from trainsim.report.rich_text import to_text
from trainsim.units import format_bytes_gib

if TYPE_CHECKING:  # types only: trainsim.measure imports numpy, which `trainsim predict` does without
    from trainsim.measure.results import MeasuredRun
    from trainsim.measure.suite import JobSummary


def render_run(run: "MeasuredRun", terminal: bool = False) -> str:
    """One run: its iteration time (median, p10, p90), throughput and the largest peak memory of its ranks."""
    table = Table("run", "ranks", "median s", "p10 s", "p90 s", "tokens/s", "peak memory (max rank)",
                  title=f"measured ({run.peak_memory_kind}; {len(run.iteration_times_s)} iterations)")
    stats = run.stats
    table.add_row(run.run_id, str(run.world_size), f"{stats.median_s:.4f}", f"{stats.p10_s:.4f}",
                  f"{stats.p90_s:.4f}", f"{run.tokens_per_s:,.0f}", format_bytes_gib(run.max_peak_memory_bytes))
    text = to_text(table, terminal=terminal)
    phase = run.settings.get("phase_normalised")
    if phase:  # `trainsim measure --phase-normalise`
        text += (f"phase-normalised (fast-phase probe {phase['fast_probe_s'] * 1e3:.3f} ms): median iteration "
                 f"{phase['median_iteration_s']:.4f} -> {phase['median_iteration_normalised_s']:.4f} s, busiest "
                 f"rank's CPU per step {phase['busiest_step_cpu_s']:.4f} -> "
                 f"{phase['busiest_step_cpu_normalised_s']:.4f} s\n")
    return text


def suite_to_dict(name: str, out: Path, summary: "list[JobSummary]") -> dict[str, Any]:
    return {"suite": name, "out": str(out), "jobs": [s.to_dict() for s in summary]}


def render_suite(name: str, summary: "list[JobSummary]", terminal: bool = False) -> str:
    """A row per job of the suite, over its repeats."""
    table = Table("job", "ranks", "runs", "median s", "p10 s", "p90 s", "run medians s", "spread %", "tokens/s",
                  "peak memory", title=f"suite {name}: iteration time (spread = (max - min) / mean of run medians)")
    for s in summary:
        table.add_row(s.name, str(s.ranks), str(s.runs), f"{s.median_s:.4f}", f"{s.p10_s:.4f}", f"{s.p90_s:.4f}",
                      " ".join(f"{m:.4f}" for m in s.run_medians_s), f"{s.spread_pct:.1f}",
                      f"{s.tokens_per_s:,.0f}", format_bytes_gib(s.peak_memory_bytes))
    return to_text(table, terminal=terminal)


def render_suite_jobs(jobs: list[tuple[str, str]]) -> str:
    """`--suite NAME --list`: a line per job, its name and what it runs."""
    return "\n".join(f"{job_name:28s} {what}" for job_name, what in jobs)
