"""Group the op log of the torch front-end into IR layers (imports torch; load it lazily).

Layers follow the module tree: each child of the repeated container is a block, what runs before the first
block is the embedding layer, what runs after the last is the head. Blocks with the same op signature (op
names, phases, dtypes, shapes, FLOPs and module paths relative to the block) are one Layer with a count.
Without a repeated container, each top-level child is a layer and identical neighbours merge.
"""

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from trainsim.frontends.torch.oplog import LoggedOp, OpLog
from trainsim.ir.graph import Layer, LayerKind, Op

_CONTAINERS = (nn.ModuleList, nn.Sequential)


@dataclass(frozen=True, slots=True)
class Container:
    """The repeated container: its path, child names (all, and those traced) and whether it repeats."""

    path: str
    module: nn.Module
    children: tuple[str, ...]
    traced: tuple[str, ...]
    repeated: bool  # identical children (a transformer stack); False: the root's children, one layer each

    @property
    def truncated(self) -> bool:
        return len(self.traced) < len(self.children)

    def identical(self, log: OpLog) -> bool:
        """Did the traced children produce the same ops?"""
        signatures = {_signature(self, name, _segment_ops(log, name)) for name in self.traced}
        return len(signatures) == 1


def find_container(module: nn.Module, max_traced: int | None) -> Container | None:
    """The ModuleList / Sequential of structurally identical modules holding the most parameters; else the
    root's children (no truncation)."""
    best: tuple[int, str, nn.Module] | None = None
    for path, sub in module.named_modules():
        if not isinstance(sub, _CONTAINERS) or len(sub) < 2:
            continue
        children = list(sub.children())
        if len({_structure(child) for child in children}) != 1:
            continue
        size = sum(p.numel() for p in sub.parameters())
        if best is None or size > best[0]:
            best = (size, path, sub)
    if best is not None:
        names = tuple(best[2]._modules)
        traced = names if max_traced is None else names[:max_traced]
        return Container(best[1], best[2], names, traced, True)
    names = tuple(name for name, _ in module.named_children())
    if not names:
        return None
    return Container("", module, names, names, False)


def _structure(module: nn.Module) -> tuple[Any, ...]:
    return (type(module).__name__, tuple((k, tuple(p.shape)) for k, p in module.named_parameters()),
            tuple(type(m).__name__ for m in module.modules()))


def _segment_ops(log: OpLog, child: str) -> list[Op]:
    segment = "block:" + child
    return [logged.op for logged in log.ops if logged.segment == segment]


def _relative(container: Container, child: str, path: str) -> str:
    prefix = f"{container.path}.{child}".lstrip(".")
    return path[len(prefix):] if path.startswith(prefix) else path


def _signature(container: Container, child: str, ops: list[Op]) -> tuple[Any, ...]:
    return tuple((op.name, op.phase, op.dtype, op.shape, round(op.flops), round(op.bytes_moved),
                  _relative(container, child, op.module_path)) for op in ops)


def build_layers(log: OpLog, container: Container | None, module: nn.Module, params_by_name: dict[str, torch.Tensor],
                 repeat_count: int | None) -> tuple[Layer, ...]:
    """The layers of a traced step; params_by_name: the model's parameters (tied weights once)."""
    params = _params_by_segment(log, container, params_by_name)
    layers: list[Layer] = []
    embedding = [lo for lo in log.ops if lo.segment == "embedding"]
    if embedding or params.get("embedding"):
        layers.append(_layer(log, "embedding", "embedding", 1, embedding, params.get("embedding", 0)))
    if container is not None:
        layers.extend(_blocks(log, container, module, params, repeat_count))
    head = [lo for lo in log.ops if lo.segment == "head"]
    if head or params.get("head"):
        last = f"block:{container.traced[-1]}" if container is not None else "embedding"
        layers.append(_layer(log, "head", "head", 1, head, params.get("head", 0), output=False, reads=last))
    return tuple(layers)


def _blocks(log: OpLog, container: Container, module: nn.Module, params: dict[str, float],
            repeat_count: int | None) -> list[Layer]:
    groups: list[tuple[tuple[Any, ...], list[str]]] = []
    for child in container.traced:
        signature = _signature(container, child, _segment_ops(log, child))
        for known, members in groups:
            if known == signature and (container.repeated or members[-1] == _previous(container, child)):
                members.append(child)
                break
        else:
            groups.append((signature, [child]))
    layers: list[Layer] = []
    total = repeat_count if repeat_count is not None else len(container.children)
    for index, (_, members) in enumerate(groups):
        first = members[0]
        segment = "block:" + first
        ops = [lo for lo in log.ops if lo.segment == segment]
        if container.repeated:
            count = total if len(groups) == 1 else len(members)
            if len(groups) > 1 and index == 0 and total > len(container.traced):
                # the traced blocks differ where the last one's backward reads the head's gradient (a cut trace
                # whose blocks differ otherwise is retraced whole, capture.graph_from_module; fusing the ops can
                # tell the last apart): the blocks not traced repeat the first
                count += total - len(container.traced)
            name = "block" if len(groups) == 1 else f"block.{index}"
            kind: LayerKind = "block"
        else:
            count = len(members)
            name = first if count == 1 else f"{first}..{members[-1]}"
            child = container.module.get_submodule(first) if container.path else module.get_submodule(first)
            kind = "embedding" if isinstance(child, nn.Embedding | nn.EmbeddingBag) else "block"
        before = _previous(container, first)
        layers.append(_layer(log, name, kind, count, ops, params.get(segment, 0), segment=segment,
                             reads=f"block:{before}" if before else "embedding"))
    return layers


def _previous(container: Container, child: str) -> str:
    index = container.traced.index(child)
    return container.traced[index - 1] if index else ""


def _layer(log: OpLog, name: str, kind: LayerKind, count: int, ops: list[LoggedOp], params: float,
           segment: str | None = None, output: bool = True, reads: str = "") -> Layer:
    """reads: the segment whose activation the layer reads ("": none, the embedding reads token ids)."""
    segment = segment or name
    fwd, hands_on = _dataflow([lo for lo in ops if lo.op.phase == "fwd"], log.boundary_values.get(reads),
                              log.boundary_values.get(segment))
    bwd = tuple(lo.op for lo in ops if lo.op.phase == "bwd")
    saved = log.saved.get(segment, {})
    kept = float(sum(size for size, _ in saved.values()))
    aux = float(sum(size for size, is_aux in saved.values() if is_aux))
    out_bytes = log.boundary_bytes.get(segment, 0.0) if output else 0.0
    if kind == "block":
        # NB: full recompute keeps the block's input, the size of its output (a residual stream)
        saved_bytes = {"none": kept, "selective": kept - aux, "full": out_bytes or kept}
    else:
        saved_bytes = {"none": kept, "selective": kept, "full": kept}
    return Layer(name, kind, count, fwd, bwd, (), params, params, saved_bytes, out_bytes,
                 hands_on=hands_on if output else None)


def _dataflow(fwd: list[LoggedOp], layer_input: int | None, handed_on: int | None) -> tuple[tuple[Op, ...], int | None]:
    """The forward ops with their data dependencies (Op.inputs: the positions of the ops that wrote what each
    reads, -1 for the layer's input; parameters and other layers' tensors, a rotary table or a mask built before
    the blocks, left out), and the position of the op writing the activation the layer hands on (None: not
    found). NB: an op writing a tensor in place is not its writer (the log's writes are new tensors)."""
    writer: dict[int, int] = {}
    ops: list[Op] = []
    for position, lo in enumerate(fwd):
        inputs = tuple(dict.fromkeys(writer.get(v, -1) for v in lo.reads if v in writer or v == layer_input))
        ops.append(replace(lo.op, inputs=inputs))
        writer.update(dict.fromkeys(lo.writes, position))
    return tuple(ops), writer.get(handed_on) if handed_on is not None else None


def _params_by_segment(log: OpLog, container: Container | None,
                       params_by_name: dict[str, torch.Tensor]) -> dict[str, float]:
    """Parameter count per segment; a parameter belongs to the segment whose ops its module (or the nearest
    ancestor with ops) ran in; tied weights count once, where they are first named."""
    segment_of = log.path_segments
    counts: dict[str, float] = {}
    for key, tensor in params_by_name.items():
        path = key.rpartition(".")[0]
        segment = _segment_for(path, container, segment_of)
        counts[segment] = counts.get(segment, 0.0) + float(tensor.numel())
    return counts


def _segment_for(path: str, container: Container | None, segment_of: dict[str, str]) -> str:
    if container is not None:
        prefix = f"{container.path}." if container.path else ""
        if path.startswith(prefix) and path != container.path:
            return "block:" + path[len(prefix):].split(".", 1)[0]
    probe = path
    while True:
        if probe in segment_of:
            return segment_of[probe]
        if not probe:
            return "head"
        probe = probe.rpartition(".")[0]
