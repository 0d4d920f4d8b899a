"""The one result type every estimator returns."""

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Result:
    """Predicted performance of one job. Times in seconds, memory in bytes, rates per second.

    breakdown: where the iteration time goes; its values add up to iteration_time_s.
    memory_breakdown: what the peak GPU's memory holds at its peak; adds up to peak_memory_bytes.
    """

    engine: str
    job: str
    iteration_time_s: float
    tokens_per_s: float
    samples_per_s: float
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_flops_per_gpu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    oom: bool
    breakdown: dict[str, float]
    memory_breakdown: dict[str, float]
    notes: list[str] = field(default_factory=list)

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / 2**30

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_memory_gib"] = self.peak_memory_gib
        data["memory_capacity_gib"] = self.memory_capacity_bytes / 2**30
        data["memory_breakdown_gib"] = {k: v / 2**30 for k, v in self.memory_breakdown.items()}
        data["mfu_formula"] = MFU_FORMULA
        return data


MFU_FORMULA = (
    "model FLOPs per iteration (forward + backward of the op graph, no recomputation; GEMMs, attention "
    "with causal masking as the kernel executes it, and pointwise ops) / (iteration time x GPUs x dense peak "
    "FLOP/s of the compute dtype)"
)
