"""L2 simulation engine: compile the job into an ExecGraph and run it through the event simulator.

Same prices as the analytical engine (the pricing service, cost.pricing), composed by a schedule instead of a
formula: the pipeline order, the overlap of gradient communication with the backward pass, ZeRO-3 prefetch,
and (optionally) the overlap slow-down and bandwidth sharing of Proteus (sec. VI-C). With both switched off
the two engines agree within 2% on the calibration runs (tests/validation/test_sim_vs_analytical.py).

Breakdown: on the bottleneck device (the one busy longest), the time of each compute-stream category and the
exposed time of each communication category (while no compute runs there); "bubble" is the rest of the
makespan, so the values add up to the iteration time.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.catalog.overlap import load_overlap_factors, model_family
from trainsim.collector import collector_paused
from trainsim.compile.build import compile_job
from trainsim.compile.context import TASK_LEVELS, TaskLevel
from trainsim.compile.stage_meshes import stage_repeated_flops
from trainsim.cost.memory import MemoryEstimate
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.result import BREAKDOWN_KEYS, Result, Timeline, make_result
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.sim import SimOptions, SimOutcome, simulate
from trainsim.sim.arrays import IS_COMPUTE, looked_up
from trainsim.strategy.lowered import LoweredPlan, default_plan

# The most layer-phases (micro-batches x layer instances x forward/backward; x ops per phase at the op level) one
# simulation builds: about 2.4 tasks each, so ~500,000 tasks, a minute and under a GiB on one core. The
# analytical engine answers larger jobs with formulas (10^7 micro-batches, 10^6 GPUs).
MAX_SIM_PHASES = 200_000


def check_sim_size(job: Job, graph: OpGraph, task_level: TaskLevel, plan: LoweredPlan | None = None) -> None:
    """Refuse, before building anything, a job whose simulation would exceed MAX_SIM_PHASES. plan: a strategy
    tree's, whose schedule may run another number of micro-batches than the job's, and whose computation
    splits lower their layers op by op (compile.splits)."""
    op_level = task_level == "op" or (plan is not None and bool(plan.op_splits))
    per_micro_batch = sum(layer.count * (len(layer.fwd) + len(layer.bwd) if op_level else 2)
                          for layer in graph.layers)
    micro_batches = max(1, job.parallel.num_micro_batches, plan.num_micro_batches if plan is not None else 0)
    phases = micro_batches * per_micro_batch
    if phases > MAX_SIM_PHASES:
        raise ConfigError("engine", "sim", f"the simulation would run {phases} layer-phases ("
                          f"{micro_batches} micro-batches x {per_micro_batch} per micro-batch at "
                          f"task level {'op' if op_level else task_level}), more than the {MAX_SIM_PHASES} it is "
                          "bounded to; use --engine analytical, or fewer micro-batches")


def sim_options(cal: Calibration, *, overlap: bool = True, sharing: bool = True) -> SimOptions:
    """Runtime behaviours from the calibration: the overlap slow-down (gamma) of the simulator's own fit where
    the calibration has one (sim_runtime), else of its runtime; bandwidth sharing on."""
    runtime = cal.sim_runtime or cal.runtime
    gamma = runtime.overlap_slowdown if overlap else 0.0
    return SimOptions(overlap_slowdown=gamma, bandwidth_sharing=sharing, launch_overhead_s=0.0)


def sim_calibration(cal: Calibration | None = None) -> Calibration:
    """The calibration with the simulator's own fit of the runtime behaviours (RuntimeParams) in place."""
    cal = cal or load_calibration()
    if cal.sim_runtime is None:
        return cal
    return cal.model_copy(update={"runtime": cal.sim_runtime, "sim_runtime": None})


@dataclass(frozen=True, slots=True)
class SimRun:
    """What one simulation built and ran."""

    job: Job
    plan: LoweredPlan
    graph: ExecGraph
    outcome: SimOutcome
    bottleneck_device: int
    busy_s: list[dict[str, float]]  # per device, seconds of compute-stream work per category (busy_by_device)


class SimEstimator:
    """Estimator "sim". pricer: the costs (default: the calibrated roofline with the simulator's own runtime
    fit, sim_calibration); overlap: apply the overlap slow-down; sharing: share links between concurrent
    transfers; task_level: "layer" (one task per layer-phase) or "op" (one per op)."""

    name = "sim"

    def __init__(self, pricer: Pricer | None = None, *, overlap: bool = True, sharing: bool = True,
                 task_level: TaskLevel = "layer",
                 overlap_factors: Mapping[tuple[str, str], float] | None = None) -> None:
        if task_level not in TASK_LEVELS:
            raise ConfigError("task_level", task_level, f"choose one of: {', '.join(TASK_LEVELS)}")
        self.pricer = pricer or Pricer(sim_calibration())
        self.options = sim_options(self.pricer.cal, overlap=overlap, sharing=sharing)
        self.task_level: TaskLevel = task_level
        # gamma measured per device and model family (catalog.overlap, `trainsim profile --overlap`)
        self.overlap_factors = (overlap_factors if overlap_factors is not None else load_overlap_factors()) \
            if overlap else {}

    def options_for(self, job: Job) -> SimOptions:
        """The runtime behaviours of this job: the measured gamma of its device and model family if stored."""
        gamma = self.overlap_factors.get((job.cluster.device.name, model_family(job.model)))
        return self.options if gamma is None else dataclasses.replace(self.options, overlap_slowdown=gamma)

    def run(self, job: Job, graph: OpGraph, plan: LoweredPlan | None = None) -> SimRun:
        """Compile and simulate; the plan defaults to the strategy's even placement."""
        check_sim_size(job, graph, self.task_level, plan)
        plan = plan or default_plan(graph, job.parallel)
        with collector_paused():  # NB: hundreds of thousands of acyclic task objects
            exec_graph = compile_job(job, plan, self.pricer, self.task_level)
            outcome = simulate(exec_graph, self.options_for(job))
        busy = busy_by_device(exec_graph, outcome)
        return SimRun(job, plan, exec_graph, outcome, bottleneck_device(exec_graph, outcome, busy), busy)

    def estimate(self, job: Job, graph: OpGraph, plan: LoweredPlan | None = None) -> Result:
        run = self.run(job, graph, plan)
        breakdown = sim_breakdown(run.graph, run.outcome, run.bottleneck_device, run.busy_s)
        names = tuple(f"stage {d.stage} ({d.ranks} ranks)" for d in run.graph.devices)
        timeline = Timeline(exec_graph=run.graph, outcome=run.outcome, device_names=names)
        memory = sim_memory(run.outcome)
        notes = []
        if memory.oom:
            notes.append(f"out of memory on stage {_peak_device(run.outcome)}: peak "
                         f"{memory.peak_bytes / 2**30:.2f} GiB > {memory.capacity_bytes / 2**30:.2f} GiB")
        return make_result(self.name, job, graph, breakdown, memory, notes=notes, timeline=timeline,
                           calibration=self.pricer.cal, repeated_flops=stage_repeated_flops(job, run.plan))


def busy_by_device(graph: ExecGraph, outcome: SimOutcome) -> list[dict[str, float]]:
    """Per device, seconds of compute-stream work per category (from the simulated start and end times), each
    summed in tid order."""
    busy: list[dict[str, float]] = [{} for _ in graph.devices]
    start, end = outcome.start_s, outcome.end_s
    columns = graph.columns()
    category, device = columns.category, columns.device
    for tid in compress(range(len(category)), looked_up(IS_COMPUTE, columns.stream)):  # NB: filtered in C
        name = category[tid]
        if name:
            row = busy[device[tid]]
            row[name] = row.get(name, 0.0) + end[tid] - start[tid]
    return busy


def bottleneck_device(graph: ExecGraph, outcome: SimOutcome, busy: list[dict[str, float]] | None = None) -> int:
    """The device busy longest: compute-stream work plus communication no compute hides. busy: busy_by_device's,
    where the caller has it."""
    busy = busy_by_device(graph, outcome) if busy is None else busy
    totals = [sum(busy[d].values()) + sum(outcome.exposed_by_device_s[d].values()) for d in range(len(busy))]
    return max(range(len(totals)), key=lambda d: (totals[d], -d)) if totals else 0


def sim_breakdown(graph: ExecGraph, outcome: SimOutcome, device: int,
                  busy_s: list[dict[str, float]] | None = None) -> dict[str, float]:
    """Where the makespan goes on `device`; the values add up to the makespan. busy_s: busy_by_device's, where the
    caller has it."""
    if busy_s is None and graph.devices:
        busy_s = busy_by_device(graph, outcome)
    busy = busy_s[device] if busy_s is not None and graph.devices else {}
    exposed = outcome.exposed_by_device_s[device] if graph.devices else {}
    parts: dict[str, float] = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    for name, seconds in (*busy.items(), *exposed.items()):
        parts[name] = parts.get(name, 0.0) + seconds
    makespan = outcome.makespan_s
    used = sum(seconds for name, seconds in parts.items() if name != "bubble")
    if used > makespan > 0.0:
        # NB: two communication categories exposed at the same moment are both counted; scale the exposed
        # communication so the breakdown still adds up.
        comm = sum(exposed.values())
        scale = max(0.0, (comm - (used - makespan)) / comm) if comm > 0.0 else 1.0
        for name, seconds in exposed.items():
            parts[name] -= seconds * (1.0 - scale)
        used = sum(seconds for name, seconds in parts.items() if name != "bubble")
    parts["bubble"] = max(0.0, makespan - used)
    return {name: seconds for name, seconds in parts.items() if seconds != 0.0 or name in ("compute", "bubble")}


def _peak_device(outcome: SimOutcome) -> int:
    """The device nearest its capacity (the highest peak where all have the same capacity; where a cluster's
    ranks differ, compile.device_classes, a smaller device may run out first)."""
    memory = outcome.memory
    def fill(d: int) -> float:
        capacity = memory[d].capacity_bytes
        return memory[d].peak_bytes / capacity if capacity > 0.0 else memory[d].peak_bytes

    return max(range(len(memory)), key=fill) if memory else 0


def sim_memory(outcome: SimOutcome) -> MemoryEstimate:
    """Peak of the simulated device nearest its capacity, with that device's breakdown at its peak."""
    if not outcome.memory:
        return MemoryEstimate(0.0, 0.0, {}, 0)
    device = _peak_device(outcome)
    memory = outcome.memory[device]
    return MemoryEstimate(memory.peak_bytes, memory.capacity_bytes, dict(memory.breakdown_at_peak), device)
