"""The DLRM ground truth normalised to the host's fast speed phase (measure.dlrm_phase), from sets that
scripts/recsys_quiet.py measured with RECSYS_PHASE=1 (every rank timed measure.dlrm_probe's probes around each
iteration):

  python scripts/recsys_phase.py normalise A,B,C [e2e|sharding] [reference|gather] [fast|median]
      # one fast-phase reference over every probed iteration of the sets (per rank count); writes each set's
      # normalised copy <experiment>_<set>-ph.csv / -gph.csv (gather probe) and its traces (the spans scaled
      # by the visit's factor), which every recsys_quiet command (passes, pool, predict, errors,
      # predict-sharding) reads as it reads a raw set. "median": scaled to the probes' median instead of their
      # fast phase (the typical speed, the scale of inputs profiled without a probe): -phm / -gphm.
      # $PHASE_REFERENCE_S: scale to this reference instead (another campaign's, so that two experiments share it)
  python scripts/recsys_phase.py premise A,B,C [e2e|sharding]
      # does the probe track the iteration? per probe: pass-to-pass spread raw against normalised, and the
      # correlation of the probe with the iteration inside a visit and between visits

docs/recommendation.md, fourteenth session (branch phase14r).
"""

import csv
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from recsys_quiet import FIELDS, OUT

from trainsim.measure.dlrm_phase import (
    campaign_fast_reference_s,
    iteration_references_s,
    normalised_iterations_s,
)

SUFFIX = {"reference": "-ph", "gather": "-gph"}
KEYS = {"e2e": ("ranks", "task", "local_batch"), "sharding": ("ranks", "task", "sharder")}


def _load(name: str, experiment: str) -> tuple[dict[tuple[str, ...], dict], dict[tuple[str, ...], dict]]:
    key = KEYS[experiment]
    rows = {tuple(r[k] for k in key): r for r in csv.DictReader((OUT / f"{experiment}_{name}.csv").open())}
    traces = {tuple(str(t[k]) for k in key): t
              for t in map(json.loads, (OUT / f"{experiment}_{name}_traces.jsonl").open())}
    return rows, traces


def _references(trace: dict, probe: str) -> list[float]:
    if "probe_s" not in trace:
        raise SystemExit(f"a trace of {trace['task']} has no probe timings: measure with RECSYS_PHASE=1")
    return iteration_references_s(trace["probe_s"][probe])


def normalise(sets: list[str], experiment: str = "e2e", probe: str = "reference", at: str = "fast") -> None:
    loaded = {name: _load(name, experiment) for name in sets}
    fast: dict[str, float] = {}
    for ranks in sorted({k[0] for _, traces in loaded.values() for k in traces}):
        refs = [_references(t, probe) for _, traces in loaded.values() for k, t in traces.items() if k[0] == ranks]
        fast[ranks] = campaign_fast_reference_s(refs) if at == "fast" else float(np.median(np.concatenate(refs)))
        if "PHASE_REFERENCE_S" in os.environ:  # another campaign's reference (e.g. the e2e sets' for the sharding set)
            print(f"{ranks} ranks: {at}-phase {probe} probe of these sets {fast[ranks] * 1e3:.3f} ms; given "
                  f"{float(os.environ['PHASE_REFERENCE_S']) * 1e3:.3f} ms")
            fast[ranks] = float(os.environ["PHASE_REFERENCE_S"])
        print(f"{ranks} ranks: {at}-phase {probe} probe {fast[ranks] * 1e3:.3f} ms over {', '.join(sets)}")
    for name, (rows, traces) in loaded.items():
        target = f"{name}{SUFFIX[probe]}{'' if at == 'fast' else 'm'}"
        with (OUT / f"{experiment}_{target}.csv").open("w", newline="") as f, \
                (OUT / f"{experiment}_{target}_traces.jsonl").open("w") as out:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for k, row in rows.items():
                t = traces[k]
                refs = _references(t, probe)
                normal = normalised_iterations_s(t["iterations_s"], refs, fast[k[0]])
                scale = fast[k[0]] / float(np.median(refs))
                writer.writerow({**row, "measured_s": float(np.median(normal)), "fastest_s": min(normal)})
                out.write(json.dumps({**{f: v for f, v in t.items() if f != "probe_s"}, **_scaled_spans(t, scale),
                                      "iterations_s": normal, "raw_iterations_s": t["iterations_s"],
                                      "references_s": refs, "fast_reference_s": fast[k[0]], "probe": probe,
                                      "span_scale": scale}) + "\n")
        print(f"{len(rows)} configs of {name} -> {experiment}_{target}.csv")


def _scaled_spans(trace: dict, scale: float) -> dict:
    """The median iteration's spans (start, end) and the spans' median thread CPU times, scaled as the visit's
    iterations were: by the fast-phase reference over the visit's median reference (the spans carry no probe of
    their own: measure.dlrm_rank)."""
    return {"events": [[[name, start * scale, end * scale] for name, start, end in rank] for rank in trace["events"]],
            "cpu_s": [[c * scale for c in rank] for rank in trace["cpu_s"]]}


def _spread(medians: dict[tuple[str, ...], list[float]]) -> tuple[float, float]:
    """Over configs: the geomean |difference| of one visit's median against another's (every pair of visits),
    and the SD of the log medians between visits (pooled over configs)."""
    diffs, devs = [], []
    for values in medians.values():
        logs = np.log(values)
        diffs += [abs(a - b) for a, b in itertools.combinations(logs, 2)]
        devs += list(logs - logs.mean())
    dof = sum(len(v) - 1 for v in medians.values())
    return float(np.exp(np.mean(diffs)) - 1.0), float(np.sqrt(np.sum(np.square(devs)) / dof))


def premise(sets: list[str], experiment: str = "e2e") -> None:
    if len(sets) < 2:
        raise SystemExit(f"premise compares visits: give 2 or more sets, not {sets}")
    loaded = {name: _load(name, experiment)[1] for name in sets}
    common = sorted(set.intersection(*(set(t) for t in loaded.values())))
    probes = sorted(next(iter(loaded[sets[0]].values()))["probe_s"])
    for ranks in sorted({k[0] for k in common}):
        keys = [k for k in common if k[0] == ranks]
        print(f"{experiment}, {ranks} ranks, {len(keys)} configs in {len(sets)} visits ({', '.join(sets)})")
        raw = {k: [float(np.median(loaded[s][k]["iterations_s"])) for s in sets] for k in keys}
        diff, sd = _spread(raw)
        print(f"  {'raw:':<33}pass to pass {diff * 100:5.1f}%, SD of log median between visits "
              f"{sd:.3f}")
        for probe in probes:
            _premise_probe(loaded, sets, keys, probe)


def _premise_probe(loaded: dict[str, dict], sets: list[str], keys: list[tuple[str, ...]], probe: str) -> None:
    refs = {(s, k): _references(loaded[s][k], probe) for s in sets for k in keys}
    fast = campaign_fast_reference_s(list(refs.values()))
    normal = {k: [float(np.median(normalised_iterations_s(loaded[s][k]["iterations_s"], refs[(s, k)], fast)))
                  for s in sets] for k in keys}
    own = {k: [_own_rank_median(loaded[s][k], probe, fast) for s in sets] for k in keys}
    for label, medians in ((f"{probe} (slowest rank's probe)", normal), (f"{probe} (each rank's own)", own)):
        diff, sd = _spread(medians)
        print(f"  {label:<33}pass to pass {diff * 100:5.1f}%, SD of log median between visits {sd:.3f}")
    # inside a visit: log iteration against log reference, each centred on its config-visit mean
    it_dev, ref_dev = [], []
    for s in sets:
        for k in keys:
            its, rs = np.log(loaded[s][k]["iterations_s"]), np.log(refs[(s, k)])
            it_dev += list(its - its.mean())
            ref_dev += list(rs - rs.mean())
    slope_in = float(np.polyfit(ref_dev, it_dev, 1)[0])
    # between visits: a config's log median iteration against its log median reference, centred per config
    it_between, ref_between = [], []
    for k in keys:
        its = np.log([float(np.median(loaded[s][k]["iterations_s"])) for s in sets])
        rs = np.log([float(np.median(refs[(s, k)])) for s in sets])
        it_between += list(its - its.mean())
        ref_between += list(rs - rs.mean())
    slope_between = float(np.polyfit(ref_between, it_between, 1)[0])
    all_refs = np.concatenate(list(refs.values()))
    print(f"    {probe}: fast {fast * 1e3:.3f} ms, median {np.median(all_refs) * 1e3:.3f} ms, p95 "
          f"{np.percentile(all_refs, 95) * 1e3:.3f} ms; corr(log iteration, log probe) inside a visit "
          f"{np.corrcoef(it_dev, ref_dev)[0, 1]:.2f} (slope {slope_in:.2f}), between visits "
          f"{np.corrcoef(it_between, ref_between)[0, 1]:.2f} (slope {slope_between:.2f})")


def _own_rank_median(trace: dict, probe: str, fast: float) -> float:
    """The median over iterations of the slowest rank after each rank's time is normalised by its own probe."""
    per_rank = [normalised_iterations_s(its, [(a + b) / 2 for a, b in pairs], fast)
                for its, pairs in zip(trace["rank_iterations_s"], trace["probe_s"][probe], strict=True)]
    return float(np.median([max(values) for values in zip(*per_rank, strict=True)]))


if __name__ == "__main__":
    command, names = sys.argv[1], sys.argv[2].split(",")
    experiment_arg = sys.argv[3] if len(sys.argv) > 3 else "e2e"
    if command == "normalise":
        normalise(names, experiment_arg, sys.argv[4] if len(sys.argv) > 4 else "reference",
                  sys.argv[5] if len(sys.argv) > 5 else "fast")
    elif command == "premise":
        premise(names, experiment_arg)
    else:
        raise SystemExit(f"command {command!r}: one of normalise, premise")
