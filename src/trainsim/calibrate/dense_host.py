"""Fit the dense part's host cost of a sharded DLRM (cost.sharded_dlrm.DenseHostCost: per forward op, per
backward op, per optimizer tensor) from measured per-rank traces: Lin et al.'s Algorithm 1 aggregates the
CPU-side overheads T1-T5 from collected traces (Sec. III-D); here the overhead is what a dense span of the trace
takes beyond the price of its kernels (their microbenchmarks, e.g. cost.profiled): the module calls, autograd's
recording and dispatch, the Python loop of the SGD step.

A sample is one dense span of one rank of one traced iteration (measure.dlrm's spans, with their thread CPU time
where the trace has it: the work without the time other processes held the core). Per phase (forward, backward)
the fit is measured = scale x priced + count x per-op cost, by least squares on the relative error (every span
weighs alike, short or long), the per-op cost held at 0 where the free fit would make it negative: the per-op
cost is what does not grow with the work (the traces show both: the bottom MLP's tiny spans are mostly per-op
cost, the top MLP's grow with the batch). The optimizer step's price (bytes over bandwidth) barely varies across
traces, so it gets a per-tensor cost only: the median over the samples of (measured - priced) / tensors, 0 when
negative.
"""

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trainsim.cost.sharded_dlrm import MAX_KERNEL_SCALE, DenseHostCost, DenseOpCounts, ShardedIteration
from trainsim.errors import ConfigError, InputFileError

# measure.dlrm_rank's dense spans -> (RankWork field, phase of DenseHostCost, DenseOpCounts field)
DENSE_SPANS = {"bottom_mlp fwd": ("bottom_fwd_s", "fwd", "bottom_fwd"),
               "top_mlp fwd": ("top_fwd_s", "fwd", "top_fwd"),
               "top_mlp bwd": ("top_bwd_s", "bwd", "top_bwd"),
               "bottom_mlp bwd": ("bottom_bwd_s", "bwd", "bottom_bwd"),
               "optimizer step": ("optimizer_s", "step", "step_tensors")}
FIELDS = ("fwd_op_s", "bwd_op_s", "step_tensor_s", "fwd_kernel_scale", "bwd_kernel_scale")


@dataclass(frozen=True, slots=True)
class DenseSpanSample:
    span: str  # a DENSE_SPANS key
    measured_s: float  # the span's thread CPU time (or its wall time where the trace has no CPU times)
    priced_s: float  # its kernels' price, without host cost
    count: int  # its ops (or the step's tensors)


def samples_from_trace(rank_spans: Sequence[Sequence[Sequence[object]]],
                       rank_cpu_s: Sequence[Sequence[float]] | None, iteration: ShardedIteration,
                       counts: DenseOpCounts) -> list[DenseSpanSample]:
    """The dense spans of one traced iteration (per rank: (name, start_s, end_s) spans, and per span its thread
    CPU seconds) against `iteration`, the same config priced without host cost."""
    out = []
    for rank, spans in enumerate(rank_spans):
        for index, (name, start, end) in enumerate(spans):  # type: ignore[misc]
            if name not in DENSE_SPANS:
                continue
            field, _, count_field = DENSE_SPANS[str(name)]
            measured = float(rank_cpu_s[rank][index]) if rank_cpu_s else float(end) - float(start)  # type: ignore[arg-type]
            out.append(DenseSpanSample(str(name), measured, getattr(iteration.ranks[rank], field),
                                       getattr(counts, count_field)))
    return out


def fit_dense_host(samples: Sequence[DenseSpanSample]) -> DenseHostCost:
    """The per-op costs and in-situ kernel factors of the samples' phases; a phase without samples prices nothing
    extra."""
    import numpy as np

    per_phase: dict[str, list[DenseSpanSample]] = {"fwd": [], "bwd": [], "step": []}
    for s in samples:
        if s.count < 1 or not (math.isfinite(s.measured_s) and math.isfinite(s.priced_s)) or s.measured_s <= 0.0 \
                or s.priced_s < 0.0:
            raise ConfigError(f"sample {s.span}", (s.measured_s, s.priced_s, s.count),
                              "needs finite times (measured > 0, priced >= 0) and a positive count")
        per_phase[DENSE_SPANS[s.span][1]].append(s)
    fitted: dict[str, float] = {}
    for phase in ("fwd", "bwd"):
        if per_phase[phase]:
            fitted[f"{phase}_kernel_scale"], fitted[f"{phase}_op_s"] = _scale_and_per_op(per_phase[phase])
    step = per_phase["step"]
    if step:
        fitted["step_tensor_s"] = max(0.0, float(np.median([(s.measured_s - s.priced_s) / s.count for s in step])))
    return DenseHostCost(**fitted)


def _scale_and_per_op(samples: Sequence[DenseSpanSample]) -> tuple[float, float]:
    """measured ~ scale * priced + count * per_op, least squares on measured-relative error; per_op >= 0."""
    import numpy as np

    measured = np.array([s.measured_s for s in samples])
    design = np.array([[s.priced_s, float(s.count)] for s in samples]) / measured[:, None]
    target = np.ones(len(samples))
    (scale, per_op), *_ = np.linalg.lstsq(design, target, rcond=None)
    if per_op < 0.0:  # the work explains it all: refit the scale alone
        per_op = 0.0
        column = design[:, 0]
        scale = float(column @ target / (column @ column)) if column @ column > 0.0 else 1.0
    if not 0.0 < scale <= MAX_KERNEL_SCALE:
        raise ConfigError("dense_host fit", scale, f"the kernel factor must come out in (0, {MAX_KERNEL_SCALE:g}]; "
                          "are the prices and the traces of the same configs?")
    return float(scale), float(per_op)


def save_dense_host(host: DenseHostCost, path: Path, source: str, samples: int) -> None:
    path.write_text(json.dumps({"dense_host": asdict(host), "source": source, "samples": samples}, indent=1) + "\n")


def load_dense_host(path: Path) -> DenseHostCost:
    """A DenseHostCost saved by save_dense_host (bad file -> one-line error naming it)."""
    if not path.is_file():
        raise ConfigError("dense_host", str(path), "a JSON file written by the dense host-cost fit")
    try:
        values = json.loads(path.read_text())["dense_host"]
        return DenseHostCost(**{k: float(values[k]) for k in FIELDS})
    except (ValueError, KeyError, TypeError) as exc:
        raise InputFileError(f"{path}: not a dense host-cost fit ({type(exc).__name__}: {exc})") from None
