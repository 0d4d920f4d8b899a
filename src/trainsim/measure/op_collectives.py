"""Autograd-aware collectives over a tp (sub-)group on plain tensors, each with the conjugate its backward needs
(Shoeybi et al. 2019, Sec. 3, the f / g operators; Korthikanti et al. 2022, Sec. 4.2.2, g and g-bar of sequence
parallelism; Jacobs et al. 2023, DeepSpeed-Ulysses, Sec. 3, the all-to-all between heads and sequence):

- slice: keep this rank's part of a dimension; backward all-gathers the parts' gradients;
- gather: all-gather a dimension's parts; backward keeps this rank's part (the gradient is the same on every rank);
- gather_sum: all-gather a dimension's parts; backward reduce-scatters (each rank's gradient is partial: keys and
  values read by every rank's query rows);
- exchange: all-to-all, one dimension split, another gathered; backward the inverse all-to-all;
- scatter_sum: reduce-scatter a dimension's parts; backward all-gathers;
- all_reduce and reduce_grads: Megatron-LM's g (all-reduce; backward identity) and f (identity; backward
  all-reduce).
Slice, gather_sum, exchange, scatter_sum, all_reduce and reduce_grads are the split executor's autograd collectives
(measure/split_model.py) on a Group.
Imported only inside measure workers (torch).
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainsim.measure.split_model import (
    AllGather,
    AllReduce,
    AllToAll,
    ReduceGradients,
    ReduceScatter,
    Slice,
    all_gather_parts,
)


@dataclass(frozen=True, slots=True)
class Group:
    """A tp (sub-)group of `size` ranks and this rank's index in it."""

    handle: Any  # torch.distributed.ProcessGroup
    size: int
    index: int


class _Gather(torch.autograd.Function):
    """All-gather forward; the backward keeps this rank's part (the gradient is the same on every rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
        ctx.args = (group, dim)
        return all_gather_parts(x, dim, group.handle, group.size)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        group, dim = ctx.args
        return grads[0].chunk(group.size, dim=dim)[group.index].contiguous(), None, None


def slice_part(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    return Slice.apply(x, dim, group.size, group.index, group.handle)  # type: ignore[no-any-return]


def gather(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    return _Gather.apply(x, group, dim)  # type: ignore[no-any-return]


def gather_sum(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    return AllGather.apply(x, dim, group.handle, group.size)  # type: ignore[no-any-return]


def exchange(x: torch.Tensor, group: Group, split_dim: int, gather_dim: int) -> torch.Tensor:
    """Part j of split_dim goes to rank j; the parts received are concatenated along gather_dim in rank order."""
    return AllToAll.apply(x, split_dim, gather_dim, group.handle, group.size)  # type: ignore[no-any-return]


def scatter_sum(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    return ReduceScatter.apply(x, dim, group.handle, group.size)  # type: ignore[no-any-return]


def all_reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    return AllReduce.apply(x, group.handle)  # type: ignore[no-any-return]


def reduce_grads(x: torch.Tensor, group: Group) -> torch.Tensor:
    return ReduceGradients.apply(x, group.handle)  # type: ignore[no-any-return]


def sum_grads(params: list[torch.nn.Parameter], group: Group) -> None:
    """Sum the gradients of weights held whole by ranks that split their tokens, in one flat all-reduce. A
    DTensor's gradient (a sequence-parallel norm's: partial sums) becomes the replicated sum it stands for."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    from torch.distributed.tensor import DTensor, Replicate

    held = [p for p in params if p.grad is not None]
    if not held:
        return
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in held]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group.handle)
    for param, summed in zip(held, _unflatten_dense_tensors(flat, grads), strict=True):
        grad = param.grad
        if isinstance(grad, DTensor):
            assert grad.placements[0].is_partial(), grad.placements  # else DTensor summed it already
            param.grad = DTensor.from_local(summed, grad.device_mesh, [Replicate()], run_check=False)
        else:
            assert grad is not None
            grad.copy_(summed)
