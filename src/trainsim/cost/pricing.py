"""The pricing service: what one op, layer, stage, collective, overlap window, optimizer step and the memory of
a job cost on a cluster, for any (graph, plan, cluster, costs). Every engine and the compiler ask it; none asks
another engine.

A Pricer holds the costs (op times, step costs and collective times, with the calibration behind them) and the
caches of one run, so a search that prices thousands of plans of one model prices each distinct thing once:
group layouts per (axis degrees, cluster), collective times per (collective, bytes, layout, cluster), layer
prices per (layer, the groups its collectives use, cluster), stage prices per (stage layers, layouts, recompute,
ZeRO-3, precision, vpp, host overhead), stage memory per (stage layers, the plan's memory settings) and a
graph's stages per pipeline split (pp and the blocks per virtual stage).
Every cache returns what the uncached formula returns for the same inputs: the keys hold every input the
formula reads.
"""

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from operator import add
from pathlib import Path
from typing import Literal

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.comm.collectives import CommCostModel, NcclComm
from trainsim.cost.compute import OpCostModel, RooflineCosts
from trainsim.cost.memory import (
    ExpertParams,
    MemoryEstimate,
    StageMemoryBase,
    chunk_shares,
    estimate_memory,
    memory_estimate,
    memory_key,
    optimizer_shards,
    owned_params,
    saved_key,
    stage_expert_params,
    stage_in_flight,
    stage_memory_base,
)
from trainsim.cost.optimizer_zeros import zero_state_share
from trainsim.cost.rank_classes import (
    DeviceClass,
    default_kind,
    device_classes,
    job_on_device,
    rank_device,
    ranks_differ,
    stage_capacities,
    uniform,
)
from trainsim.cost.stack_effects import (
    BucketQueue,
    BucketRuns,
    bucket_closes,
    bucket_queue,
    bucket_runs,
    bucketed_backward_s,
    bucketed_s,
    column_backward_s,
    ep_overlap_share,
    fuses_every_op,
    overlapped_s,
    queue_exposed_s,
    unfused_extra_bytes,
    window_micro_batches,
)
from trainsim.cost.step import FittedStepCosts, StepCosts
from trainsim.hardware.cluster import ClusterSpec, GroupLayout
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import Comm, Layer, Op, OpGraph
from trainsim.ir.model_spec import DlrmSpec
from trainsim.job import Job
from trainsim.profile.paths import default_db_path
from trainsim.registry import Registry
from trainsim.strategy.expert_groups import expert_data_ranks, expert_data_size, experts_own_group
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision, PrecisionPolicy, policy_for
from trainsim.strategy.stack import BEHAVIOURS, StackSpec
from trainsim.strategy.stages import (
    BLOCK_KINDS,
    StagePart,
    is_even_graph_split,
    num_blocks,
    partition_stages,
    virtual_stage_blocks,
)

Overlapped = Literal["grad_reduce_overlap", "param_gather_overlap", "tp_comm_overlap", "tp_dgrad_overlap",
                     "cp_comm_overlap", "pp_comm_overlap", "ep_comm_overlap"]


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One micro-batch through one layer on one device, in seconds."""

    fwd_s: float
    bwd_s: float
    selective_s: float  # the part of forward that selective recompute repeats
    comm_s: dict[str, float]  # axis -> feature-communication seconds (forward + backward)
    comm_fwd_s: float  # forward feature communication (repeated by full recompute)
    wgrad_s: float = 0.0  # the weight-gradient GEMMs of backward (what zero-bubble schedules defer)
    # the exposed fraction of the tensor-parallel collectives of forward and backward (a stack that overlaps
    # them with the GEMMs: Pricer.tp_exposed_s); 1 where nothing overlaps
    tp_exposed_fraction: tuple[float, float] = (1.0, 1.0)
    # the same for the context-parallel key/value exchange a stack overlaps with attention (Pricer.cp_exposed_s)
    cp_exposed_fraction: tuple[float, float] = (1.0, 1.0)
    # the same for the expert all-to-alls a stack overlaps with another micro-batch's compute, averaged over the
    # step's micro-batches (Pricer.ep_exposed_fraction)
    ep_exposed_fraction: tuple[float, float] = (1.0, 1.0)


@dataclass(frozen=True, slots=True)
class StageCost:
    """One micro-batch through one pipeline stage on one device, in seconds."""

    compute_s: float
    recompute_s: float
    comm_s: dict[str, float]
    fsdp_exposed_s: float
    overhead_s: float = 0.0
    wgrad_s: float = 0.0
    forward_s: float = 0.0  # the forward part of compute_s (the window of parameter gathers)
    backward_s: float = 0.0  # the backward part of compute_s (the window of gradient reduction)
    feature_fwd_s: float = 0.0  # the forward part of comm_s's feature collectives (TP, CP, EP; not pp)
    # the hop latency an overlapped interleaved pipeline still waits for on its fill and drain (not in total_s:
    # the bubble's; Pricer.pipeline_chain_s)
    pp_chain_s: float = 0.0
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
    # per stage: blocks per model chunk, for an uneven split of more than one chunk per stage (else empty: the
    # even split, whose stages' activations are taken as spread evenly over their chunks)
    chunk_blocks: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class GradientQueues:
    """A stage's data-parallel gradient reduction as queues of buckets (Pricer.gradient_queues): the
    reduction's, in the order the backward pass fills them, and the parameter all-gathers' (ZeRO >= 1; empty
    at ZeRO 0) in sending order; whether each overlaps compute (the stack's grad_reduce_overlap and
    param_gather_overlap) or waits for all of it."""

    reduce: BucketQueue
    gather: BucketQueue
    reduce_overlaps: bool
    gather_overlaps: bool


def ordered_sum(values: Iterable[float]) -> float:
    """The values added one by one from the first, from 0 (Python 3.11's sum() of floats; 3.12's compensates the
    rounding): the same bits as a running sum over arrays in the same order (the search's grid engine)."""
    return reduce(add, values, 0)


def axis_group(axis: str, par: ParallelSpec) -> tuple[int, int]:
    """(size, stride) of the group of `axis`. Ranks are ordered tp (fastest), cp, dp, pp; ep groups are made of
    ep consecutive (cp, dp) positions, cp fastest: Megatron-Core's expert mesh, its own order tp-ep-dp-pp over
    the ranks with cp folded into the expert data parallelism (initialize_model_parallel's expert
    RankGenerator, megatron/core/parallel_state.py, megatron-core 0.16.1; strategy.expert_groups); "grad" is the
    data-parallel gradient group (dp x cp ranks, stride tp)."""
    if axis == "tp":
        return par.tp, 1
    if axis == "cp":
        return par.cp, par.tp
    if axis == "dp":
        return par.dp, par.tp * par.cp
    if axis == "ep":
        return par.ep, par.tp
    if axis == "pp":
        return min(par.pp, 2), par.tp * par.cp * par.dp
    if axis == "grad":
        return par.dp * par.cp, par.tp
    raise KeyError(axis)


def sub_group(group: tuple[int, int], ranks: int) -> tuple[int, int]:
    """(size, stride) of `ranks` consecutive ranks of a group (a Comm's sub-group); the group where ranks is 0."""
    return (ranks, group[1]) if ranks else group


def axis_layout(axis: str, par: ParallelSpec, cluster: ClusterSpec) -> GroupLayout:
    """Where the ranks of the group of `axis` sit (axis_group)."""
    return cluster.group_layout(*axis_group(axis, par))


def _stack_content(stack: StackSpec) -> tuple[object, ...]:
    return tuple(getattr(stack, name) for name in BEHAVIOURS)


def _layout_key(job: Job) -> tuple[object, ...]:
    """The plan's groups, and the share of passes whose expert all-to-alls overlap (it reads the micro-batches)."""
    par, cluster = job.parallel, job.cluster
    return (par.tp, par.cp, par.dp, par.ep, par.pp, cluster.gpus_per_node, cluster.num_nodes, ep_overlap_share_of(job))


def ep_overlap_share_of(job: Job) -> float:
    """stack_effects.ep_overlap_share of the job (0.0 on a device whose collectives take the cores that compute)."""
    return ep_overlap_share(job.stack, job.parallel, job.cluster.device.comm_overlaps_compute)


# a layer's feature communication (Pricer.layer_comm_s): per axis its exposed seconds (in the order its comms first
# name the axes), the forward's, and the tp, cp and ep exposed fractions (forward, backward)
LayerComm = tuple[dict[str, float], float, tuple[float, float], tuple[float, float], tuple[float, float]]
# a layer's forward, backward, selective-recompute and weight-gradient op seconds (Pricer._layer_op_sums_s)
OpSums = tuple[float, float, float, float]
# the exposed fractions of a layer's tp and cp collectives (forward, backward) where no stack overlap applies
_NOT_OVERLAPPED = ((1.0, 1.0), (1.0, 1.0))
StageKey = tuple[tuple[int, float], ...]  # (id of a pinned layer, count) per part: what a stage holds


class Pricer:
    """Prices work with one set of costs. calibration: the fitted parameters (runtime overlap, pipeline
    overhead); op_costs / step_costs / comm_costs: where op times, the optimizer step and fixed overheads, and
    collective times come from (default: the calibrated roofline, fitted overheads and NCCL model)."""

    def __init__(self, calibration: Calibration | None = None, *, op_costs: OpCostModel | None = None,
                 step_costs: StepCosts | None = None, comm_costs: CommCostModel | None = None) -> None:
        self.cal = calibration or load_calibration()
        self.op_costs: OpCostModel = op_costs or RooflineCosts(self.cal)
        self.step_costs: StepCosts = step_costs or FittedStepCosts(self.cal)
        self.comm_costs: CommCostModel = comm_costs or NcclComm(self.cal)
        # NB: the caches key layers, stages, graphs and clusters by id; _pinned keeps every object whose id a key
        # holds alive, so no other object can take that id while the pricer lives.
        self._pinned: dict[int, object] = {}
        self._layer_costs: dict[tuple[object, ...], LayerCost] = {}
        # (id of a layer, id of a device) -> op_costs' seconds of its ops (add_op_times)
        self._op_times: dict[tuple[int, int], tuple[float, ...]] = {}
        self._layer_axes: dict[int, tuple[tuple[str, int], ...]] = {}  # id of a layer -> (axis, sub-group ranks)
        self._layouts: dict[tuple[object, ...], GroupLayout] = {}
        self._collectives: dict[tuple[object, ...], float] = {}
        self._axis_collectives: dict[tuple[object, ...], float] = {}
        self._policies: dict[str, PrecisionPolicy] = {}
        self._stage_keys: dict[int, int] = {}  # id of a stage of self.stages() -> the number of its content
        self._stage_numbers: dict[StageKey, int] = {}
        self._stage_costs: dict[tuple[object, ...], StageCost] = {}
        self._stage_work_s: dict[tuple[object, ...], tuple[float, float, float, dict[str, float]]] = {}
        self._stage_extra_s: dict[tuple[object, ...], float] = {}  # recompute and ZeRO-3 seconds of a stage
        self._stage_params: dict[object, float] = {}
        self._grad_buckets: dict[tuple[object, ...], BucketRuns] = {}
        self._grad_sync: dict[tuple[object, ...], float] = {}
        self._grad_queues: dict[tuple[object, ...], GradientQueues] = {}
        self._stage_ops: dict[object, tuple[int, int, int]] = {}
        # stage key -> ((collective, phase), calls) of the reshards a tree adds (ir.graph.Comm.reshard)
        self._stage_reshards: dict[object, tuple[tuple[tuple[str, str], float], ...]] = {}
        self._partitions: dict[tuple[object, ...], Partition] = {}
        self._splits: dict[tuple[object, ...], tuple[int, ...] | None] = {}
        self._chunk_shares: dict[tuple[object, ...], tuple[tuple[float, ...], ...]] = {}
        self._forward_fractions: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._partition_of: dict[int, Partition] = {}  # id of a Partition's stages -> it
        self._memory_bases: dict[tuple[object, ...], tuple[StageMemoryBase, ...]] = {}
        self._in_flight: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._max_params: dict[int, float] = {}
        self._cluster_keys: dict[int, int] = {}  # id of a cluster -> the number of its content
        self._cluster_numbers: dict[tuple[object, ...], int] = {}
        self._stack_keys: dict[int, int] = {}  # id of a stack -> the number of its content
        self._stack_numbers: dict[tuple[object, ...], int] = {}
        self._rank_clusters: dict[tuple[int, str], ClusterSpec] = {}  # (id of a cluster, device) -> on it
        self._rank_stage_costs: dict[tuple[int, int, float, float], StageCost] = {}
        self._classes: dict[tuple[object, ...], list[DeviceClass]] = {}

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
                       cluster.gpus_per_node, cluster.num_nodes, cluster.fabric_key)
            number = self._cluster_numbers.setdefault(content, len(self._cluster_numbers))
            self._cluster_keys[self._pin(cluster)] = number
        return number

    def _stack_key(self, stack: StackSpec) -> int:
        """A number for a stack's behaviours (equal stacks of different ids share it)."""
        number = self._stack_keys.get(id(stack))
        if number is None:
            number = self._stack_numbers.setdefault(_stack_content(stack), len(self._stack_numbers))
            self._stack_keys[self._pin(stack)] = number
        return number

    def stage_key(self, stage: list[StagePart]) -> object:
        """What a stage holds (its layers and counts): stages of equal keys cost the same. A stage of
        self.stages() has a number for a key, made once; any other, the tuple of (layer, count) of its parts."""
        key = self._stage_keys.get(id(stage))
        if key is None:
            return tuple((self._pin(part.layer), part.count) for part in stage)
        return key

    def partition(self, graph: OpGraph, pp: int, virtual_blocks: tuple[int, ...] | None = None) -> Partition:
        """partition_stages(graph, pp), made once per (graph, pp, virtual_blocks). virtual_blocks: blocks per
        virtual stage (pp x vpp entries, chunk-major as strategy.stages.split_blocks gives them; None = even)."""
        key = (self._pin(graph), pp, virtual_blocks)
        partition = self._partitions.get(key)
        if partition is None:
            vpp = len(virtual_blocks) // pp if virtual_blocks else 1
            per_chunk = tuple(tuple(virtual_blocks[chunk * pp + rank] for chunk in range(vpp))
                              for rank in range(pp)) if virtual_blocks else ()
            stages = partition_stages(graph, pp, tuple(sum(chunks) for chunks in per_chunk) if per_chunk else None,
                                      virtual_blocks)
            first: dict[StageKey, int] = {}
            numbers: list[int] = []
            firsts: list[int] = []
            pinned, stage_numbers = self._pinned, self._stage_numbers
            for layer in graph.layers:  # every part's layer (the keys below hold their ids)
                pinned.setdefault(id(layer), layer)
            for index, stage in enumerate(stages):
                content = tuple([(id(part.layer), part.count) for part in stage])
                firsts.append(first.setdefault(content, index))
                numbers.append(stage_numbers.setdefault(content, len(stage_numbers)))
                self._stage_keys[id(stage)] = numbers[-1]
                pinned[id(stage)] = stage
            distinct = tuple(index for index, head in enumerate(firsts) if head == index)
            partition = self._partitions[key] = Partition(stages, tuple(numbers), tuple(firsts), distinct,
                                                          per_chunk if vpp > 1 else ())
            self._partition_of[self._pin(stages)] = partition
        return partition

    def plan_split(self, graph: OpGraph, par: ParallelSpec) -> tuple[int, ...] | None:
        """Blocks per virtual stage of the strategy's split (strategy.stages.virtual_stage_blocks), or None for
        the even split of a layer count pp x vpp divides (and for a model without blocks); once per
        (graph, split settings)."""
        split = (par.pp, par.vpp, par.first_stage_layers, par.last_stage_layers, par.embedding_in_split,
                 par.loss_in_split, par.stage_layers)
        key = (self._pin(graph), split)
        if key not in self._splits:
            even = is_even_graph_split(graph, par)
            self._splits[key] = None if even else virtual_stage_blocks(num_blocks(graph), par)
        return self._splits[key]

    def plan_partition(self, graph: OpGraph, par: ParallelSpec) -> Partition:
        """The partition of the strategy's pipeline split: even, or as its first/last stage layers,
        embedding/loss accounting, stage list or a layer count pp x vpp does not divide say."""
        return self.partition(graph, par.pp, self.plan_split(graph, par))

    # --- ops and collectives ---

    def op_time_s(self, op: Op, job: Job) -> float:
        """The op's time, plus the kernels a stack that does not fuse it adds (stack_effects.unfused_extra_bytes,
        at the calibrated memory bandwidth, one more launch)."""
        return self._unfused_s(op, self.op_costs.op_time_s(op, job.cluster.device), job.stack,
                               self.policy(job.parallel.precision).linear_dtype == "fp8", job.cluster.device)

    def _unfused_s(self, op: Op, seconds: float, stack: StackSpec, fp8_linears: bool, device: DeviceSpec) -> float:
        """op_time_s given the op cost model's seconds of the op."""
        extra = unfused_extra_bytes(op, stack, fp8_linears)
        if extra > 0.0:
            compute = self.cal.compute
            seconds += extra / (device.hbm_bw_bytes_per_s * compute.memory_efficiency) + compute.kernel_overhead_s
        return seconds

    def add_op_times(self, layer: Layer, device: DeviceSpec, seconds: tuple[float, ...]) -> None:
        """The op cost model's seconds of each op of layer.fwd + layer.bwd on `device`, priced elsewhere all at
        once (the search's grid engine: cost/roofline_arrays.py, equal to op_costs.op_time_s op by op); the
        layer's prices read them instead of asking op_costs op by op."""
        self._op_times[(self._pin(layer), self._pin(device))] = seconds

    def has_op_times(self, layer: Layer, device: DeviceSpec) -> bool:
        return (id(layer), id(device)) in self._op_times

    def policy(self, precision: Precision) -> PrecisionPolicy:
        """policy_for(precision), made once."""
        policy = self._policies.get(precision)
        if policy is None:
            policy = self._policies[precision] = policy_for(precision)
        return policy

    def ops_time_s(self, ops: tuple[Op, ...], job: Job) -> float:
        return sum(self.op_time_s(op, job) for op in ops)

    def collective_s(self, collective: str, buffer_bytes: float, layout: GroupLayout, job: Job) -> float:
        cluster = job.cluster
        key = (collective, buffer_bytes, layout.size, layout.ranks_per_node, layout.num_nodes,
               layout.ranks_per_domain, layout.num_domains, layout.num_leaves, self._cluster_key(cluster))
        seconds = self._collectives.get(key)
        if seconds is None:
            seconds = self._collectives[key] = self.comm_costs.collective_time_s(collective, buffer_bytes, layout,
                                                                                 cluster)
        return seconds

    def layout(self, axis: str, job: Job) -> GroupLayout:
        """axis_layout(axis, job.parallel, job.cluster), made once per (group size and stride, cluster)."""
        return self.group_layout(axis_group(axis, job.parallel), job)

    def group_layout(self, group: tuple[int, int], job: Job) -> GroupLayout:
        """The layout of a group of (size, stride) ranks on the job's cluster, made once per cluster."""
        key = (group, self._cluster_key(job.cluster))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = job.cluster.group_layout(*group)
        return layout

    def axis_collective_s(self, collective: str, buffer_bytes: float, axis: str, job: Job) -> float:
        """A collective over the group of `axis` (tp, cp, dp, ep, pp, or grad: the gradient group); once per
        (collective, bytes, the group's size and stride, cluster)."""
        return self._group_collective_s(collective, buffer_bytes, axis, axis_group(axis, job.parallel),
                                        self._cluster_key(job.cluster), job)

    def _group_collective_s(self, collective: str, buffer_bytes: float, axis: str, group: tuple[int, int],
                            cluster_key: int, job: Job) -> float:
        """axis_collective_s given the group of `axis` (axis_group) and the cluster's key (_cluster_key). NB: a
        new one goes to the comm model directly, not through collective_s's cache by layout: groups of one key
        share a layout, and few of a search's (size, stride) groups share another's (24 of 272 on LLaMA-3.1-70B x
        1,024 H100), so that cache cost more than it saved; the same seconds either way."""
        key = (collective, buffer_bytes, *group, cluster_key)
        seconds = self._axis_collectives.get(key)
        if seconds is None:
            layout = self._layouts.get((group, cluster_key)) or self.group_layout(group, job)
            seconds = self._axis_collectives[key] = self.comm_costs.collective_time_s(collective, buffer_bytes,
                                                                                      layout, job.cluster)
        return seconds

    # --- layers and stages ---

    def layer_cost(self, layer: Layer, job: Job) -> LayerCost:
        """Priced once per (layer, cluster, the groups of the axes its collectives use, tp, stack, sp,
        precision): a layer without collectives costs the same whatever the plan's pp and dp."""
        par = job.parallel
        key = (self._pin(layer), self._cluster_key(job.cluster), self._layer_groups(layer, par), par.tp,
               self._stack_key(job.stack), par.sp, par.precision, ep_overlap_share_of(job))
        cost = self._layer_costs.get(key)
        if cost is None:
            cost = self._layer_costs[key] = self._price_layer(layer, job)
        return cost

    def _layer_groups(self, layer: Layer, par: ParallelSpec) -> tuple[tuple[int, int], ...]:
        """(size, stride) of the group of each axis the layer's feature collectives use (_price_layer skips
        pp): with tp, sp, the cluster, the stack and the precision, all of the plan its price reads."""
        axes = self._layer_axes.get(id(layer))
        if axes is None:
            axes = self._layer_axes[self._pin(layer)] = tuple(sorted({(c.axis, c.ranks) for c in layer.comms
                                                                       if c.axis != "pp"}))
        return tuple([sub_group(axis_group(axis, par), ranks) for axis, ranks in axes])

    def new_layer_cost(self, layer: Layer, job: Job) -> LayerCost:
        """layer_cost made anew and not kept: for a caller that keeps its own table of the layers it priced (the
        search's grid engine, once per layer and layer context), whose keys the Pricer's would only repeat."""
        self._pin(layer)
        return self._price_layer(layer, job)

    def _price_layer(self, layer: Layer, job: Job) -> LayerCost:
        op_sums = self._layer_op_sums_s(layer, job)
        comm, comm_fwd, tp_fraction, cp_fraction, ep_fraction = self.layer_comm_s(layer, job, op_sums)
        forward, backward, selective, wgrad = op_sums
        return LayerCost(forward, backward, selective, comm, comm_fwd, wgrad, tp_fraction, cp_fraction, ep_fraction)

    def layer_comm_s(self, layer: Layer, job: Job, op_sums_s: OpSums | None = None) -> LayerComm:
        """A layer's feature communication (its LayerCost's comm_s, comm_fwd_s and exposed fractions): each
        feature collective priced once (the pipeline's are the stage's sends), each axis's group once. op_sums_s:
        the layer's _layer_op_sums_s where the caller has them (else made where the expert overlap reads them)."""
        par, cluster_key = job.parallel, self._cluster_key(job.cluster)
        groups: dict[str, tuple[int, int]] = {}
        priced: list[tuple[Comm, float]] = []
        for c in layer.comms:
            axis = c.axis
            if axis == "pp":
                continue
            group = groups.get(axis)
            if group is None:
                group = groups[axis] = axis_group(axis, par)
            priced.append((c, self._group_collective_s(c.collective, c.buffer_bytes, axis, sub_group(group, c.ranks),
                                                       cluster_key, job)))
        tp_fraction, cp_fraction = fractions = self._exposed_fractions(layer, priced, job)
        scaled = fractions is not _NOT_OVERLAPPED  # NB: else every fraction is 1.0, and x * 1.0 is x
        ep_fraction = self.ep_exposed_fraction(layer, priced, job, op_sums_s)
        comm: dict[str, float] = {}
        comm_fwd = 0.0
        for c, comm_s in priced:
            if scaled and c.axis in ("tp", "cp"):
                comm_s *= (tp_fraction if c.axis == "tp" else cp_fraction)[0 if c.phase == "fwd" else 1]
            elif c.axis == "ep" and ep_fraction != (1.0, 1.0):
                comm_s *= ep_fraction[0 if c.phase == "fwd" else 1]
            comm[c.axis] = comm.get(c.axis, 0.0) + comm_s
            if c.phase == "fwd":
                comm_fwd += comm_s
        return comm, comm_fwd, tp_fraction, cp_fraction, ep_fraction

    def _layer_op_sums_s(self, layer: Layer, job: Job) -> OpSums:
        """A layer's forward, backward, selective-recompute and weight-gradient seconds: its ops' times (each op
        priced once) summed in order (ordered_sum)."""
        known = self._op_times.get((id(layer), id(job.cluster.device)))
        seconds: Sequence[float]
        if known is None:
            ops = layer.fwd + layer.bwd
            times = {id(op): self.op_time_s(op, job) for op in ops}  # each op priced once
            seconds = [times[id(op)] for op in ops]
        else:
            stack, device = job.stack, job.cluster.device
            fp8 = self.policy(job.parallel.precision).linear_dtype == "fp8"
            seconds = known if fuses_every_op(stack, fp8) else \
                [self._unfused_s(op, op_s, stack, fp8, device) for op, op_s in zip(layer.fwd + layer.bwd, known,
                                                                                     strict=True)]
        forward, backward = seconds[:len(layer.fwd)], seconds[len(layer.fwd):]
        return (ordered_sum(forward), ordered_sum(backward),
                ordered_sum([op_s for op, op_s in zip(layer.fwd, forward, strict=True) if op.recompute_selective]),
                ordered_sum([op_s for op, op_s in zip(layer.bwd, backward, strict=True)
                             if op.name.endswith(".wgrad")]))

    def fuses_every_op(self, job: Job) -> bool:
        """Whether the job's stack runs every op of its precision as the graph prices it (no unfused traffic:
        stack_effects.fuses_every_op): its layers' op times are then the op costs' own."""
        return fuses_every_op(job.stack, self.policy(job.parallel.precision).linear_dtype == "fp8")

    def _exposed_fractions(self, layer: Layer, priced: list[tuple[Comm, float]],
                           job: Job) -> tuple[tuple[float, float], tuple[float, float]]:
        """tp_exposed_fraction and cp_exposed_fraction of the layer's priced feature collectives; the phases'
        totals summed only where the stack overlaps the layer's tp or cp collectives (else _NOT_OVERLAPPED: all
        1.0, as the two give then)."""
        par = job.parallel
        dgrad = self.overlaps_dgrad(job)
        if not ((par.sp and par.tp > 1 and self.overlaps("tp_comm_overlap", job)) or dgrad
                or (par.cp > 1 and self.overlaps("cp_comm_overlap", job))):
            return _NOT_OVERLAPPED
        totals = {axis: {"fwd": 0.0, "bwd": 0.0} for axis in ("tp", "cp")}
        for c, seconds in priced:
            if c.axis in totals:
                totals[c.axis][c.phase] += seconds
        tp_fraction = self.dgrad_exposed_fraction(layer, priced, totals["tp"]["bwd"], job) if dgrad else \
            self.tp_exposed_fraction(layer, totals["tp"], job)
        return (tp_fraction, self.cp_exposed_fraction(layer, totals["cp"], job))

    def overlaps_dgrad(self, job: Job) -> bool:
        """Whether the job's column-parallel linears overlap their backward collectives with their own GEMMs
        (StackSpec.tp_dgrad_overlap, at tp > 1), where userbuffers (tp_comm_overlap, under sp) do not already
        pipeline every tp collective with the GEMMs."""
        par = job.parallel
        return (par.tp > 1 and self.overlaps("tp_dgrad_overlap", job)
                and not (par.sp and self.overlaps("tp_comm_overlap", job)))

    def dgrad_exposed_fraction(self, layer: Layer, priced: list[tuple[Comm, float]], bwd_tp_s: float,
                               job: Job) -> tuple[float, float]:
        """(forward, backward) exposed fractions of the layer's tp collectives (bwd_tp_s: the backward's seconds)
        where each column-parallel linear overlaps its backward collectives with its own GEMMs (overlaps_dgrad):
        Megatron's LinearWithGradAccumulationAndAsyncCommunication.backward (megatron/core/tensor_parallel/
        layers.py, megatron-core 0.1.0 and 0.9.0) issues the input gradient's all-reduce (reduce-scatter under
        sp) with async_op=True before the weight-gradient GEMM and waits after it; under sp it first all-gathers
        the saved input again for that GEMM, async, beside the input-gradient GEMM. Each pair is priced as
        overlapped (stack_effects.column_backward_s); the re-gather, which the graph does not carry (a forward
        all-gather of the same input: ir.graph.Comm.column_input), adds its exposed part, so under sp the
        fraction may exceed 1. The forward's collectives stay exposed."""
        if bwd_tp_s <= 0.0:
            return (1.0, 1.0)
        per_column: dict[str, list[float]] = {}  # column matmul -> [its input gradient's seconds, re-gather's]
        for c, seconds in priced:
            if c.axis != "tp" or not c.column_input:
                continue
            if c.phase == "bwd" and c.collective in ("all-reduce", "reduce-scatter"):
                per_column.setdefault(c.column_input, [0.0, 0.0])[0] += seconds
            elif c.phase == "fwd" and c.collective == "all-gather" and job.parallel.sp:
                per_column.setdefault(c.column_input, [0.0, 0.0])[1] += seconds
        gemms = {op.name: op for op in layer.bwd if op.kind == "matmul"}
        gamma = self.overlap_slowdown(job)
        exposed = bwd_tp_s
        for column, (dgrad_comm, regather) in per_column.items():
            wgrad, dgrad = gemms.get(column + ".wgrad"), gemms.get(column + ".dgrad")
            if wgrad is None or dgrad is None or dgrad_comm <= 0.0:
                continue
            exposed += column_backward_s(dgrad_comm, self.op_time_s(wgrad, job), regather,
                                         self.op_time_s(dgrad, job), gamma) - dgrad_comm
        return (1.0, exposed / bwd_tp_s)

    def tp_exposed_fraction(self, layer: Layer, tp_s: dict[str, float], job: Job) -> tuple[float, float]:
        """Of the tensor-parallel collectives of forward and backward (tp_s: phase -> seconds), the fraction
        left exposed. A stack with tp_comm_overlap (Megatron-Core's userbuffers; NeMo turns it on with sequence
        parallelism only, nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py, nemo-toolkit 2.0.0) splits
        each GEMM and its all-gather / reduce-scatter into tp chunks and pipelines them: bucketed overlap
        (stack_effects.bucketed_s) with tp buckets over the phase's GEMMs."""
        par = job.parallel
        if not (par.sp and par.tp > 1 and self.overlaps("tp_comm_overlap", job)):
            return (1.0, 1.0)
        gamma = self.overlap_slowdown(job)
        out: list[float] = []
        for phase, ops in (("fwd", layer.fwd), ("bwd", layer.bwd)):
            total = tp_s[phase]
            if total <= 0.0:
                out.append(1.0)
                continue
            gemm = self.ops_time_s(tuple(op for op in ops if op.kind == "matmul"), job)
            out.append(bucketed_s(total, gemm, float(par.tp), gamma) / total)
        return (out[0], out[1])

    def cp_exposed_fraction(self, layer: Layer, cp_s: dict[str, float], job: Job) -> tuple[float, float]:
        """Of the context-parallel collectives of forward and backward (cp_s: phase -> seconds), the fraction
        left exposed. A stack with cp_comm_overlap runs ring attention: each step's keys and values (in backward
        also their gradients) travel to the next rank while the current step's attention runs, so the exchange
        hides behind the phase's attention kernels (stack_effects.overlapped_s)."""
        if job.parallel.cp <= 1 or not self.overlaps("cp_comm_overlap", job):
            return (1.0, 1.0)
        gamma = self.overlap_slowdown(job)
        out: list[float] = []
        for phase, ops in (("fwd", layer.fwd), ("bwd", layer.bwd)):
            total = cp_s[phase]
            attention = self.ops_time_s(tuple(op for op in ops if op.kind == "attention"), job)
            out.append(overlapped_s(total, attention, gamma) / total if total > 0.0 else 1.0)
        return (out[0], out[1])

    def ep_exposed_fraction(self, layer: Layer, priced: list[tuple[Comm, float]], job: Job,
                            op_sums_s: OpSums | None = None) -> tuple[float, float]:
        """Of the layer's expert all-to-alls of forward and backward (priced: its feature collectives), the
        fraction left exposed over the step. A paired forward's all-to-alls hide behind the paired backward's
        compute of the layer and the backward's behind the forward's (combined_1f1b.py: "EP A2A in forward step is
        hidden by the attention/mlp computation in the backward step, and vice versa"; stack_effects.overlapped_s);
        the unpaired passes (1 - the ep_overlap_share) stay exposed. op_sums_s: the layer's _layer_op_sums_s,
        made here where not given."""
        share = ep_overlap_share_of(job)
        if share <= 0.0:
            return (1.0, 1.0)
        ep_fwd = sum(seconds for c, seconds in priced if c.axis == "ep" and c.phase == "fwd")
        ep_bwd = sum(seconds for c, seconds in priced if c.axis == "ep" and c.phase != "fwd")
        if ep_fwd <= 0.0 and ep_bwd <= 0.0:
            return (1.0, 1.0)
        forward_s, backward_s, _, _ = op_sums_s if op_sums_s is not None else self._layer_op_sums_s(layer, job)
        gamma = self.overlap_slowdown(job)
        out: list[float] = []
        for total, window in ((ep_fwd, backward_s), (ep_bwd, forward_s)):
            paired = overlapped_s(total, window, gamma) / total if total > 0.0 else 1.0
            out.append(1.0 - share + share * paired)
        return (out[0], out[1])

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
                par.vpp, par.sp, self._stack_key(job.stack))

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
        forward, backward, wgrad, feature_comm = self._stage_work(stage, job)
        recompute = self._stage_recompute_s(stage, job)
        fsdp = self.zero3_exposed_s(stage, job) if par.zero >= 3 else 0.0
        comm = dict(feature_comm)
        if par.pp > 1:
            comm["pp"] = self.pipeline_send_s(stage, job)
        feature_fwd = sum(part.count * self.layer_cost(part.layer, job).comm_fwd_s for part in stage)
        chain = self.pipeline_chain_s(stage, job) if par.pp > 1 else 0.0
        return StageCost(forward + backward, recompute, comm, fsdp, overhead_s, wgrad, forward, backward,
                         feature_fwd, chain)

    def _stage_work(self, stage: list[StagePart], job: Job) -> tuple[float, float, float, dict[str, float]]:
        """Forward, backward, the weight-gradient GEMMs and the feature communication per axis of one
        micro-batch through the stage; once per (stage layers, cluster, layouts, stack)."""
        key = ("work", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job),
               self._stack_key(job.stack), job.parallel.sp, job.parallel.precision)
        work = self._stage_work_s.get(key)
        if work is None:
            forward = backward = wgrad = 0.0
            comm: dict[str, float] = {}
            for part in stage:
                cost = self.layer_cost(part.layer, job)
                forward += part.count * cost.fwd_s
                backward += part.count * cost.bwd_s
                wgrad += part.count * cost.wgrad_s
                for axis, seconds in cost.comm_s.items():
                    comm[axis] = comm.get(axis, 0.0) + part.count * seconds
            work = self._stage_work_s[key] = (forward, backward, wgrad, comm)
        return work

    def _stage_recompute_s(self, stage: list[StagePart], job: Job) -> float:
        """What recompute repeats of one micro-batch's forward: every block's forward and its forward
        communication (full), the selective ops (selective), nothing (none)."""
        recompute_mode = job.parallel.recompute
        key = ("recompute", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job), recompute_mode,
               self._stack_key(job.stack), job.parallel.sp, job.parallel.precision)
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

    def zero3_exposed_s(self, stage: list[StagePart], job: Job) -> float:
        """Under ZeRO-3, per micro-batch: the stage's gathers and scatters left exposed (fsdp_exposed_s; the
        forward's only where the stack buckets the gradients, whose backward pass is fsdp_bucketed_backward_s's)."""
        seconds = self._stage_fsdp_s(stage, job)
        if self.fsdp_bucketed(job):
            seconds += self.fsdp_bucketed_backward_s(stage, job, job.parallel.recompute)
        return seconds

    def _stage_fsdp_s(self, stage: list[StagePart], job: Job) -> float:
        """ZeRO-3 gathers and scatters left exposed over the stage's layers (fsdp_exposed_s)."""
        key = ("fsdp", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job),
               job.parallel.precision, job.parallel.sp, self._stack_key(job.stack))
        seconds = self._stage_extra_s.get(key)
        if seconds is None:
            seconds = 0.0
            for part in stage:
                seconds += part.count * self.fsdp_exposed_s(part.layer, self.layer_cost(part.layer, job), job)
            self._stage_extra_s[key] = seconds
        return seconds

    def stage_forward_fraction(self, stage: list[StagePart], job: Job) -> float:
        """The forward pass's share of one micro-batch's compute and feature communication on the stage (the
        rest is backward and recompute): what an uneven pipeline's warm-up and cool-down stalls read."""
        key = ("forward", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job),
               self._stack_key(job.stack), job.parallel.recompute)
        fraction = self._stage_extra_s.get(key)
        if fraction is None:
            forward = 0.0
            for part in stage:
                cost = self.layer_cost(part.layer, job)
                forward += part.count * (cost.fwd_s + cost.comm_fwd_s)
            forward_s, backward_s, _, comm = self._stage_work(stage, job)
            whole = forward_s + backward_s + self._stage_recompute_s(stage, job) + sum(comm.values())
            fraction = self._stage_extra_s[key] = forward / whole if whole > 0.0 else 0.0
        return fraction

    def chunk_time_shares(self, partition: Partition, job: Job) -> tuple[tuple[float, ...], ...]:
        """Per stage of a partition with chunk_blocks, each model chunk's share of the stage's forward and
        backward compute: its blocks' (the stage's blocks of each kind in one proportion), the embedding's on
        the first chunk, the head's on the last. Empty for a partition without chunk_blocks. Once per
        (partition, cluster, layouts)."""
        key = (id(partition), self._cluster_key(job.cluster), _layout_key(job), self._stack_key(job.stack))
        shares = self._chunk_shares.get(key)
        if shares is None:
            shares = self._chunk_shares[key] = tuple(
                self._chunk_time_shares(stage, blocks_per_chunk, job)
                for stage, blocks_per_chunk in zip(partition.stages, partition.chunk_blocks, strict=False))
        return shares

    def _chunk_time_shares(self, stage: list[StagePart], blocks_per_chunk: tuple[int, ...],
                           job: Job) -> tuple[float, ...]:
        blocks = sum(blocks_per_chunk)
        per_chunk = [0.0] * len(blocks_per_chunk)
        for part in stage:
            cost = self.layer_cost(part.layer, job)
            seconds = part.count * (cost.fwd_s + cost.bwd_s)
            if part.layer.kind in BLOCK_KINDS:
                for chunk, count in enumerate(blocks_per_chunk):
                    per_chunk[chunk] += seconds * count / blocks
            else:
                per_chunk[-1 if part.layer.kind == "head" else 0] += seconds
        total = sum(per_chunk)
        return tuple(value / total if total > 0.0 else 1.0 / len(per_chunk) for value in per_chunk)

    def forward_fractions(self, partition: Partition, job: Job) -> tuple[float, ...]:
        """stage_forward_fraction of every stage of the partition."""
        key = ("forward", id(partition), self._cluster_key(job.cluster), _layout_key(job),
               self._stack_key(job.stack), job.parallel.recompute)
        fractions = self._forward_fractions.get(key)
        if fractions is None:
            fractions = self._forward_fractions[key] = tuple(self.stage_forward_fraction(stage, job)
                                                        for stage in partition.stages)
        return fractions

    def pipeline_send_s(self, stage: list[StagePart], job: Job) -> float:
        """Each micro-batch sends its activation forward and its gradient backward once per model chunk
        (pipeline_hop_s each). A stack with pp_comm_overlap (interleaved schedules only, as Megatron-Core's
        overlap_p2p_comm) hides each behind one chunk's forward or backward (stack_effects.overlapped_s)."""
        one = self.pipeline_hop_s(max(part.layer.output_bytes for part in stage), job)
        if job.parallel.vpp > 1 and self.overlaps("pp_comm_overlap", job):
            forward, backward, _, _ = self._stage_work(stage, job)
            return self.pipeline_sends_s(one, forward + backward, job)
        return self.pipeline_sends_s(one, 0.0, job)

    def pipeline_chain_s(self, stage: list[StagePart], job: Job) -> float:
        """What the fill and drain of an interleaved pipeline wait for beyond the bubble when the stack overlaps
        its sends (pipeline_chain_from_s); 0 otherwise."""
        par = job.parallel
        if par.vpp <= 1 or not self.overlaps("pp_comm_overlap", job):
            return 0.0
        forward, backward, _, _ = self._stage_work(stage, job)
        hop = self.pipeline_hop_s(max(part.layer.output_bytes for part in stage), job)
        return self.pipeline_chain_from_s(hop, forward + backward, job)

    def pipeline_chain_from_s(self, hop_s: float, compute_s: float, job: Job) -> float:
        """Overlapping a send hides it from the sender, not from the stage that waits for its data. In the
        interleaved schedule (Narayanan et al. 2021, sec. 2.2.2) a stage runs chunk c of p micro-batches, then
        chunk c + 1 of the first of them, whose input has gone round the p stages meanwhile: p forwards and p
        hops of the data against the stage's p forwards and their exposed sends, so each of the v - 1 rounds of
        the warm-up, and of the cool-down, waits p (hop - exposed hop), and the fill and drain of the last
        round p - 1 each: 2 (v p - 1) (hop - exposed hop) in all (0 for v = 1 or sends that are not overlapped:
        a blocking send is in the stage's own time). hop_s: one send (pipeline_hop_s); compute_s: the stage's
        forward and backward (the window pipeline_sends_s overlaps each send with)."""
        par = job.parallel
        exposed = overlapped_s(hop_s, compute_s / (2.0 * par.vpp), self.overlap_slowdown(job))
        return 2.0 * (par.vpp * par.pp - 1) * (hop_s - exposed)

    def pipeline_sends_s(self, hop_s: float, compute_s: float, job: Job) -> float:
        """pipeline_send_s of a stage whose activation crosses a boundary in hop_s (pipeline_hop_s of its largest
        output) and whose forward and backward take compute_s (read only where pp_comm_overlap hides the sends:
        vpp > 1). The search's grid engine calls it once per stage and vpp."""
        par = job.parallel
        one = hop_s
        if par.vpp > 1 and self.overlaps("pp_comm_overlap", job):
            one = overlapped_s(one, compute_s / (2.0 * par.vpp), self.overlap_slowdown(job))
        return 2.0 * par.vpp * one + self.cal.runtime.pipeline_overhead_per_micro_batch_s

    def pipeline_hop_s(self, out_bytes: float, job: Job, layout: GroupLayout | None = None) -> float:
        """One activation (or gradient) of out_bytes crossing a pipeline boundary. Megatron-LM's scatter-gather
        (pp_scatter_gather; not with sequence parallelism, whose activations are already split) sends 1/tp of
        it from each tensor-parallel rank and all-gathers it over the tensor-parallel group at the receiver
        (megatron/p2p_communication.py, Megatron-LM v3.0). layout: the boundary's pair of ranks where the stages
        differ in size (ClusterSpec.ranks_layout); default: the pipeline group's (axis pp)."""
        par = job.parallel
        scatter = job.stack.pp_scatter_gather and par.tp > 1 and not par.sp
        sent = out_bytes / par.tp if scatter else out_bytes
        seconds = self.axis_collective_s("send-recv", sent, "pp", job) if layout is None else \
            self.collective_s("send-recv", sent, layout, job)
        return seconds + self.axis_collective_s("all-gather", out_bytes, "tp", job) if scatter else seconds

    # --- overlap and exposed gradient communication ---

    def overlaps(self, behaviour: Overlapped, job: Job) -> bool:
        """Whether the job's stack overlaps this communication with compute; never on a device whose
        collectives take the cores that compute (a CPU with gloo)."""
        return bool(getattr(job.stack, behaviour)) and job.cluster.device.comm_overlaps_compute

    def overlap_slowdown(self, job: Job) -> float:
        """gamma: compute and an overlapped collective both slow by 1 + gamma while they run together (the
        fitted runtime.overlap_slowdown; stack_effects)."""
        return self.cal.runtime.overlap_slowdown

    def fsdp_exposed_s(self, layer: Layer, cost: LayerCost, job: Job) -> float:
        """ZeRO-3/FSDP, per micro-batch: all-gather the layer's weights for forward and again for backward,
        reduce-scatter its gradients after backward. With prefetch (fsdp_prefetch_depth >= 1) the gathers run
        ahead on their own stream, one layer's gather (and, in backward, the reduce-scatter of the layer
        before) per layer's compute: what does not fit under the compute stays exposed, whatever the depth
        (a deeper prefetch only absorbs uneven layers). Without prefetch each gather waits until its layer is
        reached, behind the reduce-scatter before it (collectives of one NCCL communicator run in order): all
        exposed."""
        gather = self.fsdp_gather_s(layer, job)
        if job.stack.fsdp_prefetch_depth == 0 or not job.cluster.device.comm_overlaps_compute:
            return 2.0 * gather + self.fsdp_scatter_s(layer.param_count, job)
        gamma = self.overlap_slowdown(job)
        # The data-parallel gathers run on their own stream and communicator while the layer computes and while
        # its feature collectives (tp, cp, ep: other groups) run: both are the window (compile.apply_zero)
        forward = overlapped_s(gather, cost.fwd_s + cost.comm_fwd_s, gamma)
        if self.fsdp_bucketed(job):  # the backward pass with its buckets: fsdp_bucketed_backward_s
            return forward
        feature_bwd_s = sum(cost.comm_s.values()) - cost.comm_fwd_s
        return forward + overlapped_s(gather + self.fsdp_scatter_s(layer.param_count, job),
                                      cost.bwd_s + feature_bwd_s, gamma)

    def fsdp_bucketed(self, job: Job) -> bool:
        """Whether ZeRO-3's gradients go in buckets (fsdp_bucketed_backward_s) rather than per layer."""
        stack = job.stack
        return stack.fsdp_bucket_params > 0.0 and stack.fsdp_prefetch_depth > 0 and \
            job.cluster.device.comm_overlaps_compute

    def fsdp_bucketed_backward_s(self, stage: list[StagePart], job: Job, recompute: str) -> float:
        """ZeRO-3 with gradient buckets (fsdp_bucket_params), per micro-batch: the exposed seconds of the backward
        pass's weight gathers and bucketed reduce-scatters, which share the gradient stream (and the NIC)
        (stack_effects.bucketed_backward_s over fsdp_backward_steps); the compute does not wait for a bucket
        before the micro-batch's backward ends (compile/apply_zero.py: DeepSpeed's reduce stream). recompute:
        the job's mode (the search's grid engine asks for each). Once per (stage, cluster, layouts, precision, sp,
        stack, recompute)."""
        key = ("fsdp-backward", self.stage_key(stage), self._cluster_key(job.cluster), _layout_key(job),
               job.parallel.precision, job.parallel.sp, self._stack_key(job.stack), recompute)
        seconds = self._stage_extra_s.get(key)
        if seconds is None:
            seconds = self._stage_extra_s[key] = bucketed_backward_s(self.fsdp_backward_steps(stage, job, recompute),
                                                                     self.overlap_slowdown(job))
        return seconds

    def fsdp_backward_steps(self, stage: list[StagePart], job: Job,
                            recompute: str) -> list[tuple[float, float, float, float]]:
        """Per layer instance of the stage in backward order, what stack_effects.bucketed_backward_s reads: its
        recompute (full: forward with its feature collectives, not the embedding's and the head's; selective:
        the selective ops), its backward window (with its backward feature collectives, as fsdp_exposed_s), its
        weights' all-gather and the reduce-scatter of the gradient bucket it closes (stack_effects.bucket_closes
        of fsdp_bucket_params, as compile/apply_zero.py fills them; a partial layer of an uneven split takes its
        share of each)."""
        closes = bucket_closes([(part.layer.param_count, part.count) for part in stage[::-1]],
                               job.stack.fsdp_bucket_params)
        instances = [part for part in stage[::-1]
                     for _ in range(int(part.count) + (part.count - int(part.count) > 1e-9))]
        steps = []
        for part, (share, params) in zip(instances, closes, strict=True):
            cost = self.layer_cost(part.layer, job)
            redo = 0.0
            if recompute == "full" and part.layer.kind not in ("embedding", "head"):
                redo = cost.fwd_s + cost.comm_fwd_s
            elif recompute == "selective":
                redo = cost.selective_s
            window = cost.bwd_s + (sum(cost.comm_s.values()) - cost.comm_fwd_s)
            scatter = self.fsdp_scatter_s(params, job) if params else 0.0
            steps.append((share * redo, share * window, share * self.fsdp_gather_s(part.layer, job), scatter))
        return steps

    def fsdp_scatter_s(self, params: float, job: Job) -> float:
        """ZeRO-3: the reduce-scatter of `params` gradients over the gradient group (a layer's, or a bucket's)."""
        return self.axis_collective_s("reduce-scatter", params * self.policy(job.parallel.precision).grad_bytes,
                                      "grad", job)

    def fsdp_gather_s(self, layer: Layer, job: Job) -> float:
        """ZeRO-3: the all-gather of one layer's weights over the gradient group (fsdp_exposed_s's)."""
        policy = self.policy(job.parallel.precision)
        return self.axis_collective_s("all-gather", layer.param_count * policy.weight_bytes, "grad", job)

    def gradient_sync_exposed_s(self, stage: list[StagePart], cost: StageCost, job: Job) -> float:
        """DP gradient reduction (ZeRO 0: all-reduce; 1-2: reduce-scatter, then the parameter all-gather of the
        distributed optimizer), one collective per bucket of the stack's grad_bucket_params (grad_bucket_runs).
        Overlapped (grad_reduce_overlap), the buckets go as the last micro-batch's backward (and its recompute)
        fills them, one after another (stack_effects.queued_buckets_s); else all after it. The parameter
        all-gather overlaps the next forward pass bucket by bucket (param_gather_overlap) or follows the step."""
        par = job.parallel
        if par.dp * par.cp == 1 or par.zero >= 3:
            return 0.0
        key = (self._pin(cost), self.stage_key(stage), _layout_key(job), self._cluster_key(job.cluster),
               self._stack_key(job.stack), par.zero, par.precision, par.schedule)
        exposed = self._grad_sync.get(key)
        if exposed is None:
            exposed = self._grad_sync[key] = self._gradient_sync_s(stage, cost, job)
        return exposed

    def _gradient_sync_s(self, stage: list[StagePart], cost: StageCost, job: Job) -> float:
        # NB: the windows hold the phase's feature collectives too: they run on their own stream beside the
        # gradient stream, and a layer's gradient (its forward) is done only after them
        feature_bwd = sum(seconds for axis, seconds in cost.comm_s.items() if axis != "pp") - cost.feature_fwd_s
        par = job.parallel
        backward, forward = cost.backward_s + cost.recompute_s + feature_bwd, cost.forward_s + cost.feature_fwd_s
        micro_batches = window_micro_batches(par.schedule, par.pp)
        exposed = self.gradient_sync_windows_s(stage, backward * micro_batches, forward * micro_batches, job)
        if micro_batches == 1:
            return exposed
        # interleaved: the first chunk's buckets still fill over its own last backward alone (and the next
        # forward needs its gathers first), about the stage's one-micro-batch exposure over vpp
        one_chunk = self.gradient_sync_windows_s(stage, backward / par.vpp, forward / par.vpp, job) / par.vpp
        return max(exposed, one_chunk)

    def gradient_sync_windows_s(self, stage: list[StagePart], backward_window_s: float, forward_window_s: float,
                                job: Job) -> float:
        """gradient_sync_exposed_s given its windows: the last micro-batch's backward (with its recompute and
        feature collectives) that the reduction's buckets overlap, and the next forward pass (with its feature
        collectives) that the parameter all-gather overlaps, each over window_micro_batches micro-batches. The
        search's grid engine calls it directly."""
        par = job.parallel
        key = ("windows", self.stage_key(stage), backward_window_s, forward_window_s, _layout_key(job),
               self._cluster_key(job.cluster), self._stack_key(job.stack), par.zero, par.precision)
        exposed = self._grad_sync.get(key)
        if exposed is None:
            exposed = self._grad_sync[key] = self._gradient_sync_windows_s(stage, backward_window_s,
                                                                           forward_window_s, job)
        return exposed

    def _gradient_sync_windows_s(self, stage: list[StagePart], backward_window_s: float, forward_window_s: float,
                                 job: Job) -> float:
        queues = self.gradient_queues(stage, job)
        gamma = self.overlap_slowdown(job)
        reduce, gather = queues.reduce, queues.gather
        exposed = queue_exposed_s(reduce, backward_window_s, gamma) if queues.reduce_overlaps else reduce.total_s
        if job.parallel.zero > 0:
            exposed += queue_exposed_s(gather, forward_window_s, gamma) if queues.gather_overlaps else \
                gather.total_s
        return exposed

    def gradient_queues(self, stage: list[StagePart], job: Job) -> "GradientQueues":
        """The stage's gradient reduction as queues of buckets (stack_effects.BucketQueue), one collective per
        bucket: ZeRO 0's all-reduces, or ZeRO 1-2's reduce-scatters and the distributed optimizer's parameter
        all-gathers (in the order the next forward pass needs them where they overlap it, else after the step;
        an empty queue at ZeRO 0). Once per (the stage's layers' parameters and counts, bucket size, the
        gradient group, cluster, stack, ZeRO 0 or not, precision): what the queues read."""
        par = job.parallel
        layers = tuple([(part.layer.param_count, part.count) for part in stage])
        experts = expert_parts(stage, par)
        key = ("queues", layers, axis_group("grad", par), self._cluster_key(job.cluster), self._stack_key(job.stack),
               par.zero > 0, par.precision) + ((experts, par.tp, par.sp, par.ep) if experts else ())
        queues = self._grad_queues.get(key)
        if queues is None:
            queues = self._grad_queues[key] = self._gradient_queues(layers, job, experts)
        return queues

    def _grouped_runs_s(self, layers: tuple[tuple[float, float], ...], experts: tuple[tuple[float, int], ...],
                        job: Job) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
        """new_gradient_runs_s of a stage whose MoE experts sum their gradient over their expert data-parallel
        group (strategy.expert_groups): as the simulator's buckets (compile/insert_collectives.py), each group
        fills buckets of its own (Megatron-Core's expert parameter buffers: megatron/core/distributed/
        distributed_data_parallel.py, megatron-core 0.16.1), whole layers in the order the gradients become
        final, a bucket sent once it holds grad_bucket_params or at its group's last layer; one queue of them
        in closing order (the data-parallel group's first where both close at one layer). experts: per layer of
        `layers`, its experts' parameters and tp degree ((0.0, 0) for none: expert_parts)."""
        par = job.parallel
        policy = self.policy(par.precision)
        backward = _grouped_buckets(layers[::-1], experts[::-1], job.stack.grad_bucket_params, par)
        reduce = self._grouped_seconds("all-reduce" if par.zero == 0 else "reduce-scatter", policy.grad_bytes,
                                       backward, job)
        gather: list[tuple[float, int]] = []
        if par.zero > 0 and self.overlaps("param_gather_overlap", job):
            forward = _grouped_buckets(layers, experts, job.stack.grad_bucket_params, par)
            gather = self._grouped_seconds("all-gather", policy.weight_bytes, forward, job)[::-1]
        elif par.zero > 0:
            gather = self._grouped_seconds("all-gather", policy.weight_bytes, backward, job)
        return reduce, gather

    def _grouped_seconds(self, collective: str, bytes_per_param: float, buckets: list[tuple[float, int]],
                         job: Job) -> list[tuple[float, int]]:
        """Runs of (seconds of one bucket, how many in a row) of buckets of (parameters, expert tp degree: 0 for
        the data-parallel group's), each over its group."""
        runs: list[tuple[float, int]] = []
        for params, degree in buckets:
            layout = self.layout("grad", job) if degree == 0 else self.expert_data_layout(degree, job)
            seconds = self.collective_s(collective, params * bytes_per_param, layout, job)
            if runs and runs[-1][0] == seconds:
                runs[-1] = (seconds, runs[-1][1] + 1)
            else:
                runs.append((seconds, 1))
        return runs

    def expert_data_layout(self, expert_tp: int, job: Job) -> GroupLayout:
        """Where the ranks of the expert data-parallel group of experts split over expert_tp tp ranks sit
        (strategy.expert_groups.expert_data_ranks), made once per (what the group reads of the plan, cluster):
        the group lists its ranks, thousands of them at scale."""
        par = job.parallel
        key = ("experts", par.tp, par.cp, par.dp, par.ep, par.sp, expert_tp, self._cluster_key(job.cluster))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = job.cluster.ranks_layout(expert_data_ranks(par, expert_tp))
        return layout

    def new_gradient_runs_s(self, layers: tuple[tuple[float, float], ...], job: Job,
                            experts: tuple[tuple[float, int], ...] = ()
                            ) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
        """The runs of buckets (seconds of one bucket, how many in a row, in sending order) of gradient_queues'
        two queues (the reduction's, the parameter gathers') of a stage whose layers' (parameters, count) are
        `layers` in the stage's order, made anew and not kept: for a caller that keeps its own table (the
        search's grid engine, once per its key of what the queues read). experts: the stage's expert_parts
        (() where its experts, if any, reduce over the data-parallel group)."""
        if experts:
            return self._grouped_runs_s(layers, experts, job)
        par = job.parallel
        policy = self.policy(par.precision)
        reduce = self._bucket_seconds("all-reduce" if par.zero == 0 else "reduce-scatter", policy.grad_bytes,
                                      self._bucket_runs(layers, job, False), job)
        gather: list[tuple[float, int]] = []
        if par.zero > 0 and self.overlaps("param_gather_overlap", job):
            # the first bucket the forward pass needs waits first: the backward's queue, mirrored
            gather = self._bucket_seconds("all-gather", policy.weight_bytes,
                                          self._bucket_runs(layers, job, True), job)[::-1]
        elif par.zero > 0:
            gather = self._bucket_seconds("all-gather", policy.weight_bytes, self._bucket_runs(layers, job, False),
                                          job)
        return reduce, gather

    def _gradient_queues(self, layers: tuple[tuple[float, float], ...], job: Job,
                         experts: tuple[tuple[float, int], ...] = ()) -> "GradientQueues":
        reduce, gather = self.new_gradient_runs_s(layers, job, experts)
        return GradientQueues(bucket_queue(reduce), bucket_queue(gather), self.overlaps("grad_reduce_overlap", job),
                              self.overlaps("param_gather_overlap", job))

    def grad_bucket_runs(self, stage: list[StagePart], job: Job, forward: bool = False) -> BucketRuns:
        """The stage's gradient buckets (stack_effects.bucket_runs), filled in the order the backward pass
        finishes the layers (last layer first), or with forward=True in the order the forward pass first uses
        them (the distributed optimizer's overlapped parameter gathers)."""
        return self._bucket_runs(tuple([(part.layer.param_count, part.count) for part in stage]), job, forward)

    def _bucket_runs(self, layers: tuple[tuple[float, float], ...], job: Job, forward: bool) -> BucketRuns:
        """grad_bucket_runs of a stage whose layers' (parameters, count) are `layers`."""
        key = (layers, job.stack.grad_bucket_params, forward)  # what bucket_runs reads: stages of one tp share it
        runs = self._grad_buckets.get(key)
        if runs is None:
            runs = self._grad_buckets[key] = bucket_runs(layers if forward else layers[::-1], key[1])
        return runs

    def _bucket_seconds(self, collective: str, bytes_per_param: float, runs: BucketRuns,
                        job: Job) -> list[tuple[float, int]]:
        return [(self.axis_collective_s(collective, params * bytes_per_param, "grad", job), count)
                for params, count in runs]

    # --- ranks that differ (cost.rank_classes: device classes, shared with the simulator's compiler) ---

    def device_classes(self, job: Job) -> list[DeviceClass]:
        """rank_classes.device_classes(job), once per (cluster, tp, cp, dp); one uniform class when the cluster
        names no rank overrides."""
        par = job.parallel
        key = (self._pin(job.cluster), par.tp, par.cp, par.dp, par.pp)
        classes = self._classes.get(key)
        if classes is None:
            classes = self._classes[key] = device_classes(job)
        return classes

    def job_on(self, job: Job, device_name: str) -> Job:
        """The job on one of its cluster's rank devices (its prices), the cluster made once per device."""
        if device_name == job.cluster.device.name:
            return job
        key = (self._pin(job.cluster), device_name)
        cluster = self._rank_clusters.get(key)
        if cluster is None:
            cluster = self._rank_clusters[key] = job_on_device(job, rank_device(job, device_name)).cluster
        return dataclasses.replace(job, cluster=cluster)

    def class_stage_costs(self, partition: Partition, job: Job,
                          classes: list[DeviceClass]) -> list[list[StageCost]]:
        """Per device class, its pipeline column's stage costs: each stage's compute (forward, backward, the
        recompute's ops, the host overheads) is that of the class's slowest kind of rank in the stage (the job
        priced on the rank's device, times its slow-down), its communication the cluster's: what the simulator's
        compiler gives each class's compute and comm tasks (compile/device_classes.py)."""
        base = self.stage_costs(partition, job)
        default = default_kind(job)
        on_device: dict[str, list[StageCost]] = {default[0]: base}
        columns: list[list[StageCost]] = []
        for cls in classes:
            column: list[StageCost] = []
            for index, cost in enumerate(base):
                slowest: StageCost | None = None
                for name, slowdown in cls.kinds(index, default):
                    costs = on_device.get(name)
                    if costs is None:
                        costs = on_device[name] = self.stage_costs(partition, self.job_on(job, name))
                    stage = partition.stages[index]
                    ranked = self._rank_stage_cost(cost, costs[index], slowdown, self._recompute_comm_s(stage, job))
                    if slowest is None or ranked.total_s > slowest.total_s:
                        slowest = ranked
                column.append(slowest or cost)
            columns.append(column)
        return columns

    def _rank_stage_cost(self, base: StageCost, on: StageCost, slowdown: float, recompute_comm_s: float) -> StageCost:
        if on is base and slowdown == 1.0:
            return base
        key = (self._pin(base), self._pin(on), slowdown, recompute_comm_s)
        cost = self._rank_stage_costs.get(key)
        if cost is None:
            comm = dict(base.comm_s)
            if "pp" in comm:  # the pipeline's host overhead per micro-batch is the rank's (a compute task)
                comm["pp"] += (slowdown - 1.0) * self.cal.runtime.pipeline_overhead_per_micro_batch_s
            recompute = slowdown * (on.recompute_s - recompute_comm_s) + recompute_comm_s
            cost = self._rank_stage_costs[key] = StageCost(
                slowdown * on.compute_s, recompute, comm, base.fsdp_exposed_s, slowdown * on.overhead_s,
                slowdown * on.wgrad_s, slowdown * on.forward_s, slowdown * on.backward_s, base.feature_fwd_s,
                base.pp_chain_s)
        return cost

    def _recompute_comm_s(self, stage: list[StagePart], job: Job) -> float:
        """The forward feature collectives full recompute repeats (part of _stage_recompute_s, not compute)."""
        if job.parallel.recompute != "full":
            return 0.0
        return sum(part.count * self.layer_cost(part.layer, job).comm_fwd_s for part in stage
                   if part.layer.kind not in ("embedding", "head"))

    def class_step_s(self, stages: list[list[StagePart]], job: Job,
                     classes: list[DeviceClass]) -> tuple[float, float]:
        """(optimizer step, iteration overhead) after the barrier every stage and class meets: those of the
        (stage, kind of rank) that finishes last."""
        default = default_kind(job)
        worst = (0.0, 0.0)
        for index, stage in enumerate(stages):
            kinds = {kind for cls in classes for kind in cls.kinds(index, default)}
            for name, slowdown in kinds:
                on = self.job_on(job, name)
                step = (slowdown * self.optimizer_step_s([stage], on), slowdown * self.step_overhead_s([stage], on))
                if sum(step) > sum(worst):
                    worst = step
        return worst

    # --- step costs and memory ---

    def stage_params(self, stage: list[StagePart]) -> float:
        """Parameters one device of the stage holds."""
        key = self.stage_key(stage)
        params = self._stage_params.get(key)
        if params is None:
            params = self._stage_params[key] = sum(part.count * part.layer.param_count for part in stage)
        return params

    def optimizer_step_s(self, stages: list[list[StagePart]], job: Job) -> float:
        """The optimizer step of the stage with the most parameters, over the parameters one GPU owns; with MoE
        experts in their own expert data-parallel group, of the stage whose GPU owns the most
        (cost.memory.owned_params)."""
        experts = [stage_expert_params(stage, job.parallel) for stage in stages]
        if not any(experts):
            return self.optimizer_step_of_params_s(self.max_stage_params(stages), job)
        return max(self.optimizer_step_of_params_s(self.stage_params(stage), job, 0.0, shares)
                   for stage, shares in zip(stages, experts, strict=True))

    def step_overhead_s(self, stages: list[list[StagePart]], job: Job) -> float:
        """The host and memory-bound work of the step beside the optimizer: the iteration's fixed overhead and
        the gradient sync's bucket copies of the stage with the most parameters (grad_copies_s), as the
        simulator's step runs them (compile/build.py)."""
        return self.iteration_overhead_s(job) + self.grad_copies_s(self.max_stage_params(stages), job)

    def max_stage_params(self, stages: list[list[StagePart]]) -> float:
        """The parameters one device of the stage with the most holds (cached per partition)."""
        params = self._max_params.get(id(stages)) if id(stages) in self._partition_of else None
        if params is None:
            params = max(self.stage_params(stage) for stage in stages)
            if id(stages) in self._partition_of:
                self._max_params[id(stages)] = params
        return params

    def grad_copies_s(self, params: float, job: Job) -> float:
        """The gradient sync's bucket copies over the `params` gradients a device syncs, where the stack copies
        them (StackSpec.grad_bucket_copies) and data-parallel ranks sync them; else 0."""
        par = job.parallel
        if not job.stack.grad_bucket_copies or par.dp * par.cp == 1 or params <= 0:
            return 0.0
        return self.step_costs.grad_copies_s(params, job.cluster.device)

    def optimizer_step_of_params_s(self, params: float, job: Job, zero_state_params: float = 0.0,
                                   experts: ExpertParams | None = None) -> float:
        """The optimizer step over `params` parameters held by one device (its ZeRO shard of them), of which
        `zero_state_params` keep a zero optimizer state (zero_state_params_of) and `experts` are MoE experts'
        sharded over their expert data-parallel ranks (cost.memory.owned_params)."""
        par = job.parallel
        shards = optimizer_shards(par)
        return self.step_costs.optimizer_step_s(owned_params(params, par, experts), par.precision,
                                                job.cluster.device, zero_state_params / shards)

    def zero_state_params_of(self, layer: Layer, held_params: float, job: Job, index: int = -1) -> float:
        """Of the `held_params` a device holds of `layer` (layer instance `index` of the op graph), those whose
        optimizer state stays zero in runs that train on the same batches every step (trainsim measure's split
        executor): a DLRM's table rows that the step's batches never look up (derived: cost/optimizer_zeros.py);
        any other layer's entries between units dead for every sample, where the profile holds a census of
        them (profile/state_census.py); else none."""
        if not job.stack.split_executor:
            return 0.0
        if layer.kind == "sparse" and isinstance(job.model, DlrmSpec):
            return held_params * zero_state_share(job.model, job.parallel)
        par = job.parallel
        share = self.step_costs.zero_state_share(job.model.name, par.micro_batch * par.dp * par.num_micro_batches,
                                                 index) if index >= 0 else None
        return held_params * share if share is not None else 0.0

    def micro_batch_overhead_s(self, stage: list[StagePart], job: Job) -> float:
        key = self.stage_key(stage)
        counts = self._stage_ops.get(key)
        if counts is None:
            fwd = sum(part.count * len(part.layer.fwd) for part in stage)
            ops = sum(part.count * (len(part.layer.fwd) + len(part.layer.bwd)) for part in stage)
            layers = sum(part.count for part in stage if part.layer.kind not in ("embedding", "head"))
            counts = self._stage_ops[key] = (round(ops), round(layers), round(fwd))
        if job.stack.cuda_graphs:  # one graph launch replaces the micro-batch's kernel launches
            return 0.0
        host = self.step_costs.micro_batch_overhead_s(counts[0], counts[1], job.parallel, job.cluster.device,
                                                      job.stack.tp_module_wrappers)
        if job.stack.split_executor:  # trainsim measure's split executor: Python per op (profile/executor_overhead)
            host += self.step_costs.executor_overhead_s(job.model.kind, counts[2], counts[0] - counts[2],
                                                        job.cluster.device)
        return host + self.reshard_host_s(stage, job, key)

    def reshard_host_s(self, stage: list[StagePart], job: Job, key: object = None) -> float:
        """The host cost of one micro-batch's reshards that a strategy tree adds beyond Megatron's collectives
        (ir.graph.Comm.reshard): each call, forward or backward, its collective's measured host cost per reshard
        step beyond the collective itself (StepCosts.executor_reshard_s; profile/reshard_overhead.py, on the
        device's own profile: 0 where none measured it). The collective's own time is the layer's feature
        communication, as before. NB: per call as an explicit autograd collective runs it; a framework that
        reshards through heavier wrappers (DTensor's redistribute) pays more per call. key: the stage's
        stage_key where the caller has it."""
        key = self.stage_key(stage) if key is None else key
        calls = self._stage_reshards.get(key)
        if calls is None:
            counted: dict[tuple[str, str], float] = {}
            for part in stage:
                for c in part.layer.comms:
                    if c.reshard:
                        counted[(c.collective, c.phase)] = counted.get((c.collective, c.phase), 0.0) + part.count
            calls = self._stage_reshards[key] = tuple(sorted(counted.items()))
        device = job.cluster.device
        return sum(n * self.step_costs.executor_reshard_s(collective, phase, device)
                   for (collective, phase), n in calls)

    def executor_reshard_s(self, collective: str, phase: str, job: Job) -> float:
        """trainsim measure's split executor's host cost per reshard step (StackSpec.split_executor; profile/
        reshard_overhead.py), beyond the collective and its copies; 0 for any other stack."""
        if not job.stack.split_executor:
            return 0.0
        return self.step_costs.executor_reshard_s(collective, phase, job.cluster.device)

    def iteration_overhead_s(self, job: Job) -> float:
        return self.step_costs.iteration_overhead_s(job.cluster.device)

    def memory(self, stages: list[list[StagePart]], job: Job) -> MemoryEstimate:
        """Peak memory per GPU over the stages (cost.memory). For the stages of a partition, the stages' memory
        before the schedule is made once per (partition, cost.memory.memory_key) and the micro-batches each
        holds once per (schedule, pp, vpp, micro-batches). Where the cluster's ranks differ, the verdict is the
        stage nearest its smallest rank's memory (stage_capacities)."""
        par, cluster = job.parallel, job.cluster
        device = cluster.device
        # NB: ranks_differ, inline: a search prices every plan's memory through here
        capacities = self.stage_capacities(job) if cluster.rank_devices or cluster.compute_slowdown else ()
        partition = self._partition_of.get(id(stages))
        if partition is None:
            return estimate_memory(stages, par, device, job.stack, capacities)
        key = (id(partition), memory_key(par, job.stack))
        bases = self._memory_bases.get(key)
        if bases is None:
            distinct = {index: stage_memory_base(stages[index], par, job.stack) for index in partition.distinct}
            bases = self._memory_bases[key] = tuple(distinct[head] for head in partition.first)
        if partition.chunk_blocks and par.schedule == "interleaved-1f1b":
            # unequal chunks: the micro-batches a stage holds depend on which chunks hold them
            saved = saved_key(par.recompute, job.stack)
            flight_key = (par.schedule, par.pp, par.vpp, par.num_micro_batches, id(partition), saved)
            in_flight = self._in_flight.get(flight_key)
            if in_flight is None:
                in_flight = self._in_flight[flight_key] = tuple(
                    stage_in_flight(par, index, chunk_shares(stage, partition.chunk_blocks[index], saved))
                    for index, stage in enumerate(stages))
            return memory_estimate(bases, in_flight, device, capacities)
        flight_key = (par.schedule, par.pp, par.vpp, par.num_micro_batches, len(stages))
        in_flight = self._in_flight.get(flight_key)
        if in_flight is None:
            in_flight = self._in_flight[flight_key] = tuple(stage_in_flight(par, index)
                                                            for index in range(len(stages)))
        return memory_estimate(bases, in_flight, device, capacities)


    def stage_capacities(self, job: Job) -> tuple[float, ...]:
        """Per stage, its smallest rank's memory where the cluster's ranks differ; () where they are alike."""
        if not ranks_differ(job):
            return ()
        classes = self.device_classes(job)
        return () if uniform(classes) else stage_capacities(job, classes)


def expert_parts(stage: Sequence[StagePart], par: ParallelSpec) -> tuple[tuple[float, int], ...]:
    """Per part of the stage, its layer's experts' parameters and tp degree where their expert data-parallel
    group is not the data-parallel group ((0.0, 0) else: strategy.expert_groups); () where no part has any."""
    parts = tuple((part.layer.experts.params, part.layer.experts.tp_degree)
                  if part.layer.experts is not None and experts_own_group(par, part.layer.experts.tp_degree)
                  else (0.0, 0) for part in stage)
    return parts if any(degree for _, degree in parts) else ()


def _grouped_buckets(layers: tuple[tuple[float, float], ...], experts: tuple[tuple[float, int], ...],
                     bucket_params: float, par: ParallelSpec) -> list[tuple[float, int]]:
    """The buckets of Pricer._grouped_gradient_queues in sending order, (parameters, expert tp degree: 0 for the
    data-parallel group's), layers and experts in the order the buckets fill: per group, stack_effects.
    bucket_closes over the layers up to the group's last (the data-parallel group's: all of them). An expert
    group of one rank (its experts held by no other) sends nothing."""
    groups: dict[int, list[tuple[float, float]]] = {0: [(params - shard, count) for (params, count), (shard, _)
                                                        in zip(layers, experts, strict=True)]}
    for degree in dict.fromkeys(degree for _, degree in experts if degree and expert_data_size(par, degree) > 1):
        shares = [((shard if d == degree else 0.0), count) for (_, count), (shard, d) in zip(layers, experts,
                                                                                             strict=True)]
        last = max(i for i, (shard, _) in enumerate(shares) if shard > 0.0)
        groups[degree] = shares[:last + 1]
    closes = {degree: bucket_closes(group, bucket_params) for degree, group in groups.items()}
    out: list[tuple[float, int]] = []
    for position in range(len(closes[0])):
        out += [(group[position][1], degree) for degree, group in closes.items()
                if position < len(group) and group[position][1] > 0.0]
    return out


# --- the cost choices: one table ---

CostFactory = Callable[[Calibration, Path | None], Pricer]
COSTS: Registry[CostFactory] = Registry("costs")


@COSTS.register("roofline")
def roofline_pricer(cal: Calibration, db: Path | None = None) -> Pricer:
    """Op times from the calibrated roofline, step costs and overheads fitted, collectives as NCCL runs them."""
    return Pricer(cal)


@COSTS.register("profiled")
def profiled_pricer(cal: Calibration, db: Path | None = None) -> Pricer:
    """Op times, step costs and collective times from the profile database at `db` (default: the user's
    cache), measured by `trainsim profile`, with `cal`'s roofline, fitted overheads and NCCL model for
    what it lacks. For a device the database has measured, the Adam step and the framework overhead are
    measured too, in place of the fitted constants (fitted on GPU clusters' runs, not on this device)."""
    # NB: imported when these costs are chosen (start-up: the profile database's readers are for --costs profiled)
    from trainsim.cost.profiled import ProfiledComm, ProfiledCosts, ProfiledStepCosts

    op_costs = ProfiledCosts(db or default_db_path(), fallback=RooflineCosts(cal))
    return Pricer(cal, op_costs=op_costs, step_costs=ProfiledStepCosts(op_costs, FittedStepCosts(cal)),
                  comm_costs=ProfiledComm(op_costs, NcclComm(cal)))


def make_pricer(costs: str = "roofline", db: Path | None = None, calibration: Calibration | None = None) -> Pricer:
    """The pricer of a cost choice (COSTS: roofline | profiled)."""
    factory = COSTS.get(costs)
    return factory(calibration or load_calibration(), db)

