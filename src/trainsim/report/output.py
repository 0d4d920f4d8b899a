"""Files a command writes (--trace, --html): checked before any work, written atomically."""

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainsim.catalog.files import write_atomic
from trainsim.errors import ConfigError


def check_output_file(path: Path, flag: str) -> Path:
    """Refuse, in one line, a path a command could not write once its work is done: a folder, or a file in a
    folder that does not exist."""
    if path.is_dir():
        raise ConfigError(flag, str(path), "is a folder: name a file in it, e.g. " + str(path / "report.html"))
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(flag, str(path), f"the folder {parent} does not exist: create it first")
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all (catalog.files.write_atomic); returns the path."""
    write_atomic(path, text)
    return path


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """A table as CSV: a header of every key (in first-seen order), a line per row; nested values flattened
    as KEY.SUBKEY."""
    flat = [_flatten(row) for row in rows]
    header = list(dict.fromkeys(key for row in flat for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue()


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
