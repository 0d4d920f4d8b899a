"""Model specs from plain mappings (catalog entries, model YAML/JSON files), validated into frozen ModelSpecs."""

from functools import cache
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from trainsim.catalog.file_errors import file_error
from trainsim.ir.model_spec import ModelSpec
from trainsim.specbase import config_error_from

MODEL_SPEC_CLASSES: tuple[type[BaseModel], ...] = get_args(get_args(ModelSpec)[0])  # the kinds ModelSpec unites
_CLASS_OF_KIND: dict[object, type[BaseModel]] = {cls.model_fields["kind"].default: cls for cls in MODEL_SPEC_CLASSES}


@cache
def _model_adapter() -> TypeAdapter[ModelSpec]:
    """The validator of every model kind (built on first use: start-up)."""
    return TypeAdapter(ModelSpec)


def _validate(data: dict[str, Any]) -> ModelSpec:
    """Validate a model mapping (kind defaults to transformer). Valid data is validated by its kind's own class,
    as the union validates it, without building the validators of the other kinds; invalid data goes through the
    union, whose errors name the kind as they always have."""
    tagged = {"kind": "transformer", **data}
    cls = _CLASS_OF_KIND.get(tagged["kind"]) if isinstance(tagged["kind"], str) else None
    if cls is not None:
        try:
            return cls.model_validate(tagged)  # type: ignore[return-value]
        except ValidationError:
            pass
    return _model_adapter().validate_python(tagged)


def parse_model(data: dict[str, Any], where: str = "model") -> ModelSpec:
    try:
        return _validate(data)
    except ValidationError as exc:
        raise config_error_from(exc, where) from None


def parse_model_file(data: dict[str, Any], path: Path) -> ModelSpec:
    """parse_model for a model file: every unknown and missing key, and every bad value, with its line."""
    try:
        return _validate(data)
    except ValidationError as exc:
        kind = data.get("kind", "transformer")
        member = next((cls for cls in MODEL_SPEC_CLASSES if cls.model_fields["kind"].default == kind), None)
        accepted = [name for name in member.model_fields if name != "kind"] if member is not None else []
        tagged = all(error["loc"] and error["loc"][0] == kind for error in exc.errors())
        raise file_error(exc, path, "model", accepted, drop_tag=tagged) from None
