"""The tp splits of the hidden state that a strategy tree may give a block's norms and residual adds, the head's
final norm and the embedding's learned positions by features, and a block's residual adds, the final norm and the
positions by tokens (measure/tp_degrees.py, "features" and "seq"), applied to the measured transformer on plain
tensors and the explicit autograd collectives of measure/op_collectives.py:

- a norm by features: each rank normalises its slice of every token's features; a LayerNorm's per-token sums (of
  x, then of the centred squares) are partial over the ranks, one fp32 all-reduce each in the forward and, by
  autograd, one each in the backward (an RMSNorm's sum of squares alone) (Colossal-AI's 2D LayerNorm,
  colossalai/nn/layer/parallel_2d/_operation.py, does the same; Wang et al. 2021, Sec. 3.2). Each rank holds its
  slice of the gain and bias (a DTensor sharded by features: no gradient summed over tp). The norm slices the
  whole hidden state (the backward all-gathers the input gradient); the module reading its output (the attention,
  the MLP, the vocabulary projection) all-gathers it, once (torch's PrepareModuleInput, or the head's DTensor
  redistribute), and in the backward reduce-scatters the partial input gradient onto the features;
- a residual add by features (or by tokens, its norms whole: the same with the sequence's slices): each rank adds
  its slice; the projection before it reduce-scatters its partial sums onto the slices (RowwiseParallel onto
  Shard(-1), Shard(1)) instead of all-reducing; the skip input is read as the block's hidden state is held
  (sliced from a whole one: its gradient slices all-gathered in the backward), and a reader of the whole sum (the
  next norm where whole, the next block) all-gathers it (the backward keeps this rank's slice: the whole sum's
  gradient is the same on every rank);
- the learned positions by features: each rank holds its slice of the table's columns and adds it to its slice
  of the lookup's output; the embedding hands on the whole hidden state (all-gathered). By tokens: the table held
  whole, each rank adding its tokens' rows, its gradient summed over the ranks after the backward; the head's final
  norm by tokens likewise (its gain and bias whole, their gradients summed).
The hidden state between the ops of a block is whole or a slice as the ops leave it (_Hidden); a slice and a whole
copy are each made at most once, so a norm and an add split alike share one slice (no skip collective).
Imported only inside measure workers (torch).
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

from trainsim.measure.model import Block, Embedding, Head
from trainsim.measure.op_collectives import Group, gather, slice_part
from trainsim.measure.op_splits import TokenSplit
from trainsim.measure.parallelize import _local
from trainsim.measure.split_model import AllReduce, ReduceGradients

FEATURES = "features"


def block_by_hidden_splits(block: Block, mesh: DeviceMesh, group: Group, split: Mapping[str, str]) -> None:
    """The block's norms and residual adds that `split` gives "features", or its adds "seq" (module doc), over the
    whole tp mesh; the attention's and MLP's own splits are applied already (their projections' outputs onto the
    add's slices where it is split: measure/op_parallel.py)."""
    for norm, reader in (("norm1", "attn"), ("norm2", "mlp")):
        if split.get(norm) == FEATURES:
            module = block.attn_norm if norm == "norm1" else block.mlp_norm
            norm_by_features(module, mesh, group)
            parallelize_module(block, mesh, {reader: PrepareModuleInput(input_layouts=(Shard(-1),),
                                                                        desired_input_layouts=(Replicate(),))})
    dims = {name: part_dim(split.get(name)) for name in ("norm1", "residual1", "norm2", "residual2")}
    block.forward = lambda x: _split_forward(block, group, dims, x)  # type: ignore[method-assign]


def part_dim(split: str | None) -> int | None:
    """The dimension of a [batch, seq, hidden] hidden state an op's split slices ("features", "seq"), or None."""
    return {FEATURES: -1, "seq": 1}.get(split or "")


def norm_by_features(norm: nn.Module, mesh: DeviceMesh, group: Group) -> None:
    """The norm on this rank's slice of the features (its input), statistics all-reduced in fp32 (module doc)."""
    for name, param in list(norm.named_parameters(recurse=False)):
        norm.register_parameter(name, nn.Parameter(distribute_tensor(param.data, mesh, [Shard(0)])))
    norm.forward = lambda x: _feature_norm(norm, group, x)  # type: ignore[method-assign]


def head_norm_split(head: Head, mesh: DeviceMesh, group: Group, split: str) -> list[TokenSplit]:
    """The head's final norm by features or by tokens: it slices the last block's whole output and hands its slice
    on as a DTensor sharded alike, which the vocab-parallel projection all-gathers (Head.forward's redistribute;
    the backward reduce-scatters the partial gradient). By tokens the gain and bias are whole on each rank, their
    gradients summed over the group (returned, as op_splits.mlp_by_tokens returns its weights)."""
    dim = part_dim(split)
    assert dim is not None
    if split == FEATURES:
        norm_by_features(head.norm, mesh, group)
    head.norm.register_forward_pre_hook(lambda _m, args: (slice_part(args[0], group, dim),))

    def handed_on(_module: nn.Module, _inputs: Any, y: torch.Tensor) -> DTensor:
        return DTensor.from_local(y, mesh, [Shard(dim)], run_check=False)

    head.norm.register_forward_hook(handed_on)
    return [] if split == FEATURES else [(list(head.norm.parameters()), group)]


def positions_split(embed: Embedding, mesh: DeviceMesh, group: Group, split: str) -> list[TokenSplit]:
    """The learned positions by features (each rank holds its columns of the table) or by tokens (the table whole,
    each rank adding its rows, the table's gradient summed over the group: returned); the sum all-gathered."""
    assert embed.pos is not None
    dim = part_dim(split)
    assert dim is not None
    if split == FEATURES:
        sharded = distribute_tensor(embed.pos.weight.data, mesh, [Shard(1)])
        embed.pos.register_parameter("weight", nn.Parameter(sharded))
    embed.forward = lambda tokens: _positions_forward(embed, group, dim, tokens)  # type: ignore[method-assign]
    return [] if split == FEATURES else [(list(embed.pos.parameters()), group)]


def _positions_forward(embed: Embedding, group: Group, dim: int, tokens: torch.Tensor) -> torch.Tensor:
    assert embed.pos is not None
    rows = _local(embed.pos.weight)[: tokens.shape[1]]
    if dim == 1:  # this rank's tokens' rows
        rows = rows.chunk(group.size, dim=0)[group.index]
    part = slice_part(embed.tok(tokens), group, dim) + rows
    return gather(part, group, dim)


def _all_reduce_both_ways(x: torch.Tensor, group: Group) -> torch.Tensor:
    """A per-token partial sum all-reduced; its gradient, partial on each rank too, all-reduced in the backward
    (ReduceGradients' backward, then AllReduce's forward)."""
    return AllReduce.apply(ReduceGradients.apply(x, group.handle), group.handle)  # type: ignore[no-any-return]


def _feature_norm(norm: nn.Module, group: Group, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm (or RMSNorm) of x's last dimension, split over the group's ranks (module doc)."""
    width = x.shape[-1] * group.size
    xf = x.float()
    if isinstance(norm, nn.RMSNorm):
        mean_sq = _all_reduce_both_ways(xf.pow(2).sum(-1, keepdim=True), group) / width
        eps = norm.eps if norm.eps is not None else torch.finfo(xf.dtype).eps
        y = xf * torch.rsqrt(mean_sq + eps)
    else:
        assert isinstance(norm, nn.LayerNorm)
        mean = _all_reduce_both_ways(xf.sum(-1, keepdim=True), group) / width
        centred = xf - mean
        var = _all_reduce_both_ways(centred.pow(2).sum(-1, keepdim=True), group) / width
        y = centred * torch.rsqrt(var + norm.eps)
    weight, bias = (getattr(norm, name, None) for name in ("weight", "bias"))
    y = y.to(x.dtype)
    if weight is not None:
        y = y * _local(weight)
    return y + _local(bias) if bias is not None else y


class _Hidden:
    """The block's hidden state, whole or this rank's slice along one dimension, each made from the other at most
    once."""

    def __init__(self, group: Group, whole: torch.Tensor | None = None, part: torch.Tensor | None = None,
                 dim: int | None = None) -> None:
        self.group = group
        self._whole = whole
        self._part = part
        self._dim = dim

    def get(self, dim: int | None) -> torch.Tensor:
        """Whole (dim None) or this rank's slice along dim."""
        if dim is None:
            if self._whole is None:
                assert self._part is not None and self._dim is not None
                self._whole = gather(self._part, self.group, self._dim)
            return self._whole
        if self._part is None or self._dim != dim:
            self._part, self._dim = slice_part(self.get(None), self.group, dim), dim
        return self._part

    def add(self, y: torch.Tensor, dim: int | None) -> "_Hidden":
        """The residual add: y (whole, or this rank's slice where the add is split) plus the skip read alike."""
        total = self.get(dim) + y
        return _Hidden(self.group, whole=total) if dim is None else _Hidden(self.group, part=total, dim=dim)


def _split_forward(block: Block, group: Group, dims: Mapping[str, int | None], x: torch.Tensor) -> torch.Tensor:
    hidden = _Hidden(group, whole=x)
    hidden = hidden.add(block.attn(block.attn_norm(hidden.get(dims["norm1"]))), dims["residual1"])
    hidden = hidden.add(block.mlp(block.mlp_norm(hidden.get(dims["norm2"]))), dims["residual2"])
    return hidden.get(None)
