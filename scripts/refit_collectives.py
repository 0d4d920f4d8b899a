"""Refit the package fit's collective parameters on collectives.csv, keeping every run-level parameter.

    python scripts/refit_collectives.py [--fit PATH]

Rewrites `comm`, `comm_by_generation`, `comm_network` and `comm_network_by_fabric` of the fit (default: the
package's fitted.yaml) with calibrate.microbenchmarks.fit_collectives, the same code `trainsim calibrate` runs,
and leaves the rest as it was. For a change of the collective model whose effect on the runs is to be seen
before a full `trainsim calibrate` refits the run-level parameters (which were fitted with the old one).
"""

import argparse
import datetime
from pathlib import Path

from trainsim.calibrate.fit import write_calibration
from trainsim.calibrate.microbenchmarks import fit_collectives
from trainsim.catalog.calibration import FITTED_PATH, MEASUREMENTS_DIR, load_calibration


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fit", type=Path, default=FITTED_PATH)
    args = parser.parse_args()
    current = load_calibration(args.fit)
    comm = fit_collectives(MEASUREMENTS_DIR / "collectives.csv")
    source = current.source.split(";")[0] + f"; collectives refitted on {datetime.date.today().isoformat()}"
    updated = current.model_copy(update={"comm": comm.comm, "comm_by_generation": comm.comm_by_generation,
                                         "comm_network": comm.comm_network,
                                         "comm_network_by_fabric": comm.comm_network_by_fabric, "source": source})
    write_calibration(updated, args.fit, writer="scripts/refit_collectives.py")
    print(f"wrote {args.fit}: network fitted for {sorted(comm.comm_network_by_fabric)}; any other fabric "
          f"{comm.comm_network.latency_s * 1e6:.1f} us a step beyond NCCL's own")


if __name__ == "__main__":
    main()
