"""Read YAML/JSON files into plain data, with one-line errors."""

import json
from pathlib import Path
from typing import Any

import yaml

from trainsim.errors import InputFileError

DATA_DIR = Path(__file__).parent / "data"
# libyaml's parser where PyYAML was built with it: the same data (the same safe constructor and resolver) in
# a tenth of the time of the pure-Python parser, which matters as predict reads the whole catalog.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_FAST_LOADER)
    except yaml.YAMLError:
        return yaml.safe_load(text)  # NB: the pure-Python parser's error message, the one users have seen


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level is a mapping."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else _load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputFileError(f"{path} is not valid {kind}: {first_line}") from None
    if not isinstance(data, dict):
        raise InputFileError(f"{path} must hold a mapping at the top level, found {type(data).__name__}")
    return data


def catalog_entries(folder: str, key: str) -> list[dict[str, Any]]:
    """All entries under `key` in the data files of one catalog folder; each file may set `defaults`."""
    entries: list[dict[str, Any]] = []
    for path in sorted((DATA_DIR / folder).glob("*.yaml")):
        data = read_mapping(path)
        defaults = data.get("defaults", {})
        for entry in data.get(key, []):
            entries.append({**defaults, **entry})
    return entries
