"""L2 simulation engine: compile the job into an ExecGraph and run it through the event simulator.

Same costs as the analytical engine (layer_cost, collective_time_s), composed by a schedule instead of a
formula: the pipeline order, the overlap of gradient communication with the backward pass, ZeRO-3 prefetch,
and (optionally) the overlap slow-down and bandwidth sharing of Proteus (sec. VI-C). With both switched off
the two engines agree within 2% on the calibration runs (tests/validation/test_sim_vs_analytical.py).

Breakdown: on the bottleneck device (the one busy longest), the time of each compute-stream category and the
exposed time of each communication category (while no compute runs there); "bubble" is the rest of the
makespan, so the values add up to the iteration time.
"""

import gc
from dataclasses import dataclass

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.comm.collectives import CommCostModel
from trainsim.compile.build import compile_job
from trainsim.compile.context import TASK_LEVELS, TaskLevel
from trainsim.cost.compute import OpCostModel
from trainsim.cost.memory import MemoryEstimate
from trainsim.cost.step import StepCosts
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator, make_result
from trainsim.estimate.result import Result
from trainsim.ir.exec_graph import ExecGraph
from trainsim.job import Job
from trainsim.sim import SimOptions, SimOutcome, simulate
from trainsim.strategy.lowered import LoweredPlan, default_plan

BREAKDOWN_ORDER = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
                   "optimizer", "overhead")


def sim_options(cal: Calibration, *, overlap: bool = True, sharing: bool = True) -> SimOptions:
    """Runtime behaviours from the calibration: the overlap slow-down (gamma) where the calibration has one
    (RuntimeParams.overlap_slowdown; 0 until it is fitted), bandwidth sharing on."""
    gamma = cal.runtime.overlap_slowdown if overlap else 0.0
    return SimOptions(overlap_slowdown=gamma, bandwidth_sharing=sharing, launch_overhead_s=0.0)


def sim_calibration(cal: Calibration | None = None) -> Calibration:
    """The calibration with the simulator's own fit of the runtime behaviours (RuntimeParams) in place."""
    cal = cal or load_calibration()
    if cal.sim_runtime is None:
        return cal
    return cal.model_copy(update={"runtime": cal.sim_runtime, "sim_runtime": None})


@dataclass(frozen=True, slots=True)
class SimRun:
    """What one estimate built and simulated, kept for --trace and --explain."""

    job: Job
    plan: LoweredPlan
    graph: ExecGraph
    outcome: SimOutcome
    bottleneck_device: int


class SimEstimator:
    """Estimator "sim". overlap: apply the overlap slow-down; sharing: share links between concurrent
    transfers; task_level: "layer" (one task per layer-phase) or "op" (one per op); op_costs / step_costs /
    comm_costs: where op times, the optimizer step and overheads, and collective times come from (default: the
    calibrated roofline, fits and alpha-beta model);
    analytical: an analytical engine whose costs and runtime to use as they are, instead of all of these."""

    name = "sim"

    def __init__(self, calibration: Calibration | None = None, *, overlap: bool = True, sharing: bool = True,
                 task_level: TaskLevel = "layer", analytical: AnalyticalEstimator | None = None,
                 op_costs: OpCostModel | None = None, step_costs: StepCosts | None = None,
                 comm_costs: CommCostModel | None = None) -> None:
        if task_level not in TASK_LEVELS:
            raise ConfigError("task_level", task_level, f"choose one of: {', '.join(TASK_LEVELS)}")
        cal = calibration or (analytical.cal if analytical is not None else load_calibration())
        sim_runtime = cal.sim_runtime
        if analytical is None:
            cal = sim_calibration(cal)
        self.cal = cal
        # A given analytical estimator keeps its own costs and runtime (e.g. profiled op costs).
        self.analytical = analytical or AnalyticalEstimator(self.cal, op_costs=op_costs, step_costs=step_costs,
                                                            comm_costs=comm_costs)
        gamma_from = cal.model_copy(update={"runtime": sim_runtime}) if sim_runtime is not None else cal
        self.options = sim_options(gamma_from, overlap=overlap, sharing=sharing)
        self.task_level: TaskLevel = task_level
        self.last: SimRun | None = None

    @property
    def last_graph(self) -> ExecGraph | None:
        return self.last.graph if self.last is not None else None

    @property
    def last_outcome(self) -> SimOutcome | None:
        return self.last.outcome if self.last is not None else None

    def run(self, job: Job, plan: LoweredPlan | None = None) -> SimRun:
        """Compile and simulate; the plan defaults to the strategy's even placement."""
        graph_ir = self.analytical.graph(job)
        plan = plan or default_plan(graph_ir, job.parallel)
        collecting = gc.isenabled()
        gc.disable()  # NB: hundreds of thousands of acyclic task objects; the cyclic collector only slows it down
        try:
            graph = compile_job(job, plan, self.analytical, self.task_level)
            outcome = simulate(graph, self.options)
        finally:
            if collecting:
                gc.enable()
        run = SimRun(job, plan, graph, outcome, bottleneck_device(graph, outcome))
        self.last = run
        return run

    def estimate(self, job: Job, plan: LoweredPlan | None = None) -> Result:
        run = self.run(job, plan)
        breakdown = sim_breakdown(run.graph, run.outcome, run.bottleneck_device)
        result = make_result(self.name, job, self.analytical.graph(job), breakdown, sim_memory(run.outcome))
        if result.oom:
            result.notes.append(f"out of memory on stage {_peak_device(run.outcome)}: peak "
                                f"{result.peak_memory_bytes / 2**30:.2f} GiB > "
                                f"{result.memory_capacity_bytes / 2**30:.2f} GiB")
        return result


def _busy_by_device(graph: ExecGraph, outcome: SimOutcome) -> list[dict[str, float]]:
    """Per device, seconds of compute-stream work per category (from the simulated start and end times)."""
    busy: list[dict[str, float]] = [{} for _ in graph.devices]
    start, end = outcome.start_s, outcome.end_s
    for task in graph.tasks:
        if task.stream == "compute" and task.category:
            row = busy[task.device]
            row[task.category] = row.get(task.category, 0.0) + end[task.tid] - start[task.tid]
    return busy


def bottleneck_device(graph: ExecGraph, outcome: SimOutcome) -> int:
    """The device busy longest: compute-stream work plus communication no compute hides."""
    busy = _busy_by_device(graph, outcome)
    totals = [sum(busy[d].values()) + sum(outcome.exposed_by_device_s[d].values()) for d in range(len(busy))]
    return max(range(len(totals)), key=lambda d: (totals[d], -d)) if totals else 0


def sim_breakdown(graph: ExecGraph, outcome: SimOutcome, device: int) -> dict[str, float]:
    """Where the makespan goes on `device`; the values add up to the makespan."""
    busy = _busy_by_device(graph, outcome)[device] if graph.devices else {}
    exposed = outcome.exposed_by_device_s[device] if graph.devices else {}
    parts: dict[str, float] = dict.fromkeys(BREAKDOWN_ORDER, 0.0)
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
    return max(range(len(outcome.memory)), key=lambda d: outcome.memory[d].peak_bytes) if outcome.memory else 0


def sim_memory(outcome: SimOutcome) -> MemoryEstimate:
    """Peak over the simulated devices, with that device's breakdown at its peak."""
    if not outcome.memory:
        return MemoryEstimate(0.0, 0.0, {}, 0)
    device = _peak_device(outcome)
    memory = outcome.memory[device]
    return MemoryEstimate(memory.peak_bytes, memory.capacity_bytes, dict(memory.breakdown_at_peak), device)
