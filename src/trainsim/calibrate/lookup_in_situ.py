"""Fit the in-situ factors of the embedding lookups of a sharded DLRM (cost.embedding_lookup.InSituLookup) from
measured per-rank traces: Lin et al.'s Algorithm 1 aggregates from collected traces what the kernel models do not
see (Sec. III-D); here that is how much longer (or shorter) a rank's lookups take inside an iteration than the
lookup model, trained on one table at a time, prices them.

A sample is one "embeddings fwd" or "embeddings bwd" span of one rank of one traced iteration (measure.dlrm's
spans, with their thread CPU time where the trace has it: the work without the time other processes held the
core) against the same rank's priced lookups (the sum over its pieces, without in-situ factors). Per phase the
factor is the geometric mean of measured / priced (least squares on the log ratio): every span weighs alike, and
the occasional span that a descheduled peer or a page-fault storm stretched 3x pulls a geometric mean less than
an arithmetic one.
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainsim.cost.embedding_lookup import InSituLookup
from trainsim.cost.sharded_dlrm import ShardedIteration
from trainsim.embedding.lookup_model import LookupCostModel
from trainsim.errors import ConfigError, InputFileError

# measure.dlrm_rank's lookup spans -> (RankWork field, InSituLookup field)
LOOKUP_SPANS = {"embeddings fwd": ("lookup_fwd_s", "fwd_scale"), "embeddings bwd": ("lookup_bwd_s", "bwd_scale")}


@dataclass(frozen=True, slots=True)
class LookupSpanSample:
    span: str  # a LOOKUP_SPANS key
    measured_s: float  # the span's thread CPU time (or its wall time where the trace has no CPU times)
    priced_s: float  # the rank's lookups priced by the lookup model alone


def samples_from_trace(rank_spans: Sequence[Sequence[Sequence[object]]],
                       rank_cpu_s: Sequence[Sequence[float]] | None,
                       iteration: ShardedIteration) -> list[LookupSpanSample]:
    """The lookup spans of one traced iteration (per rank: (name, start_s, end_s) spans, and per span its thread
    CPU seconds) against `iteration`, the same config priced without in-situ factors. A rank without lookups
    (priced 0) gives no sample."""
    out = []
    for rank, spans in enumerate(rank_spans):
        for index, (name, start, end) in enumerate(spans):  # type: ignore[misc]
            if name not in LOOKUP_SPANS:
                continue
            priced = getattr(iteration.ranks[rank], LOOKUP_SPANS[str(name)][0])
            measured = float(rank_cpu_s[rank][index]) if rank_cpu_s else float(end) - float(start)  # type: ignore[arg-type]
            if priced > 0.0:
                out.append(LookupSpanSample(str(name), measured, priced))
    return out


def fit_lookup_in_situ(samples: Sequence[LookupSpanSample], model: LookupCostModel) -> InSituLookup:
    """`model` with each phase's factor: the geometric mean of measured / priced over the phase's samples (1.0
    for a phase without samples)."""
    logs: dict[str, list[float]] = {field: [] for _, field in LOOKUP_SPANS.values()}
    for s in samples:
        if not (math.isfinite(s.measured_s) and math.isfinite(s.priced_s)) or s.measured_s <= 0.0 \
                or s.priced_s <= 0.0:
            raise ConfigError(f"sample {s.span}", (s.measured_s, s.priced_s), "needs finite positive times")
        logs[LOOKUP_SPANS[s.span][1]].append(math.log(s.measured_s / s.priced_s))
    return InSituLookup(model, **{field: math.exp(sum(v) / len(v)) for field, v in logs.items() if v})


def save_lookup_in_situ(fitted: InSituLookup, path: Path, source: str, samples: int) -> None:
    factors = {"fwd_scale": fitted.fwd_scale, "bwd_scale": fitted.bwd_scale}
    path.write_text(json.dumps({"lookup_in_situ": factors, "source": source, "samples": samples}, indent=1) + "\n")


def load_lookup_in_situ(path: Path, model: LookupCostModel) -> InSituLookup:
    """`model` with the factors saved by save_lookup_in_situ (bad file -> one-line error naming it)."""
    if not path.is_file():
        raise ConfigError("lookup_in_situ", str(path), "a JSON file written by the lookup in-situ fit")
    try:
        values = json.loads(path.read_text())["lookup_in_situ"]
        return InSituLookup(model, float(values["fwd_scale"]), float(values["bwd_scale"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise InputFileError(f"{path}: not a lookup in-situ fit ({type(exc).__name__}: {exc})") from None
