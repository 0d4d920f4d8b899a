"""The measurements the package ships (catalog/data/measurements) are the project's shared/data/calibration, copied
by scripts/sync_calibration_data.py, and the fit reads them with nothing beside the repository."""

import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from conftest import module_from_file
from trainsim.calibrate.fit import default_runs_files, find_calibration_dir
from trainsim.catalog.calibration import DEFAULT_RUNS_FILES, MEASUREMENTS_DIR

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared" / "data" / "calibration"


def _sync_script() -> ModuleType:
    module = module_from_file("scripts/sync_calibration_data.py")
    return module


def test_shipped_copy_equals_the_shared_data() -> None:
    if not SHARED.is_dir():
        pytest.skip("../shared/data/calibration is not beside this checkout")
    for name in _sync_script().FILES:
        assert (MEASUREMENTS_DIR / name).read_bytes() == (SHARED / name).read_bytes(), (
            f"{name} differs from {SHARED / name}: run python scripts/sync_calibration_data.py")


def test_the_package_ships_every_file_the_fit_reads() -> None:
    for name in (*DEFAULT_RUNS_FILES, "gemm.csv", "collectives.csv", "README.md"):
        assert (MEASUREMENTS_DIR / name).is_file(), name
    assert find_calibration_dir() == MEASUREMENTS_DIR
    assert default_runs_files() == [MEASUREMENTS_DIR / "runs.csv", MEASUREMENTS_DIR / "runs_multinode.csv"]


def test_the_wheel_includes_the_measurements() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trainsim"]
    package = MEASUREMENTS_DIR.parents[2]  # src/trainsim
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    assert set(MEASUREMENTS_DIR.iterdir()) <= shipped


def test_sync_copies_and_then_has_nothing_to_do(tmp_path: Path) -> None:
    script = _sync_script()
    source = tmp_path / "source"
    source.mkdir()
    for name in script.FILES:
        (source / name).write_text(f"{name} v1\n")
    target = tmp_path / "target"
    assert script.sync(source, target) == list(script.FILES)
    assert script.sync(source, target) == []
    (source / "runs.csv").write_text("runs.csv v2\n")
    assert script.sync(source, target) == ["runs.csv"]
    assert (target / "runs.csv").read_text() == "runs.csv v2\n"
    (source / "gemm.csv").unlink()
    with pytest.raises(SystemExit, match=r"lacks gemm\.csv"):
        script.sync(source, target)


def test_the_package_fits_best_gemm_rates_are_the_shipped_gemm_tables() -> None:
    from trainsim.calibrate.microbenchmarks import fit_matmul_max_efficiency
    from trainsim.catalog.calibration import load_calibration

    fitted = load_calibration().matmul_max_efficiency
    assert fitted == fit_matmul_max_efficiency(MEASUREMENTS_DIR / "gemm.csv")
    assert fitted["mi300x"]["bf16"] == pytest.approx(668.4 / 1307.4, abs=1e-4)  # gemm.csv's MAMF row / datasheet
