"""Readable summaries of a Result."""

from collections.abc import Callable

from trainsim.estimate.result import BREAKDOWN_KEYS, MFU_FORMULA, Band, Result
from trainsim.units import format_bytes_gib, format_count, format_duration


def render_result(result: Result, model_kind: str | None = None, explain: bool = False) -> str:
    """The summary of a prediction. model_kind: the model's kind (ModelSpec.kind); only a transformer's
    throughput is counted in tokens, every other model's in samples. explain: add the MFU formula."""
    tokens = f"{format_count(result.tokens_per_s)} tokens/s, " if model_kind in (None, "transformer") else ""
    tokens_band = (_rate_band(result, "tokens_per_s", lambda value: f"{format_count(value)} tokens/s")
                   if tokens else _rate_band(result, "samples_per_s", lambda value: f"{value:,.2f} samples/s"))
    lines = [
        f"job             {result.job}",
        f"engine          {result.engine}",
        f"iteration time  {format_duration(result.iteration_time_s)}" + _time_band(result.band),
        f"throughput      {tokens}{result.samples_per_s:,.2f} samples/s" + tokens_band,
        f"model FLOP/s    {flop_rate(result.tflops_per_gpu * 1e12)} per GPU"
        + _rate_band(result, "tflops_per_gpu", lambda value: flop_rate(value * 1e12)),
        f"MFU             {result.mfu * 100:.1f}%   (HFU {result.hfu * 100:.1f}%; peak "
        f"{flop_rate(result.peak_flops_per_gpu)})" + _rate_band(result, "mfu", lambda v: f"{v * 100:.1f}%"),
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
    band = result.band
    if band is not None:
        lines.append(f"band: {band.coverage * 100:.0f}% of {band.residuals} held-out calibration runs of jobs like "
                     f"this ({band.meaning}{'' if band.basis == 'own' else f'; {band.basis} band'}) fell in "
                     "such a range")
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


def _time_band(band: Band | None) -> str:
    if band is None:
        return ""
    return f"   ({band.coverage * 100:.0f}% band {format_duration(band.low_s)} - {format_duration(band.high_s)})"


def _rate_band(result: Result, name: str, show: Callable[[float], str]) -> str:
    """The band of a figure inversely proportional to the iteration time."""
    if result.band is None:
        return ""
    value = getattr(result, name)
    low = value * result.iteration_time_s / result.band.high_s
    high = value * result.iteration_time_s / result.band.low_s
    return f"   (band {show(low)} - {show(high)})"


def flop_rate(flops_per_s: float) -> str:
    """TFLOP/s for accelerators, GFLOP/s below 0.1 TFLOP/s (a CPU), never "0.0 TFLOP/s"."""
    if flops_per_s >= 1e11:
        return f"{flops_per_s / 1e12:.1f} TFLOP/s"
    return f"{flops_per_s / 1e9:.2f} GFLOP/s"
