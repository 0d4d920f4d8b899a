"""Readable summaries of a Result."""

from trainsim.estimate.result import BREAKDOWN_KEYS, MFU_FORMULA, Result
from trainsim.units import format_bytes_gib, format_count, format_duration


def render_result(result: Result, model_kind: str | None = None, explain: bool = False) -> str:
    """The summary of a prediction. model_kind: the model's kind (ModelSpec.kind); only a transformer's
    throughput is counted in tokens, every other model's in samples. explain: add the MFU formula."""
    tokens = f"{format_count(result.tokens_per_s)} tokens/s, " if model_kind in (None, "transformer") else ""
    lines = [
        f"job             {result.job}",
        f"engine          {result.engine}",
        f"iteration time  {format_duration(result.iteration_time_s)}",
        f"throughput      {tokens}{result.samples_per_s:,.2f} samples/s",
        f"model FLOP/s    {flop_rate(result.tflops_per_gpu * 1e12)} per GPU",
        f"MFU             {result.mfu * 100:.1f}%   (HFU {result.hfu * 100:.1f}%; peak "
        f"{flop_rate(result.peak_flops_per_gpu)})",
        *([f"                MFU = {MFU_FORMULA}"] if explain else []),
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


def flop_rate(flops_per_s: float) -> str:
    """TFLOP/s for accelerators, GFLOP/s below 0.1 TFLOP/s (a CPU), never "0.0 TFLOP/s"."""
    if flops_per_s >= 1e11:
        return f"{flops_per_s / 1e12:.1f} TFLOP/s"
    return f"{flops_per_s / 1e9:.2f} GFLOP/s"
