"""The pricing service: what one op, layer, stage, collective, overlap window, optimizer step and the memory of
a job cost on a cluster, for any (graph, plan, cluster, costs). Every engine and the compiler ask it; none asks
another engine.

A Pricer holds the costs (op times, step costs and collective times, with the calibration behind them) and the
caches of one run (layer prices), so a search that prices thousands of plans of one model prices each distinct
layer once per cluster layout.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.comm.collectives import AlphaBetaComm, CommCostModel
from trainsim.cost.compute import OpCostModel, RooflineCosts
from trainsim.cost.memory import MemoryEstimate, estimate_memory, optimizer_shards
from trainsim.cost.profiled import ProfiledComm, ProfiledCosts, ProfiledStepCosts
from trainsim.cost.step import FittedStepCosts, StepCosts
from trainsim.hardware.cluster import ClusterSpec, GroupLayout
from trainsim.ir.graph import Layer, Op
from trainsim.job import Job
from trainsim.profile.database import default_db_path
from trainsim.registry import Registry
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stages import StagePart

BUCKET_BYTES = 40e6 * 2  # NB: Megatron-LM's default gradient bucket: 40M elements

OverlapKind = Literal["dp", "fsdp"]


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
    """One micro-batch through one pipeline stage on one device, in seconds."""

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
    """Ranks are ordered tp (fastest), cp, dp, pp; ep groups are made of data-parallel ranks; "grad" is the
    data-parallel gradient group (dp x cp ranks, stride tp)."""
    size, stride = {
        "tp": (par.tp, 1),
        "cp": (par.cp, par.tp),
        "dp": (par.dp, par.tp * par.cp),
        "ep": (par.ep, par.tp * par.cp),
        "pp": (min(par.pp, 2), par.tp * par.cp * par.dp),
        "grad": (par.dp * par.cp, par.tp),
    }[axis]
    return cluster.group_layout(size, stride)


def _layout_key(job: Job) -> tuple[object, ...]:
    par, cluster = job.parallel, job.cluster
    return (par.tp, par.cp, par.dp, par.ep, par.pp, cluster.gpus_per_node, cluster.num_nodes)


class Pricer:
    """Prices work with one set of costs. calibration: the fitted parameters (runtime overlap, pipeline
    overhead); op_costs / step_costs / comm_costs: where op times, the optimizer step and fixed overheads, and
    collective times come from (default: the calibrated roofline, fitted overheads and alpha-beta model)."""

    def __init__(self, calibration: Calibration | None = None, *, op_costs: OpCostModel | None = None,
                 step_costs: StepCosts | None = None, comm_costs: CommCostModel | None = None) -> None:
        self.cal = calibration or load_calibration()
        self.op_costs: OpCostModel = op_costs or RooflineCosts(self.cal)
        self.step_costs: StepCosts = step_costs or FittedStepCosts(self.cal)
        self.comm_costs: CommCostModel = comm_costs or AlphaBetaComm(self.cal)
        # NB: keyed by the layer's id; each entry keeps its layer alive, so no other layer can take that id.
        self._layer_costs: dict[tuple[object, ...], tuple[Layer, LayerCost]] = {}

    # --- ops and collectives ---

    def op_time_s(self, op: Op, job: Job) -> float:
        return self.op_costs.op_time_s(op, job.cluster.device)

    def ops_time_s(self, ops: tuple[Op, ...], job: Job) -> float:
        device = job.cluster.device
        return sum(self.op_costs.op_time_s(op, device) for op in ops)

    def collective_s(self, collective: str, buffer_bytes: float, layout: GroupLayout, job: Job) -> float:
        return self.comm_costs.collective_time_s(collective, buffer_bytes, layout, job.cluster)

    def axis_collective_s(self, collective: str, buffer_bytes: float, axis: str, job: Job) -> float:
        """A collective over the group of `axis` (tp, cp, dp, ep, pp, or grad: the gradient group)."""
        return self.collective_s(collective, buffer_bytes, axis_layout(axis, job.parallel, job.cluster), job)

    # --- layers and stages ---

    def layer_cost(self, layer: Layer, job: Job) -> LayerCost:
        cluster = job.cluster
        key = (id(layer), id(cluster.device), cluster.intra_node, cluster.inter_node, cluster.nics_per_node,
               _layout_key(job))
        entry = self._layer_costs.get(key)
        if entry is None:
            entry = self._layer_costs[key] = (layer, self._price_layer(layer, job))
        return entry[1]

    def _price_layer(self, layer: Layer, job: Job) -> LayerCost:
        comm: dict[str, float] = {}
        comm_fwd = 0.0
        for c in layer.comms:
            if c.axis == "pp":
                continue
            comm_s = self.axis_collective_s(c.collective, c.buffer_bytes, c.axis, job)
            comm[c.axis] = comm.get(c.axis, 0.0) + comm_s
            if c.phase == "fwd":
                comm_fwd += comm_s
        selective = self.ops_time_s(tuple(op for op in layer.fwd if op.recompute_selective), job)
        wgrad = self.ops_time_s(tuple(op for op in layer.bwd if op.name.endswith(".wgrad")), job)
        return LayerCost(self.ops_time_s(layer.fwd, job), self.ops_time_s(layer.bwd, job), selective, comm,
                         comm_fwd, wgrad)

    def stage_cost(self, stage: list[StagePart], job: Job) -> StageCost:
        """One micro-batch through a stage: forward, backward, recompute, feature communication, ZeRO-3 gathers
        left exposed, and the host overhead."""
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
                fsdp += part.count * self.fsdp_exposed_s(part.layer, cost, job)
        if par.pp > 1:
            comm["pp"] = self.pipeline_send_s(stage, job)
        return StageCost(compute, recompute, comm, fsdp, self.micro_batch_overhead_s(stage, job), wgrad)

    def pipeline_send_s(self, stage: list[StagePart], job: Job) -> float:
        """Each micro-batch sends its activation forward and its gradient backward once per model chunk."""
        out_bytes = max(part.layer.output_bytes for part in stage)
        one = self.axis_collective_s("send-recv", out_bytes, "pp", job)
        return 2.0 * job.parallel.vpp * one + self.cal.runtime.pipeline_overhead_per_micro_batch_s

    # --- overlap and exposed gradient communication ---

    def overlap(self, kind: OverlapKind, job: Job) -> float:
        """The fraction of compute that hides gradient reductions (dp) or ZeRO-3 gathers (fsdp): the fitted
        one, or none on a device whose collectives take the cores that compute (a CPU with gloo)."""
        if not job.cluster.device.comm_overlaps_compute:
            return 0.0
        return self.cal.runtime.dp_overlap if kind == "dp" else self.cal.runtime.fsdp_overlap

    def fsdp_exposed_s(self, layer: Layer, cost: LayerCost, job: Job) -> float:
        """ZeRO-3/FSDP: per micro-batch, all-gather weights for forward and backward, reduce-scatter
        gradients; prefetching hides them under the layer's compute up to fsdp_overlap."""
        policy = policy_for(job.parallel.precision)
        gather = self.axis_collective_s("all-gather", layer.param_count * policy.weight_bytes, "grad", job)
        scatter = self.axis_collective_s("reduce-scatter", layer.param_count * policy.grad_bytes, "grad", job)
        overlap = self.overlap("fsdp", job)
        return max(0.0, gather - overlap * cost.fwd_s) + max(0.0, gather + scatter - overlap * cost.bwd_s)

    def gradient_sync_exposed_s(self, stage: list[StagePart], cost: StageCost, job: Job) -> float:
        """DP gradient reduction (ZeRO 0: all-reduce; 1-2: reduce-scatter + parameter all-gather), bucketed
        and overlapped with the last micro-batch's backward pass; the last bucket is always exposed."""
        par = job.parallel
        if par.dp * par.cp == 1 or par.zero >= 3:
            return 0.0
        policy = policy_for(par.precision)
        params = sum(part.count * part.layer.param_count for part in stage)
        grad_bytes = params * policy.grad_bytes
        if par.zero == 0:
            total = self.axis_collective_s("all-reduce", grad_bytes, "grad", job)
        else:
            total = self.axis_collective_s("reduce-scatter", grad_bytes, "grad", job) + \
                self.axis_collective_s("all-gather", params * policy.weight_bytes, "grad", job)
        buckets = max(1.0, grad_bytes / BUCKET_BYTES)
        window = self.overlap("dp", job) * cost.compute_s / 3.0 * 2.0  # backward ~ 2/3 of fwd + bwd
        return max(total - window, total / buckets)

    # --- step costs and memory ---

    def optimizer_step_s(self, stages: list[list[StagePart]], job: Job) -> float:
        """The optimizer step of the stage with the most parameters, over the parameters one GPU owns."""
        par = job.parallel
        params = max(sum(part.count * part.layer.param_count for part in stage) for stage in stages)
        return self.step_costs.optimizer_step_s(params / optimizer_shards(par), par.precision, job.cluster.device)

    def micro_batch_overhead_s(self, stage: list[StagePart], job: Job) -> float:
        ops = sum(part.count * (len(part.layer.fwd) + len(part.layer.bwd)) for part in stage)
        layers = sum(part.count for part in stage if part.layer.kind not in ("embedding", "head"))
        return self.step_costs.micro_batch_overhead_s(round(ops), round(layers), job.parallel, job.cluster.device)

    def iteration_overhead_s(self, job: Job) -> float:
        return self.step_costs.iteration_overhead_s(job.cluster.device)

    def memory(self, stages: list[list[StagePart]], job: Job) -> MemoryEstimate:
        """Peak memory per GPU over the stages (cost.memory)."""
        return estimate_memory(stages, job.parallel, job.cluster.device)


# --- the cost choices: one table ---

CostFactory = Callable[[Calibration, Path | None], Pricer]
COSTS: Registry[CostFactory] = Registry("costs")


@COSTS.register("roofline")
def roofline_pricer(cal: Calibration, db: Path | None = None) -> Pricer:
    """Op times from the calibrated roofline, step costs and overheads fitted, collectives alpha-beta."""
    return Pricer(cal)


@COSTS.register("profiled")
def profiled_pricer(cal: Calibration, db: Path | None = None) -> Pricer:
    """Op times, step costs and collective times from the profile database at `db` (default: the user's
    cache), measured by `trainsim profile`, with `cal`'s roofline, fitted overheads and alpha-beta model for
    what it lacks. For a device the database has measured, the Adam step and the framework overhead are
    measured too, in place of the fitted constants (fitted on GPU clusters' runs, not on this device)."""
    op_costs = ProfiledCosts(db or default_db_path(), fallback=RooflineCosts(cal))
    return Pricer(cal, op_costs=op_costs, step_costs=ProfiledStepCosts(op_costs, FittedStepCosts(cal)),
                  comm_costs=ProfiledComm(op_costs, AlphaBetaComm(cal)))


def make_pricer(costs: str = "roofline", db: Path | None = None, calibration: Calibration | None = None) -> Pricer:
    """The pricer of a cost choice (COSTS: roofline | profiled)."""
    factory = COSTS.get(costs)
    return factory(calibration or load_calibration(), db)

