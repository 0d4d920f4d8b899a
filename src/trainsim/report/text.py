"""Readable summaries of a Result."""

from trainsim.estimate.result import BREAKDOWN_KEYS, MFU_FORMULA, Result
from trainsim.units import format_bytes_gib, format_count, format_duration


def render_result(result: Result) -> str:
    lines = [
        f"job             {result.job}",
        f"engine          {result.engine}",
        f"iteration time  {format_duration(result.iteration_time_s)}",
        f"throughput      {format_count(result.tokens_per_s)} tokens/s, {result.samples_per_s:.2f} samples/s",
        f"model TFLOP/s   {result.tflops_per_gpu:.1f} per GPU",
        f"MFU             {result.mfu * 100:.1f}%   (HFU {result.hfu * 100:.1f}%; peak "
        f"{result.peak_flops_per_gpu / 1e12:.0f} TFLOP/s)",
        f"                MFU = {MFU_FORMULA}",
        f"peak memory     {format_bytes_gib(result.peak_memory_bytes)} of "
        f"{format_bytes_gib(result.memory_capacity_bytes)} per GPU: "
        + ("OUT OF MEMORY" if result.oom else "fits"),
    ]
    lines += [f"  {name:<16}{format_bytes_gib(value):>12}" for name, value in result.memory_breakdown.items()]
    lines.append("time breakdown (per iteration)")
    total = result.iteration_time_s
    for name in BREAKDOWN_KEYS:
        seconds = result.breakdown.get(name, 0.0)
        if seconds > 0 or name in ("compute", "bubble"):
            lines.append(f"  {name:<16}{format_duration(seconds):>12}  {seconds / total * 100:5.1f}%")
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)
