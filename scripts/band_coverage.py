"""Honest coverage and width of the uncertainty bands, per source, group and rule, from stored held-out predictions.

The held-out predictions come from `trainsim calibrate --cross-validate --held-out HELD.csv` (or any calibrate that
makes bands); this script refits nothing, so it runs in seconds. For every source, the bands are made without
that source's held-out runs and its runs are checked against them (calibrate.bands.new_source_coverage), under
each rule:
- every calibrate.bands.BandRule shape (conformal, symmetric, 10%-90% quantiles) and weight (every run or every
  source once), pooling a group with too few residuals into all of them; and the conformal and symmetric shapes,
  every run once, pooling into the parent group first (the rule in use: conformal, every run, parent group);
- quantiles, every source once, with the unknown-stack groups' quantiles from the leave-one-source-out
  predictions only;
- the widest of the sources' own 80% bands, per group;
- a random-effects prediction interval for the unknown-stack groups (random_effects; the other groups as the rule
  in use): measured, not in use (README, "Held-out runs").
The second table gives each rule's median band width (high - low, in percent of the prediction) over the same
held-out predictions, each against the band made without its source: a band that covers by being wide is no win.

    python scripts/band_coverage.py --runs runs.csv --runs runs_multinode.csv --held-out HELD.csv
"""

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats

from trainsim.calibrate.bands import (
    BAND_RULE,
    BAND_SHAPES,
    BAND_WEIGHTS,
    COVERAGE,
    PREVIOUS_RULE,
    BandRule,
    HeldOut,
    band_ratios_of,
    covered,
    read_held_out,
    uncertainty_of,
)
from trainsim.calibrate.fit import default_runs_files, read_samples
from trainsim.calibrate.runs import FitSample
from trainsim.catalog.uncertainty import GROUPS, BandRatios, Uncertainty

Build = Callable[[Sequence[HeldOut]], Uncertainty | None]
FIRST_RULE = BandRule("runs", "quantiles", "flat")  # the first bands' rule


def _loso_unknown(records: Sequence[HeldOut]) -> list[HeldOut]:
    return [r for r in records if r.group.startswith("known-stack") or r.scheme == "leave-one-source-out"]


def envelope(records: Sequence[HeldOut], samples: Sequence[FitSample]) -> Uncertainty | None:
    """Per group, the widest of the sources' own 80% bands (the lowest 10% and the highest 90% quantile of any
    source with 5 held-out runs or more in the group): a new source is covered as well as the worst one seen."""
    base = uncertainty_of(records, samples, rule=BandRule("sources", "quantiles", "flat"))
    if base is None:
        return None
    bands = dict(base.bands)
    for group in GROUPS:
        own = [r for r in records if r.group == group]
        per_source = [band_ratios_of(mine, "own", FIRST_RULE) for source in {r.source for r in own}
                      if len(mine := [r for r in own if r.source == source]) >= 5]
        if len(per_source) >= 2:
            bands[group] = BandRatios(low_ratio=min(b.low_ratio for b in per_source),
                                      high_ratio=max(b.high_ratio for b in per_source), residuals=len(own))
    return base.model_copy(update={"bands": bands})


def random_effects_interval(records: Sequence[HeldOut]) -> tuple[float, float] | None:
    """(low, high) of log(predicted / measured) for a run of a new source: a one-way random-effects model (a
    source's bias, then its runs' scatter), tau^2 by DerSimonian & Laird (1986), and the prediction interval for a
    new study of Higgins, Thompson & Spiegelhalter (2009, "A re-evaluation of random-effects meta-analysis"):
    mu +- t(k - 2) sqrt(tau^2 + se(mu)^2), here with the within-source variance added (a run, not a source's
    mean). None with fewer than 3 sources or no within-source scatter."""
    sources = sorted({r.source for r in records})
    groups = [np.array([r.log_error for r in records if r.source == s]) for s in sources]
    scatter_dof = sum(len(g) - 1 for g in groups)
    if len(groups) < 3 or scatter_dof == 0:
        return None
    within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / scatter_dof
    if within == 0.0:
        return None
    means = np.array([g.mean() for g in groups])
    weights = np.array([len(g) / within for g in groups])
    fixed = float((weights * means).sum() / weights.sum())
    q = float((weights * (means - fixed) ** 2).sum())
    tau2 = max(0.0, (q - (len(groups) - 1)) / float(weights.sum() - (weights ** 2).sum() / weights.sum()))
    random_weights = 1.0 / (1.0 / weights + tau2)
    mu = float((random_weights * means).sum() / random_weights.sum())
    t_quantile = float(stats.t.ppf(0.5 + COVERAGE / 2, len(groups) - 2))
    half = t_quantile * math.sqrt(tau2 + 1.0 / float(random_weights.sum()) + within)
    return mu - half, mu + half


def random_effects(records: Sequence[HeldOut], samples: Sequence[FitSample]) -> Uncertainty | None:
    """The rule in use, but the unknown-stack groups from random_effects_interval over every leave-one-source-out
    prediction (too few sources: the rule in use's band)."""
    base = uncertainty_of(records, samples)
    interval = random_effects_interval([r for r in records if r.scheme == "leave-one-source-out"])
    if base is None or interval is None:
        return base
    low, high = interval  # of log(predicted / measured): the ratio measured / predicted is exp(-that)
    loso = sum(r.scheme == "leave-one-source-out" for r in records)
    band = BandRatios(low_ratio=math.exp(-high), high_ratio=math.exp(-low), residuals=loso, basis="pooled")
    return base.model_copy(update={"bands": {**base.bands, **{g: band for g in GROUPS if g.startswith("unknown")}}})


def _label(rule: BandRule) -> str:
    marks = {BAND_RULE: " (in use)", PREVIOUS_RULE: " (before)", FIRST_RULE: " (first)"}
    return rule.name + marks.get(rule, "")


def rules(samples: Sequence[FitSample]) -> dict[str, Build]:
    def made_by(rule: BandRule) -> Build:
        return lambda records: uncertainty_of(records, samples, rule=rule)

    every = [BandRule(weight, shape, "flat") for shape in BAND_SHAPES for weight in BAND_WEIGHTS]
    every += [BandRule("runs", shape, "parent") for shape in ("symmetric", "conformal")]
    out = {_label(rule): made_by(rule) for rule in every}
    out["quantiles, every source once; unknown-stack from leave-one-source-out only"] = (
        lambda records: uncertainty_of(_loso_unknown(records), samples, rule=BandRule("sources", "quantiles", "flat")))
    out["widest of the sources' own bands"] = lambda records: envelope(records, samples)
    out["unknown stack: random-effects prediction interval (not in use)"] = (
        lambda records: random_effects(records, samples))
    return out


@dataclass
class Tally:
    inside: int = 0
    widths: list[float] = field(default_factory=list)  # high - low, in percent of the prediction

    def pct(self) -> str:
        return f"{100.0 * self.inside / len(self.widths):.1f}%" if self.widths else ""

    def median_width(self) -> str:
        return f"{statistics.median(self.widths):.1f}%" if self.widths else ""


def honest(records: Sequence[HeldOut], build: Build) -> dict[str, Tally]:
    """Per source, per group and over all: each source's runs against bands built without it."""
    tally: dict[str, Tally] = {}
    for source in sorted({r.source for r in records}):
        bands = build([r for r in records if r.source != source])
        if bands is None:
            continue
        for r in (r for r in records if r.source == source):
            low, high = bands.band_ratios(r.group)
            inside, width_pct = int(covered(r, bands)), (high - low) * 100.0
            for key in (source, r.group, "ALL"):
                mine = tally.setdefault(key, Tally())
                mine.inside += inside
                mine.widths.append(width_pct)
    return tally


def table(records: Sequence[HeldOut], samples: Sequence[FitSample]) -> tuple[list[str], list[str]]:
    """(coverage, median width) tables, a row per rule."""
    sources = sorted({r.source for r in records})
    head = ["rule", *sources, "mean of sources", "all runs", *GROUPS]
    cover = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    width = ["| rule | all runs | " + " | ".join(GROUPS) + " |", "|---" + "|---:" * (len(GROUPS) + 1) + "|"]
    empty = Tally()
    for name, build in rules(samples).items():
        tally = honest(records, build)
        per_source = [100.0 * tally[s].inside / len(tally[s].widths) for s in sources if s in tally]
        mean = f"{sum(per_source) / len(per_source):.1f}%" if per_source else ""
        cells = [name, *(tally.get(s, empty).pct() for s in sources), mean, tally.get("ALL", empty).pct(),
                 *(tally.get(g, empty).pct() for g in GROUPS)]
        cover.append("| " + " | ".join(cells) + " |")
        widths = [tally.get(key, empty).median_width() for key in ("ALL", *GROUPS)]
        width.append(f"| {name} | " + " | ".join(widths) + " |")
    return cover, width


def bands_table(records: Sequence[HeldOut], samples: Sequence[FitSample]) -> list[str]:
    lines = ["| rule | " + " | ".join(GROUPS) + " |", "|---" + "|---:" * len(GROUPS) + "|"]
    for name, build in rules(samples).items():
        bands = build(records)
        if bands is None:
            continue
        cells = [f"{b.low_ratio:.3f}-{b.high_ratio:.3f} ({b.residuals}, {b.basis})"
                 for b in (bands.bands[g] for g in GROUPS)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, action="append", help="the runs the cross-validation used "
                        "(default: the package's runs.csv and runs_multinode.csv)")
    parser.add_argument("--held-out", type=Path, required=True, help="held-out predictions (calibrate --held-out)")
    args = parser.parse_args()
    samples = read_samples(args.runs or default_runs_files())
    records = read_held_out(args.held_out)
    print(f"{len(records)} held-out predictions of {len({r.run_id for r in records})} runs, "
          f"{len({r.source for r in records})} sources")
    cover, width = table(records, samples)
    print("\nhonest coverage (each source against bands made without it):\n")
    print("\n".join(cover))
    print("\nmedian band width, high - low in percent of the prediction (the same bands):\n")
    print("\n".join(width))
    print("\nbands from every held-out prediction (low-high ratio measured / predicted, predictions, basis):\n")
    print("\n".join(bands_table(records, samples)))


if __name__ == "__main__":
    main()
