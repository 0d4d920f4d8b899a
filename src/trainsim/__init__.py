"""trainsim: predict the performance of distributed deep-learning training before spending GPU hours.

The package root is the Python API's front door: `trainsim.predict`, `simulate`, `search`, `validate`,
`load` and the result types (trainsim.api). They load on first use, so `import trainsim` and every
`import trainsim.<module>` stay cheap.

>>> import trainsim
>>> trainsim.predict(model="gpt3-125m", num_gpus=8, global_batch=64).oom
False
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from trainsim.version import __version__

if TYPE_CHECKING:
    from trainsim.api import (
        Comparison,
        PlanPoint,
        PlanRow,
        Prediction,
        RunPrediction,
        SchemaTag,
        SearchResult,
        Strategy,
        TermChange,
        ValidationResult,
        compare,
        load,
        predict,
        search,
        simulate,
        validate,
        write_schemas,
    )

__all__ = ["Comparison", "PlanPoint", "PlanRow", "Prediction", "RunPrediction", "SchemaTag", "SearchResult",
           "Strategy", "TermChange", "ValidationResult", "__version__", "compare", "load", "predict", "search",
           "simulate", "validate", "write_schemas"]
API_NAMES = tuple(name for name in __all__ if name != "__version__")


# Subpackages named like an API function: trainsim.search is the search package (trainsim.search.planner ...)
# and, called, the function trainsim.api.search; trainsim.validate likewise.
PACKAGE_FUNCTIONS = ("search", "validate")


class FunctionPackage(types.ModuleType):
    """A subpackage that is also an API function: calling it calls trainsim.api.<its name>."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from trainsim import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


class _Root(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # NB: the import system sets a subpackage as an attribute of its parent once it has loaded it
        if name in PACKAGE_FUNCTIONS and type(value) is types.ModuleType:
            value.__class__ = FunctionPackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Root


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (PEP 562)."""
    if name in PACKAGE_FUNCTIONS:
        return importlib.import_module(f"trainsim.{name}")  # the package; _Root made it callable
    if name in API_NAMES:
        from trainsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
