"""Typed failures. User mistakes and infeasible plans are TrainsimError; the CLI prints one line and exits 2."""

import itertools
import reprlib

# The longest error line the command line prints (README: one short line): a value or a message longer than this
# is cut, so a huge input (a billion-laughs YAML, a 100 MB cell) can never become a huge message.
MAX_MESSAGE_CHARS = 300
class _InOrderRepr(reprlib.Repr):
    """reprlib's bounded repr, keeping a mapping's keys in their order (reprlib sorts them)."""

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        shown = itertools.islice(x.items(), self.maxdict)
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in shown]
        return "{" + ", ".join(items) + (", ..." if len(x) > self.maxdict else "") + "}"


_VALUE_REPR = _InOrderRepr()
_VALUE_REPR.maxlevel, _VALUE_REPR.maxstring, _VALUE_REPR.maxother, _VALUE_REPR.maxlong = 2, 80, 80, 40
_VALUE_REPR.maxdict = _VALUE_REPR.maxlist = _VALUE_REPR.maxtuple = _VALUE_REPR.maxset = 4


def short_repr(value: object) -> str:
    """repr() of a value, bounded: nested or long values are elided, so building it costs little whatever the
    value's size."""
    try:
        return _VALUE_REPR.repr(value)
    except (ValueError, RecursionError):  # an int past Python's digit limit, a self-referencing value
        return f"<a {type(value).__name__} too large to show>"


def one_line(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """The one place an error message is made one line of at most `limit` characters."""
    flat = " ".join(message[: limit * 4].split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# The longest reason quoted from a user's code's exception inside a longer message of ours.
MAX_REASON_CHARS = 160


def exception_reason(exc: BaseException) -> str:
    """An exception raised by the user's code as one short line: its message, or its type's name when it has none."""
    return one_line(str(exc), MAX_REASON_CHARS) or type(exc).__name__


class TrainsimError(Exception):
    """Base of every error trainsim raises on purpose."""


class ConfigError(TrainsimError, ValueError):
    """A field holds a value that is not allowed. The message names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={short_repr(value)} is invalid: {allowed}")

    @classmethod
    def across_fields(cls, where: str, message: str) -> "ConfigError":
        """A combination of fields that is not allowed; the message names the fields and their values."""
        error = cls.__new__(cls)
        error.field, error.value, error.allowed = where, None, message
        Exception.__init__(error, f"{where}: {message}")
        return error


def unknown_key(field: str, allowed: str = "") -> ConfigError:
    """A key no schema has. Its value is not shown: a file that is not what it was named as (a credentials file
    given as a model) must not come back in the message."""
    return ConfigError.across_fields(field, "unknown key" + (f"; {allowed}" if allowed else ""))


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=@")
MAX_NAME_CHARS = 128


def check_name(field: str, name: str) -> ConfigError | None:
    """The problem with a name that becomes a file name (a run id, a suite job), or None: letters, digits and
    ._-+=@ only (no separator, no '..', no leading dot), at most MAX_NAME_CHARS characters."""
    if not name or len(name) > MAX_NAME_CHARS or name.startswith(".") or not set(name) <= _NAME_CHARS:
        return ConfigError(field, name, f"must be 1-{MAX_NAME_CHARS} letters, digits or ._-+=@, not starting with "
                           "'.' (it names files under --out)")
    return None


class UnknownNameError(ConfigError):
    """A name (model, cluster, device, engine ...) that is not in its catalog or registry."""

    def __init__(self, field: str, value: str, choices: list[str], examples: list[str] | None = None,
                 listing: str | None = None) -> None:
        """examples and listing: for a catalog too long for one line, the names most asked for and the command
        that lists them all (the line names those instead of every choice)."""
        import difflib

        close = difflib.get_close_matches(str(value), choices, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        if examples and listing:
            allowed = f"choose one of the {len(choices)} that `{listing}` lists, e.g. {', '.join(examples)}"
        else:
            allowed = f"choose one of: {', '.join(sorted(choices))}"
        super().__init__(field, value, hint + allowed)
        self.choices = choices


class InputFileError(TrainsimError):
    """A file that cannot be read or parsed."""


class InfeasiblePlanError(TrainsimError):
    """A plan that is valid input but cannot run (for example, it does not divide the work evenly)."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(detail)
