"""L0 analytical engine: closed-form iteration time from the op graph, the strategy and the prices.

iteration = m * t_stage(bottleneck) + bubble + exposed gradient communication + optimizer step, where
t_stage is one micro-batch's forward, backward and recompute on a stage plus its feature communication
(TP, CP, EP collectives and pipeline sends), and the bubble follows the schedule:
(sum_i t_i - t_max) / v, which is (p - 1) t / v for equal stages (Narayanan et al. 2021) and the PredTOP
formula T = sum(t_i) + (m - 1) max(t_j) for v = 1; for an uneven split (strategy.stages: first/last stage
layers, embedding/loss counted, a stage list, layers that do not divide pp x vpp) the stage-by-stage idle time
of uneven_bubble_s. An interleaved pipeline whose stack overlaps its sends still waits for their latency on its
fill and drain (Pricer.pipeline_chain_s), which the bubble adds. Every price comes from the pricing service
(cost.pricing).

A search prices thousands of plans with one estimator: `price` gives the numbers it ranks plans by (iteration
time, throughput, peak memory) and assembles the full Result only when asked (PlanPrice.result), so a search
builds Results only for the plans it reports. `estimate` is `price(...).result()`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainsim.catalog.calibration import Calibration
from trainsim.cost.memory import MemoryEstimate
from trainsim.cost.pricing import Partition, Pricer, StageCost
from trainsim.cost.rank_classes import DeviceClass, uniform
from trainsim.estimate.interleaved_rounds import interleaved_terms_s
from trainsim.estimate.result import Result, iteration_time_s, make_result, tokens_per_s
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.strategy.front_end_splits import refuse_whole_model_tp

if TYPE_CHECKING:  # NB: lowered plans (strategy trees) load with the engines that place layers
    from trainsim.strategy.lowered import LoweredPlan


@dataclass(frozen=True, slots=True)
class PlanPrice:
    """One plan priced by the analytical engine: its breakdown and memory, and what follows from them for
    ranking; result() makes the Result that `estimate` returns."""

    engine: str
    job: Job
    graph: OpGraph
    breakdown: dict[str, float]
    memory: MemoryEstimate
    iteration_time_s: float
    calibration: Calibration | None = None  # the fit the plan was priced with: its held-out errors, the band

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_s(self.job, self.iteration_time_s)

    @property
    def peak_memory_bytes(self) -> float:
        return self.memory.peak_bytes

    @property
    def oom(self) -> bool:
        return self.memory.oom

    def result(self) -> Result:
        return make_result(self.engine, self.job, self.graph, self.breakdown, self.memory,
                           calibration=self.calibration)


def uneven_bubble_s(schedule: str, totals: list[float], forward: Sequence[float], m: int,
                    chunk_shares: tuple[tuple[float, ...], ...] = (), sends: Sequence[float] = ()) -> float:
    """The pipeline's idle time on its bottleneck beyond m x the slowest stage, for stages of unequal times.

    GPipe: (sum_i t_i - max_j t_j) (a flow shop of identical jobs, forward then backward). 1F1B and its
    interleaved form: the largest over the stages k of the time k is idle: the fill and drain of chunk 0 on the
    stages before it, sum_{i<k} t_i0, m (t_k - t_max) (negative: k is faster than the slowest), and the two
    stalls while k waits for its first (last) gradient: the round trip R_k = sum_{j>k} t_j,v-1 of its last
    chunk through the later stages, less the w_k forwards (backwards) of chunk size it runs meanwhile,
    w_k = p - k - 1 for 1F1B, 2 (p - k - 1) for interleaved 1F1B (Megatron-LM's warm-up count); t_ic = t_i x
    chunk c's share (chunk_shares; 1 for 1F1B). For equal stages it is (p - 1) t / v (Narayanan et al. 2021).
    Interleaved (estimate.interleaved_rounds): k enters the pipeline at the first forward of the chunk whose
    warm-up path is longest and leaves it after the last backward of the chunk whose drain is longest
    (fill_drain_extra_s, 0 for equal stages), and each of the m / p - 1 steady rounds after the first waits
    for k's longest stall on a neighbour no slower than itself (steady_waits.steady_stalls_s, 0 for equal chunks).
    forward: per stage, the forward pass's share of its time; sends: per stage, its pipeline sends (in totals;
    each chunk sends once forward and once backward: an even share per chunk, not the chunk's compute share).
    """
    p = len(totals)
    if schedule == "gpipe":
        return sum(totals) - max(totals)
    interleaved = bool(chunk_shares)
    first = [t * share[0] for t, share in zip(totals, chunk_shares, strict=True)] if interleaved else totals
    last = [t * share[-1] for t, share in zip(totals, chunk_shares, strict=True)] if interleaved else totals
    slowest = max(totals)
    per_warm_up = 2 if interleaved else 1
    later = [0.0] * p  # later[k] = sum of last[k + 1:]
    for k in range(p - 2, -1, -1):
        later[k] = later[k + 1] + last[k + 1]
    # NB: what differing chunks add depends on the stage times only, not on m: once per set of them
    terms = interleaved_terms_s(tuple(totals), tuple(forward), chunk_shares, tuple(sends)) if interleaved else None
    idles = [0.0] * p
    bubble = fill = 0.0
    # NB: comparisons, not max(): a search prices this for every uneven plan
    for k in range(p):
        round_trip = later[k]
        warm = (p - k - 1) * per_warm_up
        fwd = forward[k] * last[k]
        idle = fill + m * (totals[k] - slowest)
        if terms is not None:
            idle += terms[0][k]
        stall = round_trip - warm * fwd
        if stall > 0.0:
            idle += stall
        stall = round_trip - warm * (last[k] - fwd)
        if stall > 0.0:
            idle += stall
        idles[k] = idle
        if idle > bubble:
            bubble = idle
        fill += first[k]
    if terms is not None and m > p:
        rounds = m // p - 1  # steady rounds after the first
        for idle, stall in zip(idles, terms[1], strict=True):
            if idle + rounds * stall > bubble:
                bubble = idle + rounds * stall
    return bubble


class AnalyticalEstimator:
    """Estimator "analytical". pricer: the costs (default: the calibrated roofline); its caches serve every
    job this estimator prices."""

    name = "analytical"

    def __init__(self, pricer: Pricer | None = None) -> None:
        self.pricer = pricer or Pricer()

    def estimate(self, job: Job, graph: OpGraph, plan: "LoweredPlan | None" = None) -> Result:
        """plan: a strategy tree's that places layers as the strategy's default plan does (the closed form's
        even placement) and may give ops their own configs over tp: its layers shaped by them
        (compile.shape_layers.shaped_graph; ConfigError for a plan that places, schedules or splits otherwise).
        The model FLOPs (MFU) are the unshaped graph's; what the shaped ops repeat on several tp ranks counts in
        HFU only (compile.shape_layers.repeated_flops, from the same shaping), as in the simulator."""
        if plan is None:
            refuse_whole_model_tp(graph.frontend, job.parallel.tp)
            if graph.frontend == "catalog" or job.parallel.cp == 1:
                return self.price(job, graph).result()
            from trainsim.strategy.lowered import default_plan  # NB: loaded for a captured graph under cp only

            plan = default_plan(graph, job.parallel)  # shaped on its ranks' sequence shares (compile.shape_layers)
        from trainsim.compile.shape_layers import shaped_graph_and_repeated_flops  # NB: loaded for a tree only

        shaped, repeated = shaped_graph_and_repeated_flops(job, graph, plan)
        price = self.price(job, shaped)
        if shaped is graph:
            return price.result()
        return make_result(self.name, job, graph, price.breakdown, price.memory, calibration=price.calibration,
                           repeated_flops=repeated)

    def price(self, job: Job, graph: OpGraph) -> PlanPrice:
        """The closed form for one plan; the Result waits for PlanPrice.result()."""
        pricer = self.pricer
        partition = pricer.plan_partition(graph, job.parallel)
        stages = partition.stages
        cluster = job.cluster
        # NB: ranks_differ, inline: a search prices every plan through here
        classes = pricer.device_classes(job) if cluster.rank_devices or cluster.compute_slowdown else None
        if classes is None or uniform(classes):
            breakdown = self._closed_form(pricer.stage_costs(partition, job), partition, graph, job,
                                          pricer.optimizer_step_s(stages, job), pricer.step_overhead_s(stages, job))
        else:
            breakdown = self._classes_closed_form(partition, graph, job, classes)
        return PlanPrice(self.name, job, graph, breakdown, pricer.memory(stages, job),
                         iteration_time_s(job, breakdown), pricer.cal)

    def _classes_closed_form(self, partition: Partition, graph: OpGraph, job: Job,
                             classes: list[DeviceClass]) -> dict[str, float]:
        """Ranks that differ (cost.rank_classes): synchronous training waits at every collective for its slowest
        member. Each device class is a pipeline column whose stages compute at their slowest kind of rank
        (Pricer.class_stage_costs); the data-parallel gradient reduction and the optimizer barrier wait for the
        slowest column, so the iteration is the slowest column's closed form, then the step of the (stage, kind
        of rank) that finishes it last. Where the columns meet inside every micro-batch's compute (expert
        all-to-alls over data-parallel ranks: the next op needs their output) they move in lockstep: one column
        of each stage's slowest class. NB: ZeRO-3's gathers meet every micro-batch too, but ahead of the compute
        that needs them (prefetched): the columns are priced apart there, as the simulator runs them."""
        pricer = self.pricer
        columns = pricer.class_stage_costs(partition, job, classes)
        if any("ep" in cost.comm_s for column in columns for cost in column):
            columns = [[max(stage_costs, key=_total_s) for stage_costs in zip(*columns, strict=True)]]
        optimizer_s, overhead_s = pricer.class_step_s(partition.stages, job, classes)
        slowest: dict[str, float] = {}
        for column in columns:
            breakdown = self._closed_form(column, partition, graph, job, optimizer_s, overhead_s, by_class=True)
            if not slowest or sum(breakdown.values()) > sum(slowest.values()):
                slowest = breakdown
        return slowest

    def _closed_form(self, costs: list[StageCost], partition: Partition, graph: OpGraph, job: Job,
                     optimizer_s: float, step_overhead_s: float, by_class: bool = False) -> dict[str, float]:
        """The breakdown of the pipeline of one micro-batch's stage costs, then the optimizer step and the
        step's overhead (Pricer.step_overhead_s). by_class: the costs are a device class's column (stage times
        that differ by their ranks)."""
        pricer = self.pricer
        par = job.parallel
        stages = partition.stages
        totals = [cost.total_s for cost in costs]
        bottleneck = max(range(len(totals)), key=totals.__getitem__)
        slow = costs[bottleneck]
        m = par.num_micro_batches
        if pricer.plan_split(graph, par) is not None:
            # an uneven split (strategy.stages): the stalls of the warm-up and cool-down, stage by stage
            bubble = uneven_bubble_s(par.schedule, totals, pricer.forward_fractions(partition, job), m,
                                     pricer.chunk_time_shares(partition, job),
                                     [cost.comm_s.get("pp", 0.0) for cost in costs]) + slow.pp_chain_s
        elif by_class and max(totals) > min(totals):
            # an even split whose stages differ by their ranks (a straggler's stage): the same stalls
            shares = ((1.0 / par.vpp,) * par.vpp,) * len(totals) if par.vpp > 1 else ()
            bubble = uneven_bubble_s(par.schedule, totals, [_forward_fraction(cost) for cost in costs], m,
                                     shares, [cost.comm_s.get("pp", 0.0) for cost in costs]) + slow.pp_chain_s
        else:
            bubble = (sum(totals) - slow.total_s) / par.vpp + slow.pp_chain_s  # the interleaved hops waited for
        if par.schedule == "zb-h1":
            # Qi et al. 2023 (zero bubble), ZB-H1: deferring the weight-gradient GEMMs W into the bubble turns
            # 1F1B's (p-1)(F+B+W) into (p-1)(F+B-W) at 1F1B's memory.
            bubble *= max(0.0, 1.0 - 2.0 * slow.wgrad_s / slow.total_s)
        # NB: the first stage finishes its last backward pass last (1F1B and its variants drain from the last
        # stage to the first), so its gradient reduction, not the bottleneck's, is what the step waits for
        grad_exposed = max(pricer.gradient_sync_exposed_s(stages[bottleneck], slow, job),
                           pricer.gradient_sync_exposed_s(stages[0], costs[0], job))
        return {
            "compute": m * slow.compute_s,
            "recompute": m * slow.recompute_s,
            **{f"{axis}_comm": m * seconds for axis, seconds in slow.comm_s.items()},
            "dp_comm": grad_exposed + m * slow.fsdp_exposed_s,
            "bubble": bubble,
            "optimizer": optimizer_s,
            "overhead": step_overhead_s + m * slow.overhead_s,
        }


def _total_s(cost: StageCost) -> float:
    return cost.total_s


def _forward_fraction(cost: StageCost) -> float:
    """The forward pass's share of a stage's compute and feature communication (Pricer.stage_forward_fraction,
    from a stage cost)."""
    whole = cost.compute_s + cost.recompute_s + sum(s for axis, s in cost.comm_s.items() if axis != "pp")
    return (cost.forward_s + cost.feature_fwd_s) / whole if whole > 0.0 else 0.0
