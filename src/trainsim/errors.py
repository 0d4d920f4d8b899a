"""Typed failures. User mistakes and infeasible plans are TrainsimError; the CLI prints one line and exits 2."""


class TrainsimError(Exception):
    """Base of every error trainsim raises on purpose."""


class ConfigError(TrainsimError, ValueError):
    """A field holds a value that is not allowed. The message names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")

    @classmethod
    def across_fields(cls, where: str, message: str) -> "ConfigError":
        """A combination of fields that is not allowed; the message names the fields and their values."""
        error = cls.__new__(cls)
        error.field, error.value, error.allowed = where, None, message
        Exception.__init__(error, f"{where}: {message}")
        return error


class UnknownNameError(ConfigError):
    """A name (model, cluster, device, engine ...) that is not in its catalog or registry."""

    def __init__(self, field: str, value: str, choices: list[str]) -> None:
        import difflib

        shown = ", ".join(sorted(choices))
        close = difflib.get_close_matches(str(value), choices, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        super().__init__(field, value, f"{hint}choose one of: {shown}")
        self.choices = choices


class InputFileError(TrainsimError):
    """A file that cannot be read or parsed."""


class InfeasiblePlanError(TrainsimError):
    """A plan that is valid input but cannot run (for example, it does not divide the work evenly)."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(detail)
