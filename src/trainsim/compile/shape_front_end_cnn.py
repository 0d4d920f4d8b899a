"""Convolutions, pools, batch norms and token lookups of a captured graph at a config over tp (Proteus Sec. IV-B,
the S2 strategies of Sec. VIII-B: a convolution split by its output channels or its reduction, the input
channels; an embedding table by its columns or rows), for compile.shape_front_end's walk.

Image ops lie as (batch, channels, h, w) (torch's NCHW: a convolution's output, a pool's, a batch norm's and their
backward ops'): batch parts divide dim 0, out parts the channels (dim 1); a convolution's reduce parts divide its
input channels, so its output is left whole in shape, as partial sums, and its FLOPs and bytes divide by every
part. A convolution's backward (torch's one convolution_backward kernel: the input gradient and the weight
gradient) lies as the input gradient (batch, input channels, h, w), or as the weight gradient (output channels,
input channels, kh, kw) where the convolution reads no tensor that needs one (the stem reads the image). An image
has no sequence dimension: a seq split of these ops is refused.

A lookup (batch, seq, features): batch and seq parts divide its tokens, out parts its columns (each rank holds
and looks up features / out of every row); reduce parts its rows, the vocabulary (Megatron-LM's
VocabParallelEmbedding, megatron/core/tensor_parallel/layers.py, megatron-core 0.9: each rank looks up the ids in
its rows, zeroes the others and leaves partial sums to all-reduce), so each rank still writes the whole output:
its forward does not divide by reduce. Its backward (the table's gradient, (rows, features)): FLOPs (the table
written) divide by out x reduce, bytes (the token rows added) by the tokens' and columns' parts.

Parameters held at a config: a convolution's weight Cout x Cin x kh x kw (compile.splits.weight_params) 1/(out x
reduce), a batch norm's gain and bias (2 per channel) 1/out, a lookup's table 1/(out x reduce).
A table tied to a head's projection (GPT-2's lm_head reads the token table) is held at the lookup's split only
where the tree splits that projection alike (its out, the vocabulary, as the lookup's reduce; its reduce, the
features, as the lookup's out: Megatron-LM's vocab-parallel embedding and head); else the projection reads the
whole table and each rank holds it whole (hold_tied_tables).
NB: a convolution's bias is not told apart from its operands' bytes (a captured convolution's input size is not
kept), so it is held whole; a tied projection's config is the tree's own for it (an inferred one counts as whole).
"""

import dataclasses
import math
from collections.abc import Container, Mapping, Sequence

from trainsim.compile.splits import ceil_part, is_batch_norm, op_input_bytes, weight_params
from trainsim.errors import ConfigError
from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.graph import Layer, Op
from trainsim.strategy.lowered import LayerAssignment
from trainsim.strategy.megatron import UNSPLIT
from trainsim.strategy.placement import OpConfig

IMAGE_KINDS = ("conv", "pool", "norm")  # 4-dim ops of these kinds lie as (batch, channels, h, w)
TABLE_KINDS = ("conv", "embedding")  # kinds whose weight a reduce part splits (with `out`)


def is_image_op(op: Op) -> bool:
    """An op whose tensor lies as (batch, channels, h, w). NB: a 4-dim norm is taken as an image's (batch, group
    or instance norm over channels)."""
    return op.kind in IMAGE_KINDS and len(op.shape) == 4


def check_image_config(op: Op, config: OpConfig, where: str, text: str) -> None:
    """An image op split by seq: ConfigError (it has no sequence dimension)."""
    if config.seq > 1 and is_image_op(op):
        raise ConfigError(where, text, f"a {op.kind} op's tensor is (batch, channels, h, w), with no sequence "
                          "dimension: split its batch, out (channels) or, on a conv, reduce (input channels)")


def image_op(op: Op, config: OpConfig, forward: Op | None) -> Op:
    """An image op as one tp rank runs it (module doc). forward: a backward convolution's forward op."""
    shape, ratio = list(op.shape), 1.0
    weight_grad = op.kind == "conv" and op.phase == "bwd" and forward is not None and _is_weight_grad(op, forward)
    if weight_grad:
        dims = ((0, config.out), (1, config.reduce))
    elif op.kind == "conv" and op.phase == "bwd":
        dims = ((0, config.batch), (1, config.reduce))
    else:
        dims = ((0, config.batch), (1, config.out))
    for i, parts in dims:
        shape[i], excess = ceil_part(shape[i], parts)
        ratio *= excess
    divide = config.parts if op.kind == "conv" else config.batch * config.out
    return _scaled(op, tuple(shape), ratio / divide, ratio / divide)


def lookup_op(op: Op, config: OpConfig) -> Op:
    """A lookup or its table's gradient as one tp rank runs it (module doc)."""
    shape, ratio = list(op.shape), 1.0
    tokens = config.batch * config.seq
    if op.phase == "bwd" and len(shape) == 2:  # the table's gradient (rows, features)
        for i, parts in ((0, config.reduce), (1, config.out)):
            shape[i], excess = ceil_part(shape[i], parts)
            ratio *= excess
        return _scaled(op, tuple(shape), ratio / (config.out * config.reduce), ratio / (tokens * config.out))
    dims = [(0, config.batch), (1, config.seq)] if len(shape) >= 3 else [(0, tokens)]
    for i, parts in [*dims, (len(shape) - 1, config.out)] if shape else []:
        shape[i], excess = ceil_part(shape[i], parts)
        ratio *= excess
    factor = ratio / (tokens * config.out)
    return _scaled(op, tuple(shape), factor, factor)


def own_params(op: Op, layer: Layer) -> float:
    """The parameters an op of TABLE_KINDS or a batch norm owns, whole: a convolution's weight, a lookup's table
    (its backward's (rows, features)), a batch norm's gain and bias; 0 for any other op."""
    if op.kind == "conv" and len(op.shape) == 4 and op.phase == "fwd":
        return weight_params(op)
    if op.kind == "embedding":
        table = next((b for b in layer.bwd if b.kind == "embedding" and b.module_path == op.module_path), None)
        return float(math.prod(table.shape)) if table is not None else 0.0
    if is_batch_norm(op) and is_image_op(op):
        return 2.0 * op.shape[1]
    return 0.0


def hold_tied_tables(whole: Sequence[LayerAssignment], shaped: list[LayerAssignment],
                     configs: Mapping[int, Mapping[str, OpConfig]]) -> list[LayerAssignment]:
    """The shaped layer instances with each split lookup's table held whole again where a head's projection tied
    to it (a matmul whose n x k weight its layer does not hold and the table's size) is not split alike (module
    doc). whole: the captured instances, in the same order."""
    tied = [(a.index, op) for a in whole if a.layer.kind == "head" for op in a.layer.fwd
            if op.kind == "matmul" and len(op.shape) == 4 and op.shape[2] * op.shape[3] > a.layer.full_param_count]
    out = list(shaped)
    for position, a in enumerate(whole):
        lookups = [op for op in a.layer.fwd if op.kind == "embedding"] if a.layer.kind == "embedding" else []
        for op in lookups:
            config = configs.get(a.index, {}).get(op.module_path, UNSPLIT)
            parts = config.out * config.reduce
            if parts == 1:
                continue
            table = own_params(op, a.layer)
            heads = [configs.get(index, {}).get(m.module_path, UNSPLIT) for index, m in tied
                     if m.shape[2] * m.shape[3] == table]
            if any((h.out, h.reduce) != (config.reduce, config.out) for h in heads):
                layer = out[position].layer
                out[position] = dataclasses.replace(out[position], layer=dataclasses.replace(
                    layer, param_count=layer.param_count + table * (1.0 - 1.0 / parts)))
    return out


def input_elements(reader: Op, layer: Layer) -> float:
    """Elements of the tensor `reader` reads from its layer's input: a convolution's, its backward's input
    gradient (batch, input channels, h, w); any other op's, compile.splits.op_input_bytes'."""
    if reader.kind == "conv":
        grad = next((b for b in layer.bwd if b.kind == "conv" and b.module_path == reader.module_path
                     and not _is_weight_grad(b, reader)), None)
        if grad is not None:
            return float(math.prod(grad.shape))
    return op_input_bytes(reader) / BYTES_PER_DTYPE[reader.dtype]


def backward_pairs(layer: Layer, carries: Container[int]) -> dict[int, Op]:
    """{id of a backward op: its forward op} where a module runs several forward ops of one kind whose output
    carries a gradient (ids in `carries`) and as many backward ops of that kind: the backward pass meets them in
    reverse (a block's two batch-norm groups under the block's path, each fused with its ReLU)."""
    forward: dict[tuple[str, str], list[Op]] = {}
    backward: dict[tuple[str, str], list[Op]] = {}
    for op in layer.fwd:
        if id(op) in carries:
            forward.setdefault((op.module_path, op.kind), []).append(op)
    for op in layer.bwd:
        backward.setdefault((op.module_path, op.kind), []).append(op)
    return {id(b): f for key, ops in forward.items() if len(ops) > 1 and len(backward.get(key, ())) == len(ops)
            for b, f in zip(backward[key], reversed(ops), strict=True)}


def _is_weight_grad(op: Op, forward: Op) -> bool:
    """Whether a backward convolution lies as its weight's gradient (Cout, Cin, kh, kw): Cout leading and the
    weight's elements."""
    return op.shape[:1] == forward.shape[1:2] and math.prod(op.shape) == round(weight_params(forward))


def _scaled(op: Op, shape: tuple[int, ...], flops_factor: float, bytes_factor: float) -> Op:
    return dataclasses.replace(op, flops=op.flops * flops_factor, bytes_moved=op.bytes_moved * bytes_factor,
                               shape=shape)
