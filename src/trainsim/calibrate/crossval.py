"""Cross-validation of the run-level fit, and the uncertainty bands it measures.

Three ways of holding runs out (splits), each refitting the run-level parameters (runs.fit_runtime, the
analytical engine) on the rest and predicting the held-out runs:
- k-fold over runs: new runs of the stacks, GPUs and scales the fit has seen;
- leave-one-source-out: a publication's or repository's runs, predicted from the others' (a stack it has not
  seen, where no other source runs the same stack);
- scale extrapolation: fitted on the runs of at most SCALE_TRAIN_MAX_GPUS GPUs, predicting those on
  SCALE_TEST_GPUS (a known stack at a scale outside the fit's).
The microbenchmark fits (GEMM and collective curves) use no runs and are kept in every split. Each split's fit
starts from the fit on all runs and stops when an iteration improves its cost by less than WARM_TOLERANCE
(relative): Gauss-Newton steps on the split's training runs alone, from a nearby start, in a tenth of the
evaluations of a fit from the priors. The held-out runs are in no split's objective, but the start has seen
them: cold=True (--cold) fits every split from the priors to the full fit's tolerance instead (the README
compares the two).

Every held-out prediction lands in its group of comparable jobs (catalog.uncertainty.band_group, from the split's
training runs: their stacks, their range of GPU counts); per group, the band that holds 80% of measured /
predicted is the band every prediction carries (bands.uncertainty_of, BAND_RULE), made once per calibration.
"""

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainsim.calibrate.bands import BAND_RULE, HeldOut, coverage, new_source_coverage
from trainsim.calibrate.runs import FitSample, fit_runtime, log_errors
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.uncertainty import GROUPS, Uncertainty, band_group
from trainsim.estimate.result import stack_name_of
from trainsim.pipeline import GraphCache

SCALE_TRAIN_MAX_GPUS = 64
SCALE_TEST_GPUS = (128, 256)
SCHEMES = ("k-fold", "leave-one-source-out", "scale-extrapolation")
WARM_TOLERANCE = 1e-3  # a split's fit from the fit on all runs stops below 0.1% improvement per iteration


@dataclass(frozen=True, slots=True)
class Split:
    scheme: str  # one of SCHEMES
    name: str
    train: list[FitSample]
    test: list[FitSample]


def stack_key(sample: FitSample) -> str:
    """The stack a calibration run ran on: the job's stated stack, else its source (one source, one stack)."""
    return stack_name_of(sample.job) or f"source {sample.source}"


def splits(samples: Sequence[FitSample], folds: int = 5, seed: int = 0) -> list[Split]:
    """Every split the runs allow: k-fold (folds at most the runs), leave-one-source-out where there are two
    sources or more, scale extrapolation where runs lie on both sides."""
    out: list[Split] = []
    k = min(folds, len(samples))
    if k >= 2:
        order = list(range(len(samples)))
        random.Random(seed).shuffle(order)
        for fold in range(k):
            held = set(order[fold::k])
            out.append(Split("k-fold", f"fold {fold + 1} of {k}", [samples[i] for i in order if i not in held],
                             [samples[i] for i in sorted(held)]))
    sources = sorted({s.source for s in samples})
    if len(sources) >= 2:
        for source in sources:
            out.append(Split("leave-one-source-out", f"without {source}", [s for s in samples if s.source != source],
                             [s for s in samples if s.source == source]))
    low, high = SCALE_TEST_GPUS
    train = [s for s in samples if s.job.num_gpus <= SCALE_TRAIN_MAX_GPUS]
    test = [s for s in samples if low <= s.job.num_gpus <= high]
    if train and test:
        out.append(Split("scale-extrapolation", f"<= {SCALE_TRAIN_MAX_GPUS} GPUs -> {low}-{high} GPUs", train, test))
    return out


def held_out(base: Calibration, split: Split, progress: Callable[[], None] | None = None,
             start: Calibration | None = None, tolerance: float | None = None) -> list[HeldOut]:
    """Fit on the split's training runs (from `start`'s parameters, else from the priors), predict its test runs,
    and group each prediction. tolerance: the split's fit's (default: WARM_TOLERANCE from a start, the full
    fit's from the priors)."""
    if start is None:
        fitted = (fit_runtime(base, split.train, progress=progress) if tolerance is None else
                  fit_runtime(base, split.train, progress=progress, tolerance=tolerance))
    else:
        fitted = fit_runtime(base, split.train, progress=progress, start=start,
                             tolerance=WARM_TOLERANCE if tolerance is None else tolerance)
    errors = log_errors(fitted, split.test, GraphCache())
    stacks = {stack_key(s) for s in split.train}
    gpus = [s.job.num_gpus for s in split.train]
    return [HeldOut(split.scheme, split.name, s.run_id, s.source, s.job.num_gpus, float(error),
                    band_group(stack_key(s), s.job.num_gpus, stacks, min(gpus), max(gpus)))
            for s, error in zip(split.test, errors, strict=True)]


def _mape(records: Sequence[HeldOut]) -> float:
    return sum(r.percent_error for r in records) / len(records) if records else math.nan


def _per_source(records: Sequence[HeldOut], value: Callable[[Sequence[HeldOut]], float]) -> dict[str, float]:
    sources = sorted({r.source for r in records})
    return {**{s: value([r for r in records if r.source == s]) for s in sources}, "ALL": value(records)}


def summary(records: Sequence[HeldOut], samples: Sequence[FitSample],
            uncertainty: Uncertainty | None) -> dict[str, object]:
    """Iteration-time MAPE of the held-out runs per scheme and source; the bands `uncertainty` (made from these
    records, bands.uncertainty_of; None: no bands); their coverage.

    coverage_pct: the share of held-out runs inside their group's band, per scheme and group (the bands come
    from these same runs, so over all runs it is near the 80% the rule makes). coverage_new_source_pct: the honest
    figure for a source the bands have not seen: each source's held-out runs against bands from the other
    sources' held-out runs only (bands.new_source_coverage)."""
    out: dict[str, object] = {
        "runs": {scheme: sum(r.scheme == scheme for r in records) for scheme in SCHEMES},
        "mape_pct": {scheme: _per_source([r for r in records if r.scheme == scheme], _mape) for scheme in SCHEMES
                     if any(r.scheme == scheme for r in records)},
    }
    if uncertainty is None:
        return out
    out["band_rule"] = BAND_RULE.name
    out["bands"] = {group: ratios.model_dump() for group, ratios in uncertainty.bands.items()}
    cover: dict[str, float] = {"ALL": coverage(records, uncertainty)}
    cover.update({scheme: coverage([r for r in records if r.scheme == scheme], uncertainty) for scheme in SCHEMES})
    cover.update({group: coverage([r for r in records if r.group == group], uncertainty) for group in GROUPS})
    out["coverage_pct"] = {key: value * 100.0 for key, value in cover.items()}
    out["coverage_new_source_pct"] = new_source_coverage(records, samples)
    return out
