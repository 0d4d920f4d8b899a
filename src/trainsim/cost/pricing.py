"""The pricing service: what one op, layer, stage, collective, overlap window, optimizer step and the memory of
a job cost on a cluster, for any (graph, plan, cluster, costs). Every engine and the compiler ask it; none asks
another engine.

A Pricer holds the costs (op times, step costs and collective times, with the calibration behind them) and the
caches of one run, so a search that prices thousands of plans of one model prices each distinct thing once:
group layouts per (axis degrees, cluster), collective times per (collective, bytes, layout, cluster), layer
prices per (layer, layouts, cluster), stage prices per (stage layers, layouts, recompute, ZeRO-3, precision, vpp,
host overhead), stage memory per (stage layers, the plan's memory settings) and a graph's stages per pp.
Every cache returns what the uncached formula returns for the same inputs: the keys hold every input the
formula reads.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.comm.collectives import AlphaBetaComm, CommCostModel
from trainsim.cost.compute import OpCostModel, RooflineCosts
from trainsim.cost.memory import (
    MemoryEstimate,
    StageMemoryBase,
    estimate_memory,
    memory_estimate,
    memory_key,
    optimizer_shards,
    stage_in_flight,
    stage_memory_base,
)
from trainsim.cost.profiled import ProfiledComm, ProfiledCosts, ProfiledStepCosts
from trainsim.cost.step import FittedStepCosts, StepCosts
from trainsim.hardware.cluster import ClusterSpec, GroupLayout
from trainsim.ir.graph import Layer, Op, OpGraph
from trainsim.job import Job
from trainsim.profile.database import default_db_path
from trainsim.registry import Registry
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stages import StagePart, partition_stages

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
    total_s: float = field(init=False)  # all of the above: one micro-batch's time on the stage

    def __post_init__(self) -> None:
        total = self.compute_s + self.recompute_s + sum(self.comm_s.values()) + self.fsdp_exposed_s + self.overhead_s
        object.__setattr__(self, "total_s", total)


@dataclass(frozen=True, slots=True, eq=False)
class Partition:
    """A graph's pipeline stages for one pp (strategy.stages.partition_stages), as the pricing service caches
    them: stages of equal content (the same layers and counts) cost the same and are priced once."""

    stages: list[list[StagePart]]  # callers must not change them
    numbers: tuple[int, ...]  # per stage: the number of its content
    first: tuple[int, ...]  # per stage: the index of the first stage of the same content
    distinct: tuple[int, ...]  # the stages that are first of their content


def gradient_buckets(stage: list[StagePart], grad_bytes_per_param: float,
                     backward_s: Callable[[Layer], float]) -> list[tuple[float, float]]:
    """(parameters, seconds into the last backward pass when its last gradient is ready) of each gradient bucket,
    in the order the buckets are reduced: layers' gradients in reverse order (the backward pass runs last layer
    first) fill a bucket until it holds BUCKET_BYTES, as Megatron-LM's and DDP's buckets do and the simulator's
    gradient tasks (compile.insert_collectives) are built."""
    buckets: list[tuple[float, float]] = []
    pending = elapsed = 0.0
    for part in reversed(stage):
        whole, fraction = divmod(part.count, 1.0)
        layer_s = backward_s(part.layer)
        for share in [1.0] * int(whole) + ([fraction] if fraction else []):
            pending += part.layer.param_count * share
            elapsed += layer_s * share
            if pending * grad_bytes_per_param >= BUCKET_BYTES:
                buckets.append((pending, elapsed))
                pending = 0.0
    if pending or not buckets:
        buckets.append((pending, elapsed))
    return buckets


def axis_group(axis: str, par: ParallelSpec) -> tuple[int, int]:
    """(size, stride) of the group of `axis`. Ranks are ordered tp (fastest), cp, dp, pp; ep groups are made of
    data-parallel ranks; "grad" is the data-parallel gradient group (dp x cp ranks, stride tp)."""
    if axis == "tp":
        return par.tp, 1
    if axis == "cp":
        return par.cp, par.tp
    if axis == "dp":
        return par.dp, par.tp * par.cp
    if axis == "ep":
        return par.ep, par.tp * par.cp
    if axis == "pp":
        return min(par.pp, 2), par.tp * par.cp * par.dp
    if axis == "grad":
        return par.dp * par.cp, par.tp
    raise KeyError(axis)


def axis_layout(axis: str, par: ParallelSpec, cluster: ClusterSpec) -> GroupLayout:
    """Where the ranks of the group of `axis` sit (axis_group)."""
    return cluster.group_layout(*axis_group(axis, par))


def _layout_key(job: Job) -> tuple[object, ...]:
    par, cluster = job.parallel, job.cluster
    return (par.tp, par.cp, par.dp, par.ep, par.pp, cluster.gpus_per_node, cluster.num_nodes)


StageKey = tuple[tuple[int, float], ...]  # (id of a pinned layer, count) per part: what a stage holds


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
        # NB: the caches key layers, stages, graphs and clusters by id; _pinned keeps every object whose id a key
        # holds alive, so no other object can take that id while the pricer lives.
        self._pinned: dict[int, object] = {}
        self._layer_costs: dict[tuple[object, ...], LayerCost] = {}
        self._layouts: dict[tuple[object, ...], GroupLayout] = {}
        self._collectives: dict[tuple[object, ...], float] = {}
        self._stage_keys: dict[int, int] = {}  # id of a stage of self.stages() -> the number of its content
        self._stage_numbers: dict[StageKey, int] = {}
        self._stage_costs: dict[tuple[object, ...], StageCost] = {}
        self._stage_work_s: dict[tuple[object, ...], tuple[float, float, dict[str, float]]] = {}
        self._stage_extra_s: dict[tuple[object, ...], float] = {}  # recompute and ZeRO-3 seconds of a stage
        self._stage_params: dict[object, float] = {}
        self._stage_ops: dict[object, tuple[int, int]] = {}
        self._partitions: dict[tuple[int, int], Partition] = {}
        self._partition_of: dict[int, Partition] = {}  # id of a Partition's stages -> it
        self._memory_bases: dict[tuple[object, ...], tuple[StageMemoryBase, ...]] = {}
        self._in_flight: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._max_params: dict[int, float] = {}
        self._cluster_keys: dict[int, int] = {}  # id of a cluster -> the number of its content
        self._cluster_numbers: dict[tuple[object, ...], int] = {}

    # --- cache keys ---

    def _pin(self, obj: object) -> int:
        key = id(obj)
        if key not in self._pinned:
            self._pinned[key] = obj
        return key

    def _cluster_key(self, cluster: ClusterSpec) -> int:
        """A number for what prices read from a cluster: its device, links and shape (equal clusters of
        different ids share it)."""
        number = self._cluster_keys.get(id(cluster))
        if number is None:
            content = (self._pin(cluster.device), cluster.intra_node, cluster.inter_node, cluster.nics_per_node,
                       cluster.gpus_per_node, cluster.num_nodes)
            number = self._cluster_numbers.setdefault(content, len(self._cluster_numbers))
            self._cluster_keys[self._pin(cluster)] = number
        return number

    def stage_key(self, stage: list[StagePart]) -> object:
        """What a stage holds (its layers and counts): stages of equal keys cost the same. A stage of
        self.stages() has a number for a key, made once; any other, the tuple of (layer, count) of its parts."""
        key = self._stage_keys.get(id(stage))
        if key is None:
            return tuple((self._pin(part.layer), part.count) for part in stage)
        return key

    def partition(self, graph: OpGraph, pp: int) -> Partition:
        """partition_stages(graph, pp), made once per (graph, pp)."""
        key = (self._pin(graph), pp)
        partition = self._partitions.get(key)
        if partition is None:
            stages = partition_stages(graph, pp)
            first: dict[StageKey, int] = {}
            numbers: list[int] = []
            firsts: list[int] = []
            for index, stage in enumerate(stages):
                content = tuple((self._pin(part.layer), part.count) for part in stage)
                firsts.append(first.setdefault(content, index))
                numbers.append(self._stage_numbers.setdefault(content, len(self._stage_numbers)))
                self._stage_keys[self._pin(stage)] = numbers[-1]
            distinct = tuple(index for index, head in enumerate(firsts) if head == index)
            partition = self._partitions[key] = Partition(stages, tuple(numbers), tuple(firsts), distinct)
            self._partition_of[self._pin(stages)] = partition
        return partition

    # --- ops and collectives ---

    def op_time_s(self, op: Op, job: Job) -> float:
        return self.op_costs.op_time_s(op, job.cluster.device)

    def ops_time_s(self, ops: tuple[Op, ...], job: Job) -> float:
        device = job.cluster.device
        return sum(self.op_costs.op_time_s(op, device) for op in ops)

    def collective_s(self, collective: str, buffer_bytes: float, layout: GroupLayout, job: Job) -> float:
        cluster = job.cluster
        key = (collective, buffer_bytes, layout.size, layout.ranks_per_node, layout.num_nodes,
               self._cluster_key(cluster))
        seconds = self._collectives.get(key)
        if seconds is None:
            seconds = self._collectives[key] = self.comm_costs.collective_time_s(collective, buffer_bytes, layout,
                                                                                 cluster)
        return seconds

    def layout(self, axis: str, job: Job) -> GroupLayout:
        """axis_layout(axis, job.parallel, job.cluster), made once per (group size and stride, cluster)."""
        group = axis_group(axis, job.parallel)
        key = (group, self._cluster_key(job.cluster))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = job.cluster.group_layout(*group)
        return layout

    def axis_collective_s(self, collective: str, buffer_bytes: float, axis: str, job: Job) -> float:
        """A collective over the group of `axis` (tp, cp, dp, ep, pp, or grad: the gradient group)."""
        return self.collective_s(collective, buffer_bytes, self.layout(axis, job), job)

    # --- layers and stages ---

    def layer_cost(self, layer: Layer, job: Job) -> LayerCost:
        key = (self._pin(layer), self._cluster_key(job.cluster), _layout_key(job))
        cost = self._layer_costs.get(key)
        if cost is None:
            cost = self._layer_costs[key] = self._price_layer(layer, job)
        return cost

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
        return self._stage_cost(stage, job, self._stage_plan_key(job))

    def stage_costs(self, partition: Partition, job: Job) -> list[StageCost]:
        """stage_cost of every stage of the partition (each content priced once)."""
        plan_key = self._stage_plan_key(job)
        stages, first = partition.stages, partition.first
        costs: list[StageCost] = []
        for index, head in enumerate(first):
            costs.append(self._stage_cost(stages[index], job, plan_key) if head == index else costs[head])
        return costs

    def _stage_plan_key(self, job: Job) -> tuple[object, ...]:
        """Everything of the job _price_stage reads but the stage and its host overhead: the cluster, the
        group layouts, recompute, ZeRO-3, precision (ZeRO-3 gathers) and vpp (pipeline sends)."""
        par = job.parallel
        return (self._cluster_key(job.cluster), _layout_key(job), par.recompute, par.zero >= 3, par.precision,
                par.vpp)

    def _stage_cost(self, stage: list[StagePart], job: Job, plan_key: tuple[object, ...]) -> StageCost:
        """Priced once per (stage content, plan_key, host overhead)."""
        overhead = self.micro_batch_overhead_s(stage, job)
        key = (self.stage_key(stage), plan_key, overhead)
        cost = self._stage_costs.get(key)
        if cost is None:
            cost = self._stage_costs[key] = self._price_stage(stage, job, overhead)
        return cost

    def _price_stage(self, stage: list[StagePart], job: Job, overhead_s: float) -> StageCost:
        par = job.parallel
        compute, wgrad, feature_comm = self._stage_work(stage, job)
        recompute = self._stage_recompute_s(stage, job)
        fsdp = self._stage_fsdp_s(stage, job) if par.zero >= 3 else 0.0
        comm = dict(feature_comm)
        if par.pp > 1:
            comm["pp"] = self.pipeline_send_s(stage, job)
        return StageCost(compute, recompute, comm, fsdp, overhead_s, wgrad)

    def _stage_work(self, stage: list[StagePart], job: Job) -> tuple[float, float, dict[str, float]]:
        """Forward + backward, the weight-gradient GEMMs and the feature communication per axis of one
        micro-batch through the stage; once per (stage layers, cluster, layouts)."""
        key = ("work", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job))
        work = self._stage_work_s.get(key)
        if work is None:
            compute = wgrad = 0.0
            comm: dict[str, float] = {}
            for part in stage:
                cost = self.layer_cost(part.layer, job)
                compute += part.count * (cost.fwd_s + cost.bwd_s)
                wgrad += part.count * cost.wgrad_s
                for axis, seconds in cost.comm_s.items():
                    comm[axis] = comm.get(axis, 0.0) + part.count * seconds
            work = self._stage_work_s[key] = (compute, wgrad, comm)
        return work

    def _stage_recompute_s(self, stage: list[StagePart], job: Job) -> float:
        """What recompute repeats of one micro-batch's forward: every block's forward and its forward
        communication (full), the selective ops (selective), nothing (none)."""
        recompute_mode = job.parallel.recompute
        key = ("recompute", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job), recompute_mode)
        seconds = self._stage_extra_s.get(key)
        if seconds is None:
            seconds = 0.0
            for part in stage:
                cost = self.layer_cost(part.layer, job)
                if recompute_mode == "full" and part.layer.kind not in ("embedding", "head"):
                    seconds += part.count * (cost.fwd_s + cost.comm_fwd_s)
                elif recompute_mode == "selective":
                    seconds += part.count * cost.selective_s
            self._stage_extra_s[key] = seconds
        return seconds

    def _stage_fsdp_s(self, stage: list[StagePart], job: Job) -> float:
        """ZeRO-3 gathers and scatters left exposed over the stage's layers (fsdp_exposed_s)."""
        key = ("fsdp", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job),
               job.parallel.precision)
        seconds = self._stage_extra_s.get(key)
        if seconds is None:
            seconds = 0.0
            for part in stage:
                seconds += part.count * self.fsdp_exposed_s(part.layer, self.layer_cost(part.layer, job), job)
            self._stage_extra_s[key] = seconds
        return seconds

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
        priced: dict[float, float] = {}

        def bucket_s(params: float) -> float:  # NB: each bucket is its own collective call, with its latency
            if params not in priced:
                grad_bytes = params * policy.grad_bytes
                if par.zero == 0:
                    priced[params] = self.axis_collective_s("all-reduce", grad_bytes, "grad", job)
                else:
                    priced[params] = self.axis_collective_s("reduce-scatter", grad_bytes, "grad", job) + \
                        self.axis_collective_s("all-gather", params * policy.weight_bytes, "grad", job)
            return priced[params]

        buckets = gradient_buckets(stage, policy.grad_bytes, lambda layer: self._backward_s(layer, job))
        backward_s = buckets[-1][1]
        # the reduction may start once dp_overlap of the last backward pass remains; buckets go one after another
        # on the gradient stream, each when its gradients are ready (the simulator's schedule, in closed form)
        done = backward_s * (1.0 - self.overlap("dp", job))
        for params, ready_s in buckets:
            done = max(done, ready_s) + bucket_s(params)
        return max(0.0, done - backward_s)

    def _backward_s(self, layer: Layer, job: Job) -> float:
        """One micro-batch's backward pass through a layer: its compute, its feature communication, and the
        forward it repeats first under full recompute."""
        cost = self.layer_cost(layer, job)
        seconds = cost.bwd_s + sum(cost.comm_s.values()) - cost.comm_fwd_s
        return seconds + (cost.fwd_s + cost.comm_fwd_s if job.parallel.recompute == "full" else 0.0)

    # --- step costs and memory ---

    def stage_params(self, stage: list[StagePart]) -> float:
        """Parameters one device of the stage holds."""
        key = self.stage_key(stage)
        params = self._stage_params.get(key)
        if params is None:
            params = self._stage_params[key] = sum(part.count * part.layer.param_count for part in stage)
        return params

    def optimizer_step_s(self, stages: list[list[StagePart]], job: Job) -> float:
        """The optimizer step of the stage with the most parameters, over the parameters one GPU owns."""
        par = job.parallel
        params = self._max_params.get(id(stages)) if id(stages) in self._partition_of else None
        if params is None:
            params = max(self.stage_params(stage) for stage in stages)
            if id(stages) in self._partition_of:
                self._max_params[id(stages)] = params
        return self.step_costs.optimizer_step_s(params / optimizer_shards(par), par.precision, job.cluster.device)

    def micro_batch_overhead_s(self, stage: list[StagePart], job: Job) -> float:
        key = self.stage_key(stage)
        counts = self._stage_ops.get(key)
        if counts is None:
            ops = sum(part.count * (len(part.layer.fwd) + len(part.layer.bwd)) for part in stage)
            layers = sum(part.count for part in stage if part.layer.kind not in ("embedding", "head"))
            counts = self._stage_ops[key] = (round(ops), round(layers))
        return self.step_costs.micro_batch_overhead_s(counts[0], counts[1], job.parallel, job.cluster.device)

    def iteration_overhead_s(self, job: Job) -> float:
        return self.step_costs.iteration_overhead_s(job.cluster.device)

    def memory(self, stages: list[list[StagePart]], job: Job) -> MemoryEstimate:
        """Peak memory per GPU over the stages (cost.memory). For the stages of a partition, the stages' memory
        before the schedule is made once per (partition, cost.memory.memory_key) and the micro-batches each
        holds once per (schedule, pp, vpp, micro-batches)."""
        par, device = job.parallel, job.cluster.device
        partition = self._partition_of.get(id(stages))
        if partition is None:
            return estimate_memory(stages, par, device)
        key = (id(partition), memory_key(par))
        bases = self._memory_bases.get(key)
        if bases is None:
            distinct = {index: stage_memory_base(stages[index], par) for index in partition.distinct}
            bases = self._memory_bases[key] = tuple(distinct[head] for head in partition.first)
        flight_key = (par.schedule, par.pp, par.vpp, par.num_micro_batches, len(stages))
        in_flight = self._in_flight.get(flight_key)
        if in_flight is None:
            in_flight = self._in_flight[flight_key] = tuple(stage_in_flight(par, index)
                                                            for index in range(len(stages)))
        return memory_estimate(bases, in_flight, device)


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

