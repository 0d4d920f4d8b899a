"""The Python API of trainsim (also importable from the package root: `trainsim.predict(...)`).

    import trainsim
    r = trainsim.predict(model="llama3.1-8b", cluster="dgx-h100-80gb", num_gpus=8, tp=2, global_batch=64)
    print(r.iteration_time_s, r.mfu, r.peak_memory_gib)
    r.write_html("report.html")

predict / simulate -> Prediction, search -> SearchResult, validate -> ValidationResult, load(path) reads any of
them back from their JSON. docs/api.md has the details.
"""

from trainsim.api.compare import Comparison, TermChange, compare
from trainsim.api.functions import Strategy, predict, search, simulate, validate
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

__all__ = ["Comparison", "PlanPoint", "PlanRow", "Prediction", "RunPrediction", "SchemaTag", "SearchResult",
           "Strategy", "TermChange", "ValidationResult", "compare", "load", "predict", "search", "simulate",
           "validate", "write_schemas"]
