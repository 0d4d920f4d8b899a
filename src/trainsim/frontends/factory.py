"""Load a user's factory named as "path/to/file.py:factory" or "package.module:factory" (torch and jax)."""

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError


def is_factory_target(source: str) -> bool:
    """FILE.py:name or module:name (not an existing path: a path never names a factory)."""
    location, _, attr = source.rpartition(":")
    return bool(location and attr.isidentifier()) and not Path(source).exists()


def load_factory(target: str, frontend: str) -> Callable[..., Any]:
    location, _, attr = target.rpartition(":")
    if not location or not attr:
        raise ConfigError("model", target, f"the {frontend} front-end takes path/to/file.py:factory or module:factory")
    if location.endswith(".py"):
        path = Path(location)
        if not path.exists():
            raise ConfigError("model", target, f"{path} does not exist")
        spec = importlib.util.spec_from_file_location(f"_trainsim_{frontend}_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as exc:
            raise ConfigError("model", target, f"cannot import {exc.name}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError("model", target, f"{location} has no callable {attr!r}")
    return factory


def call_factory(factory: Callable[..., Any], **shape: Any) -> Any:
    """Call with the keyword arguments the factory declares among `shape` (micro_batch, seq_len, precision)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return factory(**shape)
    return factory(**{key: value for key, value in shape.items() if key in parameters})
