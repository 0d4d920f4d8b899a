"""Copy the calibration measurements from the project's shared folder into the package.

The package ships its own copy (src/trainsim/catalog/data/measurements/) so that `trainsim calibrate`, the
validation tests and a plain clone work with nothing beside the repository; ../shared/data/calibration stays the
source it is copied from. Rerun after the shared data changes:

    python scripts/sync_calibration_data.py [--source DIR]

tests/unit/catalog/test_measurements.py checks that the copy equals the source wherever the source is present.
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "data" / "calibration"
TARGET = REPO / "src" / "trainsim" / "catalog" / "data" / "measurements"
# What the package ships: the measured runs, the microbenchmarks and the README that describes their sources.
FILES = ("README.md", "runs.csv", "runs_multinode.csv", "gemm.csv", "collectives.csv")


def sync(source: Path, target: Path = TARGET) -> list[str]:
    """Copy FILES from `source` to `target` (each through a temporary file and a rename); the names changed."""
    missing = [name for name in FILES if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"error: {source} lacks {', '.join(missing)}")
    target.mkdir(parents=True, exist_ok=True)
    changed = []
    for name in FILES:
        data = (source / name).read_bytes()
        destination = target / name
        if destination.is_file() and destination.read_bytes() == data:
            continue
        partial = destination.with_name(f".{name}.partial")
        partial.write_bytes(data)
        partial.chmod(0o644)
        partial.replace(destination)
        changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy the calibration measurements into the package.")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="folder to copy from")
    args = parser.parse_args(argv)
    changed = sync(args.source)
    print(f"{TARGET}: " + (f"updated {', '.join(changed)}" if changed else "already up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
