"""Collective-time MAPE on every row of collectives.csv, per collective, scope and size band, with the committed
fit (or --calibration FILE). The README's "Collectives" table comes from this script:

    python scripts/collectives_mape.py [--data ../shared/data/calibration] [--calibration fitted.yaml]

Scopes: single node (one server's NVLink), NVL72 rack (one NVLink domain of several trays), multi-node (across
NVLink domains, over the NICs). Every row is predicted: the script fails if collectives.csv has a row it skips.
"""

import argparse
from pathlib import Path

from trainsim.calibrate.fit import find_calibration_dir
from trainsim.calibrate.microbenchmarks import SIZE_BANDS, collective_mape, collective_samples
from trainsim.catalog.calibration import FITTED_PATH, load_calibration

SCOPES = ("single node", "NVL72 rack", "multi-node", "all")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--calibration", type=Path, default=FITTED_PATH)
    args = parser.parse_args()
    data = args.data or find_calibration_dir()
    csv_path = data / "collectives.csv"
    samples = collective_samples(csv_path)
    with csv_path.open() as handle:
        rows = sum(1 for _ in handle) - 1
    if len(samples) != rows:
        raise SystemExit(f"{rows - len(samples)} of {rows} rows of {csv_path} were not predicted")
    table = collective_mape(samples, load_calibration(args.calibration))
    bands = [name for name, _, _ in SIZE_BANDS] + ["all"]
    print("| collective | scope | " + " | ".join(bands) + " |")
    print("|---|---|" + "---:|" * len(bands))
    for collective in COLLECTIVES:
        for scope in SCOPES:
            if (collective, scope, "all") not in table:
                continue
            cells = [f"{table[(collective, scope, band)][1]:.1f}% ({table[(collective, scope, band)][0]})"
                     if (collective, scope, band) in table else "" for band in bands]
            print(f"| {collective} | {scope} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
