"""The analytical engine over a whole grid of plans at once: the search's fast path.

AnalyticalEstimator.price walks one plan through Python: its partition, its stages' prices, the bubble, the
gradient reduction, the optimizer step and the memory, ~100 us a plan even with every price cached. A grid of
plans of one model on one cluster shares almost all of that: its plans differ in a few integers (tp, pp, vpp,
dp, micro-batch, recompute, ZeRO). GridEngine prices what the plans share once, as the plain engine does (the
same Pricer, the same formulas, the same order of operations), and what they do not share as numpy arrays over
the plans:

- the plans' settings: read once per base from the enumeration's columns where the search hands them
  (search.space.plan_grid), else from every plan's spec;
- every op of the plans' graphs through the roofline at once (cost.roofline_arrays), for the layer prices;
- the partitions once per graph shape (the layers' kinds and counts), pp and split (even, or uneven: first/last
  stage layers, the embedding and loss counted, a stage list, layers pp x vpp does not divide, dense blocks
  that lead), as templates the graphs of one model fill with their layers;
- once per distinct stage of a partition (graph, pp) under a layer context (tp, cp, ep, sp, precision),
  whatever the dp and vpp: its forward, backward, weight-gradient and feature-communication seconds, what its
  recompute would repeat, its host overhead, its parameters, saved activations and working buffers (Pricer's
  public prices of layers and stages); once per dp its ZeRO-3 exposure (the layers' gathers and scatters once
  per parameters and group, the exposure over arrays) and pipeline hop, once per vpp its pipeline sends. The
  engine keeps them for its later calls on the same cluster and stack;
- once per (partition, recompute, ZeRO-3 or not): each stage's time, the bottleneck, the stages' sum;
- per plan, as arrays: the stage times (recompute, ZeRO-3), the bottleneck stage, the bubble (an uneven
  split's once per (partition, recompute, ZeRO-3, micro-batches, schedule): estimate.analytical.uneven_bubble_s,
  with its chunks' shares of each stage's time where interleaved, Pricer.chunk_time_shares),
  the exposed gradient reduction, the optimizer step, the iteration time, and each stage's memory under the
  schedule and its peak (cost.memory's formulas; an uneven interleaved split's stage by stage, each with its
  chunks' shares of its activations). At ep > 1 (or experts over fewer tp ranks than tp under sp)
  the MoE experts' gradients reduce, and their optimizer states shard, over their own expert data-parallel
  group (strategy.expert_groups): the gradient queues are the Pricer's grouped ones, the optimizer step and the
  model states read each stage's experts' share (cost.memory.stage_expert_params) per combo. Where the stack
  overlaps the expert all-to-alls, the share of passes that hide them (stack_effects.ep_overlap_share: the
  group's micro-batches, pp, vpp; 0 under full recompute) is part of the layer context: a group has a combo
  for its plans without full recompute and one for those with it.

The plans the fast path does not cover (a cluster or stack other than the first plan's; a cluster whose ranks
differ, rank_devices or compute_slowdown, whose device classes the plain engine prices; a step-cost model whose host
overhead reads the plan; an optimizer other than fused on a model with experts) go to the plain engine one by one,
so every plan gets the figures AnalyticalEstimator.price gives it: tests/unit/search/test_grid.py holds them equal.
"""

import dataclasses
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import is_, itemgetter
from typing import NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from trainsim.collector import collector_paused
from trainsim.cost.compute import RooflineCosts
from trainsim.cost.memory import (
    chunk_shares,
    kept_bytes,
    loss_grad_bytes,
    rebuilt_bytes,
    saved_key,
    stage_expert_params,
)
from trainsim.cost.pricing import Partition, Pricer, ep_overlap_share_of, expert_parts
from trainsim.cost.rank_classes import ranks_differ
from trainsim.cost.roofline_arrays import op_times_s
from trainsim.cost.stack_effects import queue_tail_s
from trainsim.cost.step import FittedStepCosts
from trainsim.errors import TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator, PlanPrice, uneven_bubble_s
from trainsim.ir.graph import Layer, OpGraph
from trainsim.job import Job
from trainsim.search.space import PlanColumns
from trainsim.strategy.parallel import Recompute
from trainsim.strategy.precision import Precision, policy_for
from trainsim.strategy.stages import BLOCK_KINDS, StagePart, in_flight_micro_batches

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]
_Runs = list[tuple[float, int]]  # runs of buckets: (seconds of one bucket, how many in a row), in sending order
# of a stage, what its gradient queues read of its MoE experts: per part its experts' (parameters, tp degree) where
# they reduce over a group of their own (cost.pricing.expert_parts), and the plan's (cp, ep, sp) that place it
_StageExperts = tuple[tuple[tuple[float, int], ...], tuple[int, ...]]
_NO_EXPERTS: _StageExperts = ((), ())
# a stage's layers' (parameters, count), and its _StageExperts (_Shared.param_layers)
_QueueLayers = tuple[tuple[tuple[float, float], ...], tuple[tuple[float, int], ...], tuple[int, ...]]
# what _Batch reads of its plans: per plan its local group, per local group its key and first plan, and per plan
# its zero, recompute code, global batch, micro-batch and sequence length
_PlanReads = tuple[Ints, list[tuple[object, ...]], list[int], tuple[Ints, Ints, Ints, Ints, Ints]]

RECOMPUTE_CODES: dict[Recompute, int] = {"none": 0, "selective": 1, "full": 2}
SCHEDULE_CODES = {"1f1b": 0, "interleaved-1f1b": 1, "gpipe": 2, "zb-h1": 3}
OPTIMIZER_CODES = {"fused": 0, "foreach": 1, "loop": 2}
_RECOMPUTE_NAMES: dict[int, Recompute] = {code: name for name, code in RECOMPUTE_CODES.items()}
_SCHEDULE_NAMES = {code: name for name, code in SCHEDULE_CODES.items()}
# of a plan's ParallelSpec: what its group reads (_Batch._group): its settings, its split (from _SPLIT_AT on:
# strategy.stages.is_even_split's fields) and its global batch (the micro-batches an overlapped expert all-to-all
# reads: stack_effects.ep_overlap_share)
_KEY_FIELDS = itemgetter("tp", "cp", "ep", "dp", "pp", "vpp", "sp", "precision", "schedule", "optimizer_impl",
                         "stage_layers", "first_stage_layers", "last_stage_layers", "embedding_in_split",
                         "loss_in_split", "global_batch")
_SPLIT_AT = 10
_SPLIT_END = _SPLIT_AT + 5
# a group the plain engine prices (_Batch._group's combos -1)
_SLOW_GROUP = (-1, 1, 1, 1, 0, 0, 0, 1, 1, -1)
_FULL_COMBO = 9  # the group's setting: the combo of its plans under full recompute (_Batch._group)
COMM_SLOTS = 4  # feature-communication axes of a stage (tp, cp, ep) and its pipeline sends


@dataclass(frozen=True, slots=True)
class _Template:
    """A partition of a graph (Pricer.partition) as positions in graph.layers: per distinct stage its parts'
    (position, count), per stage which distinct stage it is, per distinct stage its first stage."""

    stages: tuple[tuple[tuple[int, float], ...], ...]
    local: tuple[int, ...]
    heads: tuple[int, ...]
    # per stage its blocks per model chunk, for an uneven split of several chunks per stage (Partition.
    # chunk_blocks; else empty): stages of one content may hold their chunks apart
    chunk_blocks: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class _Shape:
    """A graph's partition over one pp and split: its template's distinct stages made of the graph's layers (their
    StageParts made only where a price reads a stage: _Batch._stage)."""

    graph: OpGraph
    template: _Template
    layout: int  # the template's number (_Shared.layouts)
    distinct: int  # the template's distinct stages
    split: tuple[int, ...] | None = None  # Pricer.plan_split's blocks per virtual stage (None: even)

    @property
    def uneven(self) -> bool:
        """A split other than the even one (Pricer.plan_split): the uneven bubble's."""
        return self.split is not None


def _signature(graph: OpGraph) -> tuple[object, ...]:
    """What strategy.stages.partition_stages reads of a graph: its layers' kinds and counts, in order, and its
    leading dense blocks. A graph that holds one layer object twice is its own (its partition's stages are told
    apart by layer object)."""
    if len({id(layer) for layer in graph.layers}) < len(graph.layers):
        return ("graph", id(graph))
    return (graph.leading_dense_blocks, *[(layer.kind, layer.count) for layer in graph.layers])


def _template(partition: Partition, graph: OpGraph) -> _Template:
    """The partition as a _Template."""
    position = {id(layer): index for index, layer in enumerate(graph.layers)}
    return _Template(tuple(tuple((position[id(part.layer)], part.count) for part in partition.stages[head])
                           for head in partition.distinct),
                     tuple(partition.distinct.index(head) for head in partition.first), partition.distinct,
                     partition.chunk_blocks)


@dataclass(frozen=True, slots=True)
class GridPrices:
    """Per plan, in the order given: what the planner ranks plans by. errors: plans the engine refused."""

    iteration_time_s: Floats
    tokens_per_s: Floats
    peak_memory_bytes: Floats
    oom: NDArray[np.bool_]
    errors: dict[int, TrainsimError] = field(default_factory=dict)


class GridEngine:
    """Prices many plans at once with the analytical engine's closed form (see the module doc).
    estimator: the plain engine whose pricer (and caches) this engine shares and whose price() makes a plan's
    full PlanPrice (plan_price). What the plans share (the stage rows of each partition and layer context) is
    kept for the engine's later calls on the same cluster and stack: a second grid of the same graphs (another
    global batch, other ZeRO stages or recompute modes) prices only its arrays."""

    def __init__(self, estimator: AnalyticalEstimator | None = None) -> None:
        self.estimator = estimator or AnalyticalEstimator()
        self.pricer: Pricer = self.estimator.pricer
        # NB: keyed by ids (of the cluster, the stack and the graphs); _pinned keeps those objects alive
        self._shared: dict[tuple[int, int], _Shared] = {}
        self._pinned: dict[int, object] = {}

    def plan_price(self, job: Job, graph: OpGraph) -> PlanPrice:
        """The plain engine's full price of one plan (its Result via .result())."""
        return self.estimator.price(job, graph)

    def price(self, plans: Sequence[tuple[Job, OpGraph]], columns: PlanColumns | None = None) -> GridPrices:
        """columns: the enumeration's columns of the plans (search.space.plan_grid; plans of one base share their
        graph): the engine reads each base's settings once instead of each plan's (None: from every plan)."""
        if columns is not None and len(columns.base) != len(plans):
            raise ValueError(f"columns: {len(columns.base)} plans' columns for {len(plans)} plans")
        with collector_paused():  # NB: a full pass of the collector made a cold grid 20-40% slower, now and then
            return self._price(plans, columns)

    def _price(self, plans: Sequence[tuple[Job, OpGraph]], columns: PlanColumns | None) -> GridPrices:
        n = len(plans)
        time_s = np.zeros(n)
        peak = np.zeros(n)
        oom = np.zeros(n, dtype=np.bool_)
        tokens = np.zeros(n)  # per iteration
        errors: dict[int, TrainsimError] = {}
        # NB: a cluster of extreme (valid) figures overflows (inf - inf) in the shared prices' arrays as in the
        # plans': as Python's floats do, silently; such plans go to the plain engine (below)
        with np.errstate(all="ignore"):
            fast, slow = _Batch(self, plans, columns).split() if n else (None, list[int]())
            if fast is not None:
                fast.compute(time_s, peak, oom)
        if fast is not None:
            tokens[fast.index] = fast.tokens
            # a plan whose figures are not finite goes to the plain engine, which refuses it with its message
            unfinished = ~(np.isfinite(time_s[fast.index]) & np.isfinite(peak[fast.index]))
            slow = sorted([*slow, *fast.index[unfinished].tolist()])
        for index in slow:
            job, graph = plans[index]
            try:
                priced = self.estimator.price(job, graph)
            except TrainsimError as exc:
                errors[index] = exc.with_traceback(None)  # NB: its traceback's frames hold `errors`: a cycle
                continue
            time_s[index], peak[index], oom[index] = priced.iteration_time_s, priced.peak_memory_bytes, priced.oom
            tokens[index] = job.tokens_per_iteration
        with np.errstate(divide="ignore", invalid="ignore"):  # a refused plan (errors) has no figures
            tokens_per_s = tokens / time_s
        return GridPrices(time_s, tokens_per_s, peak, oom, errors)

    def shared(self, job: Job) -> "_Shared":
        """What the plans on the job's cluster and stack share."""
        key = (id(job.cluster), id(job.stack))
        shared = self._shared.get(key)
        if shared is None:
            self.pin(job.cluster)
            self.pin(job.stack)
            shared = self._shared[key] = _Shared()
        return shared

    def pin(self, obj: object) -> None:
        self._pinned.setdefault(id(obj), obj)


def _ints() -> "array[int]":
    return array("q")


def _floats() -> "array[float]":
    return array("d")


@dataclass(slots=True)
class _Shared:
    """The stage rows and combos of one (cluster, stack), their arrays made when rows were added. Numbers per row,
    content or combo are kept in typed arrays (array.array: one object, not one per number or row, for the
    cyclic collector to walk when the engine's call ends; numpy reads them as one buffer)."""

    # a stage row: a distinct stage of a combo: its content and its pipeline sends (0 for pp = 1)
    row_content: "array[int]" = field(default_factory=_ints)
    row_sends_s: "array[float]" = field(default_factory=_floats)
    # ZeRO-3's exposure per RECOMPUTE_CODES (the bucketed backward pass reads the recompute; else all equal), a
    # row's len(RECOMPUTE_CODES) in a row
    row_fsdp_s: "array[float]" = field(default_factory=_floats)
    # Pricer.pipeline_chain_s (0 unless overlapped, vpp > 1)
    row_chain_s: "array[float]" = field(default_factory=_floats)
    # of the row's MoE experts whose expert data-parallel group is not the data-parallel group (cost.memory.
    # stage_expert_params: it reads dp): their parameters, and the sum of their parameters / their group's ranks
    row_expert_params: "array[float]" = field(default_factory=_floats)
    row_expert_owned: "array[float]" = field(default_factory=_floats)
    has_experts: dict[int, bool] = field(default_factory=dict)  # id of a graph -> whether a layer has experts
    # a content: one distinct stage of a shape under one layer context but dp; a shape's contents under one
    # context are numbered in a row, from the first (block_of: (id of a kept shape, layer context) -> its first)
    block_of: dict[tuple[object, ...], int] = field(default_factory=dict)
    content_shapes: list[_Shape] = field(default_factory=list)  # the shape, for its stage (_Batch._stage)
    content_stage: "array[int]" = field(default_factory=_ints)  # which of the shape's distinct stages
    content_compute_s: "array[float]" = field(default_factory=_floats)  # forward + backward (_Batch._contents)
    # a (content, dp): its ZeRO-3 exposure per RECOMPUTE_CODES and pipeline hop (Pricer.pipeline_hop_s of its
    # largest output; 0 for pp = 1), a block's contents' in a row from the first (by_dp_of: (first content, dp)
    # -> its first)
    by_dp_of: dict[tuple[int, int], int] = field(default_factory=dict)
    by_dp_fsdp_s: "array[float]" = field(default_factory=_floats)  # len(RECOMPUTE_CODES) each, in a row
    by_dp_hop_s: "array[float]" = field(default_factory=_floats)
    by_dp_count: int = 0  # numbered, including those a batch has yet to price
    # (parameters, precision, dp x cp, tp) -> the all-gather of a layer's weights and the reduce-scatter of its
    # gradients over the gradient group (Pricer.fsdp_exposed_s's collectives; _Batch._fsdp_collectives)
    fsdp_collectives: dict[tuple[object, ...], tuple[float, float]] = field(default_factory=dict)
    # per graph and layer context its layers' terms (_Batch._graph_terms); per (layers' parameters, precision,
    # gradient group) the layers' ZeRO-3 collectives (_Batch._graph_collectives)
    graph_terms: dict[tuple[object, ...], "list[_LayerTerms]"] = field(default_factory=dict)
    graph_collectives: dict[tuple[object, ...], list[tuple[float, float]]] = field(default_factory=dict)
    hops: dict[tuple[object, ...], float] = field(default_factory=dict)  # _Batch._hop_s
    # id of a graph -> per (position of a layer, count) its StagePart (_Batch._stage); and its layers' parameters
    parts: dict[int, dict[tuple[int, float], StagePart]] = field(default_factory=dict)
    graph_params: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # (id of a kept shape, layer context, dp) -> its first content and first (content, dp) (_Batch._new_combo)
    shape_rows: dict[tuple[object, ...], tuple[int, int]] = field(default_factory=dict)
    # (id of a template, the axes of a graph's layers' feature collectives) -> per distinct stage its feature
    # slots (_Batch._contents); (id of a template, a graph's layers' parameters) -> per distinct stage its number
    # of param_layers
    slots_of: dict[tuple[object, ...], list[list[int]]] = field(default_factory=dict)
    layers_of: dict[tuple[object, ...], list[int]] = field(default_factory=dict)
    # the contents' figures (_Batch._contents), per name an array over a batch's new contents
    content_blocks: list[dict[str, Floats]] = field(default_factory=list)
    # (id of a graph, pp, split) -> its partition (_Batch._shape)
    shapes: dict[tuple[object, ...], _Shape] = field(default_factory=dict)
    # what a partition reads of a graph (_signature) -> per (pp, split) the partition's template, and per
    # (signature, pp, vpp, the plan's split settings) its split (Pricer.plan_split; None: even)
    signatures: dict[int, int] = field(default_factory=dict)  # id of a graph -> the number of its signature
    signature_numbers: dict[tuple[object, ...], int] = field(default_factory=dict)
    templates: dict[tuple[object, ...], _Template] = field(default_factory=dict)
    splits: dict[tuple[object, ...], tuple[int, ...] | None] = field(default_factory=dict)
    # a combo: a partition under one layer context: the index of its first stage row and the number of its
    # partition's template (of `layouts`: how its stages map to its distinct rows)
    combo_rows: "array[int]" = field(default_factory=_ints)
    combo_layouts: "array[int]" = field(default_factory=_ints)
    combo_uneven: "array[int]" = field(default_factory=_ints)  # 1: its partition's split is uneven (_Shape.uneven)
    combo_chunks: list[tuple[tuple[float, ...], ...]] = field(default_factory=list)  # Pricer.chunk_time_shares
    combo_shapes: list[_Shape] = field(default_factory=list)
    in_flight: dict[tuple[object, ...], float] = field(default_factory=dict)  # _Fast._in_flight
    layouts: list[_Template] = field(default_factory=list)
    layout_of: dict[int, int] = field(default_factory=dict)  # id of a kept template -> its number
    combo_of: dict[tuple[object, ...], int] = field(default_factory=dict)  # (graph, plan's layout) -> combo
    # per (id of a graph, *_KEY_FIELDS) a number: its group of plans (_Batch._group), whose len(_SLOW_GROUP)
    # settings are in a row in `groups`
    group_of: dict[tuple[object, ...], int] = field(default_factory=dict)
    groups: "array[int]" = field(default_factory=_ints)
    precisions: list[Precision] = field(default_factory=list)  # the precisions of the plans, each once
    # a stage's layers' (parameters, count) and what its gradient queues read of its experts (_Batch._stage_experts)
    param_layers: dict["_QueueLayers", int] = field(default_factory=dict)
    param_layer_list: list["_QueueLayers"] = field(default_factory=list)  # param_layers' keys
    layer_terms: dict[tuple[object, ...], "_LayerTerms"] = field(default_factory=dict)
    # per layer terms a row (_Batch._layer_terms; the batch's new rows made into the table by _Batch._terms)
    term_table: Floats = field(default_factory=lambda: np.zeros((0, _TERM_COLUMNS)))
    term_count: int = 0  # numbered, including those a batch has yet to add
    # the gradient reduction's queues (Pricer.gradient_queues' runs of buckets: Pricer.new_gradient_runs_s) per
    # (param_layers, ZeRO > 0, precision code, dp x cp, tp), and their arrays (_QueueTable) made when queues were added
    queue_of: dict[tuple[int, ...], int] = field(default_factory=dict)
    queue_runs: list[tuple[_Runs, _Runs]] = field(default_factory=list)  # Pricer.new_gradient_runs_s
    queue_table: "_QueueTable | None" = None
    tables: "tuple[_RowTable, _ComboTable] | None" = None
    tables_rows: int = 0  # the combos the tables hold

    def queue_arrays(self, pricer: Pricer, job: Job) -> "_QueueTable":
        """The queues as arrays (job: of the cluster and stack: their overlaps)."""
        if self.queue_table is None or self.queue_table.size != len(self.queue_runs):
            self.queue_table = _QueueTable(self.queue_runs, pricer.overlaps("grad_reduce_overlap", job),
                                           pricer.overlaps("param_gather_overlap", job))
        return self.queue_table

    def arrays(self) -> "tuple[_RowTable, _ComboTable]":
        if self.tables is None or self.tables_rows != len(self.combo_rows):
            columns = {name: np.concatenate([block[name] for block in self.content_blocks])
                       for name in self.content_blocks[0]}
            self.tables = (_RowTable(columns, self.row_content, self.row_sends_s, self.row_fsdp_s, self.row_chain_s,
                                     self.row_expert_params, self.row_expert_owned),
                           _ComboTable(self.combo_rows, self.combo_layouts, self.layouts, self.combo_uneven))
            self.tables_rows = len(self.combo_rows)
        return self.tables


class _Batch:
    """The plans of one price() call: gathers the fast ones' settings and prices what they share (once per
    engine: _Shared)."""

    def __init__(self, engine: GridEngine, plans: Sequence[tuple[Job, OpGraph]], columns: PlanColumns | None) -> None:
        self.engine = engine
        self.pricer = engine.pricer
        self.plans = plans
        self.columns = columns
        self.job0 = plans[0][0]
        shared = self.shared = engine.shared(self.job0)
        self.precisions = shared.precisions
        # NB: FittedStepCosts' host overhead per micro-batch reads none of its arguments: one price per stage
        self.fitted_overhead = isinstance(self.pricer.step_costs, FittedStepCosts)
        # what _shape_rows registers, for _finish to sum: per new block (first content, shape, graph, job, the
        # graph's layer terms); per new block and dp (first (content, dp), first content, shape, job, the graph's
        # layers' ZeRO-3 collectives and layer terms, the distinct stages' pipeline hops); per new combo (first
        # content, first (content, dp), distinct stages, pp, vpp)
        self.new_blocks: list[tuple[int, _Shape, OpGraph, Job, list[_LayerTerms]]] = []
        self.new_by_dp: list[tuple[int, int, _Shape, Job, list[tuple[float, float]], list[_LayerTerms],
                                   list[float]]] = []
        self.new_rows: list[tuple[int, int, int, int, int]] = []
        # the new layers' terms (_layer_terms): their rows, and those whose op sums _terms fills from op_sums
        # (number, op sums' row, whether a block, forward and backward feature seconds)
        self.term_rows: list[tuple[float, ...]] = []
        self.op_terms: list[tuple[int, int, bool, float, float]] = []
        # per layer whose ops this batch priced (_price_ops) the row of its op sums (_sum_ops)
        self.op_sum_of: dict[int, int] = {}
        self.op_sums: Floats = np.zeros((0, 4))

    def split(self) -> tuple["_Fast | None", list[int]]:
        """The fast plans' settings as arrays, and the indices of the plans left to the plain engine. The plans
        fall in local groups (_read_plans, _read_columns), each of one key (graph, _KEY_FIELDS: the group's
        settings and its split, a split other than the even one going to the plain engine); the groups are made
        once per distinct key."""
        plans = self.plans
        cluster, stack = self.job0.cluster, self.job0.stack
        if ranks_differ(self.job0):  # stragglers, other devices (cost.rank_classes): the plain engine prices
            return None, list(range(len(plans)))  # their device classes plan by plan
        if _on(plans, cluster, stack):
            candidates: Sequence[int] = range(len(plans))
            slow: list[int] = []
        else:
            same = [(job.cluster is cluster or job.cluster == cluster) and (job.stack is stack or job.stack == stack)
                    for job, _ in plans]
            candidates = [index for index, ok in enumerate(same) if ok]
            slow = [index for index, ok in enumerate(same) if not ok]
            plans = [plans[index] for index in candidates]
        if not plans:
            return None, slow
        numbers, keys, first, per_plan = self._read_plans(plans) if self.columns is None else \
            self._read_columns(plans, candidates, self.columns)
        group_of, groups = self.shared.group_of, self.shared.groups
        width = len(_SLOW_GROUP)
        count = len(groups) // width
        new: dict[tuple[object, ...], int] = {}  # the new groups' keys and first plans, numbered in a row
        known: list[int] = []  # per local group its group
        for key, at in zip(keys, first, strict=True):
            number = group_of.get(key)
            if number is None:
                number = new.get(key)
                if number is None:
                    number = count + len(new)
                    new[key] = at
            known.append(number)
        self._price_ops([plans[at][1] for at in new.values()])
        for key, at in new.items():
            groups.extend(self._group(plans[at], key))
        group_of.update(zip(new, range(count, count + len(new)), strict=True))
        if self.new_rows or self.new_blocks or self.new_by_dp or self.term_rows:
            self._finish()
        local = np.array(known, dtype=np.int64)[numbers]
        # NB: one row per setting, each contiguous (the groups' settings transposed before the plans' are taken)
        columns = np.take(_int_array(groups).reshape(-1, width).T, local, axis=1)
        zero, recompute, global_batch, micro_batch, seq_len = per_plan
        columns[0] = np.where(recompute == RECOMPUTE_CODES["full"], columns[_FULL_COMBO], columns[0])
        fast = columns[0] >= 0
        if not fast.all():
            where = np.array(candidates, dtype=np.int64)
            slow = sorted([*slow, *where[~fast].tolist()])
            if not fast.any():
                return None, slow
        m = global_batch // (columns[8] * micro_batch)
        table = np.concatenate([columns[:8], np.stack([zero, m, recompute, global_batch * seq_len])])
        index = np.arange(len(candidates)) if isinstance(candidates, range) else \
            np.array(candidates, dtype=np.int64)  # NB: candidates is range(len(plans)) or a list of indices
        if not fast.all():
            index, table = index[fast], table[:, fast]
        return _Fast(self, index, table), slow

    def _read_plans(self, plans: Sequence[tuple[Job, OpGraph]]) -> "_PlanReads":
        """Each plan's fields read once, in comprehensions: its key and its zero, recompute, global batch,
        micro-batch and sequence length; a local group per distinct key (numbered as first seen)."""
        fields = [job.parallel.__dict__ for job, _ in plans]  # NB: a pydantic model's fields; ~2x getattr's speed
        # NB: (id,) + fields makes the same tuple as (id, *fields) in ~0.9x the time
        keys: list[tuple[object, ...]] = [(id(graph),) + _KEY_FIELDS(values)  # noqa: RUF005
                                          for (_, graph), values in zip(plans, fields, strict=True)]
        local: dict[tuple[object, ...], int] = {}
        numbers = np.array([local.setdefault(key, len(local)) for key in keys], dtype=np.int64)  # first seen, first
        _, first = np.unique(numbers, return_index=True)
        zero, global_batch, micro_batch, seq_len = (np.array([values[name] for values in fields], dtype=np.int64)
                                                     for name in ("zero", "global_batch", "micro_batch", "seq_len"))
        recompute = np.array([RECOMPUTE_CODES[values["recompute"]] for values in fields], dtype=np.int64)
        return numbers, list(local), first.tolist(), (zero, recompute, global_batch, micro_batch, seq_len)

    def _read_columns(self, plans: Sequence[tuple[Job, OpGraph]], candidates: Sequence[int],
                      columns: PlanColumns) -> "_PlanReads":
        """The plans' local groups from the enumeration's columns: one per base, whose first plan's fields give
        the group's key, global batch, micro-batch and sequence length; each plan's zero and recompute from its
        variant. Where a plan's graph is not its base's first plan's (columns of other plans), every plan is
        read (_read_plans)."""
        base = np.fromiter(columns.base, np.int64, len(columns.base))
        variant = np.fromiter(columns.variant, np.int64, len(columns.variant))
        if not isinstance(candidates, range):
            base, variant = base[candidates], variant[candidates]
        first_array, numbers = _first_and_numbers(base)
        first = first_array.tolist()
        heads = [plans[at][1] for at in first]
        if not all(map(is_, map(itemgetter(1), plans), map(heads.__getitem__, numbers.tolist()))):
            return self._read_plans(plans)
        fields = [plans[at][0].parallel.__dict__ for at in first]
        keys = [(id(graph),) + _KEY_FIELDS(values)  # noqa: RUF005 (as in _read_plans)
                for graph, values in zip(heads, fields, strict=True)]
        global_batch, micro_batch, seq_len = (np.array([values[name] for values in fields], dtype=np.int64)[numbers]
                                              for name in ("global_batch", "micro_batch", "seq_len"))
        variants = np.array([(RECOMPUTE_CODES[recompute], zero) for recompute, zero in columns.variants],
                            dtype=np.int64).reshape(-1, 2)
        return numbers, keys, first, (variants[variant, 1], variants[variant, 0], global_batch, micro_batch, seq_len)

    def _price_ops(self, graphs: list[OpGraph]) -> None:
        """Every op of the graphs' layers not yet priced on the cluster's device, through the roofline at once
        (cost.roofline_arrays, equal to RooflineCosts op by op), for the layer prices to read
        (Pricer.add_op_times); nothing where the op costs are another model (profiled)."""
        pricer, device = self.pricer, self.job0.cluster.device
        if type(pricer.op_costs) is not RooflineCosts:
            return
        distinct = {id(graph): graph for graph in graphs}.values()
        layers = list({id(layer): layer for graph in distinct for layer in graph.layers
                       if not pricer.has_op_times(layer, device)}.values())
        if not layers:
            return
        ops = [layer.fwd + layer.bwd for layer in layers]
        seconds = op_times_s([op for layer_ops in ops for op in layer_ops], device, pricer.op_costs.cal)
        start = 0
        for layer, layer_ops in zip(layers, ops, strict=True):
            pricer.add_op_times(layer, device, tuple(seconds[start:start + len(layer_ops)]))
            start += len(layer_ops)
        self._sum_ops(layers, seconds)

    def _sum_ops(self, layers: list[Layer], seconds: list[float]) -> None:
        """Per layer (the ops' seconds: per layer its forward ops' then its backward ops', in order) what
        Pricer._layer_op_sums_s sums of its known op times where the stack fuses every op: forward, backward,
        selective recompute's and weight-gradient seconds, each a running sum from 0 in the ops' order
        (pricing.ordered_sum) as column adds over the layers' ops, padded with 0.0 where a layer has fewer ops or
        the op is not summed (s + 0.0 is s: the sums are never -0.0)."""
        forward = np.array([len(layer.fwd) for layer in layers], dtype=np.int64)
        backward = np.array([len(layer.bwd) for layer in layers], dtype=np.int64)
        starts = np.cumsum(forward + backward) - (forward + backward)
        op_s = np.array(seconds, dtype=np.float64)
        selective = np.array([op.recompute_selective for layer in layers for op in layer.fwd], dtype=np.bool_)
        wgrad = np.array([op.name.endswith(".wgrad") for layer in layers for op in layer.bwd], dtype=np.bool_)

        def summed(lengths: Ints, offsets: Ints, kept: NDArray[np.bool_]) -> Floats:
            """Per layer its ops' seconds summed, and those kept summed (2 x layers)."""
            layer, column = np.repeat(np.arange(len(layers)), lengths), _offsets(lengths)
            values = op_s[np.repeat(offsets, lengths) + column]
            table = np.zeros((2, len(layers), max(1, int(lengths.max()))))
            table[0, layer, column], table[1, layer, column] = values, np.where(kept, values, 0.0)
            total = np.zeros((2, len(layers)))
            for position in range(table.shape[2]):
                total = total + table[:, :, position]
            return total

        (fwd, chosen), (bwd, wgrad_s) = summed(forward, starts, selective), summed(backward, starts + forward, wgrad)
        self.op_sums = np.stack([fwd, bwd, chosen, wgrad_s], axis=1)
        self.op_sum_of = {id(layer): number for number, layer in enumerate(layers)}

    def _precision(self, precision: Precision) -> int:
        if precision not in self.precisions:
            self.precisions.append(precision)
        return self.precisions.index(precision)

    def _group(self, plan: tuple[Job, OpGraph], key: tuple[object, ...]) -> tuple[int, ...]:
        """The settings a new group of plans shares: its combo (-1 where the plain engine must price the plan: an
        uneven interleaved split, a graph whose partition or prices raise, a step-cost model whose overhead reads
        the plan), pp, vpp, dp x cp, the codes of its schedule, optimizer and precision, tp, dp, and its combo
        under full recompute. The two combos differ where the stack overlaps the expert all-to-alls
        (ep_comm_overlap): the share of passes that overlap (stack_effects.ep_overlap_share, of the group's
        micro-batches, pp and vpp) is 0 under full recompute, which Megatron-Core refuses with it; it is part of
        the layer context the layers' feature collectives are priced under. key: the plans' group key (id of
        their graph, *_KEY_FIELDS), whose first 9 entries (graph, tp, cp, ep, dp, pp, vpp, sp, precision) and
        split are what the combo reads."""
        _, tp, cp, ep, dp, pp, vpp, sp, precision, schedule, optimizer = key[:1 + _SPLIT_AT]
        assert isinstance(tp, int) and isinstance(cp, int) and isinstance(dp, int) and isinstance(pp, int) \
            and isinstance(vpp, int)
        job, graph = plan
        self.engine.pin(graph)
        if optimizer != "fused" and self._has_experts(graph):
            # NB: the step temporaries of an optimizer other than fused read the experts' owned shards
            # (cost.memory.optimizer_step_bytes), which _peak_memory does not price
            return _SLOW_GROUP
        combo_key = key[:9] + key[1 + _SPLIT_AT:1 + _SPLIT_END]
        jobs = self._overlap_jobs(job) if isinstance(ep, int) and ep > 1 else (job, job)
        combos = []
        for one in jobs:
            share = ep_overlap_share_of(one)
            combo = self.shared.combo_of.get((*combo_key, share))
            if combo is None:
                try:
                    combo = self._new_combo(one, graph, (tp, cp, ep, sp, precision, share), dp, pp, vpp)
                except TrainsimError:
                    combo = -1
                self.shared.combo_of[(*combo_key, share)] = combo
            combos.append(combo)
        return (combos[0], pp, vpp, dp * cp, SCHEDULE_CODES[schedule], OPTIMIZER_CODES[optimizer],  # type: ignore[index]
                self._precision(precision), tp, dp, combos[1])  # type: ignore[arg-type]

    @staticmethod
    def _overlap_jobs(job: Job) -> tuple[Job, Job]:
        """The group's job as its plans without full recompute and with it run: the same, but where the stack
        overlaps the expert all-to-alls (whose share of passes reads the recompute: stack_effects.
        ep_overlap_share), each with its recompute."""
        if not (job.stack.ep_comm_overlap and job.cluster.device.comm_overlaps_compute):
            return job, job
        par = job.parallel
        other = par.replaced(recompute="full" if par.recompute != "full" else "none")
        other_job = dataclasses.replace(job, parallel=other)
        return (job, other_job) if par.recompute != "full" else (other_job, job)

    def _has_experts(self, graph: OpGraph) -> bool:
        has = self.shared.has_experts.get(id(graph))  # graph: pinned (_group)
        if has is None:
            has = self.shared.has_experts[id(graph)] = any(layer.experts is not None for layer in graph.layers)
        return has

    def _row_experts(self, shape: _Shape, job: Job) -> tuple[list[float], list[float]]:
        """Per distinct stage of the shape under the job's plan: its experts' parameters that reduce and shard
        over their own expert data-parallel group (cost.memory.stage_expert_params), and the sum of those
        parameters over their group's ranks; 0.0 each for a graph without experts."""
        if not self._has_experts(shape.graph):
            return [0.0] * shape.distinct, [0.0] * shape.distinct
        params: list[float] = []
        owned: list[float] = []
        for index in range(shape.distinct):
            shares = stage_expert_params(self._stage(shape, index), job.parallel)
            params.append(sum(shares.values()))
            owned.append(sum(count / ranks for ranks, count in shares.items()))
        return params, owned

    def _stage_experts(self, shape: _Shape, job: Job) -> tuple["_StageExperts", ...]:
        """Per distinct stage of the shape, what its gradient queues read of its experts: their expert_parts
        (Pricer.gradient_queues) and the cp, ep and sp that place their groups, or ((), ()) where none reduces
        over a group of its own; () for a graph without experts."""
        if not self._has_experts(shape.graph):
            return ()
        par = job.parallel
        out: list[_StageExperts] = []
        for index in range(shape.distinct):
            parts = expert_parts(self._stage(shape, index), par)
            out.append((parts, (par.cp, par.ep, int(par.sp))) if parts else _NO_EXPERTS)
        return tuple(out)

    def _new_combo(self, job: Job, graph: OpGraph, context: tuple[object, ...], dp: int, pp: int, vpp: int) -> int:
        """context: the plan's layer context (tp, cp, ep, sp, precision); dp, pp, vpp: its."""
        if not self.fitted_overhead:
            return -1
        shared = self.shared
        shape = self._shape(job, graph, pp, vpp)
        rows_key = (id(shape), context, dp)  # shape: kept (_Shared.shapes)
        rows = shared.shape_rows.get(rows_key)
        if rows is None:  # NB: the vpp of one partition share its rows' contents, ZeRO-3 exposure and hops
            terms, collectives = self._graph_terms(graph, job, context), self._graph_collectives(graph, job)
            rows = shared.shape_rows[rows_key] = self._shape_rows(shape, graph, job, context, dp, pp, terms,
                                                                  collectives)
        first_content, first_by_dp = rows
        distinct = shape.distinct
        combo_rows = shared.combo_rows
        combo_rows.append(len(shared.row_content))
        shared.row_content.extend(range(first_content, first_content + distinct))
        expert_params, expert_owned = self._row_experts(shape, job)
        shared.row_expert_params.extend(expert_params)
        shared.row_expert_owned.extend(expert_owned)
        self.new_rows.append((first_content, first_by_dp, distinct, pp, vpp))
        shared.combo_layouts.append(shape.layout)
        shared.combo_uneven.append(int(shape.uneven))
        # an uneven interleaved split: its chunks' shares of each stage's time (the uneven bubble's)
        shared.combo_chunks.append(self.pricer.chunk_time_shares(self.pricer.partition(graph, pp, shape.split), job)
                                   if shape.template.chunk_blocks else ())
        shared.combo_shapes.append(shape)
        return len(combo_rows) - 1

    def _shape(self, job: Job, graph: OpGraph, pp: int, vpp: int) -> _Shape:
        """The graph's partition over the plan's pp and split (Pricer.plan_split). The partition is made
        once per what it reads of a graph (_signature: the layers' kinds and counts), pp and split, as a template
        of layer positions and counts: the search's graphs of one model (one per tp, sp and micro-batch) share
        it."""
        shared = self.shared
        signature = shared.signatures.get(id(graph))
        if signature is None:  # a number per distinct signature (cheaper keys below)
            signature = shared.signatures[id(graph)] = shared.signature_numbers.setdefault(
                _signature(graph), len(shared.signature_numbers))
        par = job.parallel
        split_key = (signature, pp, vpp, par.first_stage_layers, par.last_stage_layers, par.embedding_in_split,
                     par.loss_in_split, par.stage_layers)
        if split_key in shared.splits:
            split = shared.splits[split_key]
        else:
            # NB: one stage (pp 1) is its own even split: a graph whose dense blocks lead (OpGraph.
            # leading_dense_blocks) has a split there (Pricer.plan_split), but its one stage holds every layer as
            # the even partition's does, and the uneven bubble of one stage is the even one's, 0.0
            split = shared.splits[split_key] = None if pp == 1 else self.pricer.plan_split(graph, par)
        key = (id(graph), pp, split)
        if key in shared.shapes:
            return shared.shapes[key]
        template_key = (signature, pp, split)
        if template_key not in shared.templates:
            shared.templates[template_key] = _template(self.pricer.partition(graph, pp, split), graph)
        template = shared.templates[template_key]
        layout = shared.layout_of.get(id(template))
        if layout is None:  # NB: the template is kept (_Shared.templates)
            layout = shared.layout_of[id(template)] = len(shared.layouts)
            shared.layouts.append(template)
        shape = shared.shapes[key] = _Shape(graph, template, layout, len(template.stages), split)
        return shape

    def _stage(self, shape: _Shape, index: int) -> list[StagePart]:
        """The shape's distinct stage `index` as the partition's StageParts: one object per (graph, layer, count),
        as partition_stages makes them, kept per graph."""
        graph = shape.graph
        parts = self.shared.parts.get(id(graph))  # graph: pinned (_group)
        if parts is None:
            parts = self.shared.parts[id(graph)] = {}
        stage: list[StagePart] = []
        for part in shape.template.stages[index]:
            made = parts.get(part)
            if made is None:
                made = parts[part] = StagePart(graph.layers[part[0]], part[1])
            stage.append(made)
        return stage

    def _shape_rows(self, shape: _Shape, graph: OpGraph, job: Job, context: tuple[object, ...], dp: int, pp: int,
                    terms: "list[_LayerTerms]", collectives: list[tuple[float, float]]) -> tuple[int, int]:
        """The shape's first content under the context (its distinct stages' contents, shared by every dp and
        vpp of the partition) and first (content, dp) (their ZeRO-3 exposures and pipeline hops: the gradient and
        pipeline groups' strides read dp), registered where new; each vpp's row adds its pipeline sends
        (_finish). What may refuse the plans (the layers' and collectives' prices, the hops) is priced before
        (_graph_terms, _graph_collectives) or here; the sums are made for all new rows at once (_finish).
        context: tp, cp, ep, sp and precision; dp, pp: the plan's; terms and collectives: of the graph's layers."""
        shared = self.shared
        key = (id(shape), context)  # shape: kept (_Shared.shapes)
        first = shared.block_of.get(key)
        if first is None:
            first = shared.block_of[key] = len(shared.content_shapes)
            shared.content_shapes += [shape] * shape.distinct
            shared.content_stage.extend(range(shape.distinct))
            self.new_blocks.append((first, shape, graph, job, terms))
        dp_key = (first, dp)
        start = shared.by_dp_of.get(dp_key)
        if start is None:
            tp, cp, _, sp, *_ = context
            layers = graph.layers
            hops = [0.0] * shape.distinct if pp == 1 else \
                [self._hop_s(max([layers[position].output_bytes for position, _ in parts]), (tp, cp, dp, sp), job)
                 for parts in shape.template.stages]
            start = shared.by_dp_of[dp_key] = shared.by_dp_count
            shared.by_dp_count += shape.distinct
            self.new_by_dp.append((start, first, shape, job, collectives, terms, hops))
        return first, start

    def _hop_s(self, out_bytes: float, settings: tuple[object, ...], job: Job) -> float:
        """Pricer.pipeline_hop_s of a stage's largest output (pp > 1), once per what it reads: the bytes, tp, sp
        and the pipeline group (2 ranks, stride tp x cp x dp). settings: the job's tp, cp, dp and sp."""
        key = (out_bytes, *settings)
        seconds = self.shared.hops.get(key)
        if seconds is None:
            seconds = self.shared.hops[key] = self.pricer.pipeline_hop_s(out_bytes, job)
        return seconds

    def _graph_terms(self, graph: OpGraph, job: Job, context: tuple[object, ...]) -> "list[_LayerTerms]":
        """_layer_terms of each of the graph's layers, in order, once per graph and layer context."""
        key = (id(graph), context)  # graph: pinned (_group)
        terms = self.shared.graph_terms.get(key)
        if terms is None:
            terms = self.shared.graph_terms[key] = [self._layer_terms(layer, job, context) for layer in graph.layers]
        return terms

    def _graph_collectives(self, graph: OpGraph, job: Job) -> list[tuple[float, float]]:
        """_fsdp_collectives of each of the graph's layers, in order, once per (the layers' parameters, precision,
        gradient group): the graphs of one tp share them."""
        par = job.parallel
        params = self._graph_params(graph)
        key = (params, par.precision, par.dp * par.cp, par.tp)
        pairs = self.shared.graph_collectives.get(key)
        if pairs is None:
            pairs = self.shared.graph_collectives[key] = [self._fsdp_collectives(value, job) for value in params]
        return pairs

    def _graph_params(self, graph: OpGraph) -> tuple[float, ...]:
        """The graph's layers' parameters (Layer.param_count), in order, once per graph."""
        params = self.shared.graph_params.get(id(graph))  # graph: pinned (_group)
        if params is None:
            params = self.shared.graph_params[id(graph)] = tuple([layer.param_count for layer in graph.layers])
        return params

    def _fsdp_collectives(self, params: float, job: Job) -> tuple[float, float]:
        """The collectives of Pricer.fsdp_exposed_s of a layer of `params` parameters: the all-gather of its
        weights and the reduce-scatter of its gradients over the gradient group (dp x cp ranks, stride tp), once
        per (parameters, precision, group): the layers of every graph of one tp share them."""
        par = job.parallel
        key = (params, par.precision, par.dp * par.cp, par.tp)
        pair = self.shared.fsdp_collectives.get(key)
        if pair is None:
            pricer = self.pricer
            policy = pricer.policy(par.precision)
            pair = self.shared.fsdp_collectives[key] = (
                pricer.axis_collective_s("all-gather", params * policy.weight_bytes, "grad", job),
                pricer.axis_collective_s("reduce-scatter", params * policy.grad_bytes, "grad", job))
        return pair

    def _finish(self) -> None:
        """The new rows' sums: their contents (_contents), their ZeRO-3 exposure (Pricer.zero3_exposed_s: the sum
        of the layers' fsdp_exposed_s in order, with the bucketed backward pass per recompute mode) and their
        pipeline sends (Pricer.pipeline_sends_s over arrays: 2 vpp hops a micro-batch, each overlapped with one
        chunk's forward and backward where the stack overlaps p2p and vpp > 1, and the fitted overhead)."""
        pricer, shared = self.pricer, self.shared
        if self.term_rows:
            self._terms()
        term_table = shared.term_table  # NB: complete here (_graph_terms); one table for both
        if self.new_blocks:
            self._contents(term_table)
        if self.new_by_dp:
            self._by_dp(term_table)
        if self.new_rows:
            first_content, first_by_dp, distinct, pp, vpp = (np.array(column, dtype=np.int64)
                                                              for column in zip(*self.new_rows, strict=True))
            offset = _offsets(distinct)  # per new row its distinct stage
            by_dp = np.repeat(first_by_dp, distinct) + offset
            fsdp = np.take(_float_array(shared.by_dp_fsdp_s).reshape(-1, len(RECOMPUTE_CODES)), by_dp, axis=0)
            hop = _float_array(shared.by_dp_hop_s)[by_dp]
            compute = _float_array(shared.content_compute_s)[np.repeat(first_content, distinct) + offset]
            pp = np.repeat(pp, distinct)
            vpp = np.repeat(vpp, distinct).astype(np.float64)
            chain = np.zeros_like(hop)
            if pricer.overlaps("pp_comm_overlap", self.job0):
                gamma, window = pricer.overlap_slowdown(self.job0), compute / (2.0 * vpp)
                exposed = np.maximum(0.0, hop - window) + gamma * np.minimum(hop, window)
                # Pricer.pipeline_chain_from_s: 2 (v p - 1) (hop - exposed hop) for an overlapped interleaved pipeline
                chain = np.where((vpp > 1) & (pp > 1), 2.0 * (vpp * pp - 1) * (hop - exposed), 0.0)
                hop = np.where(vpp > 1, exposed, hop)
            sends = np.where(pp > 1, 2.0 * vpp * hop + pricer.cal.runtime.pipeline_overhead_per_micro_batch_s, 0.0)
            _extend(shared.row_fsdp_s, fsdp)
            _extend(shared.row_sends_s, sends)
            _extend(shared.row_chain_s, chain)
        self.new_blocks, self.new_by_dp, self.new_rows = [], [], []

    def _terms(self) -> None:
        """The new layers' term rows into _Shared.term_table, with the op sums of those priced from this batch's
        op times (op_terms: their forward, backward, weight-gradient and selective seconds, what full recompute
        repeats and the windows of their ZeRO-3 gathers, the same additions as _layer_terms's rows)."""
        rows = _rows(self.term_rows, _TERM_COLUMNS, np.float64)
        if self.op_terms:
            number, at, block, comm_fwd, comm_bwd = (np.array(column) for column in zip(*self.op_terms, strict=True))
            local = number - (self.shared.term_count - len(rows))
            forward, backward, selective, wgrad = self.op_sums[at].T
            rows[local, 0], rows[local, 1], rows[local, 2], rows[local, 4] = forward, backward, wgrad, selective
            rows[local, 5] = np.where(block, forward + comm_fwd, 0.0)
            rows[local, _FSDP_AT], rows[local, _FSDP_AT + 1] = forward + comm_fwd, backward + comm_bwd
        self.shared.term_table = np.concatenate([self.shared.term_table, rows])
        self.term_rows, self.op_terms = [], []

    def _by_dp(self, term_table: Floats) -> None:
        """The new (content, dp)'s ZeRO-3 exposure over arrays: Pricer.zero3_exposed_s, i.e. the sum over the
        stage's parts of count x fsdp_exposed_s of its layer (from 0.0, in the stage's order), per recompute mode:
        where the stack buckets ZeRO-3's gradients, the sum is of the forward's gathers and the Pricer's
        fsdp_bucketed_backward_s is added (the backward pass's stream, one layer at a time: not over arrays); per
        template (its stages' parts are fixed positions of the graphs' layers), over the new blocks and dp of
        that template. The formulas are Pricer.fsdp_exposed_s's and stack_effects.overlapped_s's (max and min as
        np.maximum and np.minimum, the same operations in the same order); tests/unit/search/test_grid.py holds
        them equal to the plain engine's for stacks with and without prefetch and buckets."""
        pricer, shared, job0 = self.pricer, self.shared, self.job0
        new = self.new_by_dp
        base = new[0][0]
        fsdp = np.zeros(shared.by_dp_count - base)
        exposes = job0.stack.fsdp_prefetch_depth != 0 and job0.cluster.device.comm_overlaps_compute
        gamma, bucketed = pricer.overlap_slowdown(job0), pricer.fsdp_bucketed(job0)
        for entries in _by_template(new, 2):
            template = entries[0][2].template
            layers = len(entries[0][4])
            starts = np.array([entry[0] for entry in entries], dtype=np.int64) - base
            pairs = _rows([list(chain.from_iterable(entry[4])) for entry in entries], 2 * layers,
                          np.float64).reshape(len(entries), layers, 2)  # entries x layers x (gather, scatter)
            numbers = _rows([[term.number for term in entry[5]] for entry in entries], layers, np.int64)
            for stage, parts in enumerate(template.stages):
                seconds = np.zeros(len(entries))
                for position, count in parts:
                    gather, scatter = pairs[:, position, 0], pairs[:, position, 1]
                    if not exposes:
                        exposed = 2.0 * gather + scatter
                    else:
                        table = term_table[numbers[:, position]]
                        forward_window, backward_window = table[:, _FSDP_AT], table[:, _FSDP_AT + 1]
                        exposed = np.maximum(0.0, gather - forward_window) + gamma * np.minimum(gather, forward_window)
                        if not bucketed:  # else the backward pass with its buckets, below
                            both = gather + scatter
                            exposed = exposed + \
                                (np.maximum(0.0, both - backward_window) + gamma * np.minimum(both, backward_window))
                    seconds = seconds + (count * exposed if count > 0.0 else 0.0)
                fsdp[starts + stage] = seconds
        by_mode = [fsdp] * len(RECOMPUTE_CODES)
        if bucketed:  # the backward pass's stream, per recompute mode (the Pricer's, cached)
            stages = [(self._stage(shape, index), job) for _, _, shape, job, _, _, _ in new
                      for index in range(shape.distinct)]
            by_mode = [fsdp + np.array([pricer.fsdp_bucketed_backward_s(stage, job, mode) for stage, job in stages],
                                       dtype=np.float64) for mode in RECOMPUTE_CODES]
        _extend(shared.by_dp_fsdp_s, np.stack(by_mode, axis=1))
        shared.by_dp_hop_s.extend(chain.from_iterable(hops for *_, hops in new))

    def _contents(self, term_table: Floats) -> None:
        """The new contents: what a stage's price reads but its ZeRO-3 exposure and pipeline sends, the sums over
        its parts of Pricer._stage_work, _stage_recompute_s, stage_params and cost.memory's stage_kept_bytes,
        recompute_working_bytes and loss_working_bytes, from each layer's terms (_layer_terms: made once per
        layer and layer context for every stage that holds the layer). As arrays per template (its stages' parts
        are fixed positions of the graphs' layers) over the new blocks of that template, part by part in the
        stage's order, each sum from 0.0 as the Pricer's; the feature collectives summed per axis and laid out
        in the order the stage's parts first name them (Pricer._stage_work's dict);
        tests/unit/search/test_grid.py holds the results equal to the plain engine's."""
        pricer, shared = self.pricer, self.shared
        new = self.new_blocks
        base = new[0][0]
        n = len(shared.content_shapes) - base  # the batch's new contents, numbered in a row
        sums = np.zeros((n, _TERM_SUMS))
        most = np.full((n, 4), -np.inf)  # what it rebuilds per RECOMPUTE_CODES, its largest layer's parameters
        head = np.zeros(n)
        slot_rows: list[list[int]] = [[]] * n  # per content per feature slot its axis in _AXES (padding: 0.0)
        layer_numbers: list[int] = [0] * n  # per content: its number of _Shared.param_layers
        for entries in _by_template(new, 1):
            template = entries[0][1].template
            layers = len(entries[0][4])
            firsts = np.array([entry[0] for entry in entries], dtype=np.int64) - base
            numbers = _rows([[term.number for term in entry[4]] for entry in entries], layers, np.int64)
            for first, shape, graph, job, terms in entries:
                slots = self._slots(template, tuple([term.axes for term in terms]))
                slot_rows[first - base:first - base + len(slots)] = slots
                numbered = self._param_layers(template, self._graph_params(graph), self._stage_experts(shape, job))
                layer_numbers[first - base:first - base + len(numbered)] = numbered
            for stage, parts in enumerate(template.stages):
                stage_sums = np.zeros((len(entries), _TERM_SUMS))
                stage_most = np.full((len(entries), 4), -np.inf)
                stage_head = np.zeros(len(entries))
                tables = [term_table[numbers[:, position]] for position, _ in parts]
                for (_, count), table in zip(parts, tables, strict=True):
                    stage_sums = stage_sums + count * table[:, :_TERM_SUMS]
                    stage_most = np.maximum(stage_most, table[:, _TERM_SUMS:_HEAD_AT])
                for table in reversed(tables):  # the first head's (loss_working_bytes)
                    stage_head = np.where(table[:, _HEAD_AT] > 0, table[:, _HEAD_AT + 1], stage_head)
                sums[firsts + stage], most[firsts + stage], head[firsts + stage] = stage_sums, stage_most, stage_head
        working = np.where(most[:, :3] == -np.inf, 0.0, most[:, :3])  # no block: 0 (cost.memory)
        features = np.array([len(slots) for slots in slot_rows], dtype=np.float64)
        slots_array = _rows([slots + [len(_AXES)] * (COMM_SLOTS - len(slots)) for slots in slot_rows], COMM_SLOTS,
                            np.int64)
        feature = np.concatenate([sums[:, _FEATURE_AT:_FEATURE_AT + len(_AXES)], np.zeros((n, 1))], axis=1)
        feature = np.take_along_axis(feature, slots_array, axis=1)
        total = np.zeros(n)
        for slot in range(COMM_SLOTS):
            total = total + feature[:, slot]
        forward, backward, feature_fwd = sums[:, 0], sums[:, 1], sums[:, 3]
        compute = forward + backward
        _extend(shared.content_compute_s, compute)
        _, shape, _, job, _ = new[0]
        shared.content_blocks.append({
            "compute": compute, "forward": forward, "backward": backward, "wgrad": sums[:, 2],
            "feature_fwd": feature_fwd, "feature_bwd": total - feature_fwd, "feature": feature,
            "features": features, "feature_total": total,
            "recompute": np.stack([np.zeros(n), sums[:, 4], sums[:, 5]], axis=1),
            "overhead": np.full(n, pricer.micro_batch_overhead_s(self._stage(shape, 0), job)),  # see fitted_overhead
            "params": sums[:, _PARAMS_AT], "saved": sums[:, _KEPT_AT:_KEPT_AT + 3], "working": working,
            "max_layer_params": most[:, 3], "head_saved": head,
            "param_layers": np.array(layer_numbers, dtype=np.float64)})

    def _slots(self, template: _Template, axes: tuple[tuple[str, ...], ...]) -> list[list[int]]:
        """Per distinct stage of the template its feature slots: the axes of its parts' feature collectives (of
        the graph's layers: `axes`) in the order the parts first name them, as positions in _AXES."""
        key = (id(template), axes)  # template: kept (_Shared.templates)
        slots = self.shared.slots_of.get(key)
        if slots is None:
            slots = self.shared.slots_of[key] = [
                [_AXES.index(axis) for axis in dict.fromkeys(name for position, _ in parts for name in axes[position])]
                for parts in template.stages]
        return slots

    def _param_layers(self, template: _Template, params: tuple[float, ...],
                      experts: tuple[_StageExperts, ...]) -> list[int]:
        """Per distinct stage of the template the number of its layers' (parameters, count) and its experts'
        groups in _Shared.param_layers (what its gradient buckets read); params: the graph's layers'; experts:
        _stage_experts of the stages (() for none)."""
        key = (id(template), params, experts)  # template: kept (_Shared.templates)
        numbers = self.shared.layers_of.get(key)
        if numbers is None:
            numbers = self.shared.layers_of[key] = [
                self._param_layer_number((tuple([(params[position], count) for position, count in parts]),
                                          *(experts[index] if experts else _NO_EXPERTS)))
                for index, parts in enumerate(template.stages)]  # NB: (layers, expert parts, their group)
        return numbers

    def _param_layer_number(self, layers: _QueueLayers) -> int:
        """The number of a stage's (layers' (parameters, count), experts' groups) in _Shared.param_layers, made
        where new."""
        param_layers = self.shared.param_layers
        number = param_layers.get(layers)
        if number is None:
            number = param_layers[layers] = len(param_layers)
            self.shared.param_layer_list.append(layers)
        return number

    def _layer_terms(self, layer: Layer, job: Job, context: tuple[object, ...]) -> "_LayerTerms":
        """A layer's part of its stages' prices under the job's layer context but dp (what _contents sums): its
        feature collectives run over the tp, cp and ep groups only (ir.graph.Comm), none of which reads dp. Its
        LayerCost's figures (Pricer.layer_cost), the op sums made over arrays (_sum_ops, filled in by _terms)
        where this batch priced its ops and the stack fuses every op, else by Pricer.new_layer_cost."""
        key = (id(layer), context)  # layer: of a pinned graph
        terms = self.shared.layer_terms.get(key)
        if terms is not None:
            return terms
        pricer, number = self.pricer, self.shared.term_count
        at = self.op_sum_of.get(id(layer))
        if at is not None and pricer.fuses_every_op(job):
            comm, comm_fwd, _, _, _ = pricer.layer_comm_s(layer, job)
            is_block = layer.kind not in ("embedding", "head")
            self.op_terms.append((number, at, is_block, comm_fwd, sum(comm.values()) - comm_fwd))
            ops = (_LATER, _LATER, _LATER, comm_fwd, _LATER, _LATER)  # _terms fills them
            windows = (_LATER, _LATER)
        else:
            cost = pricer.new_layer_cost(layer, job)  # NB: kept here (layer_terms), once per key
            comm, comm_fwd = cost.comm_s, cost.comm_fwd_s
            full = cost.fwd_s + comm_fwd if layer.kind not in ("embedding", "head") else 0.0
            ops = (cost.fwd_s, cost.bwd_s, cost.wgrad_s, comm_fwd, cost.selective_s, full)
            windows = (cost.fwd_s + comm_fwd, cost.bwd_s + (sum(comm.values()) - comm_fwd))
        self.term_rows.append((*ops, *[comm.get(axis, 0.0) for axis in _AXES], *self._memory_terms(layer, job),
                               *windows))
        self.shared.term_count += 1
        terms = self.shared.layer_terms[key] = _LayerTerms(number, tuple(comm))
        return terms

    def _memory_terms(self, layer: Layer, job: Job) -> tuple[float, ...]:
        """What a layer keeps per RECOMPUTE_CODES, its parameters, what it rebuilds per RECOMPUTE_CODES (a block;
        else never the largest), its parameters, whether it is a head and the loss's gradient buffers."""
        stack, kind = job.stack, layer.kind
        is_head = kind == "head"
        kept = [kept_bytes(layer, saved_key(mode, stack)) for mode in RECOMPUTE_CODES]
        rebuilt = [rebuilt_bytes(layer, mode, stack) for mode in RECOMPUTE_CODES] if kind in BLOCK_KINDS else \
            _NOT_REBUILT
        params = float(layer.param_count)
        return (*kept, params, *rebuilt, params, float(is_head), loss_grad_bytes(layer, stack) if is_head else 0.0)


# the columns of a layer's terms (_Shared.term_table): first what a stage sums (count x each): forward, backward,
# weight-gradient, forward feature communication, what selective and full recompute repeat (0 for the
# embedding and the head), the feature communication per _AXES, what it keeps per RECOMPUTE_CODES, its
# parameters; then what a stage takes the largest of: what it rebuilds per RECOMPUTE_CODES (-inf: not a block),
# its parameters; then whether it is a head (1.0) and the loss's gradient buffers (loss_grad_bytes; else 0); then
# the windows of its ZeRO-3 gathers (Pricer.fsdp_exposed_s): its forward with its forward feature collectives,
# its backward with its backward ones
_AXES = ("tp", "cp", "ep")  # the axes of feature collectives (ir.graph.Comm; pp's are the pipeline sends)
_NOT_REBUILT = (-np.inf,) * len(RECOMPUTE_CODES)  # what a layer that is not a block rebuilds: never the largest
_FEATURE_AT = 6
_KEPT_AT = _FEATURE_AT + len(_AXES)
_PARAMS_AT = _KEPT_AT + 3
_TERM_SUMS = _PARAMS_AT + 1
_HEAD_AT = _TERM_SUMS + 4
_FSDP_AT = _HEAD_AT + 2
_TERM_COLUMNS = _FSDP_AT + 2
_LATER = float("nan")  # a term row's op sum _Batch._terms fills in


class _LayerTerms(NamedTuple):
    """A layer's terms of its stages' prices under one layer context: the number of its row of
    _Shared.term_table and the axes of its feature collectives (in LayerCost.comm_s's order)."""

    number: int
    axes: tuple[str, ...]


class _Fast:
    """The fast plans as arrays (one entry per plan) and the closed form over them."""

    def __init__(self, batch: _Batch, index: Ints, columns: Ints) -> None:
        """columns: one row per setting (_Batch.split), one entry per plan."""
        self.batch = batch
        self.index = index
        (self.combo, self.pp, self.vpp, self.shards_dp, self.schedule, self.optimizer, self.precision, self.tp,
         self.zero, self.m, self.recompute, self.tokens) = columns  # NB: each row contiguous
        policies = [policy_for(name) for name in batch.precisions]
        self.weight_bytes = np.array([policy.weight_bytes for policy in policies], dtype=np.float64)[self.precision]
        self.grad_bytes = np.array([policy.grad_bytes for policy in policies], dtype=np.float64)[self.precision]
        self.state_bytes = np.array([policy.master_bytes + policy.optimizer_state_bytes for policy in policies],
                                    dtype=np.float64)[self.precision]

    def compute(self, time_out: Floats, peak_out: Floats, oom_out: NDArray[np.bool_]) -> None:
        batch = self.batch
        pricer, job0 = batch.pricer, batch.job0
        table, combos = batch.shared.arrays()
        plans = np.arange(len(self.index))
        m = self.m.astype(np.float64)
        zero3 = (self.zero >= 3).astype(np.int64)
        recompute_code = self.recompute

        # --- one micro-batch on each distinct stage of each combo, per recompute mode and with or without
        # ZeRO-3 (Pricer._price_stage, StageCost.total_s): the variants (combo, recompute, ZeRO-3) ---
        rows = combos.safe_rows  # C x R
        by_mode = table.fsdp[rows].transpose(0, 2, 1)  # C x 3 x R
        fsdp = np.stack([np.zeros_like(by_mode), by_mode], axis=2)  # C x 3 x 2 x R
        variant = (table.compute[rows][:, None, None, :] + table.recompute[rows].transpose(0, 2, 1)[:, :, None, :]
                   + table.comm_total[rows][:, None, None, :] + fsdp
                   + table.overhead[rows][:, None, None, :])  # C x 3 x 2 x R
        variant = np.where(combos.valid_rows[:, None, None, :], variant, -np.inf)
        slowest = np.argmax(variant, axis=-1)  # rows in stage order: the first slowest stage, as max(range(p), ..)
        stage_sums = combos.stage_sums(variant)

        # NB: the plans' entries of the variants' tables through flat indices (numpy's multi-index is slower)
        code = (self.combo * 3 + recompute_code) * 2 + zero3  # the plan's variant
        slow_local = slowest.ravel()[code]
        slow_row = combos.first_row[self.combo] + slow_local
        slow_total = variant.ravel()[code * variant.shape[-1] + slow_local]
        stage_sum = stage_sums.ravel()[code]
        slow_recompute = table.recompute.ravel()[slow_row * 3 + recompute_code]
        slow_fsdp = np.where(zero3 == 1, table.fsdp.ravel()[slow_row * 3 + recompute_code], 0.0)
        first_row = combos.first_row[self.combo]

        # --- the bubble (even split) and zero bubble ---
        bubble = (stage_sum - slow_total) / self.vpp + table.chain[slow_row]
        uneven = combos.uneven[self.combo]
        if uneven.any():
            bubble = np.where(uneven, self._uneven_bubble(table, combos, variant, code, uneven) + table.chain[slow_row],
                              bubble)
        zb = self.schedule == SCHEDULE_CODES["zb-h1"]
        if zb.any():
            factor = np.maximum(0.0, 1.0 - 2.0 * table.wgrad[slow_row] / slow_total)
            bubble = np.where(zb, bubble * factor, bubble)

        # --- the exposed gradient reduction of the bottleneck and of the first stage ---
        grad = self._grad_exposed(table, slow_row, slow_recompute, first_row,
                                  table.recompute.ravel()[first_row * 3 + recompute_code], code)

        # --- the optimizer step and the host overheads ---
        # the stage with the most parameters (Pricer.optimizer_step_s; stage_params: the contents' params)
        max_params = np.where(combos.valid_rows, table.params[rows], -np.inf).max(axis=1)
        optimizer = self._optimizer_s(table, combos)
        iteration_overhead = pricer.iteration_overhead_s(job0) + self._grad_copies_s(max_params.tolist())

        # --- the breakdown, summed in AnalyticalEstimator.price's order (estimate.result.iteration_time_s) ---
        total = m * table.compute[slow_row]
        total = total + m * slow_recompute
        for slot in range(COMM_SLOTS):
            total = total + m * table.comm[slow_row, slot]
        dp_comm = grad + m * slow_fsdp
        total = total + dp_comm
        total = total + bubble
        total = total + optimizer
        total = total + (iteration_overhead + m * table.overhead[slow_row])
        share = job0.cluster.device.compute_share
        if share < 1.0:
            total = total + np.maximum(0.0, (total - bubble) / share - total)
        time_out[self.index] = total

        peak, capacity = self._peak_memory(table, combos, plans)
        peak_out[self.index] = peak
        oom_out[self.index] = peak > capacity

    def _uneven_bubble(self, table: "_RowTable", combos: "_ComboTable", variant: Floats, code: Ints,
                       uneven: NDArray[np.bool_]) -> Floats:
        """estimate.analytical.uneven_bubble_s of the plans of an uneven split, once per (variant, micro-batches,
        schedule): each stage's one-micro-batch time (its row's of the variant), its forward share (Pricer.
        stage_forward_fraction: the forward and its feature collectives over the compute, the recompute and the
        feature collectives), its chunks' shares of its time where interleaved (Pricer.chunk_time_shares, per
        combo) and its pipeline sends; 0.0 for the other plans."""
        out = np.zeros(len(self.index))
        where = np.flatnonzero(uneven)
        keys = np.stack([code[where], self.m[where], self.schedule[where]], axis=1)
        _, first, inverse = np.unique(_row_codes(keys), return_index=True, return_inverse=True)
        width = variant.shape[-1]
        flat = variant.reshape(-1, width)
        values = []
        for at in where[first].tolist():
            combo, mode = int(self.combo[at]), int(self.recompute[at])
            layout = combos.layouts[int(combos.kind[combo])]
            rows = combos.first_row[combo] + np.arange(len(layout.heads))
            times = flat[int(code[at])].tolist()
            forward = (table.forward[rows] + table.feature_fwd[rows]).tolist()
            whole = (table.compute[rows] + table.recompute[rows, mode] + table.feature_only[rows]).tolist()
            fractions = [f / w if w > 0.0 else 0.0 for f, w in zip(forward, whole, strict=True)]
            sends = table.sends[rows].tolist()
            values.append(uneven_bubble_s(_SCHEDULE_NAMES[int(self.schedule[at])], [times[i] for i in layout.local],
                                          [fractions[i] for i in layout.local], int(self.m[at]),
                                          self.batch.shared.combo_chunks[combo], [sends[i] for i in layout.local]))
        out[where] = np.array(values, dtype=np.float64)[inverse]
        return out

    def _grad_exposed(self, table: "_RowTable", slow_row: Ints, slow_recompute: Floats, first_row: Ints,
                      first_recompute: Floats, variant: Ints) -> Floats:
        """Pricer.gradient_sync_exposed_s per plan, of the bottleneck stage and of the first, the larger: the
        Pricer's queues of buckets (gradient_queues, once per distinct queue) over the plans' windows as arrays
        (stack_effects.queue_tail_s, the plain engine's formula; the sum as Pricer._gradient_sync_windows_s).
        Priced once per what it reads of a plan that reduces its gradients (dp x cp > 1, ZeRO < 3): its variant
        (combo, recompute, ZeRO-3 or not: its rows and recompute seconds), ZeRO > 0 or not, and whether its
        schedule is interleaved; the combo gives the rest (precision, dp x cp, tp, pp, vpp)."""
        n = len(self.index)
        out = np.zeros(n)
        reduces = np.flatnonzero((self.shards_dp > 1) & (self.zero < 3))  # else no reduction
        if not reduces.size:
            return out
        interleaved = self.schedule == SCHEDULE_CODES["interleaved-1f1b"]
        what = (variant * 2 + (self.zero > 0)) * 2 + interleaved
        _, first_of, priced_as = np.unique(what[reduces], return_index=True, return_inverse=True)
        ours = reduces[first_of]  # one plan of each
        out[reduces] = self._grad_exposed_of(table, ours, slow_row[ours], slow_recompute[ours], first_row[ours],
                                             first_recompute[ours])[priced_as]
        return out

    def _grad_exposed_of(self, table: "_RowTable", ours: Ints, slow_row: Ints, slow_recompute: Floats,
                         first_row: Ints, first_recompute: Floats) -> Floats:
        """_grad_exposed of the plans `ours` (each reduces its gradients), of their bottleneck stages (slow_row)
        and first stages (first_row), element by element."""
        n = len(ours)
        plan = np.concatenate([ours, ours])
        rows = np.concatenate([slow_row, first_row])
        recompute = np.concatenate([slow_recompute, first_recompute])
        keys = np.stack([table.param_layers[rows], (self.zero[plan] > 0).astype(np.int64), self.precision[plan],
                         self.shards_dp[plan], self.tp[plan]], axis=1)
        _, first, inverse = np.unique(_row_codes(keys), return_index=True, return_inverse=True)
        numbers = [self._queue(tuple(key), int(plan[at])) for key, at in zip(keys[first].tolist(), first.tolist(),
                                                                              strict=True)]
        queue = np.array(numbers, dtype=np.int64)[inverse]
        queues = self.batch.shared.queue_arrays(self.batch.pricer, self.batch.job0)
        backward = table.backward[rows] + recompute + table.feature_bwd[rows]
        forward = table.forward[rows] + table.feature_fwd[rows]
        gamma = self.batch.pricer.cal.runtime.overlap_slowdown
        zero = self.zero[plan] > 0

        def exposed(scale: Floats, at: Ints) -> Floats:  # of the entries `at`, element by element
            seconds = queues.reduce.exposed_s(queue[at], backward[at] * scale, gamma) \
                if queues.reduce_overlaps else queues.reduce.total_s[queue[at]]
            gathers = np.flatnonzero(zero[at])  # ZeRO >= 1 adds the parameters' gathers
            if gathers.size:
                entries = at[gathers]
                gather = queues.gather.exposed_s(queue[entries], forward[entries] * scale[gathers], gamma) \
                    if queues.gather_overlaps else queues.gather.total_s[queue[entries]]
                seconds[gathers] = seconds[gathers] + gather
            return seconds

        # Pricer._gradient_sync_s: the interleaved schedule's windows (stack_effects.window_micro_batches);
        # the one-chunk window only where the schedule is interleaved
        interleaved = self.schedule[plan] == SCHEDULE_CODES["interleaved-1f1b"]
        scaled = exposed(np.where(interleaved, self.pp[plan], 1.0), np.arange(len(plan)))
        where = np.flatnonzero(interleaved)
        if where.size:
            vpp = self.vpp[plan[where]].astype(np.float64)
            scaled[where] = np.maximum(scaled[where], exposed(1.0 / vpp, where) / vpp)
        return np.maximum(scaled[:n], scaled[n:])

    def _queue(self, key: tuple[int, ...], plan: int) -> int:
        """The number of the gradient queues of a key of _grad_exposed, made with the plan's job and the stage's
        layers' (parameters, count) (key[0]: their number in _Shared.param_layers) where new."""
        shared = self.batch.shared
        number = shared.queue_of.get(key)
        if number is None:
            job = self.batch.plans[int(self.index[plan])][0]
            layers, experts, _ = shared.param_layer_list[key[0]]
            number = shared.queue_of[key] = len(shared.queue_runs)
            runs = self.batch.pricer.new_gradient_runs_s(layers, job, experts)
            shared.queue_runs.append(runs)  # NB: kept, once per key
        return number

    def _optimizer_s(self, table: "_RowTable", combos: "_ComboTable") -> Floats:
        """Pricer.optimizer_step_s per plan: per combo (one precision, one dp) the step over the parameters one GPU
        owns on its stage that owns the most (cost.memory.owned_params: the data-parallel group's share, 1 / (dp x
        cp) from ZeRO-1 on, and the MoE experts' share over their expert data-parallel group), unsharded and
        sharded (ZeRO >= 1), one step-cost call per distinct (parameters, precision). NB: the step cost grows
        with the parameters (FittedStepCosts, the fast path's), so the stage that owns the most steps longest,
        as the Pricer's max over the stages' steps."""
        batch = self.batch
        pricer, device = batch.pricer, batch.job0.cluster.device
        used, first_plan = np.unique(self.combo, return_index=True)
        rows, valid = combos.safe_rows[used], combos.valid_rows[used]
        experts = table.expert_params[rows]
        dense = table.params[rows] - experts  # x - 0.0 is x: a dense stage's parameters as they are
        shards = self.shards_dp[first_plan][:, None]
        owned = np.stack([np.where(valid, dense + experts, -np.inf).max(axis=1),
                          np.where(valid, dense / shards + table.expert_owned[rows], -np.inf).max(axis=1)], axis=1)
        codes = np.repeat(self.precision[first_plan], 2)
        steps: dict[tuple[float, int], float] = {}
        values = []
        for params, code in zip(owned.ravel().tolist(), codes.tolist(), strict=True):
            step = steps.get((params, code))
            if step is None:
                step = steps[(params, code)] = pricer.step_costs.optimizer_step_s(params, batch.precisions[code],
                                                                                  device)
            values.append(step)
        by_combo = np.zeros((int(self.combo.max()) + 1, 2))
        by_combo[used] = np.array(values, dtype=np.float64).reshape(len(used), 2)
        return by_combo.ravel()[self.combo * 2 + (self.zero >= 1)]

    def _grad_copies_s(self, max_params: list[float]) -> Floats | float:
        """Pricer.grad_copies_s per plan (Pricer.step_overhead_s): the bucket copies of its combo's stage with the
        most parameters where the stack copies and the gradients are synced (dp x cp > 1); 0.0 otherwise."""
        batch = self.batch
        if not batch.job0.stack.grad_bucket_copies:
            return 0.0
        device = batch.job0.cluster.device
        by_combo = np.array([batch.pricer.step_costs.grad_copies_s(params, device) if params > 0 else 0.0
                             for params in max_params])
        return np.where(self.shards_dp > 1, by_combo[self.combo], 0.0)

    def _peak_memory(self, table: "_RowTable", combos: "_ComboTable", plans: Ints) -> tuple[Floats, float]:
        """Pricer.memory of every plan: each stage's memory at its peak (cost.memory.stage_memory_base,
        stage_in_flight, stage_memory_values) and the largest. Of the stages of one content only the first
        can be the largest: every schedule holds as many micro-batches or more on an earlier stage, and a
        stage's memory does not fall with the micro-batches it holds."""
        device = self.batch.job0.cluster.device
        rows = np.take(combos.safe_rows, self.combo, axis=0)  # n x R (np.take: numpy's row gather is slower)
        valid = np.take(combos.valid_rows, self.combo, axis=0)
        weight_bytes = self.weight_bytes[:, None]
        grad_bytes = self.grad_bytes[:, None]
        state_bytes = self.state_bytes[:, None]
        shards = self.shards_dp[:, None]
        opt_shards = np.where(self.zero >= 1, self.shards_dp, 1)[:, None]
        zero = self.zero[:, None]
        params = table.params[rows]
        # cost.memory.model_state_bytes: the experts' own group shards theirs (0.0 each for a dense stage: x - 0.0
        # and x + 0.0 are x)
        experts = table.expert_params[rows]
        dense = params - experts
        experts_owned = table.expert_owned[rows]
        weights = dense * weight_bytes / np.where(zero >= 3, shards, 1) \
            + np.where(zero >= 3, experts_owned, experts) * weight_bytes
        gradients = dense * grad_bytes / np.where(zero >= 2, shards, 1) \
            + np.where(zero >= 2, experts_owned, experts) * grad_bytes
        optimizer = dense * state_bytes / opt_shards + np.where(zero >= 1, experts_owned, experts) * state_bytes
        at = rows * 3 + self.recompute[:, None]  # the plan's recompute mode of its rows (flat index)
        per_micro_batch = table.saved.ravel()[at]
        working = table.recompute_working.ravel()[at]
        max_layer_params = table.max_layer_params[rows]
        working = np.where(zero >= 3, working + 2 * max_layer_params * weight_bytes, working)
        working = working + table.head_saved[rows]  # 0 where the stage has no head: x + 0.0 is x
        impl = self.optimizer[:, None]
        if (self.optimizer == OPTIMIZER_CODES["fused"]).all():  # no step temporaries (the search's default)
            step = np.zeros_like(params)
        else:
            step = np.where(impl == OPTIMIZER_CODES["foreach"], 4.0 * params / opt_shards,
                            np.where(impl == OPTIMIZER_CODES["loop"], 4.0 * max_layer_params / opt_shards,
                                     0.0))
        # micro-batches each stage holds at its peak (strategy.stages.in_flight_micro_batches)
        stage = np.take(combos.heads, self.combo, axis=0)
        pp, vpp, m = self.pp[:, None], self.vpp[:, None], self.m[:, None]
        schedule = self.schedule[:, None]
        interleaved = np.minimum(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp) / vpp
        in_flight = np.where(schedule == SCHEDULE_CODES["gpipe"], m.astype(np.float64),
                             np.where(schedule == SCHEDULE_CODES["interleaved-1f1b"], interleaved,
                                      np.minimum(m, pp - stage).astype(np.float64)))
        activations = per_micro_batch * in_flight
        stepping = step > activations + working
        states = weights + gradients + optimizer
        chunked = np.flatnonzero(combos.chunked[self.combo] & (self.schedule == SCHEDULE_CODES["interleaved-1f1b"]))
        held = (per_micro_batch[chunked], working[chunked], step[chunked])
        activations = np.where(stepping, 0.0, activations)
        working = np.where(stepping, 0.0, working)
        step = np.where(stepping, step, 0.0)
        totals = states + activations + working + step + device.runtime_reserved_bytes
        totals = np.where(valid, totals, -np.inf)
        peak = totals.max(axis=1)
        if chunked.size:
            peak[chunked] = self._chunked_peaks(chunked, combos, states[chunked], held, device.runtime_reserved_bytes)
        return peak, device.hbm_bytes

    def _in_flight(self, stage: int, pp: int, vpp: int, m: int, shares: tuple[float, ...] | None) -> float:
        """in_flight_micro_batches of an interleaved stage whose chunks hold `shares` of its activations, once per
        what it reads (the engine's graphs of one model share their stages' shares)."""
        known = self.batch.shared.in_flight
        key = (stage, pp, vpp, m, shares)
        held = known.get(key)
        if held is None:
            held = known[key] = (in_flight_micro_batches("interleaved-1f1b", stage, pp, vpp, m, None) if shares is None
                                 else interleaved_peak_chunks_array(stage, pp, vpp, m, shares))
        return held

    def _chunked_peaks(self, plans: Ints, combos: "_ComboTable", states: Floats,
                       held: tuple[Floats, Floats, Floats], reserved_bytes: float) -> Floats:
        """The peak memory of interleaved plans of an uneven split (Pricer.memory with chunk_blocks): every stage
        (stages of one content may hold their chunks apart), each holding the micro-batches of its chunks'
        shares of its activations (cost.memory.chunk_shares, stage_in_flight), its memory stage_memory_values'.
        states, held: the plans' rows' model states and (one micro-batch's activations, working buffers, step
        temporaries). The micro-batches in flight once per (combo, recompute, micro-batches), the rest as arrays
        over the plans' stages (n x pp, -inf past a plan's last stage), summed in stage_memory_values' order."""
        batch = self.batch
        keys = np.stack([self.combo[plans], self.recompute[plans], self.m[plans]], axis=1)
        _, first, inverse = np.unique(_row_codes(keys), return_index=True, return_inverse=True)
        # per (shape, recompute): not m's nor dp's (the combos of one graph and split share a shape, _Shared.shapes)
        shares_of: dict[tuple[int, int], list[tuple[float, ...] | None]] = {}
        width = int(self.pp[plans].max())
        flights = np.zeros((len(first), width))
        locals_ = np.zeros((len(first), width), dtype=np.int64)
        stages = np.zeros((len(first), width), dtype=np.bool_)
        for number, plan in enumerate(plans[first].tolist()):
            combo, mode, m = int(self.combo[plan]), int(self.recompute[plan]), int(self.m[plan])
            layout = combos.layouts[int(combos.kind[combo])]
            shape = batch.shared.combo_shapes[combo]
            shares = shares_of.get((id(shape), mode))
            if shares is None:
                saved = saved_key(_RECOMPUTE_NAMES[mode], batch.job0.stack)
                shares = shares_of[(id(shape), mode)] = [
                    chunk_shares(batch._stage(shape, local), layout.chunk_blocks[stage], saved)
                    for stage, local in enumerate(layout.local)]
            pp, vpp = int(self.pp[plan]), int(self.vpp[plan])
            flights[number, :pp] = [self._in_flight(stage, pp, vpp, m, share) for stage, share in enumerate(shares)]
            locals_[number, :pp] = layout.local
            stages[number, :pp] = True
        at = locals_[inverse]  # per plan and stage its distinct row (the columns of states and held)
        per_micro_batch, working, step = (np.take_along_axis(values, at, axis=1) for values in held)
        state = np.take_along_axis(states, at, axis=1)
        activations = per_micro_batch * flights[inverse]
        stepping = step > activations + working
        totals = np.where(stepping, state + 0.0 + 0.0 + step + reserved_bytes,
                          state + activations + working + 0.0 + reserved_bytes)
        return np.where(stages[inverse], totals, -np.inf).max(axis=1)


class _ComboTable:
    """The combos as arrays: per combo its distinct rows (R columns, padded) and their first stages, made per
    template (layouts) and taken per combo (kind: its template's number)."""

    def __init__(self, first_rows: "array[int]", kinds: "array[int]", layouts: list[_Template],
                 uneven: "array[int]") -> None:
        distinct = max(len(layout.heads) for layout in layouts)
        self.kind = _int_array(kinds)
        self.uneven = _int_array(uneven).astype(np.bool_)
        self.chunked = np.array([bool(layout.chunk_blocks) for layout in layouts], dtype=np.bool_)[self.kind]
        self.layouts = layouts
        heads = _rows([layout.heads + (0,) * (distinct - len(layout.heads)) for layout in layouts], distinct,
                      np.int64)[self.kind]
        count = np.array([len(layout.heads) for layout in layouts], dtype=np.int64)[self.kind]
        self.first_row = _int_array(first_rows)
        self.valid_rows = np.arange(distinct)[None, :] < count[:, None]
        self.safe_rows = np.where(self.valid_rows, self.first_row[:, None] + np.arange(distinct)[None, :], 0)
        self.heads = heads

    def stage_sums(self, variant: Floats) -> Floats:
        """Per combo and variant (C x ... x R: its distinct rows' figures) the sum over its stages in stage order
        from the first (Python's sum from 0: 0 + x is x), each stage taking its distinct row's figure: per
        template, whose stages' rows are fixed positions."""
        sums = np.zeros(variant.shape[:-1])
        for number, layout in enumerate(self.layouts):
            members = np.flatnonzero(self.kind == number)
            if not members.size:
                continue
            rows = variant[members]
            total = rows[..., layout.local[0]]
            for position in layout.local[1:]:
                total = total + rows[..., position]
            sums[members] = total
        return sums


class _RowTable:
    """The stage rows as columns (each a content's, with the row's pipeline sends after its feature axes)."""

    def __init__(self, columns: dict[str, Floats], row_content: "array[int]", row_sends_s: "array[float]",
                 row_fsdp_s: "array[float]", row_chain_s: "array[float]", row_expert_params: "array[float]",
                 row_expert_owned: "array[float]") -> None:
        index = _int_array(row_content)
        sends = _float_array(row_sends_s)
        self.compute = columns["compute"][index]
        self.forward = columns["forward"][index]
        self.backward = columns["backward"][index]
        self.wgrad = columns["wgrad"][index]
        self.comm = columns["feature"][index]
        self.comm[np.arange(len(index)), columns["features"][index].astype(np.int64)] = sends  # 0 where pp = 1
        self.comm_total = columns["feature_total"][index] + sends  # sum(feature_s + (sends,)): x + 0.0 is x
        self.recompute = columns["recompute"][index]
        self.fsdp = _float_array(row_fsdp_s).reshape(len(index), len(RECOMPUTE_CODES))
        self.chain = _float_array(row_chain_s)
        self.overhead = columns["overhead"][index]
        self.params = columns["params"][index]
        self.sends = sends  # the pipeline sends (a stage's comm_s["pp"]; 0 for pp = 1)
        self.feature_only = columns["feature_total"][index]  # the feature collectives without the sends
        self.expert_params = _float_array(row_expert_params)  # _Shared.row_expert_params
        self.expert_owned = _float_array(row_expert_owned)
        self.saved = columns["saved"][index]
        self.recompute_working = columns["working"][index]
        self.max_layer_params = columns["max_layer_params"][index]
        self.head_saved = columns["head_saved"][index]
        self.content_of_row = index
        self.param_layers = columns["param_layers"][index].astype(np.int64)
        self.feature_fwd = columns["feature_fwd"][index]
        self.feature_bwd = columns["feature_bwd"][index]


class _Queues:
    """Queues of buckets as arrays (stack_effects.bucket_queue's terms of each: count, total_s, peaks_s, lags),
    one column per queue, the candidates padded (peaks -inf, lags 0: never the largest). A candidate's row over
    the queues is contiguous, so the plans' rows are one take each (numpy gathers rows of a 2-d table several
    times slower)."""

    def __init__(self, runs: Sequence[_Runs]) -> None:
        """runs: per queue its runs of buckets (seconds of one bucket, how many in a row) in sending order. The
        terms are bucket_queue's, over arrays with the same operations in the same order: the total a sum
        from the first run (Python's sum from 0: 0 + x is x; a padded run adds 0.0), the peaks and lags from
        the last run back, `later` the seconds of the runs after (a running sum from 0.0, as bucket_queue's)."""
        lengths = np.fromiter(map(len, runs), np.int64, len(runs))
        depth = max(1, int(lengths.max()) if len(runs) else 1)
        queue = np.repeat(np.arange(len(runs)), lengths)
        position = _offsets(lengths)
        flat = _rows(list(chain.from_iterable(runs)), 2, np.float64)  # (seconds, count) per run
        seconds, counts = np.zeros((len(runs), depth)), np.zeros((len(runs), depth))
        seconds[queue, position], counts[queue, position] = flat[:, 0], flat[:, 1]
        self.count = counts.sum(axis=1)  # whole numbers: exact in any order
        self.total_s = np.cumsum(seconds * counts, axis=1)[:, -1]
        back = lengths[queue] - 1 - position  # the run's place counted from the last
        seconds, counts = np.zeros((len(runs), depth)), np.zeros((len(runs), depth))
        seconds[queue, back], counts[queue, back] = flat[:, 0], flat[:, 1]
        run_s = counts * seconds
        later = np.concatenate([np.zeros((len(runs), 1)), np.cumsum(run_s, axis=1)[:, :-1]], axis=1)
        after = np.concatenate([np.zeros((len(runs), 1)), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
        real = np.arange(depth)[None, :] < lengths[:, None]
        peaks = np.stack([later + seconds, later + run_s], axis=2).reshape(len(runs), 2 * depth)
        lags = np.stack([after, after + counts - 1], axis=2).reshape(len(runs), 2 * depth)
        real = np.repeat(real, 2, axis=1)
        self.peaks_s = np.ascontiguousarray(np.where(real, peaks, -np.inf).T)  # candidate x queue
        self.lags = np.ascontiguousarray(np.where(real, lags, 0.0).T)

    def exposed_s(self, queue: Ints, window_s: Floats, gamma: float) -> Floats:
        """stack_effects.queue_exposed_s of queue[i] over window_s[i]."""
        count, total = self.count[queue], self.total_s[queue]
        peaks, lags = np.take(self.peaks_s, queue, axis=1), np.take(self.lags, queue, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):  # an empty queue: 0, below
            tail = queue_tail_s(total, list(peaks), list(lags), window_s / count, gamma, np.maximum)
        return np.where((count == 0) | (total <= 0.0), 0.0, tail)


class _QueueTable:
    """The gradient queues of a _Shared (Pricer.new_gradient_runs_s: the reduction's and the parameter
    gathers') as arrays. The overlaps are the stack's and the cluster's: one for all."""

    def __init__(self, runs: list[tuple[_Runs, _Runs]], reduce_overlaps: bool, gather_overlaps: bool) -> None:
        self.size = len(runs)
        self.reduce = _Queues([reduce for reduce, _ in runs])
        self.gather = _Queues([gather for _, gather in runs])
        self.reduce_overlaps = reduce_overlaps
        self.gather_overlaps = gather_overlaps


def _on(plans: Sequence[tuple[Job, OpGraph]], cluster: object, stack: object) -> bool:
    """Whether every plan's job is on this cluster object and stack object (a plain loop: ~2.5x the speed of
    all() over a generator here)."""
    on = True
    for job, _ in plans:
        if job.cluster is not cluster or job.stack is not stack:
            on = False
            break
    return on


def _rows(rows: Sequence[Sequence[float]], width: int, dtype: type[np.float64] | type[np.int64]) -> NDArray:
    """np.array(rows, dtype) of rows each `width` long (a 2-d table), from the rows' entries in one flat pass: the
    same numbers (numpy converts each entry alone either way), without numpy's walk of a nested list."""
    flat = np.fromiter(chain.from_iterable(rows), dtype, count=len(rows) * width)
    return flat.reshape(len(rows), width)


def _int_array(values: "array[int]") -> Ints:
    """A copy of a typed array's numbers as a numpy array (one copy of its buffer; the array may grow later)."""
    return np.array(values, dtype=np.int64)


def _float_array(values: "array[float]") -> Floats:
    return np.array(values, dtype=np.float64)


def _extend(values: "array[float]", numbers: Floats) -> None:
    """values += numbers' entries in row-major order, bit for bit."""
    values.frombytes(np.ascontiguousarray(numbers, dtype=np.float64).tobytes())


def _row_codes(columns: Ints) -> Ints:
    """One number per row of non-negative integer columns (mixed radix): equal rows, equal numbers (np.unique
    of one column is several times faster than of rows)."""
    codes = np.zeros(len(columns), dtype=np.int64)
    for column in columns.T:
        codes = codes * (int(column.max()) + 1) + column
    return codes


def _first_and_numbers(values: Ints) -> tuple[Ints, Ints]:
    """np.unique(values, return_index=True, return_inverse=True)'s first indices and inverse; for values in
    non-decreasing order (the enumeration's bases) from where they change, without a sort."""
    if len(values) and bool((values[1:] >= values[:-1]).all()):
        change = np.flatnonzero(values[1:] != values[:-1]) + 1
        numbers = np.zeros(len(values), dtype=np.int64)
        numbers[change] = 1
        return np.concatenate([np.zeros(1, dtype=np.int64), change]), np.cumsum(numbers)
    _, first, numbers = np.unique(values, return_index=True, return_inverse=True)
    return first, numbers


def _offsets(lengths: Ints) -> Ints:
    """0, 1, ..., length - 1 for each of `lengths`, one after another."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lengths, lengths)


_Entry = TypeVar("_Entry", bound=tuple)


def _by_template(entries: "list[_Entry]", at: int) -> "list[list[_Entry]]":
    """The entries grouped by the template of their shape (entry[at]), each group in the entries' order."""
    groups: dict[int, list[_Entry]] = {}
    for entry in entries:
        groups.setdefault(id(entry[at].template), []).append(entry)
    return list(groups.values())


def interleaved_peak_chunks_array(stage: int, pp: int, vpp: int, num_micro_batches: int,
                                  chunk_shares: Sequence[float]) -> float:
    """strategy.stages.interleaved_peak_chunks as one running sum in numpy, to the bit: the warm-up's forwards,
    then forward k + W and backward k alternately, summed in the same order (np.cumsum is sequential; adding
    -x is subtracting x), the peak over the sums after the warm-up and after each steady forward."""
    total = num_micro_batches * vpp
    warmup = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    shares = np.asarray(chunk_shares, dtype=np.float64)
    positions = (np.arange(total) % (pp * vpp)) // pp
    steady = total - warmup
    steps = np.empty(1 + warmup + 2 * steady)
    steps[0] = 0.0
    steps[1:1 + warmup] = shares[positions[:warmup]]
    steps[1 + warmup::2] = shares[positions[warmup:]]
    steps[2 + warmup::2] = -shares[vpp - 1 - positions[:steady]]
    held = np.cumsum(steps)
    return float(max(held[warmup], held[1 + warmup::2].max())) if steady else float(held[warmup])
