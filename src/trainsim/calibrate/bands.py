"""Held-out predictions and the uncertainty bands they give (catalog.uncertainty).

Every prediction the cross-validation makes of a run it held out (crossval.py) is a HeldOut: the split, the run,
log(predicted / measured) and its group of comparable jobs. Per group, the held-out runs' measured / predicted give
the band that every prediction of the group carries, holding COVERAGE (80%) of them. How (BandRule):

- shape "conformal" (in use): exp(-q) to exp(q), q the finite-sample conformal quantile of |log(measured /
  predicted)| over the n residuals, the ceil((n + 1) x COVERAGE)-th smallest (split conformal prediction's
  absolute-residual score; Lei et al. 2018, "Distribution-free predictive inference for regression", Sec. 2.2;
  with weights, that share of their total). shape "symmetric" (the rule before): the same with the plain COVERAGE
  quantile. The sources' errors go both ways (a stack that hides communication is predicted too slow, one whose
  collectives cross the network too fast), and which way a stack the fit has not seen goes is not known from the
  others'. shape "quantiles": from the 10% to the 90% quantile of measured / predicted, which hands the seen
  sources' lean to an unseen one.
- weight "runs" (in use): every run counts once. weight "sources": every source counts once, whatever its number
  of runs (a run weighs one over its source's runs in the group; weighted_quantile). Measured on sources held
  out, counting sources did worse: a source of 2 or 12 runs then weighs as much as one of 1,440, and its few
  runs' quantiles are noise (README, "Held-out runs").
- pooling "parent" (in use): a group with too few residuals (fewer than MIN_GROUP_RESIDUALS; for an
  unknown-stack group, also from fewer than MIN_GROUP_SOURCES sources: one stack's errors say nothing of how far
  another stack's fall) takes its parent's, the residuals of every group of the same stack side (known or
  unknown) at either scale (basis "scales-pooled"), then every residual (basis "pooled"). A job on an unknown
  stack thus keeps the errors of stacks their fits had not seen (the leave-one-source-out predictions, nearly all
  of the unknown-stack groups) as long as there are enough; a known-stack group may come from one source (a
  user's own cluster). pooling "flat" (the rule before): the group's own, else every residual; no count of
  sources under weight "runs".
scripts/band_coverage.py measures every rule side by side, the honest way: new_source_coverage, each source's
held-out runs against bands made without any of that source's held-out runs.
"""

import csv
import io
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np

from trainsim.calibrate.runs import FitSample
from trainsim.catalog.uncertainty import GROUPS, QUANTILES, BandRatios, Uncertainty
from trainsim.errors import InputFileError
from trainsim.estimate.result import stack_name_of

BandWeight = Literal["sources", "runs"]
BandShape = Literal["conformal", "symmetric", "quantiles"]
BandPooling = Literal["parent", "flat"]
BAND_WEIGHTS: tuple[BandWeight, ...] = ("sources", "runs")
BAND_SHAPES: tuple[BandShape, ...] = ("conformal", "symmetric", "quantiles")
BAND_POOLINGS: tuple[BandPooling, ...] = ("parent", "flat")
COVERAGE = QUANTILES[1] - QUANTILES[0]  # the share of held-out runs a band holds
MIN_GROUP_RESIDUALS = 20  # fewer held-out runs than this: the group takes its parent's residuals (module docstring)
MIN_GROUP_SOURCES = 2  # so does one whose runs come from fewer sources (unknown stack; weight "sources": any)


@dataclass(frozen=True, slots=True)
class BandRule:
    """How held-out runs make a group's band: weight (how each run counts), shape, and pooling (where a group
    with too few residuals takes its band): module docstring."""

    weight: BandWeight = "runs"
    shape: BandShape = "conformal"
    pooling: BandPooling = "parent"

    @property
    def name(self) -> str:
        pooled = "parent group, then all" if self.pooling == "parent" else "all"
        return f"{self.shape}, every {self.weight[:-1]} once, too few: {pooled}"


BAND_RULE = BandRule()
PREVIOUS_RULE = BandRule("runs", "symmetric", "flat")  # the rule before BAND_RULE


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One held-out prediction. log_error: log(predicted / measured); group: its band group in its split."""

    scheme: str
    split: str
    run_id: str
    source: str
    num_gpus: int
    log_error: float
    group: str

    @property
    def ratio(self) -> float:
        """measured / predicted."""
        return math.exp(-self.log_error)

    @property
    def percent_error(self) -> float:
        """|predicted / measured - 1| in percent."""
        return abs(math.exp(self.log_error) - 1.0) * 100.0


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The q-quantile of the distribution that puts weights[i] on values[i]: the smallest value whose cumulative
    weight (values in increasing order) reaches q of the total weight (numpy's method="inverted_cdf", with
    weights). NB: a relative 1e-12 of slack, so that sums of fractions like 1/3 + 2/3 reach a q that is exact."""
    if not values or len(values) != len(weights):
        raise ValueError(f"weighted_quantile needs as many weights ({len(weights)}) as values ({len(values)}), "
                         "at least one")
    if not 0.0 <= q <= 1.0 or any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError(f"q={q} must lie in [0, 1] and every weight be positive and finite")
    order = sorted(range(len(values)), key=lambda i: values[i])
    target = q * math.fsum(weights) * (1.0 - 1e-12)
    cumulative = 0.0
    for i in order:
        cumulative += weights[i]
        if cumulative >= target:
            return values[i]
    return values[order[-1]]


def source_weights(records: Sequence[HeldOut]) -> list[float]:
    """One over the record's source's number of records: every source weighs one in all."""
    counts = Counter(r.source for r in records)
    return [1.0 / counts[r.source] for r in records]


def conformal_level(residuals: int, coverage: float = COVERAGE) -> float:
    """The share of `residuals` calibration scores below a split conformal band's edge: ceil((n + 1) x coverage)
    / n, so that a new score exchangeable with them falls inside with probability coverage or more (Lei et al.
    2018, Sec. 2.2). NB: above 1 (n < coverage / (1 - coverage), 4 at 80%) no finite band does."""
    if residuals < 1 or not 0.0 < coverage < 1.0:
        raise ValueError(f"residuals={residuals} must be 1 or more and coverage={coverage} in (0, 1)")
    level = math.ceil((residuals + 1) * coverage * (1.0 - 1e-12)) / residuals  # NB: slack as weighted_quantile's
    if level > 1.0:
        raise ValueError(f"residuals={residuals} are too few for a finite {coverage:.0%} conformal band "
                         f"(needs {math.ceil(coverage / (1.0 - coverage))} or more)")
    return level


def band_ratios_of(records: Sequence[HeldOut], basis: str, rule: BandRule = BAND_RULE) -> BandRatios:
    """The band of `records` under `rule`, as ratios measured / predicted."""
    log_ratios = [-r.log_error for r in records]
    weights = source_weights(records) if rule.weight == "sources" else [1.0] * len(records)
    if rule.shape in ("conformal", "symmetric"):
        level = conformal_level(len(records)) if rule.shape == "conformal" else COVERAGE
        q = weighted_quantile([abs(v) for v in log_ratios], weights, level)
        low, high = -q, q
    elif rule.weight == "runs":  # numpy's linear interpolation: the first bands' rule
        low, high = (float(v) for v in np.quantile(np.array(log_ratios), QUANTILES))
    else:
        low, high = (weighted_quantile(log_ratios, weights, q) for q in QUANTILES)
    return BandRatios(low_ratio=math.exp(low), high_ratio=math.exp(high), residuals=len(records),
                      basis=basis)  # type: ignore[arg-type]  # BandRatios checks it


def _enough(records: Sequence[HeldOut], rule: BandRule, group: str) -> bool:
    counts_sources = rule.weight == "sources" or (rule.pooling == "parent" and _stack_side(group) == "unknown-stack")
    return len(records) >= MIN_GROUP_RESIDUALS and (
        not counts_sources or len({r.source for r in records}) >= MIN_GROUP_SOURCES)


def _stack_side(group: str) -> str:
    return group.split("/")[0]


def pooling_levels(group: str, records: Sequence[HeldOut], rule: BandRule) -> list[tuple[str, list[HeldOut]]]:
    """(basis, residuals) a group's band may come from, the first with enough (module docstring, pooling)."""
    own = [r for r in records if r.group == group]
    if rule.pooling == "flat":
        return [("own", own), ("pooled", list(records))]
    side = [r for r in records if _stack_side(r.group) == _stack_side(group)]
    return [("own", own), ("scales-pooled", side), ("pooled", list(records))]


def uncertainty_of(records: Sequence[HeldOut], samples: Sequence[FitSample], fallback: Uncertainty | None = None,
                   rule: BandRule = BAND_RULE) -> Uncertainty | None:
    """The bands of a fit on `samples`, from the held-out predictions `records`. A group with too few records
    (MIN_GROUP_RESIDUALS, MIN_GROUP_SOURCES) takes its parent's (pooling_levels); with too few in all, the
    group's band of `fallback` (the package's own fit), if any; else None."""
    stacks = sorted({name for s in samples if (name := stack_name_of(s.job)) is not None})
    gpus = [s.job.num_gpus for s in samples]
    bands: dict[str, BandRatios] = {}
    for group in GROUPS:
        levels = pooling_levels(group, records, rule)
        usable = next(((basis, level) for basis, level in levels if _enough(level, rule, group)), None)
        if usable is not None:
            bands[group] = band_ratios_of(usable[1], usable[0], rule)
        elif fallback is not None:
            bands[group] = fallback.bands[group].model_copy(update={"basis": "package"})
        else:
            return None
    return Uncertainty(quantiles=QUANTILES, calibrated_stacks=stacks, min_gpus=min(gpus), max_gpus=max(gpus),
                       bands=bands)


def covered(record: HeldOut, uncertainty: Uncertainty) -> bool:
    """Whether the held-out run's measured time lies in the band its group gives its prediction."""
    low, high = uncertainty.band_ratios(record.group)
    return low <= record.ratio <= high


def coverage(records: Sequence[HeldOut], uncertainty: Uncertainty) -> float:
    return sum(covered(r, uncertainty) for r in records) / len(records) if records else math.nan


def new_source_coverage(records: Sequence[HeldOut], samples: Sequence[FitSample],
                        rule: BandRule = BAND_RULE) -> dict[str, float]:
    """The honest coverage, in percent: each source's held-out runs against the bands made from the other
    sources' held-out runs only (the band itself held out by source). ALL: over every run; mean: the sources'
    mean, each source once."""
    out: dict[str, float] = {}
    hits = counted = 0
    for source in sorted({r.source for r in records}):
        own = [r for r in records if r.source == source]
        bands = uncertainty_of([r for r in records if r.source != source], samples, rule=rule)
        if bands is None:
            continue
        inside = sum(covered(r, bands) for r in own)
        hits, counted = hits + inside, counted + len(own)
        out[source] = inside / len(own) * 100.0
    if counted:
        out["mean"] = sum(out.values()) / len(out)
        out["ALL"] = hits / counted * 100.0
    return out


HELD_OUT_COLUMNS = tuple(f.name for f in fields(HeldOut))


def held_out_csv(records: Sequence[HeldOut]) -> str:
    """The held-out predictions as CSV (HELD_OUT_COLUMNS; log_error to full precision, so bands recomputed from
    the file equal those from the records)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HELD_OUT_COLUMNS)
    writer.writerows([*astuple(r)[:5], repr(r.log_error), r.group] for r in records)
    return out.getvalue()


def read_held_out(path: Path) -> list[HeldOut]:
    """Held-out predictions written by held_out_csv (`trainsim calibrate --held-out FILE`)."""
    try:
        rows = list(csv.DictReader(io.StringIO(path.read_text(), newline="")))
        records = [HeldOut(row["scheme"], row["split"], row["run_id"], row["source"], int(row["num_gpus"]),
                           float(row["log_error"]), row["group"]) for row in rows]
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise InputFileError(f"held_out={path}: not a file of held-out predictions with the columns "
                             f"{', '.join(HELD_OUT_COLUMNS)} ({exc})") from exc
    bad = sorted({r.group for r in records} - set(GROUPS))
    if bad:
        raise InputFileError(f"held_out={path}: unknown groups {', '.join(bad)}; allowed: {', '.join(GROUPS)}")
    if not records or not all(math.isfinite(r.log_error) for r in records):
        raise InputFileError(f"held_out={path}: needs at least one held-out prediction, every log_error finite")
    return records
