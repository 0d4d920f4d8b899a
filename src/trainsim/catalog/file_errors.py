"""Every problem of a model or cluster file in one line, each with the line it is on.

pydantic reports all of a file's problems at once (ValidationError.errors()); `file_error` turns them into one
ConfigError line: the unknown keys with their line and the closest accepted key, the missing keys, then every
other problem with its line and value, as many as the one-line limit holds and a count of the rest. Values of
mappings are never echoed (a file named by mistake must not come back in the message). The accepted keys of
each file are in docs/inputs.md.
"""

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainsim.catalog.files import key_lines, shown_path
from trainsim.errors import MAX_MESSAGE_CHARS, ConfigError

_SHOWN_VALUE_CHARS = 40
_SHOWN_FIELD_CHARS = 60
_SHOWN_MESSAGE_CHARS = 120


def file_error(exc: ValidationError, path: Path, what: str, accepted: Sequence[str] = (),
               drop_tag: bool = False) -> ConfigError:
    """One line naming every problem of the `what` file at `path`, in the order unknown keys, missing keys, bad
    values, as many as the one-line limit (errors.MAX_MESSAGE_CHARS) holds, then a count of the rest.
    accepted: the keys the file takes (for "did you mean"); drop_tag: the first part of each error's location
    is a union member's tag (a model's kind), not a key of the file."""
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
            context = error.get("ctx") or {}
            loc = [str(context.get("discriminator", "kind")).strip("'")]
            error = {**error, "loc": tuple(loc), "input": context.get("tag"), "msg": "choose one of: " + str(
                context.get("expected_tags", "")).replace("'", "")}
        field = ".".join(loc)[:_SHOWN_FIELD_CHARS]
        line = _line_of(loc, lines)
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1], list(accepted), n=1) if len(loc) == 1 else []
            place = ", ".join([*([f"line {line}"] if line is not None else []),
                               *([f"did you mean {close[0]}?"] if close else [])])
            unknown.append(f"{field} ({place})" if place else field)
        elif error["type"] == "missing":
            missing.append(field)
        else:
            value, message = _problem(error)
            where = f" (line {line})" if line is not None else ""
            message = message[:_SHOWN_MESSAGE_CHARS]
            named = f"{field}={value}" if value else field
            other.append(f"{named}{where} is invalid: {message}" if named else message)
    head = f"{shown_path(path)}: "
    hint = f"; the keys a {what} file takes: docs/inputs.md" if unknown or missing else ""
    groups = [("unknown " + ("keys " if len(unknown) > 1 else "key "), "; ", unknown),
              ("missing " + ("keys " if len(missing) > 1 else "key "), ", ", missing), ("", "; ", other)]
    total = len(unknown) + len(missing) + len(other)
    budget = MAX_MESSAGE_CHARS - len("error: ") - len(head) - len(hint) - len("; and 99 more problems")
    parts: list[str] = []
    shown = 0
    for label, joiner, items in groups:
        taken: list[str] = []
        for item in items:
            text = label + joiner.join([*taken, item])
            if len("; ".join([*parts, text])) > budget and shown:
                break
            taken.append(item)
            shown += 1
        if taken:
            parts.append(label + joiner.join(taken))
        if len(taken) < len(items):
            break
    rest = total - shown
    more = f"; and {rest} more problem{'s' if rest > 1 else ''}" if rest else ""
    return ConfigError.across_fields(shown_path(path), "; ".join(parts) + more + hint)


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
