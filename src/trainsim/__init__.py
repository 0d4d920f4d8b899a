"""trainsim: predict the performance of distributed deep-learning training before spending GPU hours.

The package root is the Python API's front door: `trainsim.predict`, `simulate`, `search`, `validate`,
`load` and the result types (trainsim.api). They load on first use, so `import trainsim` and every
`import trainsim.<module>` stay cheap.

>>> import trainsim
>>> trainsim.predict(model="gpt3-125m", num_gpus=8, global_batch=64).oom
False
"""

from typing import TYPE_CHECKING, Any

from trainsim.version import __version__

if TYPE_CHECKING:
    from trainsim.api import (
        PlanPoint,
        PlanRow,
        Prediction,
        RunPrediction,
        SchemaTag,
        SearchResult,
        Strategy,
        ValidationResult,
        load,
        predict,
        search,
        simulate,
        validate,
        write_schemas,
    )

API_NAMES = ("PlanPoint", "PlanRow", "Prediction", "RunPrediction", "SchemaTag", "SearchResult", "Strategy",
             "ValidationResult", "load", "predict", "search", "simulate", "validate", "write_schemas")
__all__ = ["__version__", *API_NAMES]


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (PEP 562)."""
    if name in API_NAMES:
        from trainsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
