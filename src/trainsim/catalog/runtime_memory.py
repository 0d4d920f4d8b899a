"""Stored resident memory of a CPU rank's runtime, as `trainsim profile --runtime-memory` measures it
(profile.runtime_memory): the process' resident memory once torch is imported and the gloo group joined
(baseline_bytes, what `trainsim measure --memory-cap-gib` leaves out of its cap), and what the training runtime
adds above it with a model of negligible size (runtime_bytes: the measure harness' own code and graph, the
oneDNN and autograd working set, gloo's buffers). A device with a stored measurement reserves
baseline_bytes + runtime_bytes for the runtime (DeviceSpec.runtime_reserved_bytes) instead of its catalog entry's
placeholder (catalog/loader.py).

File: a YAML list of {device, baseline_bytes, runtime_bytes, world_size, backend, ...}; one entry per device, the
latest measurement replacing an earlier one.
"""

import math
from pathlib import Path
from typing import Any

from trainsim.catalog.files import read_entry_list, store_entry
from trainsim.errors import ConfigError

RUNTIME_MEMORY_PATH = Path(__file__).parent / "data" / "calibration" / "runtime_memory.yaml"
_FIELDS = ("baseline_bytes", "runtime_bytes")


def read_runtime_memory(path: Path = RUNTIME_MEMORY_PATH) -> list[dict[str, Any]]:
    data = read_entry_list(path, "{device, baseline_bytes, runtime_bytes}")
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("device"), str):
            raise ConfigError(f"{path.name}[{i}]", entry, "needs a device name")
        for name in _FIELDS:
            value = entry.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and 0 <= value < 2**50):
                raise ConfigError(f"{path.name}[{i}].{name}", value, "a finite number of bytes >= 0")
    return data


def measured_runtime_bytes(device: str, path: Path = RUNTIME_MEMORY_PATH) -> tuple[float, float] | None:
    """(baseline_bytes, runtime_bytes) stored for `device`, or None."""
    for entry in read_runtime_memory(path):
        if entry["device"] == device:
            return float(entry["baseline_bytes"]), float(entry["runtime_bytes"])
    return None


def store_runtime_memory(entry: dict[str, Any], path: Path = RUNTIME_MEMORY_PATH) -> None:
    """Add or replace the entry of entry["device"]."""
    store_entry(path, read_runtime_memory(path), entry, ("device",),
                "a CPU rank's resident runtime, measured by `trainsim profile --runtime-memory` "
                "(catalog/runtime_memory.py); rerun to refresh")
