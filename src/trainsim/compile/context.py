"""What the compile passes share: the job, its plan and costs, the graph being built, and per-stage writers.

Costs come from the pricing service (cost.pricing: layer prices, collectives over axis_layout), as the analytical
engine's do, so the two fidelity levels price the same work identically and differ only in how they compose it.
"""

from dataclasses import dataclass, field
from functools import reduce
from itertools import accumulate
from operator import attrgetter, iadd
from typing import Literal

from trainsim.catalog.calibration import Calibration
from trainsim.compile.splits import LayerSplit
from trainsim.cost.pricing import Pricer, axis_group, axis_layout, sub_group
from trainsim.hardware.cluster import GroupLayout
from trainsim.ir.exec_graph import ExecGraph, Phase, Stream, TaskKind, TemplateRun
from trainsim.ir.graph import Comm, Layer, Op
from trainsim.job import Job
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.megatron import module_site
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import PrecisionPolicy, policy_for
from trainsim.strategy.reshard import ReshardStep
from trainsim.strategy.stages import StagePart

TaskLevel = Literal["layer", "op"]
TASK_LEVELS: tuple[TaskLevel, ...] = ("layer", "op")
WGRAD_SUFFIX = ".wgrad"  # weight-gradient GEMMs in the OpGraph (cost.flops.matmul_backward, conv_backward)
# NB: op times come from the pricer's op cost model, the one its layer prices use.


@dataclass(frozen=True, slots=True)
class Work:
    """A piece of compute: one op, or a whole layer-phase at task_level="layer". site: the module the op
    belongs to ("attn", "mlp", ...), where a feature collective of that site is placed at op level."""

    name: str
    seconds: float
    site: str = ""


@dataclass(frozen=True, slots=True)
class CommWork:
    """A feature collective of one layer-phase (merged per axis and sub-group at task_level="layer"). ranks: the
    sub-group of the axis' group it spans (ir.graph.Comm.ranks; over "split", the data-parallel ranks of a
    reshard: compile.splits), 0: the whole group; its links are the sub-group's (BuildContext.comm_layout)."""

    name: str
    axis: str
    seconds: float
    site: str = ""
    ranks: int = 0


@dataclass(frozen=True, slots=True)
class LayerTiming:
    """One micro-batch through one layer instance on one device: compute split the way the passes need it."""

    fwd: tuple[Work, ...]
    bwd: tuple[Work, ...]  # whole backward
    dgrad: tuple[Work, ...]  # input-gradient part (zero-bubble B)
    wgrad: tuple[Work, ...]  # weight-gradient part (zero-bubble W)
    selective: tuple[Work, ...]  # what selective recompute repeats
    comms: dict[str, tuple[CommWork, ...]]  # "fwd" | "bwd" -> feature collectives


def _site(op: Op) -> str:
    """The attention, MLP (strategy.megatron.module_site) or MoE module an op runs in."""
    return module_site(op.module_path) or ("moe" if "moe" in op.module_path.split(".") else "")


def _comm_site(name: str) -> str:
    head = name.split(".")[0]
    return head if head in ("attn", "mlp") else ""


def _links(layout: GroupLayout) -> tuple[str, ...]:
    """The levels a transfer of this layout crosses: the fabric inside a domain, the NIC out of it, the leaf's
    up-links out of the leaf (compile/place_links.py puts the shared ones in their place)."""
    if layout.size <= 1:
        return ()
    if layout.num_domains == 1:
        return ("fabric",)
    across = ("nic", "uplink") if layout.num_leaves > 1 else ("nic",)
    return (*across, "fabric") if layout.ranks_per_domain > 1 else across


def _link_names(layout: GroupLayout, senders: tuple[int, ...], receivers: tuple[int, ...]) -> tuple[str, ...]:
    """Per simulated device and link, a transmit and a receive resource: links are full duplex, so a send and
    a receive in the other direction do not share bandwidth."""
    links = _links(layout)
    return tuple(dict.fromkeys([f"stage{d}.{link}.tx" for d in senders for link in links]
                               + [f"stage{d}.{link}.rx" for d in receivers for link in links]))


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A chain task of a layer-phase, whatever its micro-batch: the task of micro-batch mb is named
    f"{prefix}{mb}{suffix}" (compiling builds a layer-phase's specs once and replays them for every micro-batch)."""

    prefix: str
    suffix: str
    stream: Stream
    kind: TaskKind
    duration_s: float
    phase: Phase
    category: str
    layer: str = ""
    alloc_bytes: float = 0.0
    free_bytes: float = 0.0
    resources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpertReplicas:
    """The ranks (rank 0's) that hold the same shard of an MoE block's experts and sum its gradient, where they
    are not the data-parallel group (compile.shape_layers.expert_grad_groups)."""

    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


SyncGroup = int | ExpertReplicas  # a gradient's sync group: that many ranks of the data-parallel group, or those


def sync_size(group: SyncGroup) -> int:
    return group.size if isinstance(group, ExpertReplicas) else group


@dataclass(slots=True)
class BuildContext:
    job: Job
    plan: LoweredPlan
    pricer: Pricer
    level: TaskLevel
    graph: ExecGraph
    _timings: dict[object, LayerTiming] = field(default_factory=dict)
    _layouts: dict[str, GroupLayout] = field(default_factory=dict)
    _resources: dict[tuple[object, ...], tuple[str, ...]] = field(default_factory=dict)
    _micro_batch_overheads: dict[int, float] = field(default_factory=dict)
    splits: dict[int, LayerSplit] = field(default_factory=dict)  # layer index -> its computation configs
    mesh_comms: dict[int, tuple[Comm, ...]] = field(default_factory=dict)  # layer index -> its configs' tp/cp/ep
    # collectives (compile.splits.plan_mesh_comms), where the plan carries configs over those axes
    expert_grads: dict[int, tuple[float, ExpertReplicas]] = field(default_factory=dict)  # layer index -> its
    # experts' parameters per rank and the ranks summing their gradient, where not the data-parallel group
    tp_token_params: dict[int, dict[int, float]] = field(default_factory=dict)  # layer index -> {k: parameters
    # whose gradient k tp ranks make from their own tokens} (compile.splits.plan_tp_token_params)
    split_timings: dict[tuple[object, ...], LayerTiming] = field(default_factory=dict)
    # (layer instance index, F | B | W) -> the chain tasks of that layer-phase (lower_layers.unit_specs), where
    # no pass cuts into it
    unit_specs: dict[tuple[int, str], tuple["TaskSpec", ...]] = field(default_factory=dict)

    @property
    def par(self) -> ParallelSpec:
        return self.job.parallel

    @property
    def policy(self) -> PrecisionPolicy:
        return policy_for(self.job.parallel.precision)

    @property
    def cal(self) -> Calibration:
        return self.pricer.cal

    def add(self, *, name: str, device: int, stream: Stream, kind: TaskKind, duration_s: float,
            deps: tuple[int, ...] = (), phase: Phase = "fwd", category: str = "", layer: str = "",
            micro_batch: int = -1, stage: int = -1, sync_key: str = "", resources: tuple[str, ...] = (),
            alloc_bytes: float = 0.0, free_bytes: float = 0.0, priority: int = 0) -> int:
        """Add a task to the graph's columns; returns its tid."""
        # NB: positional, in Task's field order
        return self.graph.writable_columns().append(name, device, stream, kind, duration_s, deps, sync_key, resources,
                                           alloc_bytes, free_bytes, phase, layer, micro_batch, stage, category,
                                           priority)

    def micro_batch_overhead_s(self, stage: int) -> float:
        """The host-side cost of one micro-batch on `stage` (the analytical engine's, over the stage's layers)."""
        seconds = self._micro_batch_overheads.get(stage)
        if seconds is None:
            seconds = self._micro_batch_overheads[stage] = self.pricer.micro_batch_overhead_s(
                self.stage_parts(stage), self.job)
        return seconds

    def stage_parts(self, stage: int) -> list[StagePart]:
        """The layers the plan puts on `stage`, one part each, as the pricer's stage prices take them."""
        return [StagePart(a.layer, 1.0) for a in self.plan.layers if a.stage == stage]

    def layout(self, axis: str) -> GroupLayout:
        """Group layout of an axis; "grad" is the data-parallel gradient group (dp x cp ranks, stride tp);
        "split" the data-parallel group that computation configs partition (compile.splits)."""
        layout = self._layouts.get(axis)
        if layout is None:
            par = self.job.parallel
            layout = self._layouts[axis] = (self.job.cluster.group_layout(par.dp, par.tp * par.cp)
                                            if axis == "split" else axis_layout(axis, par, self.job.cluster))
        return layout

    def hop_layout(self, boundary: int) -> GroupLayout:
        """The layout of a pipeline transfer across `boundary` (between virtual stages boundary and boundary + 1,
        on pipeline ranks boundary mod p and (boundary + 1) mod p: Megatron-LM's interleaved placement): the
        pipeline group's; where the plan gives the stages their own device counts, the farthest pair of the two
        stages' blocks of ranks (the first rank of the earlier block, the last of the later one: a transfer
        between them crosses a server if any of it does)."""
        stages = self.plan.num_stages
        if not self.plan.stage_ranks or boundary + 1 >= stages * self.plan.num_chunks:  # (past the last: none)
            return self.layout("pp")
        lower, upper = sorted((boundary % stages, (boundary + 1) % stages))
        first, _ = self.plan.stage_block(lower)
        start, count = self.plan.stage_block(upper)
        return self.job.cluster.ranks_layout([first, start + count - 1])

    def pipeline_hop_s(self, boundary: int, out_bytes: float) -> float:
        """One activation (or gradient) of out_bytes across `boundary` (Pricer.pipeline_hop_s over hop_layout)."""
        layout = self.hop_layout(boundary) if self.plan.stage_ranks else None
        return self.pricer.pipeline_hop_s(out_bytes, self.job, layout)

    def reshard_s(self, step: ReshardStep) -> float:
        """A reshard collective (compile.splits) over `step.ranks` neighbouring data-parallel ranks."""
        par = self.job.parallel
        layout = self.job.cluster.group_layout(step.ranks, par.tp * par.cp)
        return self.pricer.collective_s(step.collective, step.buffer_bytes, layout, self.job)

    def grad_params(self, index: int, params: float) -> float:
        """Parameters whose gradient a device syncs over the data-parallel group for layer instance `index`
        (fewer where computation or memory configs split weights: compile.splits)."""
        split = self.splits.get(index)
        return params if split is None else split.grad_params

    def grad_params_by_ranks(self, index: int, params: float) -> dict[SyncGroup, float]:
        """Of grad_params, how many parameters are summed over how many data-parallel ranks (compile.splits:
        a split weight's part only over the ranks holding it; the whole group, dp ranks, otherwise); an MoE's
        experts that a tree splits over fewer tp ranks than tp, over their ExpertReplicas (expert_grads); a weight
        whose matmul splits its tokens k ways over tp, over the dp x k ranks that hold it (tp_token_params,
        strategy.megatron.token_split_params)."""
        split = self.splits.get(index)
        if split is not None:
            return {ranks: part for ranks, part in split.grad_params_by_ranks.items()}  # int keys as SyncGroup
        dp = self.job.parallel.dp
        experts = self.expert_grads.get(index)
        shared = self.tp_token_params.get(index, {})
        by_ranks: dict[SyncGroup, float] = {
            dp: params - (experts[0] if experts is not None else 0.0) - sum(shared.values())}
        if experts is not None:
            by_ranks[experts[1]] = experts[0]
        for parts, count in shared.items():
            by_ranks[dp * parts] = by_ranks.get(dp * parts, 0.0) + count
        return by_ranks

    def stage_expert_params(self, stage: int) -> dict[int, float]:
        """{ranks: parameters} of the MoE experts on `stage` whose gradient an expert data-parallel group of that
        many ranks sums (expert_grads; cost.memory.model_state_bytes shards their states over it)."""
        out: dict[int, float] = {}
        for a in self.plan.layers:
            experts = self.expert_grads.get(a.index) if a.stage == stage else None
            if experts is not None:
                out[experts[1].size] = out.get(experts[1].size, 0.0) + experts[0]
        return out

    def sync_layout(self, ranks: SyncGroup) -> GroupLayout:
        """The layout of a gradient sync over `ranks` of the data-parallel group: the group's own ("grad"), or
        for a split weight's part the ranks holding it; an ExpertReplicas' from its ranks. NB: taken as
        neighbouring ranks (as reshard_s); on one node the layout is the same whichever ranks they are. More ranks
        than dp (dp x k: a weight k tp ranks hold whole, grad_params_by_ranks): taken at a stride of tp x cp / k
        (exact where k = tp)."""
        par = self.job.parallel
        if isinstance(ranks, ExpertReplicas):
            return self.job.cluster.ranks_layout(ranks.ranks)
        if ranks == par.dp:
            return self.layout("grad")
        if ranks > par.dp:  # the dp replicas of k tp ranks splitting a matmul's tokens (grad_params_by_ranks)
            return self.job.cluster.group_layout(ranks, max(1, par.tp * par.cp // (ranks // par.dp)))
        return self.job.cluster.group_layout(ranks, par.tp * par.cp)

    def held_params(self, index: int, params: float) -> float:
        """Parameters a device stores for layer instance `index` (compile.splits: split and sharded weights)."""
        split = self.splits.get(index)
        return params if split is None else split.held_params

    def collective_s(self, collective: str, buffer_bytes: float, axis: str, ranks: int = 0) -> float:
        """A collective over the group of `axis`, or over `ranks` consecutive ranks of it (ir.graph.Comm)."""
        return self.pricer.collective_s(collective, buffer_bytes, self.comm_layout(axis, ranks), self.job)

    def comm_layout(self, axis: str, ranks: int = 0) -> GroupLayout:
        """The layout of a collective over the group of `axis` (layout), or over `ranks` consecutive ranks of it
        (a sub-group: ir.graph.Comm.ranks; over "split", neighbouring data-parallel ranks, as reshard_s)."""
        if not ranks:
            return self.layout(axis)
        if axis == "split":
            return self.job.cluster.group_layout(ranks, self.job.parallel.tp * self.job.parallel.cp)
        return self.pricer.group_layout(sub_group(axis_group(axis, self.job.parallel), ranks), self.job)

    def link_resources(self, layout: GroupLayout, senders: tuple[int, ...],
                       receivers: tuple[int, ...] | None = None) -> tuple[str, ...]:
        """Links the ranks of these simulated devices use for a transfer of `layout`: their fabric ports inside
        a node, their NICs across nodes, their leaf's up-links across leaves, each direction a resource of its own,
        named per simulated device ("stage3.nic.tx"); compile/place_links.py then puts the shared ones (NICs, up-links,
        a PCIe bus) in their place among the cluster's physical links. A collective sends and receives on every rank
        (receivers default to the senders); a send-recv transmits on the sender and receives on the receiver."""
        receivers = senders if receivers is None else receivers
        key = (layout.size, layout.ranks_per_domain, layout.num_domains, layout.num_leaves, senders, receivers)
        names = self._resources.get(key)
        if names is None:
            names = _link_names(layout, senders, receivers)
            self._resources[key] = names
        return names

    def timing(self, layer: Layer, index: int = -1) -> LayerTiming:
        """One micro-batch through layer instance `index` (its feature collectives from the plan's configs over
        tp, cp and ep where it carries them, else the layer's own)."""
        comms = self.mesh_comms.get(index) if self.mesh_comms else None
        key = id(layer) if comms is None else (id(layer), id(comms))  # plan_mesh_comms shares equal tuples
        timing = self._timings.get(key)
        if timing is None:
            timing = self._layer_timing(layer, layer.comms if comms is None else comms)
            self._timings[key] = timing
        return timing

    def _layer_timing(self, layer: Layer, layer_comms: tuple[Comm, ...]) -> LayerTiming:
        cost = self.pricer.layer_cost(layer, self.job)
        comms: dict[str, list[CommWork]] = {"fwd": [], "bwd": []}
        for c in layer_comms:
            if c.axis == "pp":
                continue  # pipeline transfers are the schedule pass's
            seconds = self.collective_s(c.collective, c.buffer_bytes, c.axis, c.ranks)
            if c.axis == "tp":  # the part a stack that overlaps it with the GEMMs leaves exposed (pricing)
                seconds *= cost.tp_exposed_fraction[0 if c.phase == "fwd" else 1]
            elif c.axis == "cp":  # the part ring attention leaves exposed (pricing)
                seconds *= cost.cp_exposed_fraction[0 if c.phase == "fwd" else 1]
            elif c.axis == "ep":  # the part another micro-batch's compute leaves exposed (pricing)
                seconds *= cost.ep_exposed_fraction[0 if c.phase == "fwd" else 1]
            if seconds > 0.0:
                comms[c.phase].append(CommWork(f"{c.name} {c.collective}", c.axis, seconds, _comm_site(c.name),
                                               c.ranks))
        if self.level == "op":
            pricer, job = self.pricer, self.job

            def works(ops: tuple[Op, ...]) -> tuple[Work, ...]:
                return tuple(Work(op.name, pricer.op_time_s(op, job), _site(op)) for op in ops)

            bwd = works(layer.bwd)
            return LayerTiming(works(layer.fwd), bwd, tuple(w for w in bwd if not w.name.endswith(WGRAD_SUFFIX)),
                               tuple(w for w in bwd if w.name.endswith(WGRAD_SUFFIX)),
                               works(tuple(op for op in layer.fwd if op.recompute_selective)),
                               {phase: tuple(items) for phase, items in comms.items()})
        wgrad_s = cost.wgrad_s
        merged: dict[str, tuple[CommWork, ...]] = {}
        for phase, items in comms.items():
            per_group: dict[tuple[str, int], float] = {}  # (axis, sub-group ranks) -> seconds
            for item in items:
                per_group[(item.axis, item.ranks)] = per_group.get((item.axis, item.ranks), 0.0) + item.seconds
            merged[phase] = tuple(CommWork(f"{axis} comm" + (f" x{ranks}" if ranks else ""), axis, seconds, "", ranks)
                                  for (axis, ranks), seconds in per_group.items())
        return LayerTiming((Work("fwd", cost.fwd_s),), (Work("bwd", cost.bwd_s),),
                           (Work("dgrad", max(0.0, cost.bwd_s - wgrad_s)),), (Work("wgrad", wgrad_s),),
                           (Work("selective", cost.selective_s),) if cost.selective_s > 0.0 else (), merged)


@dataclass(frozen=True, slots=True)
class SpecBlock:
    """Chain task specs as columns (TaskColumns' fields that do not depend on the micro-batch or the stage), so a
    step's tasks are written with one list extension per field (StageWriter.emit_block)."""

    affixes: tuple[tuple[str, str], ...]  # (prefix, suffix) of each name
    stream: tuple[Stream, ...]
    kind: tuple[TaskKind, ...]
    duration_s: tuple[float, ...]
    resources: tuple[tuple[str, ...], ...]
    alloc_bytes: tuple[float, ...]
    free_bytes: tuple[float, ...]
    phase: tuple[Phase, ...]
    layer: tuple[str, ...]
    category: tuple[str, ...]
    blank: tuple[str, ...]  # sync keys
    zeros: tuple[int, ...]  # priorities
    no_shares: tuple[tuple[float, ...], ...]  # link shares
    last_compute: int  # offset of the last task on the compute stream (-1: none)

    @classmethod
    def of(cls, specs: tuple[TaskSpec, ...]) -> "SpecBlock":
        n = len(specs)
        return cls(tuple((s.prefix, s.suffix) for s in specs), tuple(s.stream for s in specs),
                   tuple(s.kind for s in specs), tuple(s.duration_s for s in specs),
                   tuple(s.resources for s in specs), tuple(s.alloc_bytes for s in specs),
                   tuple(s.free_bytes for s in specs), tuple(s.phase for s in specs), tuple(s.layer for s in specs),
                   tuple(s.category for s in specs), ("",) * n, (0,) * n, ((),) * n,
                   max((i for i, s in enumerate(specs) if s.stream == "compute"), default=-1))


_STREAM = attrgetter("stream")
_AFFIXES = attrgetter("affixes")
# TaskColumns' columns that a SpecBlock gives as they are (emit_blocks), with the block field holding each
# NB: a block's sync keys, priorities and link shares are always "", 0 and () (SpecBlock.of): written as one list
_BLOCK_COLUMNS = tuple((column, attrgetter(column)) for column in (
    "stream", "kind", "duration_s", "resources", "alloc_bytes", "free_bytes", "category"))
_KEPT = frozenset(("stream", "kind", "resources", "category"))  # what a template run keeps of what it wrote


class StageWriter:
    """Appends one stage's serialized work: compute tasks and the feature collectives that block them form
    one chain (each waits for the previous), which is how the analytical engine adds them up."""

    __slots__ = ("blocks", "columns", "ctx", "pending", "prev", "stage", "step_first")

    def __init__(self, ctx: BuildContext, stage: int) -> None:
        self.ctx = ctx
        self.columns = ctx.graph.writable_columns()
        self.stage = stage
        self.prev = -1  # last task of the chain
        self.pending: list[int] = []  # extra dependencies of the next chain task
        self.step_first = -1  # first chain task since the driver reset it (-1: none yet)
        self.blocks: dict[int, tuple[tuple[TaskSpec, ...], SpecBlock]] = {}  # id(specs) -> (specs, their block)

    def chain(self, *, name: str, stream: Stream, kind: TaskKind, duration_s: float, phase: Phase,
              category: str, layer: str = "", micro_batch: int = -1, alloc_bytes: float = 0.0,
              free_bytes: float = 0.0, resources: tuple[str, ...] = ()) -> int:
        """Append a chain task; returns its tid."""
        deps = (self.prev, *self.pending) if self.prev >= 0 else tuple(self.pending)
        self.pending = []
        tid = self.columns.append(name, self.stage, stream, kind, duration_s, deps, "", resources, alloc_bytes,
                                  free_bytes, phase, layer, micro_batch, self.stage, category, 0)
        self.prev = tid
        if self.step_first < 0:
            self.step_first = tid
        return tid

    def emit(self, spec: TaskSpec, micro_batch: int) -> int:
        """Append the chain task of `spec` for one micro-batch; returns its tid."""
        return self.chain(name=f"{spec.prefix}{micro_batch}{spec.suffix}", stream=spec.stream, kind=spec.kind,
                          duration_s=spec.duration_s, phase=spec.phase, category=spec.category, layer=spec.layer,
                          micro_batch=micro_batch, alloc_bytes=spec.alloc_bytes, free_bytes=spec.free_bytes,
                          resources=spec.resources)

    def emit_all(self, specs: tuple[TaskSpec, ...], micro_batch: int) -> int:
        """Append the chain tasks of `specs` for one micro-batch, in order, as `emit` would one by one; returns the
        tid of the last one on the compute stream (-1: none). The specs' columns are made once per specs tuple."""
        if not specs:
            return -1
        held = self.blocks.get(id(specs))
        if held is None or held[0] is not specs:
            held = self.blocks[id(specs)] = (specs, SpecBlock.of(specs))
        return self.emit_block(held[1], micro_batch)

    def emit_block(self, block: SpecBlock, micro_batch: int) -> int:
        """Append a block's chain tasks for one micro-batch; returns the tid of the last one on the compute stream
        (-1: none). NB: the hot path of compiling (each schedule step's tasks, for every micro-batch): one list
        extension per column, the chain's dependencies (tid - 1,) made by zip over a range."""
        c, stage = self.columns, self.stage
        n = len(block.stream)
        if not n:
            return -1
        tid = len(c)
        c.deps.append((self.prev, *self.pending) if self.prev >= 0 else tuple(self.pending))
        c.deps += zip(range(tid, tid + n - 1))
        self.pending = []
        c.name_later(block.affixes, block.blank, micro_batch)
        c.device += [stage] * n
        c.stream += block.stream
        c.kind += block.kind
        c.duration_s += block.duration_s
        c.sync_key += block.blank
        c.resources += block.resources
        c.alloc_bytes += block.alloc_bytes
        c.free_bytes += block.free_bytes
        c.phase += block.phase
        c.layer += block.layer
        c.micro_batch += [micro_batch] * n
        c.stage += [stage] * n
        c.category += block.category
        c.priority += block.zeros
        c.link_shares += block.no_shares
        self.prev = tid + n - 1
        if self.step_first < 0:
            self.step_first = tid
        return tid + block.last_compute if block.last_compute >= 0 else -1

    def emit_blocks(self, blocks: list[SpecBlock], micro_batches: list[int]) -> None:
        """Append several blocks' chain tasks, each for its micro-batch, in order: the graph emit_block would
        write one by one (each block's first task waits for the task before it, so the whole batch is one chain),
        with one extension per column for all of them (in C: no Python step per block and column). NB: step_first is
        left as it is: the caller records where each block's tasks are."""
        c, stage = self.columns, self.stage
        sizes = list(map(len, map(_STREAM, blocks)))
        total = sum(sizes)
        if not total:
            return
        tid = len(c)
        c.deps.append((self.prev, *self.pending) if self.prev >= 0 else tuple(self.pending))
        links = list(zip(range(tid, tid + total - 1)))
        c.deps += links
        self.pending = []
        firsts = list(accumulate(sizes, initial=tid))
        firsts.pop()
        c.name_blocks_later(firsts, list(map(_AFFIXES, blocks)), micro_batches, total)
        c.device += [stage] * total
        c.stage += [stage] * total
        c.sync_key += [""] * total
        c.priority += [0] * total
        c.link_shares += [()] * total
        held = tuple(blocks)
        c.blocks_later(held, list(micro_batches), sizes)  # phases, layers and micro-batches: when first read
        written: dict[str, list[object]] = {}
        for column, read in _BLOCK_COLUMNS:  # NB: += of each block's tuple, looped in C (reduce), copies it at once
            if column in _KEPT:
                values = written[column] = reduce(iadd, map(read, blocks), [])
                getattr(c, column).extend(values)
            else:
                reduce(iadd, map(read, blocks), getattr(c, column))
        # (the readers' shortcut: ir/template_runs.py)
        c.note_template_run(TemplateRun(tid, stage, held, links, written))
        self.prev = tid + total - 1

    def wait_for(self, *tids: int) -> None:
        """Make the next chain task also wait for these tasks."""
        self.pending.extend(tids)
