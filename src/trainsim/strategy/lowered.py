"""LoweredPlan: the per-layer placement a strategy lowers to, and the compiler consumes.

The plain ParallelSpec lowers to an even plan (default_plan); a StrategyTree lowers to any plan (uneven
stages, per-layer recompute). Layers are numbered in model order after expanding repeats: for a
transformer, 0 = embedding, 1..L = blocks, L + 1 = head.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from trainsim.ir.graph import Layer, OpGraph
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.megatron import Axis, axis_sizes, op_config
from trainsim.strategy.parallel import ParallelSpec, Recompute, Schedule
from trainsim.strategy.placement import OpConfig
from trainsim.strategy.stages import BLOCK_KINDS, virtual_stage_blocks


@dataclass(frozen=True, slots=True)
class LayerAssignment:
    index: int
    layer: Layer  # the OpGraph layer this instance repeats
    stage: int  # pipeline rank (device mesh) that runs it
    chunk: int  # model chunk (virtual stage) on that rank, 0 .. vpp-1
    recompute: Recompute

    def run_flops(self) -> float:
        """One micro-batch through the instance: forward, backward and its recompute."""
        return self.layer.flops("fwd") + self.layer.flops("bwd") + self.layer.recomputed_flops(self.recompute)


@dataclass(frozen=True, slots=True)
class OpSplit:
    """A computation config set on the ops of one module of one layer instance (Proteus Sec. IV-B): parts of
    the batch, sequence, output-feature and reduction dimensions over the stage's data-parallel ranks
    (compile.splits). 0: not set (inferred along data dependencies)."""

    layer: int  # expanded layer index
    module_path: str  # the Op.module_path of the ops it configures
    batch: int = 0
    seq: int = 0
    out: int = 0
    reduce: int = 0
    weight_out: int = 0  # the weight's memory config (split item "weight", dims out / reduce): stored in parts,
    weight_reduce: int = 0  # gathered to the computation config for compute (ZeRO-3 style)

    @property
    def has_compute(self) -> bool:
        return any((self.batch, self.seq, self.out, self.reduce))


@dataclass(frozen=True, slots=True)
class MeshSplit:
    """A computation config over a model-parallel axis (tp, cp, ep) on the ops of one module of one layer
    instance: a tree's split(..., "compute", ..., axis=...) (strategy.megatron derives its collectives)."""

    layer: int  # expanded layer index
    module_path: str  # the Op.module_path of the ops it configures
    axis: Axis  # tp | cp | ep
    config: OpConfig


@dataclass(frozen=True, slots=True)
class StageMesh:
    """A pipeline stage whose subtree maps to its own mesh (Proteus Sec. IV-B, map): its own tensor- and
    data-parallel degrees, and the micro-batch of each of its replicas (every stage runs the same micro-batches
    of the global batch). Its devices (tp x dp x cp) are the job's per stage, or its own count where the plan's
    stages differ in size (LoweredPlan.stage_ranks)."""

    stage: int
    tp: int
    dp: int
    micro_batch: int  # samples per replica and micro-batch: the job's micro_batch x the job's dp / dp

    def parallel_of(self, par: ParallelSpec) -> ParallelSpec:
        """The job's strategy as this stage runs it: its tp, dp and replicas' micro-batch (sp where its tp splits)."""
        return par.replaced(tp=self.tp, dp=self.dp, micro_batch=self.micro_batch, sp=par.sp and self.tp > 1)


@dataclass(frozen=True, slots=True)
class LoweredPlan:
    layers: tuple[LayerAssignment, ...]
    num_stages: int
    num_chunks: int  # virtual stages per rank (vpp)
    num_micro_batches: int
    schedule: Schedule | str  # a name of strategy.parallel.SCHEDULES
    max_in_flight: int = 0  # 0 = what the schedule implies
    # computation configs of a tree's split(..., "compute", ...), over the data-parallel ranks of the op's stage
    op_splits: tuple[OpSplit, ...] = ()
    # computation configs over tp, cp, ep (every op of every layer), each over its stage's mesh (its StageMesh's tp
    # where it has one)
    mesh_splits: tuple[MeshSplit, ...] = ()
    stage_meshes: tuple[StageMesh, ...] = ()  # stages whose mesh differs from the job's (compile.stage_meshes)
    # devices per stage, in stage order, where they differ between stages (each stage a contiguous block of ranks,
    # Alpa's submesh); (): every stage holds the job's tp x dp x cp
    stage_ranks: tuple[int, ...] = ()
    # layer indices where the chain of placements of the computation configs over dp starts again in the plain
    # batch split: a model chunk entered from a stage on another mesh (compile.stage_meshes); (): one chain
    chain_starts: frozenset[int] = frozenset()
    # the front-end that built the layers (ir.graph.OpGraph.frontend): a capturing front-end's layers are one
    # device's whole model, shaped over tp from mesh_splits by compile.shape_front_end
    frontend: str = "catalog"
    # a captured graph's layers once shaped (compile.shape_front_end): (layer index, k, parameters) of its matmuls
    # and norms whose tp config splits their tokens k ways (their gradient summed over those ranks too)
    front_end_token_params: tuple[tuple[int, int, float], ...] = ()
    # a captured graph's layer instances captured again at the micro-batch of a stage mesh whose replicas take
    # another one than the job's (compile.front_end_meshes): (micro-batch, the instances in plan order)
    captured: tuple[tuple[int, tuple[Layer, ...]], ...] = ()

    def tp_configs(self) -> dict[int, dict[str, OpConfig]]:
        """Per layer index, each op's computation config over tp (by op module path) from mesh_splits."""
        out: dict[int, dict[str, OpConfig]] = {}
        for s in self.mesh_splits:
            if s.axis == "tp":
                out.setdefault(s.layer, {})[s.module_path] = s.config
        return out

    def stage_block(self, stage: int) -> tuple[int, int]:
        """(first rank, ranks) of a stage's block where stage_ranks gives the stages' sizes."""
        return sum(self.stage_ranks[:stage]), self.stage_ranks[stage]


def expand_layers(graph: OpGraph) -> list[Layer]:
    """Repeats in model order. Dense and mixture-of-experts blocks (stored as two layers) are interleaved
    evenly, as `moe_every` places them: block i is an MoE block when floor((i+1)k/n) > floor(ik/n); a graph
    whose dense blocks lead (OpGraph.leading_dense_blocks) holds them first, then the MoE blocks."""
    out: list[Layer] = []
    dense = [layer for layer in graph.layers if layer.kind == "block"]
    moe = [layer for layer in graph.layers if layer.kind == "moe_block"]
    if graph.leading_dense_blocks:  # the graph's layers are in model order
        return [layer for layer in graph.layers for _ in range(layer.count)]
    for layer in graph.layers:
        if layer.kind == "moe_block" and dense:
            continue
        if layer.kind == "block" and moe:
            total, experts = layer.count + moe[0].count, moe[0].count
            out += [moe[0] if (i + 1) * experts // total > i * experts // total else layer for i in range(total)]
            continue
        out += [layer] * layer.count
    return out


def default_plan(graph: OpGraph, par: ParallelSpec) -> LoweredPlan:
    """Megatron-LM's placement: blocks split over pp x vpp chunks as the strategy says (strategy.stages
    virtual_stage_blocks: evenly by default), chunk c of rank r holds model chunk c * pp + r; the embedding goes
    on the first virtual stage, the head on the last."""
    layers = expand_layers(graph)
    blocks = [i for i, layer in enumerate(layers) if layer.kind in BLOCK_KINDS]
    chunks = par.pp * par.vpp
    per_vs = virtual_stage_blocks(len(blocks), par, allow_empty=True) if blocks else ()  # make_job checked
    block_vs = [vs for vs, count in enumerate(per_vs) for _ in range(count)]
    assignments: list[LayerAssignment] = []
    for index, layer in enumerate(layers):
        if blocks:
            position = index - blocks[0]
            global_chunk = 0 if position < 0 else chunks - 1 if position >= len(blocks) else block_vs[position]
        else:
            global_chunk = index * chunks // len(layers)
        assignments.append(LayerAssignment(index, layer, global_chunk % par.pp, global_chunk // par.pp,
                                           par.recompute))
    if graph.frontend != "catalog":  # no op of a captured graph is split unless a tree says so
        return LoweredPlan(tuple(assignments), par.pp, par.vpp, par.num_micro_batches, par.schedule,
                           frontend=graph.frontend)
    return LoweredPlan(tuple(assignments), par.pp, par.vpp, par.num_micro_batches, par.schedule,
                       mesh_splits=megatron_splits(layers, par))


def megatron_splits(layers: Sequence[Layer], par: ParallelSpec) -> tuple[MeshSplit, ...]:
    """Megatron's computation configs over tp, cp and ep (strategy.megatron.op_config) of every forward op of
    every layer instance, in layer, op and axis order: the plain strategy's model-parallel splits, from which the
    compiler derives the feature collectives. () where no axis splits the layers, or the graph has no
    transformer blocks (CNNs and DLRM split over dp only)."""
    if not any(layer.kind in BLOCK_KINDS for layer in layers) or par.tp * par.cp * par.ep == 1:
        return ()
    dev = DeviceSlice.of(par)
    per_layer: dict[int, list[tuple[str, Axis, OpConfig]]] = {}
    out: list[MeshSplit] = []
    for index, layer in enumerate(layers):
        items = per_layer.get(id(layer))
        if items is None:
            sizes = axis_sizes(layer.kind, dev)
            items = per_layer[id(layer)] = list(dict.fromkeys(
                (op.module_path, axis, op_config(axis, op, dev)) for op in layer.fwd for axis in sizes))
        out += [MeshSplit(index, path, axis, config) for path, axis, config in items]
    return tuple(out)


def stage_megatron_splits(layers: Sequence[Layer], pars: Sequence[ParallelSpec]) -> tuple[MeshSplit, ...]:
    """megatron_splits with each layer instance's configs over its own stage's strategy (pars[i]: the job's, or
    its stage mesh's: StageMesh.parallel_of), in layer order (a layer's own in megatron_splits' order)."""
    per_par: dict[int, tuple[MeshSplit, ...]] = {}
    for par in pars:
        if id(par) not in per_par:
            per_par[id(par)] = megatron_splits(layers, par)
    mine = (s for key, splits in per_par.items() for s in splits if id(pars[s.layer]) == key)
    return tuple(sorted(mine, key=lambda s: s.layer))
