"""Model specs from plain mappings (catalog entries, model YAML/JSON files), validated into frozen ModelSpecs."""

from typing import Any

from pydantic import TypeAdapter, ValidationError

from trainsim.ir.model_spec import ModelSpec
from trainsim.specbase import config_error_from

_MODEL_ADAPTER: TypeAdapter[ModelSpec] = TypeAdapter(ModelSpec)


def parse_model(data: dict[str, Any], where: str = "model") -> ModelSpec:
    try:
        return _MODEL_ADAPTER.validate_python({"kind": "transformer", **data})
    except ValidationError as exc:
        raise config_error_from(exc, where) from None
