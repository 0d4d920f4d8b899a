"""A strategy tree's computation configs over tp on a capturing front-end's graph (Proteus Sec. IV-B: a split on
any op takes effect).

A captured graph (the torch front-end's: ir.graph.OpGraph.frontend) is one device's whole model, its ops named as
the framework's kernels (addmm, native_layer_norm, fused element-wise groups) under their module paths, with no
Megatron vocabulary to place splits by. The tree gives an op a config over tp where a split item "compute" with
axis tp reaches its node (set there or inherited from an ancestor; parts 1 sets "whole" explicitly); every other
op is left to the compiler, which infers its config from its inputs along the captured data dependencies (Proteus
Sec. VII; compile.shape_front_end). A reduce split reaches the matmuls under its node; the node's other ops (a JAX
Dense's bias add, its own equation in the Dense's scope) infer theirs, so the matmul's partial sums are added up
before them, as Megatron's row-parallel linear adds its bias after the all-reduce (megatron/core/tensor_parallel/
layers.py, RowParallelLinear.forward, megatron-core 0.9). A tree splits a captured graph over tp only: the job's cp
splits every op of the torch front-end's graph by sequence (compile.front_end_context), ep is refused by the
front-end.
"""

from collections.abc import Mapping, Sequence
from typing import Protocol

from trainsim.errors import ConfigError
from trainsim.ir.graph import Op
from trainsim.strategy.lowered import MeshSplit
from trainsim.strategy.megatron import COMPUTE_PARTS
from trainsim.strategy.placement import CONTRACTING, OpConfig


class _Value(Protocol):
    @property
    def value(self) -> object: ...


class _Node(Protocol):
    @property
    def layer_index(self) -> int: ...

    @property
    def fwd(self) -> tuple[Op, ...]: ...


def refuse_whole_model_tp(frontend: str, tp: int, where: str = "") -> None:
    """A captured graph at tp > 1 is priced only through a strategy tree's configs over tp (an engine that places
    no plan, or no tree, would price one device's whole model as each tp rank's share); `where` (an engine) takes
    no tree, or, empty, the caller was given none: ConfigError."""
    if frontend == "catalog" or tp == 1:
        return
    needs = f"{where} takes no tree: use --engine sim or analytical with " if where else "give "
    raise ConfigError("tp", tp, f"the {frontend} front-end's graph is one device's whole model: {needs}a strategy "
                      "tree that splits its ops over tp (--tree, split item compute, axis tp), or use tp=1")


def refuse_whole_model_cp(frontend: str, cp: int, where: str) -> None:
    """A captured graph at cp > 1 is priced only where the compiler shapes it (compile.front_end_context: every
    op on its rank's sequence share); `where` (an engine, a search) prices the graph as it is: ConfigError."""
    if frontend == "catalog" or cp == 1:
        return
    raise ConfigError("cp", cp, f"the {frontend} front-end's graph is one device's whole sequence, which {where} "
                      "does not split: use --engine sim or analytical, or cp=1")


def front_end_mesh_splits(nodes: Mapping[str, _Node], resolved: Mapping[str, Mapping[str, _Value]],
                          tps: Sequence[int], frontend: str, notes: Sequence[str]) -> tuple[MeshSplit, ...]:
    """The tp configs a tree gives the ops of a captured graph (module doc), in node order. tps: per layer
    instance, its stage's tp (a stage on its own mesh: its own); notes: per layer instance, the words an error
    adds where its stage runs its own mesh. ConfigError for a split over another axis, parts whose product does
    not divide tp, or a reduce split of an op without a reduction dimension (a lookup's: its table's rows)."""
    out: list[MeshSplit] = []
    for path, node in nodes.items():
        if not node.fwd or node.layer_index < 0:
            continue
        row = resolved[path]
        for key in row:
            axis = key.partition("@")[2]
            if axis and axis != "tp":
                raise ConfigError(f"{path}.{key}", row[key].value, f"a tree splits the {frontend} front-end's graph "
                                  "over tp only (context parallelism is the job's --cp, every op by sequence; ep "
                                  "needs the catalog front-end)")
        keys = [f"split.compute.{dim}@tp" for dim in COMPUTE_PARTS]
        if not any(key in row for key in keys):
            continue
        config = OpConfig(*(int(str(row[key].value)) if key in row else 1 for key in keys))
        tp = tps[node.layer_index]
        if tp % config.parts:
            raise ConfigError(f"{path} split.compute@tp", config_text(config),
                              f"the parts' product must divide tp={tp}{notes[node.layer_index]}")
        if config.reduce > 1 and not any(op.kind in (*CONTRACTING, "embedding") for op in node.fwd):
            op = node.fwd[0]
            raise ConfigError(f"{path} split.compute@tp", config_text(config), f"{op.name} is a {op.kind} op, "
                              "with no reduction dimension: split its batch, seq or out, or reduce on a matmul, "
                              "a conv (input channels) or a lookup (the table's rows)")
        for op in node.fwd:
            out.append(MeshSplit(node.layer_index, op.module_path, "tp", config))
    return tuple(dict.fromkeys(out))


def config_text(config: OpConfig) -> str:
    """A config's parts above 1, as a tree writes them ("out=2 reduce=2"; "nothing")."""
    return " ".join(f"{dim}={getattr(config, dim)}" for dim in COMPUTE_PARTS if getattr(config, dim) > 1) or "nothing"
