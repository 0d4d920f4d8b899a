"""Does the reference probe (measure/phase.py) co-vary with a Table IV cell's step time? The premise of
`scripts/proteus_table4.py --phase-normalise`, checked on two cells of 2 gloo ranks (one S1, one S2): each visit
measures both with `trainsim measure --tree --phase-normalise` (the probe just before and after every timed step on
every rank); visits minutes apart, each under the timing lock:

    for v in 1 2 3 4 5; do
        flock /tmp/trainsim-timing.lock python scripts/proteus_phase_premise.py --visit $v --out OUT; sleep 120
    done
    python scripts/proteus_phase_premise.py --analyse --out OUT

The analysis: per cell, the busiest rank's CPU seconds per step of each visit, raw and phase-normalised (one
fast-phase probe over every probe timing of the check), their pass-to-pass spread (mean absolute deviation from
the visits' median, and (max - min) / median), and the correlation of log step CPU with log probe (the mean of the
two around the step) over every step of every rank and visit.
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proteus_table4 import measure, pearson, slope

from trainsim.measure.phase import busiest_phase_normalised_s, fast_reference_s, pair_means_s

CELLS = (("resnet50-small", "s1"), ("inception-v3-small", "s2"))
RANKS = 2


def visit(out: Path, number: int, iterations: int, warmup: int) -> None:
    path = out / "premise.json"
    record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for model, strategy in CELLS:
        load = Path("/proc/loadavg").read_text().split()[:3]
        began = time.strftime("%H:%M:%S", time.gmtime())
        cell = measure(model, strategy, RANKS, out, iterations, warmup, phase_normalise=True,
                       run_id=f"{model}-{strategy}-g{RANKS}-visit{number}")
        record.setdefault(f"{model}/{strategy}", {})[str(number)] = {"began_utc": began, "load_before": load, **cell}
        print(f"visit {number} {model} {strategy}: {cell.get('cpu_s')} s CPU per step, load {load}", flush=True)
        path.write_text(json.dumps(record, indent=1) + "\n")


def spread(values: list[float]) -> tuple[float, float]:
    """(mean absolute deviation from the median, (max - min) / median), as fractions."""
    mid = statistics.median(values)
    return statistics.fmean(abs(v - mid) for v in values) / mid, (max(values) - min(values)) / mid


def analyse(out: Path, reference: str = "mean") -> dict[str, Any]:
    record = json.loads((out / "premise.json").read_text())
    probes = [t for cell in record.values() for run in cell.values() for pairs in
              run["phase"]["phase_probe_s_per_rank"] for pair in pairs for t in pair]
    fast_s = fast_reference_s(probes)
    result: dict[str, Any] = {"fast_probe_s": fast_s, "probe_timings": len(probes), "reference": reference,
                              "cells": {}}
    for key, cell in record.items():
        raw, normalised, log_step, log_probe, visit_probe = [], [], [], [], []
        for run in cell.values():
            steps, pairs = run["phase"]["step_cpu_s_per_rank"], run["phase"]["phase_probe_s_per_rank"]
            raw.append(max(statistics.fmean(s) for s in steps))
            normalised.append(busiest_phase_normalised_s(steps, pairs, fast_s, reference=reference))
            means = [pair_means_s(p, reference) for p in pairs]
            visit_probe.append(statistics.fmean(m for rank in means for m in rank))
            for rank_steps, rank_means in zip(steps, means, strict=True):
                log_step += [math.log(s) for s in rank_steps]
                log_probe += [math.log(m) for m in rank_means]
        result["cells"][key] = {
            "visits": [{"began_utc": r["began_utc"], "load_before": r["load_before"]} for r in cell.values()],
            "raw_s": raw, "normalised_s": normalised, "mean_probe_s": visit_probe,
            "raw_spread": spread(raw), "normalised_spread": spread(normalised),
            "corr_log_step_log_probe_steps": pearson(log_step, log_probe),
            "slope_log_step_log_probe_steps": slope(log_probe, log_step),
            "corr_log_visit_log_probe_visits": pearson([math.log(v) for v in raw],
                                                       [math.log(p) for p in visit_probe])}
    (out / f"premise-analysis-{reference}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--visit", type=int, help="measure both cells once (a visit number)")
    parser.add_argument("--analyse", action="store_true")
    parser.add_argument("--reference", choices=("mean", "before"), default="mean", help="a step's probe: the mean "
                        "of the two around it, or the one before it (measure.phase.pair_means_s)")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if args.visit is not None:
        visit(args.out, args.visit, args.iterations, args.warmup)
    if args.analyse:
        print(json.dumps(analyse(args.out, args.reference), indent=1))


if __name__ == "__main__":
    main()
