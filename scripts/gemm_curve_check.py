"""The package's fitted GEMM curve against the H100 bf16 GEMM microbenchmarks of gemm.csv (the XLA per-shape
table), per band of GEMM work: what the run-level fit prices a GEMM at, next to what the table measured.

    python scripts/gemm_curve_check.py [--fitted PATH]

The curve is cost.compute.matmul_efficiency with the in-training factor applied (as the engines price a GEMM of
a training step); the table times GEMMs alone, so a ratio near the training factor is the curve's shape agreeing.
"""

import argparse
import csv
import itertools
import statistics
from pathlib import Path

from trainsim.catalog import load_device
from trainsim.catalog.calibration import FITTED_PATH, MEASUREMENTS_DIR, load_calibration
from trainsim.cost.compute import matmul_efficiency

DEVICE = "h100-sxm5-80gb"
BANDS_FLOP = (1e9, 3e9, 1e10, 3e10, 1e11, 3e11, 1e12)


def h100_bf16_rows() -> list[tuple[float, float, float]]:
    """(work in FLOP, smallest dimension, measured TFLOP/s) of every H100 bf16 row of gemm.csv."""
    rows = []
    with (MEASUREMENTS_DIR / "gemm.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["gpu"].startswith("H100") and row["dtype"].startswith("bf16"):
                batch, m, n, k = (int(float(row[key])) for key in ("batch", "M", "N", "K"))
                rows.append((2.0 * batch * m * n * k, float(min(m, n, k)), float(row["tflops"])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="The fitted GEMM curve against the H100 GEMM table of gemm.csv")
    parser.add_argument("--fitted", type=Path, default=FITTED_PATH)
    args = parser.parse_args()
    cal = load_calibration(args.fitted)
    device = load_device(DEVICE)
    peak = device.peak_flops_per_s["bf16"]
    max_eff = cal.max_efficiency(DEVICE, "bf16")
    factor = cal.training_factor(DEVICE)
    rows = h100_bf16_rows()
    print(f"{args.fitted}: max efficiency {max_eff:.3f}, in-training factor {factor:.3f}")
    print("work band (FLOP)     rows  measured TFLOP/s  curve TFLOP/s  measured / curve")
    for low, high in itertools.pairwise(BANDS_FLOP):
        band = [r for r in rows if low <= r[0] < high]
        if not band:
            continue
        measured = statistics.median(r[2] for r in band)
        curve = statistics.median(
            matmul_efficiency(work, peak, max_eff, cal, factor, min_dim) * peak / 1e12 for work, min_dim, _ in band)
        print(f"{low:8.0e}-{high:8.0e}  {len(band):5d}  {measured:16.0f}  {curve:13.0f}  {measured / curve:16.2f}")


if __name__ == "__main__":
    main()
