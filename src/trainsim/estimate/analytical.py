"""L0 analytical engine: closed-form iteration time from the op graph, the strategy and the costs.

iteration = m * t_stage(bottleneck) + bubble + exposed gradient communication + optimizer step, where
t_stage is one micro-batch's forward, backward and recompute on a stage plus its feature communication
(TP, CP, EP collectives and pipeline sends), and the bubble follows the schedule:
(sum_i t_i - t_max) / v, which is (p - 1) t / v for equal stages (Narayanan et al. 2021) and the PredTOP
formula T = sum(t_i) + (m - 1) max(t_j) for v = 1.
"""

from dataclasses import dataclass
from typing import Literal

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.comm.collectives import AlphaBetaComm, CommCostModel
from trainsim.cost.compute import OpCostModel, RooflineCosts
from trainsim.cost.memory import MemoryEstimate, estimate_memory, optimizer_shards
from trainsim.cost.step import FittedStepCosts, StepCosts
from trainsim.estimate.result import Result
from trainsim.frontends.catalog.build import build_graph
from trainsim.hardware.cluster import ClusterSpec, GroupLayout
from trainsim.ir.graph import Layer, Op, OpGraph
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stages import StagePart, partition_stages

BUCKET_BYTES = 40e6 * 2  # NB: Megatron-LM's default gradient bucket: 40M elements


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One micro-batch through one layer on one device, in seconds."""

    fwd_s: float
    bwd_s: float
    selective_s: float  # the part of forward that selective recompute repeats
    comm_s: dict[str, float]  # axis -> feature-communication seconds (forward + backward)
    comm_fwd_s: float  # forward feature communication (repeated by full recompute)
    wgrad_s: float = 0.0  # the weight-gradient GEMMs of backward (what zero-bubble schedules defer)


@dataclass(frozen=True, slots=True)
class StageCost:
    compute_s: float
    recompute_s: float
    comm_s: dict[str, float]
    fsdp_exposed_s: float
    overhead_s: float = 0.0
    wgrad_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + sum(self.comm_s.values()) + self.fsdp_exposed_s + self.overhead_s


def axis_layout(axis: str, par: ParallelSpec, cluster: ClusterSpec) -> GroupLayout:
    """Ranks are ordered tp (fastest), cp, dp, pp; ep groups are made of data-parallel ranks."""
    size, stride = {
        "tp": (par.tp, 1),
        "cp": (par.cp, par.tp),
        "dp": (par.dp, par.tp * par.cp),
        "ep": (par.ep, par.tp * par.cp),
        "pp": (min(par.pp, 2), par.tp * par.cp * par.dp),
    }[axis]
    return cluster.group_layout(size, stride)


class AnalyticalEstimator:
    """Holds the calibration and the caches of one run (graphs, layer costs); no module-level state."""

    name = "analytical"

    def __init__(self, calibration: Calibration | None = None,
                 graphs: dict[tuple[object, ...], OpGraph] | None = None, op_costs: OpCostModel | None = None,
                 step_costs: StepCosts | None = None, comm_costs: CommCostModel | None = None) -> None:
        """graphs: a graph cache to share between estimators that differ only in calibration.
        op_costs: where op times come from (default: the calibrated roofline).
        step_costs: the optimizer step and fixed overheads (default: the roofline and the fitted overheads).
        comm_costs: collective times (default: the calibrated alpha-beta model over the topology)."""
        self.cal = calibration or load_calibration()
        self.op_costs: OpCostModel = op_costs or RooflineCosts(self.cal)
        self.step_costs: StepCosts = step_costs or FittedStepCosts(self.cal)
        self.comm_costs: CommCostModel = comm_costs or AlphaBetaComm(self.cal)
        self._graphs: dict[tuple[object, ...], OpGraph] = {} if graphs is None else graphs
        self._layer_costs: dict[tuple[object, ...], LayerCost] = {}

    def graph(self, job: Job) -> OpGraph:
        par = job.parallel
        dev = DeviceSlice.of(par)
        key = (job.model.name, id(job.model), dev)
        if key not in self._graphs:
            self._graphs[key] = build_graph(job.model, dev)
        return self._graphs[key]

    def layer_cost(self, layer: Layer, job: Job) -> LayerCost:
        cluster = job.cluster
        key = (id(layer), id(cluster.device), cluster.intra_node, cluster.inter_node, cluster.nics_per_node,
               _layout_key(job))
        cost = self._layer_costs.get(key)
        if cost is None:
            cost = self._compute_layer_cost(layer, job)
            self._layer_costs[key] = cost
        return cost

    def _compute_layer_cost(self, layer: Layer, job: Job) -> LayerCost:
        device = job.cluster.device
        comm: dict[str, float] = {}
        comm_fwd = 0.0
        for c in layer.comms:
            if c.axis == "pp":
                continue
            comm_s = self.comm_costs.collective_time_s(c.collective, c.buffer_bytes,
                                                       axis_layout(c.axis, job.parallel, job.cluster), job.cluster)
            comm[c.axis] = comm.get(c.axis, 0.0) + comm_s
            if c.phase == "fwd":
                comm_fwd += comm_s

        def seconds(ops: tuple[Op, ...]) -> float:
            return sum(self.op_costs.op_time_s(op, device) for op in ops)

        selective = seconds(tuple(op for op in layer.fwd if op.recompute_selective))
        wgrad = seconds(tuple(op for op in layer.bwd if op.name.endswith(".wgrad")))
        return LayerCost(seconds(layer.fwd), seconds(layer.bwd), selective, comm, comm_fwd, wgrad)

    def stage_cost(self, stage: list[StagePart], job: Job) -> StageCost:
        par = job.parallel
        compute = recompute = fsdp = wgrad = 0.0
        comm: dict[str, float] = {}
        for part in stage:
            cost = self.layer_cost(part.layer, job)
            compute += part.count * (cost.fwd_s + cost.bwd_s)
            wgrad += part.count * cost.wgrad_s
            if par.recompute == "full" and part.layer.kind not in ("embedding", "head"):
                recompute += part.count * (cost.fwd_s + cost.comm_fwd_s)
            elif par.recompute == "selective":
                recompute += part.count * cost.selective_s
            for axis, seconds in cost.comm_s.items():
                comm[axis] = comm.get(axis, 0.0) + part.count * seconds
            if par.zero >= 3:
                fsdp += part.count * self._fsdp_exposed_s(part.layer, cost, job)
        if par.pp > 1:
            comm["pp"] = self._pipeline_send_s(stage, job)
        return StageCost(compute, recompute, comm, fsdp, self.micro_batch_overhead_s(stage, job), wgrad)

    def micro_batch_overhead_s(self, stage: list[StagePart], job: Job) -> float:
        ops = sum(part.count * (len(part.layer.fwd) + len(part.layer.bwd)) for part in stage)
        layers = sum(part.count for part in stage if part.layer.kind not in ("embedding", "head"))
        return self.step_costs.micro_batch_overhead_s(round(ops), round(layers), job.parallel, job.cluster.device)

    def overlap(self, kind: Literal["dp", "fsdp"], job: Job) -> float:
        """The fraction of compute that hides gradient reductions (dp) or ZeRO-3 gathers (fsdp): the fitted
        one, or none on a device whose collectives take the cores that compute (a CPU with gloo)."""
        if not job.cluster.device.comm_overlaps_compute:
            return 0.0
        return self.cal.runtime.dp_overlap if kind == "dp" else self.cal.runtime.fsdp_overlap

    def iteration_overhead_s(self, job: Job) -> float:
        return self.step_costs.iteration_overhead_s(job.cluster.device)

    def _pipeline_send_s(self, stage: list[StagePart], job: Job) -> float:
        """Each micro-batch sends its activation forward and its gradient backward once per model chunk."""
        par = job.parallel
        out_bytes = max(part.layer.output_bytes for part in stage)
        one = self.comm_costs.collective_time_s("send-recv", out_bytes, axis_layout("pp", par, job.cluster),
                                                job.cluster)
        return 2.0 * par.vpp * one + self.cal.runtime.pipeline_overhead_per_micro_batch_s

    def _fsdp_exposed_s(self, layer: Layer, cost: LayerCost, job: Job) -> float:
        """ZeRO-3/FSDP: per micro-batch, all-gather weights for forward and backward, reduce-scatter
        gradients; prefetching hides them under the layer's compute up to fsdp_overlap."""
        par = job.parallel
        policy = policy_for(par.precision)
        layout = job.cluster.group_layout(par.dp * par.cp, par.tp)
        comm = self.comm_costs
        gather = comm.collective_time_s("all-gather", layer.param_count * policy.weight_bytes, layout, job.cluster)
        scatter = comm.collective_time_s("reduce-scatter", layer.param_count * policy.grad_bytes, layout,
                                         job.cluster)
        overlap = self.overlap("fsdp", job)
        return max(0.0, gather - overlap * cost.fwd_s) + max(0.0, gather + scatter - overlap * cost.bwd_s)

    def estimate(self, job: Job) -> Result:
        par = job.parallel
        graph = self.graph(job)
        stages = partition_stages(graph, par.pp)
        costs = [self.stage_cost(stage, job) for stage in stages]
        bottleneck = max(range(len(costs)), key=lambda i: costs[i].total_s)
        slow = costs[bottleneck]
        m = par.num_micro_batches
        bubble = (sum(c.total_s for c in costs) - slow.total_s) / par.vpp
        if par.schedule == "zb-h1":
            # Qi et al. 2023 (zero bubble), ZB-H1: deferring the weight-gradient GEMMs W into the bubble turns
            # 1F1B's (p-1)(F+B+W) into (p-1)(F+B-W) at 1F1B's memory.
            bubble *= max(0.0, 1.0 - 2.0 * slow.wgrad_s / slow.total_s)
        grad_exposed = self._gradient_sync_exposed_s(stages[bottleneck], slow, job)
        optimizer = self.optimizer_step_s(stages, job)
        breakdown = {
            "compute": m * slow.compute_s,
            "recompute": m * slow.recompute_s,
            **{f"{axis}_comm": m * seconds for axis, seconds in slow.comm_s.items()},
            "dp_comm": grad_exposed + m * slow.fsdp_exposed_s,
            "bubble": bubble,
            "optimizer": optimizer,
            "overhead": self.iteration_overhead_s(job) + m * slow.overhead_s,
        }
        memory = estimate_memory(stages, par, job.cluster.device)
        return make_result(self.name, job, graph, breakdown, memory)

    def _gradient_sync_exposed_s(self, stage: list[StagePart], cost: StageCost, job: Job) -> float:
        """DP gradient reduction (ZeRO 0: all-reduce; 1-2: reduce-scatter + parameter all-gather), bucketed
        and overlapped with the last micro-batch's backward pass; the last bucket is always exposed."""
        par = job.parallel
        if par.dp * par.cp == 1 or par.zero >= 3:
            return 0.0
        policy = policy_for(par.precision)
        params = sum(part.count * part.layer.param_count for part in stage)
        layout = job.cluster.group_layout(par.dp * par.cp, par.tp)
        grad_bytes = params * policy.grad_bytes
        if par.zero == 0:
            total = self.comm_costs.collective_time_s("all-reduce", grad_bytes, layout, job.cluster)
        else:
            total = self.comm_costs.collective_time_s("reduce-scatter", grad_bytes, layout, job.cluster) + \
                self.comm_costs.collective_time_s("all-gather", params * policy.weight_bytes, layout, job.cluster)
        buckets = max(1.0, grad_bytes / BUCKET_BYTES)
        window = self.overlap("dp", job) * cost.compute_s / 3.0 * 2.0  # backward ~ 2/3 of fwd + bwd
        return max(total - window, total / buckets)

    def optimizer_step_s(self, stages: list[list[StagePart]], job: Job) -> float:
        """The optimizer step of the stage with the most parameters, over the parameters one GPU owns."""
        par = job.parallel
        params = max(sum(part.count * part.layer.param_count for part in stage) for stage in stages)
        return self.step_costs.optimizer_step_s(params / optimizer_shards(par), par.precision, job.cluster.device)


def _layout_key(job: Job) -> str:
    par = job.parallel
    return f"{par.tp}.{par.cp}.{par.dp}.{par.ep}.{par.pp}.{job.cluster.gpus_per_node}.{job.cluster.num_nodes}"


def make_result(engine: str, job: Job, graph: OpGraph, breakdown: dict[str, float],
                memory: MemoryEstimate) -> Result:
    par = job.parallel
    breakdown = with_shared_cores(breakdown, job.cluster.device.compute_share)
    iteration = sum(breakdown.values())
    full_graph_flops = graph.total_flops("fwd") + graph.total_flops("bwd")
    # The graph is one device's share of one micro-batch: scale to the whole iteration.
    shards = par.tp * par.cp
    model_flops = full_graph_flops * shards * par.global_batch / par.micro_batch
    # NB: hardware FLOPs add the repeated forward of full recompute (selective recompute's share is small
    # and left out).
    fwd_share = graph.total_flops("fwd") / max(full_graph_flops, 1e-30)
    hardware_flops = model_flops * (1.0 + (fwd_share if par.recompute == "full" else 0.0))
    peak = job.cluster.device.peak_for(policy_for(par.precision).linear_dtype)
    achieved = model_flops / iteration / job.num_gpus
    return Result(
        engine=engine, job=job.describe(), iteration_time_s=iteration,
        tokens_per_s=job.tokens_per_iteration / iteration, samples_per_s=par.global_batch / iteration,
        model_flops_per_iteration=model_flops, hardware_flops_per_iteration=hardware_flops,
        tflops_per_gpu=achieved / 1e12, mfu=achieved / peak,
        hfu=hardware_flops / iteration / job.num_gpus / peak, peak_flops_per_gpu=peak,
        peak_memory_bytes=memory.peak_bytes, memory_capacity_bytes=memory.capacity_bytes, oom=memory.oom,
        breakdown=breakdown, memory_breakdown=memory.breakdown, notes=_kernel_notes(job),
    )


def _kernel_notes(job: Job) -> list[str]:
    device = job.cluster.device
    if job.parallel.attention == "flash3" and "flash3" not in device.attention_kernels:
        return [f"attention=flash3: {device.name} has no Hopper-native attention kernel; costed as flash2"]
    return []


def with_shared_cores(breakdown: dict[str, float], share: float) -> dict[str, float]:
    """Ranks that outnumber a host's cores (compute_share < 1) take turns on them. A rank waiting in a pipeline
    bubble leaves its core to the others; every other second of its step needs one. So the step lasts at least
    (iteration - bubble) / share; the difference is the `core_sharing` entry of the breakdown."""
    if share >= 1.0:
        return breakdown
    total = sum(breakdown.values())
    waiting = (total - breakdown.get("bubble", 0.0)) / share - total
    return {**breakdown, "core_sharing": max(0.0, waiting)}
