"""Sigmoid (Lin et al. Eq. 2-4) against alpha-beta (Eq. 1) collective curves: fit both on the even-indexed sizes
of every curve, score on the odd-indexed ones (MAPE), per collective and source: shared/data/calibration/
collectives.csv (nccl-tests of vTrain's A100/V100 nodes; XLA's default perf tables) and the local gloo sweep
(data/recsys/cpu/collectives.db, scripts/recsys_gloo_sweep.py; $COLLECTIVES_DB names another sweep, e.g.
collectives_quiet.db). Usage: python scripts/recsys_collectives.py"""

import csv
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from trainsim.comm.sigmoid import fit_alpha_beta, fit_sigmoid
from trainsim.profile.database import ProfileDB

CSV = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "calibration" / "collectives.csv"


def curves() -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """(source, collective, curve id) -> sorted (bytes, seconds)."""
    out: dict[tuple[str, str, str], dict[float, float]] = defaultdict(dict)
    path = CSV if CSV.exists() else Path("/work/shared/data/calibration/collectives.csv")
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["collective"] not in ("all-reduce", "all-to-all") or not r["time_us"]:
                continue
            source = "nccl-tests (vTrain A100/V100)" if r["system"].startswith("vTrain") else \
                "XLA perf tables" if r["system"].startswith("XLA") else r["system"]
            key = (source, r["collective"], "|".join((r["system"], r["num_gpus"], r["algorithm_or_variant"],
                                                      r["dtype"])))
            out[key][float(r["message_size_bytes"])] = float(r["time_us"]) * 1e-6
    with ProfileDB.open_read_only(Path(os.environ.get("COLLECTIVES_DB", "data/recsys/cpu/collectives.db"))) as db:
        for row in db.collective_rows():
            out[("local gloo (this CPU)", row.collective, f"gloo x{row.world_size}")][float(row.message_bytes)] = \
                row.stats.median_s
    return {k: sorted(v.items()) for k, v in out.items() if len(v) >= 8}


def main() -> None:
    scores: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for (source, collective, _), points in curves().items():
        m = np.array([p[0] for p in points])
        t = np.array([p[1] for p in points])
        if np.any(t <= 0):
            continue
        train, test = slice(0, None, 2), slice(1, None, 2)
        sig = fit_sigmoid(m[train].tolist(), t[train].tolist())
        ab = fit_alpha_beta(m[train].tolist(), t[train].tolist())

        measured = t[test]
        errors = []
        for model in (sig, ab):
            predicted = np.array([model.time_s(v) for v in m[test]])
            errors.append(float(np.mean(np.abs(predicted - measured) / measured)))
        scores[(source, collective)].append((errors[0], errors[1]))
    print(f"{'source':<32} {'collective':<11} {'curves':>6} {'sigmoid MAPE':>13} {'alpha-beta MAPE':>16}")
    for (source, collective), values in sorted(scores.items()):
        sig, ab = np.mean([v[0] for v in values]), np.mean([v[1] for v in values])
        print(f"{source:<32} {collective:<11} {len(values):>6} {sig * 100:12.2f}% {ab * 100:15.2f}%")


if __name__ == "__main__":
    main()
