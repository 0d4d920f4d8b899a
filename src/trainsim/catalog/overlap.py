"""Stored overlap factors gamma (Proteus Sec. VI-C), per device and model family, as `trainsim profile
--overlap` measures them (profile.overlap). The simulator uses the stored value for a job's device and model
family when there is one, else the calibration's overlap_slowdown.

File: a YAML list of {device, family, gamma, plain_backward_s, overlapped_backward_s, world_size, repeats,
backend}; one entry per (device, family), the latest measurement replacing an earlier one.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainsim.catalog.files import read_entry_list, store_entry
from trainsim.errors import ConfigError
from trainsim.ir.model_spec import ModelSpec, TransformerSpec

OVERLAP_PATH = Path(__file__).parent / "data" / "calibration" / "overlap.yaml"


def model_family(model: ModelSpec) -> str:
    """A transformer's architecture family (gpt, llama, ...), else the model kind (cnn, dlrm)."""
    return model.arch if isinstance(model, TransformerSpec) else str(model.kind)


def read_overlap_entries(path: Path = OVERLAP_PATH) -> list[dict[str, Any]]:
    data = read_entry_list(path, "{device, family, gamma, ...}")
    for i, entry in enumerate(data):
        gamma = entry.get("gamma") if isinstance(entry, dict) else None
        if not isinstance(gamma, int | float) or not 0.0 <= float(gamma) < float("inf"):
            raise ConfigError(f"{path.name}[{i}].gamma", gamma, "a finite number >= 0")
        if not isinstance(entry.get("device"), str) or not isinstance(entry.get("family"), str):
            raise ConfigError(f"{path.name}[{i}]", entry, "needs device and family names")
    return data


def load_overlap_factors(path: Path = OVERLAP_PATH) -> Mapping[tuple[str, str], float]:
    """(device, family) -> gamma."""
    return {(e["device"], e["family"]): float(e["gamma"]) for e in read_overlap_entries(path)}


def store_overlap_factor(entry: dict[str, Any], path: Path = OVERLAP_PATH) -> None:
    """Add or replace the entry of (entry["device"], entry["family"])."""
    store_entry(path, read_overlap_entries(path), entry, ("device", "family"),
                "gamma measured by `trainsim profile --overlap` (catalog/overlap.py); rerun to refresh")
