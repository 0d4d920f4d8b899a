"""An MoE block's experts at Megatron's split over tp with its router whole or split by tokens (measure/tp_degrees.py
"seq" on the router), run as the predictor prices them (compile/shape_layers.py, strategy/megatron.py
`dispatch_layout`; ep 1, no sp: the ranks are the tp group), on plain tensors and op_collectives' autograd
collectives:

- every expert is Megatron's MLP over the tp group (expert tensor parallelism at the job's tp: each rank holds rows
  [r f / tp, (r + 1) f / tp) of its up (and gate) weight and those columns of its down weight, DTensors sharded
  so), runs every routed copy and leaves partial sums of each copy's output;
- the router whole (Megatron's config without sp): every rank routes every token; the experts' input is Megatron's
  f (identity, backward all-reduce: `mlp.ar`), read by the router too, whose input gradient is partial (each rank
  scales its own partial outputs by the probabilities); the combined partial outputs are all-reduced (g: `mlp.ar`);
- the router by tokens over tp: each rank routes its slice of the sequence (sliced from the whole hidden state:
  the backward all-gathers, `mlp.ag`), permutes its routed copies by expert and all-gathers them with their
  probabilities beside them (`mlp.ag` of T k (h + 1) values; backward reduce-scattered: the probabilities' gradient
  is summed over the ranks' partial outputs), as Megatron-Core's MoEAlltoAllTokenDispatcher gathers the routed
  tokens and probabilities over the expert tp group after the (here one-rank) all-to-all
  (megatron/core/transformer/moe/token_dispatcher.py `dispatch_postprocess`, megatron-core 0.16.1); the experts'
  partial outputs are reduce-scattered back onto the routing rank (`mlp.rs`; backward all-gathered), combined onto
  its tokens, and the hidden state all-gathered for the residual add (`mlp.ag`; backward a slice).
Either way the router's weight is held whole and its gradient, partial on each rank, is summed over the tp group
after the backward (sum_grads; Megatron-Core sums a sequence-parallel router's over tp: finalize_model_grads.py).
Each rank learns the others' copies per expert by an all-gather of its tokens-per-expert counts (E int64 values,
Megatron-Core's `preprocess` does the same over tp x ep); the predictor does not price it (docs/strategy-tree.md).
Imported only inside measure workers (torch).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from trainsim.measure.model import MLP, MoE
from trainsim.measure.op_collectives import Group, all_reduce, gather, gather_sum, reduce_grads, scatter_sum, slice_part
from trainsim.measure.op_splits import TokenSplit
from trainsim.measure.parallelize import _local
from trainsim.measure.split_model import all_gather_parts


def moe_over_tp(moe: MoE, mesh: DeviceMesh, group: Group, router_by_tokens: bool) -> TokenSplit:
    """Shard the experts over the tp mesh and route as the module doc says; the router's weight is returned with
    the group its gradient is summed over (op_collectives.sum_grads)."""
    for mlp in moe.experts:
        assert isinstance(mlp, MLP)
        for name, dim in (("up", 0), ("gate", 0), ("down", 1)):
            linear = getattr(mlp, name)
            if linear is not None:
                linear.register_parameter("weight", nn.Parameter(distribute_tensor(linear.weight.data, mesh,
                                                                                   [Shard(dim)])))
    forward = _by_tokens if router_by_tokens else _whole
    moe.forward = lambda x: forward(moe, group, x)  # type: ignore[method-assign]
    router = moe.router.weight
    assert isinstance(router, nn.Parameter)
    return [router], group


def _whole(moe: MoE, group: Group, x: torch.Tensor) -> torch.Tensor:
    flat = reduce_grads(x.reshape(-1, x.shape[-1]), group)  # f: the router's and experts' input gradients summed
    copies, weight, tokens, counts = _route(moe, flat)
    partial = _experts(moe, copies, counts[None]) * weight[:, None]
    out = torch.zeros_like(flat).index_add(0, tokens, partial)
    return all_reduce(out, group).reshape(x.shape)  # g


def _by_tokens(moe: MoE, group: Group, x: torch.Tensor) -> torch.Tensor:
    mine = slice_part(x, group, 1)  # this rank's tokens of every sequence
    flat = mine.reshape(-1, mine.shape[-1])
    copies, weight, tokens, counts = _route(moe, flat)
    routed = gather_sum(torch.cat([copies, weight[:, None]], dim=-1), group, 0)  # copies and probabilities
    h = flat.shape[-1]
    partial = _experts(moe, routed[:, :h], _gather_counts(counts, group)) * routed[:, h:]
    out = torch.zeros_like(flat).index_add(0, tokens, scatter_sum(partial, group, 0))
    return gather(out.reshape(mine.shape), group, 1)


def _route(moe: MoE, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-k routed copies of the tokens, permuted by expert (Megatron-Core's moe_utils.permute), their
    probabilities and token indices, and the copies per expert."""
    gates = F.softmax(moe.router(flat), dim=-1)
    weight, expert = gates.topk(moe.top_k, dim=-1)
    order = torch.argsort(expert.reshape(-1), stable=True)
    tokens = order // moe.top_k
    counts = torch.bincount(expert.reshape(-1), minlength=len(moe.experts))
    return flat[tokens], weight.reshape(-1)[order], tokens, counts


def _gather_counts(counts: torch.Tensor, group: Group) -> torch.Tensor:
    """[ranks, experts]: every rank's copies per expert (no gradient)."""
    return all_gather_parts(counts[None], 0, group.handle, group.size)


def _experts(moe: MoE, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each copy through its expert's shard of rows: partial sums of the copies' outputs, in `routed`'s order
    (chunk j of the rows: rank j's copies, sorted by expert, counts[j] of each)."""
    per_rank = routed.shape[0] // counts.shape[0]
    starts = torch.cumsum(counts, dim=1) - counts
    rows, outputs = [], []
    for e, mlp in enumerate(moe.experts):
        assert isinstance(mlp, MLP)
        index = torch.cat([torch.arange(int(starts[j, e]), int(starts[j, e] + counts[j, e])) + j * per_rank
                           for j in range(counts.shape[0])])
        if index.numel():
            rows.append(index)
            outputs.append(_expert_partial(mlp, routed[index]))
    return torch.cat(outputs)[torch.argsort(torch.cat(rows))]


def _expert_partial(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    up = F.linear(x, _local(mlp.up.weight))
    hidden = F.silu(F.linear(x, _local(mlp.gate.weight))) * up if mlp.gate is not None else F.gelu(up)
    return F.linear(hidden, _local(mlp.down.weight))

