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
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    except yaml.YAMLError as exc:
        raise InputFileError(f"{path} is not valid YAML{_where(exc)}: {_problem(exc)}") from None
    if not isinstance(data, dict):
        raise InputFileError(f"{path} must hold a mapping at the top level, found {type(data).__name__}")
    return data


def _where(exc: yaml.YAMLError) -> str:
    """Where a YAML error is (1-based, as editors count), or nothing where PyYAML gives no place."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    text = " ".join(part for part in (context, problem) if part) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return text


def key_lines(path: Path) -> dict[str, int]:
    """The 1-based line of each key of a YAML mapping file, top level and one level down (`strategy.tp` is
    also listed as `tp`); {} for JSON or where the file does not parse."""
    if path.suffix == ".json":
        return {}
    try:
        root = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    lines: dict[str, int] = {}
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            lines.setdefault(str(key.value), key.start_mark.line + 1)
            if isinstance(value, yaml.MappingNode):
                for inner, _ in value.value:
                    lines.setdefault(str(inner.value), inner.start_mark.line + 1)
    return lines


def catalog_entries(folder: str, key: str) -> list[dict[str, Any]]:
    """All entries under `key` in the data files of one catalog folder; each file may set `defaults`."""
    entries: list[dict[str, Any]] = []
    for path in sorted((DATA_DIR / folder).glob("*.yaml")):
        data = read_mapping(path)
        defaults = data.get("defaults", {})
        for entry in data.get(key, []):
            entries.append({**defaults, **entry})
    return entries
