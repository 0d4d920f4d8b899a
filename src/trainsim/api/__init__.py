"""The Python API of trainsim (also importable from the package root: `trainsim.predict(...)`).

    import trainsim
    r = trainsim.predict(model="llama3.1-8b", cluster="dgx-h100-80gb", num_gpus=8, tp=2, global_batch=64)
    print(r.iteration_time_s, r.mfu, r.peak_memory_gib)
    r.write_html("report.html")

predict / simulate -> Prediction, search -> SearchResult, validate -> ValidationResult, load(path) reads any of
them back from their JSON. docs/api.md has the details.

The names load on first use (PEP 562), as the package root's do: `trainsim predict` imports api.prediction
alone, not the planner that search needs nor the tables of validate.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainsim.api.comparison import Comparison, TermChange, compare
    from trainsim.api.functions import search, validate
    from trainsim.api.prediction import Strategy, predict, simulate
    from trainsim.api.results import (
        PlanPoint,
        PlanRow,
        Prediction,
        RunPrediction,
        SchemaTag,
        SearchResult,
        ValidationResult,
        load,
        write_schemas,
    )

# name -> the module of trainsim.api that defines it
_HOMES: dict[str, str] = {
    "Comparison": "comparison", "TermChange": "comparison", "compare": "comparison",
    "search": "functions", "validate": "functions",
    "Strategy": "prediction", "predict": "prediction", "simulate": "prediction",
    **dict.fromkeys(("PlanPoint", "PlanRow", "Prediction", "RunPrediction", "SchemaTag", "SearchResult",
                     "ValidationResult", "load", "write_schemas"), "results"),
}

__all__ = ["Comparison", "PlanPoint", "PlanRow", "Prediction", "RunPrediction", "SchemaTag", "SearchResult",
           "Strategy", "TermChange", "ValidationResult", "compare", "load", "predict", "search", "simulate",
           "validate", "write_schemas"]


def __getattr__(name: str) -> Any:
    """The API's names, imported from their module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'trainsim.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainsim.api.{home}"), name)
    globals()[name] = value
    return value
