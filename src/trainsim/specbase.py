"""Base for every spec: keyword-only, frozen, strict keys; pydantic errors become one-line ConfigErrors."""

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from trainsim.errors import ConfigError


class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

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
    if not field:  # a check across fields: the message names them; show the fields it mentions
        message = str(first["msg"]).removeprefix("Value error, ")
        return ConfigError.across_fields(where or exc.title, message)
    if where:
        field = f"{where}.{field}"
    message = str(first["msg"])
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return ConfigError(field, first.get("input"), message)
