"""A CPU rank's resident runtime measured through the measure harness (profile.runtime_memory, `trainsim profile
--runtime-memory`), stored per device (catalog.runtime_memory) and held as the device's runtime reserve."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.catalog import load_device
from trainsim.catalog.runtime_memory import measured_runtime_bytes, read_runtime_memory, store_runtime_memory
from trainsim.cli.main import app
from trainsim.errors import ConfigError


def test_store_replaces_the_entry_of_the_same_device(tmp_path: Path) -> None:
    path = tmp_path / "runtime.yaml"
    store_runtime_memory({"device": "cpu-a", "baseline_bytes": 100, "runtime_bytes": 10}, path)
    store_runtime_memory({"device": "cpu-b", "baseline_bytes": 200, "runtime_bytes": 20}, path)
    store_runtime_memory({"device": "cpu-a", "baseline_bytes": 300, "runtime_bytes": 30}, path)
    assert [e["device"] for e in read_runtime_memory(path)] == ["cpu-a", "cpu-b"]
    assert measured_runtime_bytes("cpu-a", path) == (300.0, 30.0)
    assert measured_runtime_bytes("gpu-z", path) is None
    assert measured_runtime_bytes("cpu-a", tmp_path / "absent.yaml") is None


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "1GB", True, None])
def test_a_bad_figure_is_refused(tmp_path: Path, value: object) -> None:
    path = tmp_path / "runtime.yaml"
    path.write_text(json.dumps([{"device": "cpu-a", "baseline_bytes": 1, "runtime_bytes": 1}]).replace(
        '"runtime_bytes": 1', f'"runtime_bytes": {json.dumps(value)}'))
    with pytest.raises(ConfigError, match="runtime_bytes"):
        read_runtime_memory(path)


def test_the_local_device_reserves_its_measured_runtime() -> None:
    """The shipped measurement of cpu-local replaces the catalog entry's placeholder reserve."""
    measured = measured_runtime_bytes("cpu-local")
    assert measured is not None and 0 < measured[0] < 2**31 and 0 <= measured[1] < 2**31
    assert load_device("cpu-local").runtime_reserved_bytes == sum(measured)


def test_profile_runtime_memory_measures_and_stores(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    store = tmp_path / "runtime.yaml"
    result = CliRunner().invoke(app, ["profile", "--runtime-memory", "--runtime-memory-file", str(store), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)
    assert (entry["device"], entry["backend"], entry["world_size"]) == ("cpu-local", "gloo", 2)
    # torch and gloo alone hold tens of MiB; the negligible model's states are under a MiB
    assert 2**25 < entry["baseline_bytes"] < 2**31 and 0 < entry["runtime_bytes"] < 2**31
    assert entry["model_bytes"] < 2**20
    assert measured_runtime_bytes("cpu-local", store) == (entry["baseline_bytes"], entry["runtime_bytes"])
