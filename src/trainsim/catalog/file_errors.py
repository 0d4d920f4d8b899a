"""Every problem of a model or cluster file in one line, each with the line it is on.

pydantic reports all of a file's problems at once (ValidationError.errors()); `file_error` turns them into one
ConfigError line: the unknown keys with their line and the closest accepted key, the missing keys, then every
other problem with its line and value. Values of mappings are never echoed (a file named by mistake must not
come back in the message). The accepted keys of each file are in docs/inputs.md.
"""

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainsim.catalog.files import key_lines, shown_path
from trainsim.errors import ConfigError

_SHOWN_VALUE_CHARS = 40
_SHOWN_FIELD_CHARS = 60
_SHOWN_MESSAGE_CHARS = 160
MAX_PROBLEMS = 12  # problems named in the line; more are counted
FILE_ERROR_CHARS = 4000  # bounds the line: 12 problems of at most ~280 characters, the path and the hint


def file_error(exc: ValidationError, path: Path, what: str, accepted: Sequence[str] = (),
               drop_tag: bool = False) -> ConfigError:
    """One line naming every problem of the `what` file at `path`. accepted: the keys the file takes (for
    "did you mean"); drop_tag: the first part of each error's location is a union member's tag (a model's kind),
    not a key of the file."""
    lines = key_lines(path)
    unknown: list[str] = []
    missing: list[str] = []
    other: list[str] = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]][1 if drop_tag else 0:]
        raised = (error.get("ctx") or {}).get("error")
        if isinstance(raised, ConfigError) and raised.field:  # a validator named the field (Spec._strict_numbers)
            loc.append(raised.field)
        if error["type"] == "union_tag_invalid":
            loc = [str((error.get("ctx") or {}).get("discriminator", "kind")).strip("'")]
        field = ".".join(loc)
        line = _line_of(loc, lines)
        where = f" (line {line})" if line is not None else ""
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1], list(accepted), n=1) if loc and len(loc) == 1 else []
            unknown.append(f"{field[:_SHOWN_FIELD_CHARS]}{where}" + (f", did you mean {close[0]}?" if close else ""))
        elif error["type"] == "missing":
            missing.append(field[:_SHOWN_FIELD_CHARS])
        else:
            value, message = _problem(error)
            named = f"{field[:_SHOWN_FIELD_CHARS]}{where}" + (f" = {value}" if value else "")
            message = message[:_SHOWN_MESSAGE_CHARS]
            other.append(f"{named}: {message}" if named else message)
    total = len(unknown) + len(missing) + len(other)
    unknown = unknown[:MAX_PROBLEMS]
    missing = missing[:MAX_PROBLEMS - len(unknown)]
    other = other[:MAX_PROBLEMS - len(unknown) - len(missing)]
    parts = []
    if unknown:
        parts.append(f"unknown key{'s' if len(unknown) > 1 else ''} " + "; ".join(unknown))
    if missing:
        parts.append(f"missing key{'s' if len(missing) > 1 else ''} " + ", ".join(missing))
    parts += other
    shown = len(unknown) + len(missing) + len(other)
    if total > shown:
        parts.append(f"and {total - shown} more problem{'s' if total - shown > 1 else ''}")
    if unknown or missing:
        parts.append(f"the keys a {what} file takes are in docs/inputs.md")
    error = ConfigError.across_fields(shown_path(path), "; ".join(parts))
    error.message_limit = FILE_ERROR_CHARS
    return error


def _line_of(loc: list[str], lines: dict[str, int]) -> int | None:
    """The line of the innermost key the file names (key_lines knows two levels), else of the outer one."""
    for key in reversed(loc[:2]):
        if key in lines:
            return lines[key]
    return None


def _problem(error: Any) -> tuple[str, str]:
    """The value shown (none for a mapping or a check across fields) and what is wrong with it."""
    raised = (error.get("ctx") or {}).get("error")
    if isinstance(raised, ConfigError):  # a validator named the problem itself (Spec._strict_numbers)
        return _value(raised.value), raised.allowed
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, dict | list) or not error["loc"]:
        return "", message  # NB: a mapping's content (the whole file, for a check across fields) is not shown
    return _value(value), message


def _value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[:_SHOWN_VALUE_CHARS - 3] + "..."
