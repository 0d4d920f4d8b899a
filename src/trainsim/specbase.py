"""Base for every spec: keyword-only, frozen, strict keys; pydantic errors become one-line ConfigErrors."""

from typing import Any, Self, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from trainsim.errors import ConfigError, unknown_key

# The largest magnitude an integer field takes: every count trainsim multiplies (layers x hidden x batch ...)
# stays exact in a float64 and far from overflow. Fields with a tighter meaning bound themselves.
MAX_INT_FIELD = 2**53


def _is_numeric(annotation: Any) -> bool:
    """Whether a field's type holds numbers (int, float, or a tuple/union/dict of them)."""
    if annotation in (int, float):
        return True
    return any(_is_numeric(arg) for arg in get_args(annotation) if arg is not bool)


def _number_problem(value: Any) -> str | None:
    items = value if isinstance(value, list | tuple) else [value]
    for item in items:
        if isinstance(item, bool):
            return "must be a number, not true or false"
        if isinstance(item, int) and abs(item) > MAX_INT_FIELD:
            return f"must be at most {MAX_INT_FIELD} in magnitude"
    return None


class Spec(BaseModel):
    # allow_inf_nan=False: no float field takes NaN or infinity, from a file or from code. defer_build: a spec's
    # validator is built when the spec is first validated, not when its class is defined (start-up: a prediction
    # uses a few of the dozens of spec classes it imports).
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False,
                              defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _strict_numbers(cls, data: Any) -> Any:
        """A number field takes no boolean (YAML's `true` is not 1) and no integer past MAX_INT_FIELD."""
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            field = cls.model_fields.get(key) if isinstance(key, str) else None
            if field is None or not isinstance(value, int | list | tuple) or not _is_numeric(field.annotation):
                continue
            problem = _number_problem(value)
            if problem is not None:
                raise ConfigError(key, value, problem)  # config_error_from puts where it was in front
        return data

    def replaced(self, **changes: Any) -> Self:
        """model_copy(update=changes), unvalidated as it is (for changes already checked), without its general
        path: the four attributes pydantic's BaseModel.__copy__ and model_copy set (pydantic 2.x main.py), a
        spec having no extra fields (extra="forbid") and no private attributes. Several times faster: a search
        copies each plan it validates into its recompute and ZeRO variants, and make_job fills in dp."""
        if self.__pydantic_private__ is not None:
            return self.model_copy(update=changes)
        copied = type(self).__new__(type(self))
        object.__setattr__(copied, "__dict__", {**self.__dict__, **changes})
        object.__setattr__(copied, "__pydantic_extra__", None)
        object.__setattr__(copied, "__pydantic_fields_set__", self.__pydantic_fields_set__ | changes.keys())
        object.__setattr__(copied, "__pydantic_private__", None)
        return copied

    @classmethod
    def parse(cls, data: dict[str, Any], where: str = "") -> Self:
        """Validate a mapping (from YAML, JSON or flags); the first problem becomes a ConfigError."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise config_error_from(exc, where) from None


def config_error_from(exc: ValidationError, where: str = "") -> ConfigError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    raised = (first.get("ctx") or {}).get("error")
    if isinstance(raised, ConfigError):  # a validator named the field itself (Spec._strict_numbers)
        return ConfigError(".".join(part for part in (where, field, raised.field) if part), raised.value,
                           raised.allowed)
    if not field:  # a check across fields: the message names them; show the fields it mentions
        message = str(first["msg"]).removeprefix("Value error, ")
        return ConfigError.across_fields(where or exc.title, message)
    if where:
        field = f"{where}.{field}"
    message = str(first["msg"])
    if first["type"] == "missing" or isinstance(first.get("input"), dict):
        # NB: pydantic's input here is the whole enclosing mapping, which may be any file's content: not shown
        return ConfigError.across_fields(field, message.removeprefix("Value error, "))
    if first["type"] == "extra_forbidden":  # NB: not the value: a file that is no spec shows none of its content
        return unknown_key(field)
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return ConfigError(field, first.get("input"), message)
