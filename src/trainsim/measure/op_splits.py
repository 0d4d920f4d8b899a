"""The tp splits other than Megatron's that a strategy tree may give an op (measure/tp_degrees.py, its module doc),
applied to the measured transformer on plain tensors and explicit collectives (measure/op_collectives.py), or on
torch.distributed.tensor.parallel's modules where they already express the split:

- a column matmul by its reduction dimension: the module's input sliced by features once (its backward all-gathers
  the input gradient), each projection RowwiseParallel on that slice, its partial sums reduce-scattered onto the
  next stage's heads or ffn features (or all-reduced for a whole next stage; the backward all-gathers);
- the attention core by query rows, zig-zag (Brandon et al. 2023, Striped Attention, and the load-balanced
  context parallelism of Megatron-Core: rank r of d holds row chunks r and 2d - 1 - r of 2d, an equal share of a
  causal core's unmasked scores, as the predictor takes it): q, k and v exchanged from heads to rows by
  all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023, Sec. 3), the keys and values of the whole sequence
  all-gathered (their gradient reduce-scattered), each row chunk against the keys up to its last row under a
  causal mask (lower right), the output exchanged back to heads;
- a dense MLP by tokens: each rank runs the whole MLP on its slice of the sequence, the outputs all-gathered; the
  weights' gradients are summed over the ranks (sum_grads, after the backward, with the gradient reduction);
- a block's norms and residual adds by sequence: Megatron's sequence parallelism inside the block
  (Korthikanti et al. 2022, Sec. 4.2.2; SequenceParallel, the projections' outputs reduce-scattered onto the
  tokens), the block's whole input sliced and its output all-gathered (the job has no sp).
Imported only inside measure workers (torch).
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

from trainsim.measure.model import Attention, Block, rotate
from trainsim.measure.op_collectives import Group, exchange, gather, gather_sum, slice_part

TokenSplit = tuple[list[nn.Parameter], Group]  # weights held whole by ranks splitting their tokens, and those ranks


def column_by_reduce(parent: nn.Module, names: list[str], mesh: DeviceMesh, group: Group, read_at: int) -> None:
    """The parent's column matmuls `names` split by their reduction dimension over `group` (module doc)."""
    parent.register_forward_pre_hook(lambda _m, args: (slice_part(args[0], group, -1), *args[1:]))
    out = Shard(-1) if read_at == group.size else Replicate()
    parallelize_module(parent, mesh, {name: RowwiseParallel(input_layouts=Shard(-1), output_layouts=out)
                                      for name in names})


def mlp_by_tokens(mlp: nn.Module, group: Group) -> TokenSplit:
    """The whole MLP on this rank's tokens; its weights' gradients summed over the group (sum_grads)."""
    mlp.register_forward_pre_hook(lambda _m, args: (slice_part(args[0], group, 1),))
    mlp.register_forward_hook(gather_output(group))
    return list(mlp.parameters()), group


def gather_output(group: Group) -> Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]:
    """A forward hook all-gathering a module's output over the group's token slices (backward: a slice)."""
    def hook(_module: nn.Module, _inputs: Any, y: torch.Tensor) -> torch.Tensor:
        return gather(y, group, 1)

    return hook


def block_by_tokens(block: Block, mesh: DeviceMesh, group: Group) -> None:
    """Megatron's sequence parallelism inside one block over the whole tp mesh (module doc)."""
    plan: dict[str, Any] = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                            "attn.o": RowwiseParallel(output_layouts=Shard(1)), "mlp.up": ColwiseParallel(),
                            "mlp.down": RowwiseParallel(output_layouts=Shard(1))}
    if getattr(block.mlp, "gate", None) is not None:
        plan["mlp.gate"] = ColwiseParallel()
    for norm, sub in (("attn_norm", "attn"), ("mlp_norm", "mlp")):
        plan[norm] = SequenceParallel()
        plan[sub] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    parallelize_module(block, mesh, plan)
    block.register_forward_pre_hook(lambda _m, args: (slice_part(args[0], group, 1),))
    block.register_forward_hook(gather_output(group))


def attention_by_rows(attn: Attention, group: Group) -> None:
    """The core on all heads and this rank's zig-zag query rows (module doc); q, k, v from, and the output to, a
    column-parallel qkv and a row-parallel projection over the same group."""
    attn.forward = lambda x: _rows_forward(attn, group, x)  # type: ignore[method-assign]


def zigzag_chunks(parts: int) -> list[int]:
    """The sequence's 2 parts chunks in the order that makes rank r's rows (chunks r and 2 parts - 1 - r) its
    r-th part."""
    return [c for r in range(parts) for c in (r, 2 * parts - 1 - r)]


def _reorder(x: torch.Tensor, dim: int, chunks: list[int]) -> torch.Tensor:
    """x's `dim` cut into len(chunks) equal chunks, concatenated in that order (its backward slices: no scatter)."""
    parts = x.chunk(len(chunks), dim=dim)
    return torch.cat([parts[c] for c in chunks], dim=dim)


def _rows_forward(attn: Attention, group: Group, x: torch.Tensor) -> torch.Tensor:
    b, s, _ = x.shape
    order = zigzag_chunks(group.size)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    rows = _reorder(torch.arange(s, device=x.device), 0, order).chunk(group.size)[group.index]
    q, k, v = (exchange(_reorder(t, 1, order), group, 1, 2).transpose(1, 2) for t in attn._qkv(x))
    if attn.position == "rope":  # q, k, v: [b, heads, this rank's rows, hd]
        cos, sin = attn.cos[rows].to(q.dtype), attn.sin[rows].to(q.dtype)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k, v = (_reorder(gather_sum(t, group, 2), 2, inverse) for t in (k, v))  # the whole sequence, in order
    if attn.selective:  # Korthikanti et al. 2022, sec. 4.2: recompute the attention core only
        y = checkpoint(_rows_core, attn, q, k, v, rows, use_reentrant=False)
    else:
        y = _rows_core(attn, q, k, v, rows)
    assert isinstance(y, torch.Tensor)
    y = _reorder(exchange(y.transpose(1, 2), group, 2, 1), 1, inverse)  # [b, s, this rank's heads, hd]
    return attn.o(y.reshape(b, s, -1))


def _rows_core(attn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               rows: torch.Tensor) -> torch.Tensor:
    """Each contiguous chunk of this rank's rows against the keys up to its last row (a causal core) or all."""
    gqa = q.shape[1] != k.shape[1]
    outs = []
    start = 0
    for chunk in _runs(rows):
        q_part = q[:, :, start:start + chunk.numel()]
        start += chunk.numel()
        end = int(chunk[-1]) + 1 if attn.causal else k.shape[2]
        keys = torch.arange(end, device=q.device)
        mask = _mask(attn, chunk, keys, q.dtype)
        outs.append(F.scaled_dot_product_attention(q_part, k[:, :, :end], v[:, :, :end], attn_mask=mask,
                                                   enable_gqa=gqa))
    return torch.cat(outs, dim=2)


def _runs(rows: torch.Tensor) -> list[torch.Tensor]:
    """rows split where positions stop being consecutive."""
    breaks = (torch.nonzero(rows[1:] != rows[:-1] + 1).flatten() + 1).tolist()
    return list(rows.tensor_split(breaks))


def _mask(attn: Attention, rows: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The causal mask (key <= row) of these rows, as booleans, or as ALiBi's additive bias with it."""
    visible = keys[None, :] <= rows[:, None] if attn.causal else None
    if attn.position != "alibi":
        return visible
    distance = (keys[None, :] - rows[:, None]).to(dtype)  # Press et al. 2022, sec. 3: slope x (j - i)
    bias = attn.slopes.to(dtype)[:, None, None] * distance[None]
    return bias if visible is None else bias.masked_fill(~visible, float("-inf"))
