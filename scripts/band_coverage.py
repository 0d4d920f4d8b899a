"""Honest coverage of the uncertainty bands, per source and rule, from stored held-out predictions.

The held-out predictions come from `trainsim calibrate --cross-validate --held-out HELD.csv` (or any calibrate that
makes bands); this script refits nothing, so it runs in seconds. For every source, the bands are made without
that source's held-out runs and its runs are checked against them (calibrate.bands.new_source_coverage), under
each rule:
- every calibrate.bands.BandRule: symmetric or 10%-90% quantiles, every source or every run counted once (the rule
  in use: symmetric, every source once; the rule before: quantiles, every run once);
- quantiles, every source once, with the unknown-stack groups' quantiles from the leave-one-source-out
  predictions only;
- the widest of the sources' own 80% bands, per group.

    python scripts/band_coverage.py --runs runs.csv --runs runs_multinode.csv --held-out HELD.csv [--markdown]
"""

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from trainsim.calibrate.bands import (
    BAND_RULE,
    BAND_SHAPES,
    BAND_WEIGHTS,
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


def _loso_unknown(records: Sequence[HeldOut]) -> list[HeldOut]:
    return [r for r in records if r.group.startswith("known-stack") or r.scheme == "leave-one-source-out"]


def envelope(records: Sequence[HeldOut], samples: Sequence[FitSample]) -> Uncertainty | None:
    """Per group, the widest of the sources' own 80% bands (the lowest 10% and the highest 90% quantile of any
    source with 5 held-out runs or more in the group): a new source is covered as well as the worst one seen."""
    base = uncertainty_of(records, samples, rule=BandRule("sources", "quantiles"))
    if base is None:
        return None
    bands = dict(base.bands)
    for group in GROUPS:
        own = [r for r in records if r.group == group]
        per_source = [band_ratios_of(mine, "own", PREVIOUS_RULE) for source in {r.source for r in own}
                      if len(mine := [r for r in own if r.source == source]) >= 5]
        if len(per_source) >= 2:
            bands[group] = BandRatios(low_ratio=min(b.low_ratio for b in per_source),
                                      high_ratio=max(b.high_ratio for b in per_source), residuals=len(own))
    return base.model_copy(update={"bands": bands})


def rules(samples: Sequence[FitSample]) -> dict[str, Build]:
    def made_by(rule: BandRule) -> Build:
        return lambda records: uncertainty_of(records, samples, rule=rule)

    out = {f"{rule.name}{' (in use)' if rule == BAND_RULE else ''}"
           f"{' (before)' if rule == PREVIOUS_RULE else ''}": made_by(rule)
           for rule in (BandRule(weight, shape) for shape in BAND_SHAPES for weight in BAND_WEIGHTS)}
    out["quantiles, every source once; unknown-stack from leave-one-source-out only"] = (
        lambda records: uncertainty_of(_loso_unknown(records), samples, rule=BandRule("sources", "quantiles")))
    out["widest of the sources' own bands"] = lambda records: envelope(records, samples)
    return out


def honest(records: Sequence[HeldOut], build: Build) -> dict[str, tuple[int, int]]:
    """(inside, runs) per source and per group: each source's runs against bands built without it."""
    tally: dict[str, tuple[int, int]] = {}
    for source in sorted({r.source for r in records}):
        bands = build([r for r in records if r.source != source])
        if bands is None:
            continue
        for r in (r for r in records if r.source == source):
            inside = int(covered(r, bands))
            for key in (source, r.group, "ALL"):
                hits, runs = tally.get(key, (0, 0))
                tally[key] = (hits + inside, runs + 1)
    return tally


def _pct(pair: tuple[int, int] | None) -> str:
    return "" if pair is None or pair[1] == 0 else f"{100.0 * pair[0] / pair[1]:.1f}%"


def table(records: Sequence[HeldOut], samples: Sequence[FitSample]) -> list[str]:
    sources = sorted({r.source for r in records})
    head = ["rule", *sources, "mean of sources", "all runs", *GROUPS]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for name, build in rules(samples).items():
        tally = honest(records, build)
        per_source = [100.0 * tally[s][0] / tally[s][1] for s in sources if s in tally]
        mean = f"{sum(per_source) / len(per_source):.1f}%" if per_source else ""
        cells = [name, *(_pct(tally.get(s)) for s in sources), mean, _pct(tally.get("ALL")),
                 *(_pct(tally.get(g)) for g in GROUPS)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


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
    print("\nhonest coverage (each source against bands made without it):\n")
    print("\n".join(table(records, samples)))
    print("\nbands from every held-out prediction (low-high ratio measured / predicted, predictions, basis):\n")
    print("\n".join(bands_table(records, samples)))


if __name__ == "__main__":
    main()
