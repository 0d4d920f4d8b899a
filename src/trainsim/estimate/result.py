"""The one result type every estimator returns, and how an engine's time breakdown and memory become one."""

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from trainsim.catalog.calibration import Calibration
from trainsim.catalog.uncertainty import GROUP_TEXT
from trainsim.cost.memory import MemoryEstimate
from trainsim.errors import InfeasiblePlanError
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.strategy.precision import policy_for

if TYPE_CHECKING:  # NB: the event engine loads with the engines that simulate, not with every prediction
    from trainsim.ir.exec_graph import ExecGraph
    from trainsim.sim.outcome import SimOutcome

# Where the iteration time goes: the breakdown keys every engine uses, in the order reports print them.
# comm: exposed collectives whose parallel axis is unknown (a replayed execution trace's feature collectives).
BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "comm", "bubble",
                  "optimizer", "overhead", "core_sharing")


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """The simulated (or replayed) iteration behind a Result: every task's start and end on every simulated
    device, the memory timeline and the critical path (outcome.critical_path). device_names label the
    simulated devices in traces."""

    exec_graph: "ExecGraph"
    outcome: "SimOutcome"
    device_names: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """The range the iteration time is likely in: low_s <= the prediction <= high_s. The calibration's held-out
    predictions of comparable jobs (`group`, catalog.uncertainty) fell inside the same ratios `coverage` of the
    time; `residuals` of them measured it (basis: catalog.uncertainty.BandRatios). The throughput and FLOP
    figures follow as the time's reciprocal."""

    low_s: float
    high_s: float
    group: str
    coverage: float
    residuals: int
    basis: str

    def to_dict(self, result: "Result") -> dict[str, Any]:
        rate_low, rate_high = result.iteration_time_s / self.high_s, result.iteration_time_s / self.low_s
        data: dict[str, Any] = {"iteration_time_s": [self.low_s, self.high_s]}
        for name in RATE_FIELDS:
            value = getattr(result, name)
            data[name] = [value * rate_low, value * rate_high]
        return {**data, "coverage": self.coverage, "group": self.group, "meaning": self.meaning,
                "held_out_runs": self.residuals, "basis": self.basis}

    @property
    def meaning(self) -> str:
        return GROUP_TEXT.get(self.group, self.group)


# Result fields inversely proportional to the iteration time: their band follows the time's.
RATE_FIELDS = ("tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu", "hfu")


@dataclass(frozen=True, slots=True)
class Result:
    """Predicted performance of one job. Times in seconds, memory in bytes, rates per second.

    breakdown: where the iteration time goes (keys from BREAKDOWN_KEYS); its values add up to iteration_time_s.
    memory_breakdown: what the peak GPU's memory holds at its peak; adds up to peak_memory_bytes.
    timeline: the simulated iteration, for engines that simulate one (a trace, the critical path); None for
    closed-form engines. Not part of to_dict().
    band: the iteration time's likely range from the calibration's held-out errors (Band); None where the
    calibration measured none, or for an engine whose errors it did not measure (precision-aware, replay).
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
    timeline: Timeline | None = field(default=None, repr=False, compare=False)
    band: Band | None = None

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / 2**30

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in ("timeline", "band")}
        data["band"] = self.band.to_dict(self) if self.band is not None else None
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


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value


def make_result(engine: str, job: Job, graph: OpGraph, breakdown: dict[str, float], memory: MemoryEstimate, *,
                notes: list[str] | None = None, timeline: Timeline | None = None,
                calibration: Calibration | None = None, repeated_flops: float = 0.0) -> Result:
    """The Result of an engine's breakdown (seconds per BREAKDOWN_KEYS entry) and memory estimate for `job`,
    whose per-device graph is `graph`: iteration time, throughput, FLOPs, MFU and HFU follow from them.
    calibration: the fit the engine priced with, whose held-out errors give the band (None: no band).
    repeated_flops: FLOPs one device runs per micro-batch beyond its share of the model's (a module a strategy
    tree runs whole on every tp rank: compile.shape_layers.repeated_flops), counted in HFU, not in MFU."""
    unknown = set(breakdown) - set(BREAKDOWN_KEYS)
    assert not unknown, f"breakdown keys outside BREAKDOWN_KEYS: {sorted(unknown)}"
    par = job.parallel
    iteration = iteration_time_s(job, breakdown)
    breakdown = with_shared_cores(breakdown, job.cluster.device.compute_share)
    full_graph_flops = graph.total_flops("fwd") + graph.total_flops("bwd")
    # The graph is one device's share of one micro-batch: scale to the whole iteration. A captured graph (not the
    # catalog's) is the whole model: its tp ranks' shares are in it already.
    shards = par.tp * par.cp if graph.frontend == "catalog" else 1
    scale = shards * par.global_batch / par.micro_batch
    per_device_scale = par.tp * par.cp * par.global_batch / par.micro_batch
    model_flops = full_graph_flops * scale
    hardware_flops = model_flops + recompute_flops(graph, par.recompute) * scale + repeated_flops * per_device_scale
    peak = job.cluster.device.peak_for(policy_for(par.precision).linear_dtype)
    if not (math.isfinite(iteration) and iteration > 0 and math.isfinite(model_flops) and
            math.isfinite(memory.peak_bytes)):
        # NB: the last line of the validation boundary: inputs are finite and bounded, so only a job far outside
        # what the cost models cover (sizes near the bounds, multiplied together) gets here
        raise InfeasiblePlanError("not finite", f"{engine}: the prediction of {job.describe()} is not a finite "
                                  f"positive number (iteration {iteration:g} s, {model_flops:g} FLOPs, peak "
                                  f"{memory.peak_bytes:g} bytes); the job is outside what the cost models cover")
    achieved = model_flops / iteration / job.num_gpus
    return Result(
        engine=engine, job=job.describe(), iteration_time_s=iteration,
        tokens_per_s=tokens_per_s(job, iteration), samples_per_s=par.global_batch / iteration,
        model_flops_per_iteration=model_flops, hardware_flops_per_iteration=hardware_flops,
        tflops_per_gpu=achieved / 1e12, mfu=achieved / peak,
        hfu=hardware_flops / iteration / job.num_gpus / peak, peak_flops_per_gpu=peak,
        peak_memory_bytes=memory.peak_bytes, memory_capacity_bytes=memory.capacity_bytes, oom=memory.oom,
        breakdown=breakdown, memory_breakdown=memory.breakdown, notes=[*_kernel_notes(job), *(notes or [])],
        timeline=timeline, band=iteration_band(job, iteration, calibration),
    )


def recompute_flops(graph: OpGraph, recompute: str) -> float:
    """The FLOPs one micro-batch of `graph` runs again in the backward pass: the whole forward under full
    recompute, the ops marked recompute_selective (the attention core: Korthikanti et al. 2022, selective
    activation recomputation) under selective recompute; hardware FLOPs (HFU) count them, model FLOPs (MFU) do
    not."""
    if recompute == "full":
        return graph.total_flops("fwd")
    if recompute == "selective":
        return sum(layer.count * layer.recomputed_flops(recompute) for layer in graph.layers)
    return 0.0


def stack_name_of(job: Job) -> str | None:
    """The name of the training stack a job states; None where it states none."""
    stack = getattr(job, "stack", None)  # NB: Job.stack (issue 11's training-stack presets) may be absent
    name = getattr(stack, "name", None)
    return name if isinstance(name, str) else None


def iteration_band(job: Job, iteration_s: float, calibration: Calibration | None) -> Band | None:
    """The band around `iteration_s` that the calibration's held-out errors of jobs like `job` give."""
    if calibration is None or calibration.uncertainty is None:
        return None
    uncertainty = calibration.uncertainty
    group = uncertainty.group_of(stack_name_of(job), job.num_gpus)
    low, high = uncertainty.band_ratios(group)
    ratios = uncertainty.bands[group]
    coverage = uncertainty.quantiles[1] - uncertainty.quantiles[0]
    return Band(low_s=iteration_s * low, high_s=iteration_s * high, group=group, coverage=coverage,
                residuals=ratios.residuals, basis=ratios.basis)


def iteration_time_s(job: Job, breakdown: dict[str, float]) -> float:
    """The iteration time of an engine's breakdown: its sum, with the wait for shared cores added."""
    return sum(with_shared_cores(breakdown, job.cluster.device.compute_share).values())


def tokens_per_s(job: Job, iteration_s: float) -> float:
    return job.tokens_per_iteration / iteration_s


def _kernel_notes(job: Job) -> list[str]:
    """What the job asks for that the device cannot run natively, and how it was costed instead."""
    device = job.cluster.device
    notes = []
    if job.parallel.attention == "flash3" and "flash3" not in device.attention_kernels:
        notes.append(f"attention=flash3: {device.name} has no Hopper-native attention kernel; costed as flash2")
    dtype = policy_for(job.parallel.precision).linear_dtype
    ran_as = device.peak_dtype_for(dtype)
    if ran_as != dtype:
        notes.append(f"precision={job.parallel.precision}: {device.name} has no native {dtype} matmul "
                     f"({NATIVE_DTYPE_NEEDS.get(dtype, 'not in its spec sheet')}); costed at its {ran_as} peak, "
                     f"which a real run may not reach")
    return notes


# What a dtype's tensor-core GEMMs need (NVIDIA PTX ISA 8.x, the mma instruction's target requirements: .bf16 and
# .tf32 need sm_80, .e4m3/.e5m2 need sm_89; TransformerEngine 1.x refuses fp8 below compute capability 8.9).
NATIVE_DTYPE_NEEDS = {
    "fp8": "fp8 tensor cores need compute capability 8.9+: Ada, Hopper, Blackwell",
    "bf16": "bf16 tensor cores need compute capability 8.0+: Ampere and later",
    "tf32": "tf32 tensor cores need compute capability 8.0+: Ampere and later",
}


def with_shared_cores(breakdown: dict[str, float], share: float) -> dict[str, float]:
    """Ranks that outnumber a host's cores (compute_share < 1) take turns on them. A rank waiting in a pipeline
    bubble leaves its core to the others; every other second of its step needs one. So the step lasts at least
    (iteration - bubble) / share; the difference is the `core_sharing` entry of the breakdown."""
    if share >= 1.0:
        return breakdown
    total = sum(breakdown.values())
    waiting = (total - breakdown.get("bubble", 0.0)) / share - total
    return {**breakdown, "core_sharing": max(0.0, waiting)}
