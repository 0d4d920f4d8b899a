"""StrategyTree: the model's module hierarchy with a parallel configuration on its nodes (Proteus, Sec. IV).

Root = the model. Below it the layers of the expanded layer list (embedding, blocks.0 .. blocks.L-1, head for a
transformer; the CNN and DLRM blocks otherwise), grouped by their dotted names ("blocks" holds every block);
below each layer its modules ("blocks.3.attn") and, as leaves, the forward and backward ops grouped by module
path ("blocks.3.attn.qkv"). Four primitives program it, each returning a new tree (trees are immutable):
split (partition), map (device mesh: pipeline stage, model chunk, axis sizes), schedule and recompute.

Propagation (Proteus Sec. VII): a node takes its parent's settings unless it sets its own; then, along the
layer chain's data dependencies, a layer with no mesh takes the previous layer's (layers before the first
mapped one take the first mapped one's). Setting one node twice to different values is a ConfigError.

lower() turns the tree into the LoweredPlan of compile.plan (stage, chunk and recompute per layer, one
schedule). The splits the plain strategy implies (from_parallel: tp, sp, cp, ep, dp, ZeRO) are what the
DeviceSlice the graph was built with applied already; their computation configs over tp, cp and ep (Megatron's,
strategy.megatron) go into the plan as MeshSplits, from which the compiler derives the feature collectives. A tree
may give any op of a block's attention or MLP or the head's projection or cross-entropy a config of its own over
tp (batch, seq, out, reduce parts dividing tp; none: whole on each tp rank), the embedding's lookup Megatron's
split over fewer ranks or none: the compiler then rebuilds that layer with the op at its config and reshards
between the ops' configs (compile.shape_layers).
An MoE's experts may take Megatron's split over fewer tp ranks, or none (strategy.megatron).
Computation configs over dp (item "compute": batch, seq, out, reduce) go into the plan as OpSplits, which
compile.splits applies with the resharding they need.
A stage mapped to its own mesh (map tp / dp on its layers: StageMesh) reads both against its own mesh: its ops'
configs over tp against its tp, its configs over dp carved from its dp ranks (compile.stage_meshes).
"""

import fnmatch
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, cast

from pydantic import Field, model_validator

from trainsim.errors import ConfigError
from trainsim.ir.graph import Layer, Op, OpGraph
from trainsim.specbase import Spec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.front_end_splits import config_text, front_end_mesh_splits
from trainsim.strategy.lowered import (
    LayerAssignment,
    LoweredPlan,
    MeshSplit,
    OpSplit,
    StageMesh,
    default_plan,
    expand_layers,
    megatron_splits,
    stage_megatron_splits,
)
from trainsim.strategy.megatron import (
    UNSPLIT,
    Axis,
    TpConfigs,
    axis_sizes,
    dispatch_problem,
    op_config,
    own_configs,
    replicable_module,
    tp_config_problem,
)
from trainsim.strategy.parallel import RECOMPUTES, ParallelSpec, Recompute, Schedule
from trainsim.strategy.placement import OpConfig

SplitItem = Literal["weight", "activation", "gradient", "optimizer", "compute"]
SplitDim = Literal["batch", "seq", "hidden", "heads", "ffn", "vocab", "experts", "flat", "out", "reduce"]
SplitAxis = Literal["dp", "tp", "cp", "ep"]
# the computation config of an op (Proteus Sec. II-A: b, s, o, h): item "compute" with these dims
COMPUTE_DIMS = ("batch", "seq", "out", "reduce")
NodeKind = Literal["model", "group", "layer", "module"]
How = Literal["set", "inherited", "data-dep", "default"]
Value = int | str
Settings = Mapping[str, Mapping[str, Value]]  # node path -> setting key -> value

MESH_KEYS = ("stage", "chunk", "tp", "dp", "cp", "ep")
SCHEDULE_KEYS = ("micro_batches", "max_in_flight", "kind")
_AXES = ("tp", "dp", "cp", "ep")
_BLOCK_KINDS = ("block", "moe_block")
_RANGE = re.compile(r"(\d+)-(\d+)")
_MARK: dict[How, str] = {"set": "", "inherited": "^", "data-dep": "<", "default": ""}


class Split(Spec):
    """Partition `item` of a node's ops along tensor dimension `dim` into `parts` (flat: ZeRO's flat buffer).
    axis: the mesh axis whose devices a computation config's parts are (dp: carved from the stage's
    data-parallel ranks, compile.splits; tp, cp, ep: the model-parallel groups, strategy.megatron)."""

    item: SplitItem
    dim: SplitDim
    parts: int = Field(gt=0, strict=True)
    axis: SplitAxis = "dp"

    @model_validator(mode="after")
    def _axis_takes_compute(self) -> "Split":
        if self.axis != "dp" and (self.item != "compute" or self.dim not in COMPUTE_DIMS):
            raise ValueError(f"axis {self.axis} takes a computation config (item compute, dim "
                             f"{' | '.join(COMPUTE_DIMS)}), not {self.item} {self.dim}")
        return self

    @property
    def key(self) -> str:
        return f"split.{self.item}.{self.dim}" + (f"@{self.axis}" if self.axis != "dp" else "")

    @classmethod
    def of_key(cls, key: str, parts: Value) -> "Split":
        """The split a settings key (split.<item>.<dim>[@<axis>]) holds."""
        _, item, dim = key.split(".")
        dim, _, axis = dim.partition("@")
        return cls.model_validate({"item": item, "dim": dim, "parts": parts, "axis": axis or "dp"})


class Mesh(Spec):
    """Where a subtree runs: pipeline stage, model chunk of an interleaved schedule, and the device group's
    shape there. Unset fields are inherited."""

    stage: int | None = Field(default=None, ge=0, strict=True)
    chunk: int | None = Field(default=None, ge=0, strict=True)
    tp: int | None = Field(default=None, gt=0, strict=True)
    dp: int | None = Field(default=None, gt=0, strict=True)
    cp: int | None = Field(default=None, gt=0, strict=True)
    ep: int | None = Field(default=None, gt=0, strict=True)


class ScheduleConfig(Spec):
    """Proteus' schedule config: micro-batches, the most forward micro-batches ahead of their backward, kind."""

    micro_batches: int | None = Field(default=None, gt=0, strict=True)
    max_in_flight: int | None = Field(default=None, gt=0, strict=True)
    kind: Schedule | None = None


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One node. layer_index: the expanded-layer index of the layer this node is or lies in (-1 above layers).
    fwd/bwd: the ops whose module path is this node (leaves)."""

    path: str  # "" for the root
    kind: NodeKind
    children: tuple[str, ...] = ()
    layer_index: int = -1
    fwd: tuple[Op, ...] = ()
    bwd: tuple[Op, ...] = ()

    @property
    def parent(self) -> str | None:
        return None if not self.path else self.path.rpartition(".")[0]

    @property
    def label(self) -> str:
        return self.path or "<model>"


@dataclass(frozen=True, slots=True)
class Sourced:
    """An effective setting and where it came from: the node that set it, and how it reached this node."""

    value: Value
    origin: str
    how: How

    def passed_down(self) -> "Sourced":
        return Sourced(self.value, self.origin, "inherited") if self.how == "set" else self


@dataclass(frozen=True, eq=False, repr=False)
class StrategyTree:
    """The module tree of one OpGraph plus the settings its nodes set explicitly. Build with from_graph or
    from_parallel; program with split/map/schedule/recompute; lower() gives the compiler's LoweredPlan."""

    graph: OpGraph
    nodes: Mapping[str, TreeNode]
    layer_paths: tuple[str, ...]  # expanded layer index -> node path
    explicit: Settings = field(default_factory=dict)
    _resolved: Mapping[str, Mapping[str, Sourced]] = field(init=False)

    def __post_init__(self) -> None:
        frozen = {path: MappingProxyType(dict(row)) for path, row in self.explicit.items() if row}
        object.__setattr__(self, "explicit", MappingProxyType(frozen))
        object.__setattr__(self, "_resolved", _resolve(self.nodes, self.layer_paths, frozen))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StrategyTree):
            return NotImplemented
        mine = {path: dict(row) for path, row in self.explicit.items()}
        theirs = {path: dict(row) for path, row in other.explicit.items()}
        return (self.graph is other.graph or self.graph == other.graph) and mine == theirs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"StrategyTree({self.graph.model_name!r}: {len(self.layer_paths)} layers, {len(self.nodes)} nodes, "
                f"{len(self.explicit)} nodes set)")

    # --- construction ---

    @classmethod
    def from_graph(cls, graph: OpGraph) -> "StrategyTree":
        """The bare tree of a graph: no settings (lowering then follows the ParallelSpec given to lower)."""
        nodes, layer_paths = _build_nodes(graph)
        return cls(graph, nodes, layer_paths)

    @classmethod
    def from_parallel(cls, graph: OpGraph, par: ParallelSpec) -> "StrategyTree":
        """The plain strategy as a tree: the root holds the mesh shape, schedule, recompute and the dp/cp/sp/ZeRO
        splits; the first layer of each model chunk holds its stage (the rest follow along data dependencies,
        placed as default_plan places them); attention, MLP, expert and vocabulary nodes hold the tp/ep weight
        splits, and a transformer's op nodes their computation configs over tp, cp and ep (Megatron's,
        strategy.megatron), from which the compiler derives the feature collectives."""
        _require_dp(par, "building a strategy tree from it")
        bare = cls.from_graph(graph)
        explicit: dict[str, dict[str, Value]] = {"": _root_settings(par)}
        previous: tuple[int, int] | None = None
        for assignment, path in zip(default_plan(graph, par).layers, bare.layer_paths, strict=True):
            if (assignment.stage, assignment.chunk) != previous:
                previous = (assignment.stage, assignment.chunk)
                explicit[path] = {"stage": assignment.stage}
                if par.vpp > 1:
                    explicit[path]["chunk"] = assignment.chunk
        transformer = any(layer.kind in _BLOCK_KINDS for layer in graph.layers)
        dev = DeviceSlice.of(par)
        for layer, path in zip(expand_layers(graph), bare.layer_paths, strict=True):
            splits = _model_parallel_splits(bare.nodes, path, layer, par, transformer)
            splits += _megatron_splits(bare.nodes, path, layer, dev) if transformer else []
            for node_path, split in splits:
                explicit.setdefault(node_path, {})[split.key] = split.parts
        return cls(graph, bare.nodes, bare.layer_paths, explicit)

    # --- addressing ---

    def node(self, path: str) -> TreeNode:
        if path not in self.nodes:
            raise ConfigError("path", path, f"no such node ({self._children_hint(path.rpartition('.')[0])})")
        return self.nodes[path]

    def match(self, pattern: str, *, where: str = "path") -> tuple[str, ...]:
        """Node paths a pattern names, in tree order. Segments are names, fnmatch globs ("*", "Mixed_6?") or
        inclusive integer ranges ("0-15", every index must exist); "" is the root."""
        if pattern == "":
            return ("",)
        current = [""]
        for segment in pattern.split("."):
            found = [path for parent in current for path in self._match_segment(parent, segment, pattern, where)]
            if not found:
                raise ConfigError(where, pattern, f"matches no node ({self._children_hint(current[0])})")
            current = found
        return tuple(current)

    def preorder(self, path: str = "") -> Iterator[str]:
        """Node paths in tree order (a node before its children, children in model order)."""
        stack = [path]
        while stack:
            top = stack.pop()
            yield top
            stack.extend(reversed(self.nodes[top].children))

    def effective(self, path: str) -> Mapping[str, Sourced]:
        """The node's settings after propagation. Keys: stage chunk tp dp cp ep, micro_batches max_in_flight
        kind, recompute, split.<item>.<dim>; a key that is absent is unspecified."""
        return MappingProxyType(dict(self._resolved[self.node(path).path]))

    def splits(self, path: str) -> tuple[Split, ...]:
        """The effective partitions of a node (its own and its ancestors'), for the execution-graph compiler."""
        return tuple(Split.of_key(key, value.value) for key, value in sorted(self.effective(path).items())
                     if key.startswith("split."))

    # --- primitives ---

    def split(self, path: str, item: str, dim: str, parts: int, *, axis: str = "dp", override: bool = False,
              where: str = "split") -> "StrategyTree":
        """Partition item (weight | activation | gradient | optimizer | compute) of every op under path along
        dim; a computation config's parts over the mesh axis `axis` (dp, or tp / cp / ep: Megatron's splits)."""
        spec = Split.parse({"item": item, "dim": dim, "parts": parts, "axis": axis}, where)
        return self._assign(self.match(path, where=f"{where}.path"), {spec.key: spec.parts}, where, override)

    def map(self, path: str, mesh: Mesh | Mapping[str, object], *, override: bool = False,
            where: str = "map") -> "StrategyTree":
        """Place a subtree on a device mesh, e.g. {"stage": 1} or {"stage": 1, "tp": 2, "dp": 4}."""
        spec = mesh if isinstance(mesh, Mesh) else Mesh.parse(dict(mesh), where)
        values: dict[str, Value] = {key: value for key in MESH_KEYS if (value := getattr(spec, key)) is not None}
        if not values:
            given = spec.model_dump(exclude_none=True)
            raise ConfigError(where, given, "give at least one of: " + ", ".join(MESH_KEYS))
        paths = self.match(path, where=f"{where}.path")
        if "stage" in values or "chunk" in values:
            self._reject_inside_layers(paths, where, "stage and chunk place whole layers")
        return self._assign(paths, values, where, override)

    def schedule(self, path: str, micro_batches: int | None = None, max_in_flight: int | None = None,
                 kind: str | None = None, *, override: bool = False, where: str = "schedule") -> "StrategyTree":
        """Set the pipeline schedule of a subtree: micro-batches, max in-flight micro-batches, kind
        (a name of strategy.parallel.SCHEDULES)."""
        given = {"micro_batches": micro_batches, "max_in_flight": max_in_flight, "kind": kind}
        spec = ScheduleConfig.parse({key: value for key, value in given.items() if value is not None}, where)
        values: dict[str, Value] = {key: value for key in SCHEDULE_KEYS if (value := getattr(spec, key)) is not None}
        if not values:
            raise ConfigError(where, path, "give at least one of: " + ", ".join(SCHEDULE_KEYS))
        paths = self.match(path, where=f"{where}.path")
        self._reject_inside_layers(paths, where, "a schedule applies to the model, a group or a layer")
        return self._assign(paths, values, where, override)

    def recompute(self, path: str, mode: str, *, override: bool = False,
                  where: str = "recompute") -> "StrategyTree":
        """Activation recomputation of a subtree: none | selective | full."""
        if mode not in RECOMPUTES:
            raise ConfigError(f"{where}.mode", mode, "choose one of: " + ", ".join(RECOMPUTES))
        return self._assign(self.match(path, where=f"{where}.path"), {"recompute": mode}, where, override)

    # --- lowering ---

    def lower(self, par: ParallelSpec, *, num_gpus: int | None = None) -> LoweredPlan:
        """The LoweredPlan the compiler consumes. What the tree leaves unspecified comes from par (schedule
        kind, micro-batches, recompute); stage and chunk default to 0. Computation splits become the plan's
        op_splits (see the module doc). Raises ConfigError where the plan cannot hold the tree: two schedules,
        recompute that differs inside a layer, a mesh shape other than the job's, stages past pp or against model
        order, stage device counts that do not sum to the job's GPUs. num_gpus: the job's GPUs where they are
        not par's pp stages of tp x dp x cp (a job made with make_job(..., num_gpus=...) for a plan whose stages
        have their own device counts, as the stage planner's re-check makes it); default tp x dp x cp x pp."""
        self._check_recompute_inside_layers()
        kind, micro_batches, max_in_flight = self._one_schedule(par)
        if par.vpp > 1 and kind != "interleaved-1f1b":
            raise ConfigError("schedule.kind", kind, f"vpp={par.vpp} needs interleaved-1f1b")
        if kind == "interleaved-1f1b" and par.pp == 1:
            raise ConfigError("schedule.kind", kind, "interleaved-1f1b needs pp > 1")
        assignments: list[LayerAssignment] = []
        last = (0, "")
        for index, (layer, path) in enumerate(zip(expand_layers(self.graph), self.layer_paths, strict=True)):
            row = self._resolved[path]
            stage, chunk = _int(row, "stage"), _int(row, "chunk")
            if stage >= par.pp:
                raise ConfigError("map.stage", stage, f"{_whose(path, row, 'stage')} is past the last stage: "
                                  f"pp={par.pp} allows 0-{par.pp - 1}")
            if chunk >= par.vpp:
                raise ConfigError("map.chunk", chunk, f"{_whose(path, row, 'chunk')} is past the last chunk: "
                                  f"vpp={par.vpp} allows 0-{par.vpp - 1}")
            position = chunk * par.pp + stage  # the virtual stage activations flow through, in model order
            if position < last[0]:
                raise ConfigError("map.stage", stage, f"{path} (chunk {chunk}) comes after {last[1]} in the model "
                                  "but before it in the pipeline; stages must follow model order")
            last = (position, path)
            recompute = cast(Recompute, row["recompute"].value) if "recompute" in row else par.recompute
            assignments.append(LayerAssignment(index, layer, stage, chunk, recompute))
        meshes, stage_ranks = self._stage_meshes(par, assignments, num_gpus or par.num_gpus)
        return LoweredPlan(tuple(assignments), par.pp, par.vpp, micro_batches, kind, max_in_flight,
                           self._op_splits(), self._mesh_splits(par, _layer_parallels(par, assignments, meshes)),
                           meshes, stage_ranks, frontend=self.graph.frontend)

    def _op_splits(self) -> tuple[OpSplit, ...]:
        """The computation configs (split item "compute") and weight memory configs (item "weight", dims out and
        reduce) of every module node that holds ops."""
        out: list[OpSplit] = []
        for path, node in self.nodes.items():
            if not node.fwd or node.layer_index < 0:
                continue
            row = self._resolved[path]
            parts = {dim: int(row[f"split.compute.{dim}"].value) for dim in COMPUTE_DIMS
                     if f"split.compute.{dim}" in row}
            bad = [(dim, f"split.compute.{dim}") for dim in ("hidden", "heads", "ffn", "vocab", "experts", "flat")
                   if f"split.compute.{dim}" in row]
            if bad:
                raise ConfigError(f"{path}.{bad[0][1]}", row[bad[0][1]].value,
                                  "a computation config splits " + ", ".join(COMPUTE_DIMS))
            memory = {f"weight_{dim}": int(row[f"split.weight.{dim}"].value) for dim in ("out", "reduce")
                      if f"split.weight.{dim}" in row}
            if parts or memory:
                for module_path in dict.fromkeys(op.module_path for op in node.fwd):
                    out.append(OpSplit(node.layer_index, module_path, **parts, **memory))
        return tuple(out)

    def _mesh_splits(self, par: ParallelSpec, pars: list[ParallelSpec]) -> tuple[MeshSplit, ...]:
        """The computation configs over tp, cp and ep of every op, each over its own stage's mesh (pars: per
        layer instance, the job's strategy or its stage mesh's): Megatron's (lowered.megatron_splits) where the
        tree sets none over an axis. An axis the tree splits must be split as Megatron does on every op, except
        that any op of a block's attention or MLP, a block's norms and residual adds, an MoE's router, the lookup,
        the positions, the head's norm, the logits or the cross-entropy may take a config of its own over its
        stage's tp (strategy.megatron.own_configs; the compiler shapes the ops from these configs and reshards
        between them, compile.shape_layers): ConfigError naming the first op that differs."""
        notes = [_stage_note(p, par) for p in pars]  # per layer instance, what an error adds about its mesh
        if self.graph.frontend != "catalog":  # a captured graph: the tree's configs only (strategy.front_end_splits)
            return front_end_mesh_splits(self.nodes, self._resolved, [p.tp for p in pars], self.graph.frontend, notes)
        layers = expand_layers(self.graph)
        given_axes = {key.partition("@")[2] for row in self.explicit.values() for key in row if "@" in key}
        if not given_axes:
            return megatron_splits(layers, par) if all(p is par for p in pars) else stage_megatron_splits(layers, pars)
        if not any(layer.kind in _BLOCK_KINDS for layer in layers):
            raise ConfigError("split.axis", "tp | cp | ep", "model-parallel computation configs apply to "
                              "transformers; split a CNN's or DLRM's ops over dp")
        slices = {id(p): DeviceSlice.of(p) for p in pars}
        devs = [slices[id(p)] for p in pars]  # per layer instance, its stage's device slice
        given: dict[tuple[int, str, Axis], OpConfig] = {}  # (layer index, op module path, axis) -> the tree's
        op_nodes: list[tuple[str, TreeNode, dict[Axis, int]]] = []
        for path, node in self.nodes.items():
            if not node.fwd or node.layer_index < 0:
                continue
            row, dev = self._resolved[path], devs[node.layer_index]
            sizes = axis_sizes(layers[node.layer_index].kind, dev)
            for key in row:
                if "@" in key and key.partition("@")[2] not in sizes:
                    raise ConfigError(f"{path}.{key}", row[key].value, f"{key.partition('@')[2]} does not split "
                                      f"this layer (tp={dev.tp} cp={dev.cp} ep={dev.ep}{notes[node.layer_index]}"
                                      "; ep splits MoE blocks)")
            for op in node.fwd:
                for axis in sizes:
                    given[(node.layer_index, op.module_path, axis)] = OpConfig(*(
                        int(row[key].value) if (key := f"split.compute.{dim}@{axis}") in row else 1
                        for dim in COMPUTE_DIMS))
            op_nodes.append((path, node, sizes))
        own_of = self._own_configs(layers, devs, given) if "tp" in given_axes else {}
        out: list[MeshSplit] = []
        for path, node, sizes in op_nodes:
            own, dev = own_of.get(node.layer_index, frozenset()), devs[node.layer_index]
            for op in node.fwd:
                for axis in sizes:
                    expected = op_config(axis, op, dev, own)
                    config = given[(node.layer_index, op.module_path, axis)]
                    if axis in given_axes and config != expected:
                        raise ConfigError(f"{path} split.compute@{axis}", config_text(config),
                                          _mismatch(op, axis, sizes[axis], dev, config, expected, path)
                                          + notes[node.layer_index])
                    out.append(MeshSplit(node.layer_index, op.module_path, axis, expected))
        return tuple(dict.fromkeys(out))

    def _own_configs(self, layers: list[Layer], devs: list[DeviceSlice],
                     given: Mapping[tuple[int, str, Axis], OpConfig]) -> dict[int, TpConfigs]:
        """Per layer index, the replicable ops (strategy.megatron.replicable_module) the tree gives a config of
        their own over its stage's tp, with those configs."""
        out: dict[int, TpConfigs] = {}
        for index, layer in enumerate(layers):
            if devs[index].tp == 1:
                continue
            own = own_configs(layer.fwd, devs[index],
                              lambda op, i=index: given.get((i, op.module_path, "tp"), UNSPLIT))
            if own:
                _check_experts_alike(layer, devs[index], own, self.layer_paths[index])
                if problem := dispatch_problem(layer.fwd, devs[index], own):
                    router = dict(own).get("router", UNSPLIT)
                    raise ConfigError(f"{self.layer_paths[index]}.moe.router split.compute@tp",
                                      config_text(router), problem)
                out[index] = own
        return out

    # --- printing ---

    def pretty(self, max_depth: int | None = None, verbose: bool = False) -> str:
        """The tree with effective settings: the root and the layers show all of theirs, groups and the nodes
        inside a layer only what they set (verbose: all). Marks: ^ inherited from an ancestor, < along data deps."""
        lines = [f"StrategyTree {self.graph.model_name}: {len(self.layer_paths)} layers, {len(self.nodes)} nodes "
                 "(^ inherited from an ancestor, < propagated along data dependencies)"]
        kinds = [layer.kind for layer in expand_layers(self.graph)]
        for path in self.preorder():
            depth = 0 if not path else path.count(".") + 1
            if max_depth is None or depth <= max_depth:
                lines.append("  " * depth + self._describe(self.nodes[path], kinds, verbose))
        return "\n".join(lines)

    # --- internals ---

    def _describe(self, node: TreeNode, kinds: list[str], verbose: bool) -> str:
        text = node.label
        if node.kind == "layer":
            text += f" [layer {node.layer_index}: {kinds[node.layer_index]}]"
        if node.fwd or node.bwd:
            text += f" ({len(node.fwd)} fwd + {len(node.bwd)} bwd ops)"
        show_all = verbose or node.kind in ("model", "layer")
        shown = []
        for key in sorted(self._resolved[node.path], key=_key_order):
            value = self._resolved[node.path][key]
            quiet_chunk = key == "chunk" and value.value == 0 and value.how != "set"
            if (show_all or value.how == "set") and not quiet_chunk:
                shown.append(f"{key}={value.value}{_MARK[value.how]}")
        return text + ("  " + " ".join(shown) if shown else "")

    def _assign(self, paths: tuple[str, ...], values: Mapping[str, Value], where: str,
                override: bool) -> "StrategyTree":
        explicit = {path: dict(row) for path, row in self.explicit.items()}
        for path in paths:
            row = explicit.setdefault(path, {})
            for key, value in values.items():
                old = row.get(key)
                if old is not None and old != value and not override:
                    name = "parts" if key.startswith("split.") else "mode" if key == "recompute" else key
                    raise ConfigError(f"{where}.{name}", value, f"{self.nodes[path].label} already has {key}={old!r}; "
                                      "set the default on an ancestor and the exception on the node, or override")
                row[key] = value
        return StrategyTree(self.graph, self.nodes, self.layer_paths, explicit)

    def _match_segment(self, parent: str, segment: str, pattern: str, where: str) -> list[str]:
        if bounds := _RANGE.fullmatch(segment):
            low, high = (int(bound) if len(bound) <= 12 else 10**12 for bound in (bounds[1], bounds[2]))
            if low > high:
                raise ConfigError(where, pattern, f"range {segment} runs backwards; write {high}-{low}")
            # NB: at most children + 1 indices are looked at, so a range such as 0-999999999 builds no huge list
            paths = [_join(parent, str(number))
                     for number in range(low, min(high, low + len(self.nodes[parent].children)) + 1)]
            for path in paths:
                if path not in self.nodes:
                    raise ConfigError(where, pattern, f"{path} does not exist ({self._children_hint(parent)})")
            return paths
        if any(char in segment for char in "*?["):
            return [child for child in self.nodes[parent].children
                    if fnmatch.fnmatchcase(child.rpartition(".")[2], segment)]
        path = _join(parent, segment)
        return [path] if path in self.nodes else []

    def _children_hint(self, parent: str) -> str:
        node = self.nodes.get(parent)
        if node is None:
            return "top level: " + _summarize(self.nodes[""].children)
        return f"{node.label} holds: {_summarize(node.children) or 'nothing'}"

    def _reject_inside_layers(self, paths: tuple[str, ...], where: str, why: str) -> None:
        for path in paths:
            if self.nodes[path].kind == "module":
                layer = self.layer_paths[self.nodes[path].layer_index]
                raise ConfigError(f"{where}.path", path, f"{why}: set it on {layer} or an ancestor, not inside a layer")

    def _stage_meshes(self, par: ParallelSpec, assignments: list[LayerAssignment], num_gpus: int
                      ) -> tuple[tuple[StageMesh, ...], tuple[int, ...]]:
        """The stages whose layers map to a mesh of their own (Proteus Sec. IV-B), and the devices of every stage
        where they differ (() where each holds the job's tp x dp x cp). The layers of one stage share its mesh, in
        every model chunk it holds under interleaved 1F1B (its devices run them all); cp and ep are the job's.
        Raises ConfigError where a stage's mesh cannot hold the job's stage, or the stages' devices do not sum to
        the job's GPUs."""
        per_stage: dict[int, tuple[int, int, str]] = {}
        chunks: dict[int, int] = {}  # stage -> the chunk of its first layer (interleaved 1F1B: vpp chunks per stage)
        foreign = {key: self._from_other_stages(assignments, key) for key in ("tp", "dp")}
        for a, path in zip(assignments, self.layer_paths, strict=True):
            row = self._resolved[path]
            if a.index in foreign["dp"]:  # a dp that reached this stage along data dependencies does not size it
                row = {key: value for key, value in row.items() if key != "dp"}
            for axis in ("cp", "ep"):
                if axis in row and row[axis].value != getattr(par, axis):
                    raise ConfigError(f"map.{axis}", row[axis].value, f"{_whose(path, row, axis)} asks {axis}="
                                      f"{row[axis].value} but the job runs {axis}={getattr(par, axis)}; a stage's "
                                      "own mesh changes tp and dp only")
            if "tp" not in row and "dp" not in row:
                tp, dp = par.tp, par.dp
            else:
                _require_dp(par, "mapping a subtree to its own mesh")
                tp, dp = self._mesh_of(par, path, row, a.index not in foreign["tp"])
            seen = per_stage.setdefault(a.stage, (tp, dp, path))
            if seen[:2] != (tp, dp):
                _refuse_two_meshes(a, (tp, dp, path), seen, chunks[a.stage])
            chunks.setdefault(a.stage, a.chunk)
        stage_ranks = self._stage_ranks(par, per_stage, num_gpus)
        out: list[StageMesh] = []
        for stage, (tp, dp, path) in sorted(per_stage.items()):
            if (tp, dp) == (par.tp, par.dp):
                continue
            if (par.micro_batch * par.dp) % dp:
                raise ConfigError("map.dp", dp, f"{path}: the job's micro-batch x dp = {par.micro_batch} x "
                                  f"{par.dp} samples must split evenly over dp={dp} replicas")
            out.append(StageMesh(stage, tp, dp, par.micro_batch * par.dp // dp))
        return tuple(out), stage_ranks

    def _from_other_stages(self, assignments: list[LayerAssignment], key: str) -> set[int]:
        """The layers whose `key` (tp, dp) came along data dependencies from a layer on another stage (the layers
        before the first mapped one take its value): such a dp does not size the stage (a stage's own device count
        stays on it), and such a tp does not re-split the stage's dp."""
        rows = [self._resolved[path] for path in self.layer_paths]
        own = [i for i, row in enumerate(rows) if key in row and row[key].how != "data-dep"]
        out: set[int] = set()
        for i, row in enumerate(rows):
            if key in row and row[key].how == "data-dep" and own:
                source = max((j for j in own if j < i), default=None)
                source = min(j for j in own if j > i) if source is None else source
                if assignments[source].stage != assignments[i].stage:
                    out.add(i)
        return out

    @staticmethod
    def _stage_ranks(par: ParallelSpec, per_stage: Mapping[int, tuple[int, int, str]],
                     job_gpus: int) -> tuple[int, ...]:
        """Devices per stage (tp x dp x cp; a stage without layers: the job's), () where all are the job's. They
        must sum to the job's GPUs: ConfigError naming the first stage that differs from the job's."""
        devices = par.tp * par.dp * par.cp
        ranks = tuple(per_stage[s][0] * per_stage[s][1] * par.cp if s in per_stage else devices
                      for s in range(par.pp))
        total = sum(ranks)
        if all(count == devices for count in ranks) and total == job_gpus:
            return ()
        if total != job_gpus and all(count == devices for count in ranks):
            raise ConfigError("dp", par.dp, f"the {par.pp} stages hold the job's tp x dp x cp = {par.tp} x {par.dp} x "
                              f"{par.cp} devices each, {total} of its {job_gpus} GPUs; map stages to device counts of "
                              f"their own (dp) that sum to {job_gpus}, or give a dp that fills the GPUs")
        if total != job_gpus:
            stage = next(s for s, count in enumerate(ranks) if count != devices)
            tp, dp, path = per_stage[stage]
            raise ConfigError("map.dp", dp, f"{path}: stage {stage} on tp x dp x cp = {tp} x {dp} x {par.cp} = "
                              f"{ranks[stage]} devices, and the stages' devices {' + '.join(map(str, ranks))} = "
                              f"{total} must sum to the job's {job_gpus} GPUs; a stage mapped by tp alone, or not "
                              f"mapped, must be the job's {devices} devices per stage (tp x dp x cp = {par.tp} x "
                              f"{par.dp} x {par.cp})")
        return ranks

    @staticmethod
    def _mesh_of(par: ParallelSpec, path: str, row: Mapping[str, Sourced], tp_own: bool) -> tuple[int, int]:
        """A layer's (tp, dp): tp as set (else the job's); dp as set, unless tp was set on its stage below the
        node that set dp (the stage then splits its devices anew: dp is what the job's devices per stage, tp x dp x
        cp, leave). A dp as set may give the stage its own device count (_stage_ranks checks the sum). tp_own:
        the tp was not taken along data dependencies from another stage."""
        devices = par.tp * par.dp * par.cp
        tp = int(row["tp"].value) if "tp" in row else par.tp
        given = row.get("dp")
        if given is not None and not (tp_own and "tp" in row and _below(row["tp"].origin, given.origin)):
            return tp, int(given.value)
        if devices % (tp * par.cp):
            raise ConfigError("map.tp", tp, f"{_whose(path, row, 'tp')}: tp x cp = {tp} x {par.cp} must divide the "
                              f"job's {devices} devices per stage (tp x dp x cp)")
        return tp, devices // (tp * par.cp)

    def _check_recompute_inside_layers(self) -> None:
        for path, row in self.explicit.items():
            node = self.nodes[path]
            if node.kind == "module" and "recompute" in row:
                layer = self.layer_paths[node.layer_index]
                mode = self._resolved[layer].get("recompute")
                if mode is None or mode.value != row["recompute"]:
                    shown = "unset" if mode is None else mode.value
                    raise ConfigError("recompute.mode", row["recompute"], f"{path} differs from its layer {layer} "
                                      f"({shown}); an LoweredPlan recomputes per layer")

    def _one_schedule(self, par: ParallelSpec) -> tuple[str, int, int]:
        """The schedule every layer runs (an LoweredPlan has one), with par filling what the tree leaves open."""
        seen: dict[tuple[Value | None, ...], str] = {}
        for path in self.layer_paths:
            row = self._resolved[path]
            seen.setdefault(tuple(row[key].value if key in row else None for key in SCHEDULE_KEYS), path)
        if len(seen) > 1:
            (first, first_path), (other, other_path) = list(seen.items())[:2]
            raise ConfigError("schedule", other_path, f"{other_path} runs {_schedule_text(other)} but {first_path} "
                              f"runs {_schedule_text(first)}; an LoweredPlan runs one schedule: set it on the root")
        micro_batches, max_in_flight, kind = next(iter(seen))
        if micro_batches is None:
            _require_dp(par, "lowering (the micro-batch count depends on it)")
            micro_batches = par.num_micro_batches
        return str(kind or par.schedule), int(micro_batches), int(max_in_flight or 0)


# --- building the node tree ---


@dataclass(slots=True)
class _Draft:
    kind: NodeKind
    layer_index: int = -1
    children: list[str] = field(default_factory=list)
    fwd: list[Op] = field(default_factory=list)
    bwd: list[Op] = field(default_factory=list)


def _build_nodes(graph: OpGraph) -> tuple[dict[str, TreeNode], tuple[str, ...]]:
    drafts: dict[str, _Draft] = {"": _Draft("model")}
    layer_paths: list[str] = []
    for layer, names in zip(graph.layers, _instance_names(graph), strict=True):
        prefixes = _op_prefixes(layer, names[0])
        for name in names:
            index = len(layer_paths)
            _ensure(drafts, name, "layer", index)
            for op in layer.fwd + layer.bwd:
                relative = _relative(op.module_path, prefixes)
                draft = _ensure(drafts, _join(name, relative) if relative else name, "module", index)
                (draft.fwd if op.phase == "fwd" else draft.bwd).append(op)
            layer_paths.append(name)
    nodes = {path: TreeNode(path, d.kind, tuple(d.children), d.layer_index, tuple(d.fwd), tuple(d.bwd))
             for path, d in drafts.items()}
    return nodes, tuple(layer_paths)


def _ensure(drafts: dict[str, _Draft], path: str, kind: NodeKind, layer_index: int) -> _Draft:
    """The draft of a node, creating it and its missing ancestors (groups above layers, modules inside)."""
    if path in drafts:
        draft = drafts[path]
        if kind == "layer" and draft.kind == "group":  # a layer named like an earlier group: it is the layer
            draft.kind, draft.layer_index = "layer", layer_index
        return draft
    parent = path.rpartition(".")[0]
    _ensure(drafts, parent, "module" if kind == "module" else "group", layer_index if kind == "module" else -1)
    drafts[parent].children.append(path)
    drafts[path] = _Draft(kind, layer_index)
    return drafts[path]


def _instance_names(graph: OpGraph) -> list[list[str]]:
    """Node paths of each layer's repeats: blocks.<i> for transformer blocks (numbered across dense and MoE
    blocks), the CNN's "layer1.1..layer1.2" expanded to layer1.1 and layer1.2, the layer name otherwise."""
    used: set[str] = set()
    out: list[list[str]] = []
    blocks = 0
    for layer in graph.layers:
        if layer.kind in _BLOCK_KINDS:
            names = [f"blocks.{blocks + k}" for k in range(layer.count)]
            blocks += layer.count
        else:
            names = _expand_name(layer.name, layer.count)
        unique = []
        for name in names:
            candidate, suffix = name, 1
            while candidate in used:
                suffix += 1
                candidate = f"{name}_{suffix}"
            used.add(candidate)
            unique.append(candidate)
        out.append(unique)
    return out


def _expand_name(name: str, count: int) -> list[str]:
    if count == 1 and ".." not in name:
        return [name]
    first, _, last = name.partition("..")
    start, end = re.fullmatch(r"(.*?)(\d+)", first), re.fullmatch(r"(.*?)(\d+)", last)
    if start and end and start[1] == end[1] and int(end[2]) - int(start[2]) + 1 == count:
        return [f"{start[1]}{int(start[2]) + k}" for k in range(count)]
    return [f"{name.replace('..', '-')}.{k}" for k in range(count)]


def _op_prefixes(layer: Layer, first_name: str) -> tuple[str, ...]:
    """Prefixes stripped from op module paths to place them under a layer node: the layer's own name (head.proj
    under head, layer1.1.conv1 under layer1.1; a jaxpr's top-level name scope, block0.attn.qkv under blocks.0,
    block0's own equations on it) or the longest dotted prefix all its ops share (blocks.block.*, embed.*)."""
    paths = [op.module_path for op in layer.fwd + layer.bwd]
    inside = all(path == layer.name or path.startswith(layer.name + ".") for path in paths)
    scope = layer.name if inside and any(path != layer.name for path in paths) else ""
    split_paths = [path.split(".") for path in paths]
    common: list[str] = []
    if split_paths:
        for parts in zip(*split_paths, strict=False):
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
        common = common[:min(len(parts) for parts in split_paths) - 1]
    return tuple(prefix for prefix in (first_name, scope, ".".join(common)) if prefix)


def _relative(module_path: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if module_path == prefix:
            return ""
        if module_path.startswith(prefix + "."):
            return module_path[len(prefix) + 1:]
    return module_path


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _summarize(paths: tuple[str, ...]) -> str:
    """Child names with numeric runs collapsed: "embedding, blocks, head" or "0-23"."""
    names = [path.rpartition(".")[2] for path in paths]
    numbers = sorted(int(name) for name in names if name.isdigit())
    words = [name for name in names if not name.isdigit()]
    if numbers:
        words.append(f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0]))
    return ", ".join(words[:12]) + (", ..." if len(words) > 12 else "")


# --- propagation ---


def _resolve(nodes: Mapping[str, TreeNode], layer_paths: tuple[str, ...],
             explicit: Settings) -> dict[str, dict[str, Sourced]]:
    """Top-down over the tree, then along the layer chain for the mesh, then the mesh down into the layers."""
    resolved: dict[str, dict[str, Sourced]] = {}
    for path, node in nodes.items():  # parents are inserted before their children
        row = {} if node.parent is None else {k: v.passed_down() for k, v in resolved[node.parent].items()}
        row.update({key: Sourced(value, path, "set") for key, value in explicit.get(path, {}).items()})
        resolved[path] = row
    _along_data_deps([resolved[path] for path in layer_paths])
    for path, node in nodes.items():
        if node.kind == "module" and node.parent is not None:
            row, parent = resolved[path], resolved[node.parent]
            for key in MESH_KEYS:
                if key not in row and key in parent:
                    row[key] = parent[key].passed_down()
    return resolved


def _along_data_deps(rows: list[dict[str, Sourced]]) -> None:
    """A layer's unspecified mesh fields come from the layer before it (forward propagation); layers before the
    first specified one take it from the layer after them (backward propagation). Stage and chunk travel as a
    pair: a layer with a stage and no chunk is chunk 0."""
    for row in rows:
        if "stage" in row and "chunk" not in row:
            row["chunk"] = Sourced(0, row["stage"].origin, "default")
    for key in MESH_KEYS:
        first = next((i for i, row in enumerate(rows) if key in row), None)
        if first is None:
            continue
        for i in list(range(first + 1, len(rows))) + list(range(first - 1, -1, -1)):
            source = rows[i - 1] if i > first else rows[i + 1]
            if key not in rows[i]:
                rows[i][key] = Sourced(source[key].value, source[key].origin, "data-dep")


# --- the plain strategy as a tree ---


def _root_settings(par: ParallelSpec) -> dict[str, Value]:
    root: dict[str, Value] = {"tp": par.tp, "dp": par.dp, "cp": par.cp, "ep": par.ep, "kind": par.schedule,
                              "recompute": par.recompute}
    if par.num_micro_batches > 0:
        root["micro_batches"] = par.num_micro_batches
    seq_parts = par.cp * (par.tp if par.sp else 1)
    splits = [("activation", "batch", par.dp), ("activation", "seq", seq_parts)]
    # ZeRO (Rajbhandari et al. 2020): stage 1 shards optimizer states, 2 also gradients, 3 also weights
    splits += [(item, "flat", par.dp) for stage, item in ((1, "optimizer"), (2, "gradient"), (3, "weight"))
               if par.zero >= stage]
    root.update({f"split.{item}.{dim}": parts for item, dim, parts in splits if parts > 1})
    return root


def _megatron_splits(nodes: Mapping[str, TreeNode], path: str, layer: Layer,
                     dev: DeviceSlice) -> list[tuple[str, Split]]:
    """Megatron's TP/SP/CP/EP as computation configs over the model-parallel axes on every op node of a
    transformer layer (strategy.megatron.op_config)."""
    out: list[tuple[str, Split]] = []
    stack = [path]
    while stack:
        node = nodes[stack.pop()]
        stack.extend(node.children)
        for axis, _ in axis_sizes(layer.kind, dev).items() if node.fwd else ():
            config = op_config(axis, node.fwd[0], dev)
            out += [(node.path, Split(item="compute", dim=dim, parts=parts, axis=axis)) for dim in COMPUTE_DIMS
                    if (parts := int(getattr(config, dim))) > 1]
    return out


def _refuse_two_meshes(layer: LayerAssignment, mine: tuple[int, int, str], seen: tuple[int, int, str],
                       seen_chunk: int) -> None:
    """ConfigError: a layer (tp, dp, path: mine) on another mesh than an earlier layer of its stage (seen, on model
    chunk seen_chunk). Under interleaved 1F1B a pipeline rank's devices run each of its model chunks (Megatron-LM's
    virtual pipeline: chunk c of rank r is virtual stage c x pp + r), so one mesh holds them all."""
    tp, dp, path = mine
    if seen_chunk != layer.chunk:
        raise ConfigError("map.tp", tp, f"{path} (chunk {layer.chunk}) runs tp={tp} dp={dp} but {seen[2]} (chunk "
                          f"{seen_chunk}) on the same pipeline rank {layer.stage} runs tp={seen[0]} dp={seen[1]}; a "
                          "stage's mesh holds every model chunk of that rank: give its chunks one mesh")
    raise ConfigError("map.tp", tp, f"{path} runs tp={tp} dp={dp} but {seen[2]} on the same stage {layer.stage} runs "
                      f"tp={seen[0]} dp={seen[1]}; the layers of a stage share its mesh")


def _layer_parallels(par: ParallelSpec, assignments: list[LayerAssignment],
                     meshes: tuple[StageMesh, ...]) -> list[ParallelSpec]:
    """Per layer instance, the strategy its stage runs: its stage mesh's (StageMesh.parallel_of), else the job's
    (par itself)."""
    own = {mesh.stage: mesh.parallel_of(par) for mesh in meshes}
    return [own.get(a.stage, par) for a in assignments]


def _stage_note(mine: ParallelSpec, par: ParallelSpec) -> str:
    """Where a layer's stage has its own mesh (mine: its strategy), the words saying so (the degrees an error
    names are its), else nothing."""
    return "" if mine is par else f" (the layer's stage runs its own mesh: tp={mine.tp} dp={mine.dp})"


def _mismatch(op: Op, axis: str, size: int, dev: DeviceSlice, given: OpConfig, expected: OpConfig,
              path: str) -> str:
    mesh = f"{axis}={size}" + (" with sp" if axis == "tp" and dev.sp else "")
    hint = "; a sequence split over tp is sequence parallelism (--sp)" if (
        axis == "tp" and not dev.sp and given.seq > 1 and replicable_module(op) in ("", "experts")) else ""
    if axis == "tp" and replicable_module(op):
        hint += f"; or {tp_config_problem(op, given, dev)}"
    return (f"ops take Megatron's splits over {mesh}: {op.name} splits {config_text(expected)} over {axis}; "
            f"give that, or no {axis} splits{hint}")


def _check_experts_alike(layer: Layer, dev: DeviceSlice, own: TpConfigs, path: str) -> None:
    """An MoE block's expert ops share one tp degree (Megatron-Core's one expert_tensor_parallel_size for every
    expert matmul, megatron/core/model_parallel_config.py, megatron-core 0.16.1)."""
    given = {name: max(config.out, config.reduce) for name, config in own}
    found = {op.name: given.get(op.name, dev.tp) for op in layer.fwd if replicable_module(op) == "experts"}
    if len(set(found.values())) > 1:
        listed = ", ".join(f"{name} {d}" for name, d in found.items())
        raise ConfigError(f"{path} split.compute@tp", listed, "an MoE's expert ops take one tp degree (Megatron-"
                          "Core's expert tensor parallel size): split its matmuls and activation alike")


def _model_parallel_splits(nodes: Mapping[str, TreeNode], path: str, layer: Layer, par: ParallelSpec,
                           transformer: bool) -> list[tuple[str, Split]]:
    """Megatron's tensor split (heads of attention, ffn of the MLP, vocabulary of embedding and head) and the
    expert split of MoE layers, on the nodes they apply to."""
    children = {child.rpartition(".")[2]: child for child in nodes[path].children}
    out: list[tuple[str, Split]] = []
    if par.tp > 1:
        targets: list[tuple[str, SplitDim]] = [("attn", "heads"), ("mlp", "ffn"), ("moe", "ffn")]
        out = [(children[name], Split(item="weight", dim=dim, parts=par.tp)) for name, dim in targets
               if name in children]
        if not out:
            dim: SplitDim = "vocab" if transformer and layer.kind in ("embedding", "head") else "hidden"
            out.append((path, Split(item="weight", dim=dim, parts=par.tp)))
    if par.ep > 1 and "moe" in children:
        out.append((children["moe"], Split(item="weight", dim="experts", parts=par.ep)))
    return out


# --- small helpers ---


def _require_dp(par: ParallelSpec, doing: str) -> None:
    if par.dp == 0:
        raise ConfigError("dp", 0, f"resolve dp=0 (infer from the GPU count) before {doing}")


def _whose(path: str, row: Mapping[str, Sourced], key: str) -> str:
    origin = row[key].origin
    return path if origin == path else f"{path} (its {key} comes from {origin or '<model>'})"


def _below(path: str, ancestor: str) -> bool:
    """Whether node `path` lies strictly below node `ancestor` ("" is the root)."""
    return path != ancestor and (ancestor == "" or path.startswith(ancestor + "."))


def _int(row: Mapping[str, Sourced], key: str) -> int:
    return int(row[key].value) if key in row else 0


def _key_order(key: str) -> tuple[int, str]:
    order = (*MESH_KEYS, *SCHEDULE_KEYS, "recompute")
    return (order.index(key), key) if key in order else (len(order), key)


def _schedule_text(values: tuple[Value | None, ...]) -> str:
    return " ".join(f"{key}={value}" for key, value in zip(SCHEDULE_KEYS, values, strict=True) if value is not None) \
        or "the job's schedule"
