"""How consistent the vocabulary head's stages are in a database collected with `trainsim stages collect
--phase-normalise`, raw (stage_phase) against phase-normalised (stage_times): the head's increment
latency [a, H) - latency [a, H - 1) over every start a (H: the unit count), and a four-number additive fit
(constant + blocks x b + embedding x e + head x h, least squares on relative error over every stage) with its
error per stage group.

    python scripts/phase_head_check.py --db data/stages/cpu/stages_cpu_deep_phase.db \
        --model data/stages/models/gpt-deep.yaml

Reads the database only (nothing is measured).
"""

import argparse
import statistics
from pathlib import Path

import numpy as np

from trainsim.catalog import load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import StageDatabase, model_key
from trainsim.strategy.stage_plan import num_units


def spread_ms(values: list[float]) -> str:
    return (f"median {1e3 * statistics.median(values):.1f} ms, sd {1e3 * statistics.pstdev(values):.1f}, "
            f"min {1e3 * min(values):.1f}, max {1e3 * max(values):.1f}")


def group(first: int, end: int, units: int) -> str:
    if end == units:
        return "whole" if first == 0 else "head"
    return "embedding" if first == 0 else "interior"


def additive(latency: dict[tuple[int, int], float], units: int) -> str:
    stages = sorted(latency)
    y = np.array([latency[s] for s in stages])
    x = np.array([[1.0, min(b, units - 1) - max(a, 1), a == 0, b == units] for a, b in stages], dtype=float)
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    error = (x @ coef - y) / y
    groups = [group(a, b, units) for a, b in stages]
    by_group = {g: 100 * float(np.mean(np.abs(error[[i for i, h in enumerate(groups) if h == g]])))
                for g in ("interior", "embedding", "head")}
    alone = 100 * float(error[stages.index((units - 1, units))]) if (units - 1, units) in latency else float("nan")
    return (f"head {1e3 * coef[3]:.2f} ms, block {1e3 * coef[1]:.2f} ms; fit error all "
            f"{100 * float(np.mean(np.abs(error))):.1f}%, " + ", ".join(f"{g} {v:.1f}%" for g, v in by_group.items())
            + f"; head alone: fit - measured {alone:+.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description="The head stages' consistency, raw and phase-normalised.")
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    spec = load_model(args.model)
    if not isinstance(spec, TransformerSpec):
        raise SystemExit(f"model: {spec.name} is not a transformer")
    key, units = model_key(spec), num_units(spec)
    db = StageDatabase(args.db)
    rows = db.phase_rows(key, args.micro_batch, args.seq_len, 1)
    for mesh in sorted({row.key[2:] for row in rows}):
        mine = {(row.key[0], row.key[1]): row for row in rows if row.key[2:] == mesh}
        normalised = {}
        for stage in mine:
            found = db.conn.execute(
                "SELECT latency_s FROM stage_times WHERE model=? AND micro_batch=? AND seq_len=? AND threads=1 AND "
                "first=? AND end_unit=? AND nodes=? AND devices_per_node=? AND tp=? AND dp=? AND sp=?",
                (key, args.micro_batch, args.seq_len, *stage, *mesh)).fetchone()
            normalised[stage] = found[0]
        raw = {stage: row.raw_latency_s for stage, row in mine.items()}
        print(f"mesh (nodes, devices, tp, dp, sp) {mesh}: {len(mine)} stages")
        for name, latency in (("raw", raw), ("normalised", normalised)):
            starts = [a for a, b in latency if b == units and (a, units - 1) in latency]
            increments = [latency[(a, units)] - latency[(a, units - 1)] for a in starts]
            print(f"  {name:10s} head increment over {len(starts)} starts: {spread_ms(increments)}")
            print(f"  {name:10s} additive fit: {additive(latency, units)}")


if __name__ == "__main__":
    main()
