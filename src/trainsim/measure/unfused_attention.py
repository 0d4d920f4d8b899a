"""Unfused ("math") attention as Megatron's CoreAttention runs it: the s x s scores go through memory.

megatron-core 0.9.0, transformer/dot_product_attention.py (DotProductAttention.forward; Megatron-LM's and
Megatron-DeepSpeed's CoreAttention is the same algorithm): key and value heads repeated for grouped-query
attention, scores = baddbmm(q, k^T, alpha = 1/sqrt(d)) into a [b*h, sq, sk] buffer, FusedScaleMaskSoftmax (one
kernel reading the scores and writing the probabilities; fusions/fused_softmax.py, for sk <= 4096; see
_MaskedSoftmax for how close torch comes), attention
dropout on the probabilities, context = bmm(probs, v). The fused softmax's backward is one kernel too (reads the
incoming gradient and the probabilities). Megatron runs it in the model's 16-bit dtype, not under autocast
(whose fp32 policy would cast the scores to fp32 for softmax and dropout, doubling their traffic: measured on an
H200, scripts/gpu/math_profile.py), so it runs with autocast off, in the dtype of q. Imported only where torch is
available (measure workers).
"""

from typing import Any

import torch
import torch.nn.functional as F


class _MaskedSoftmax(torch.autograd.Function):
    """Causal softmax over the last dimension, standing in for Megatron's ScaledUpperTriangMaskedSoftmax. Backward
    is one pass as there (reads the gradient and the probabilities, writes the scores' gradient). Forward is
    torch's masked softmax, which on the H200 took its unfused path (a masking pass, then the softmax: one read
    and one write of the scores more than Megatron's kernel; 8.7 ms of a GPT-3 1.3B step at 1,024 tokens, in
    data/ground-truth/h200-kernels/math_profile.json)."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        probs = torch.ops.aten._masked_softmax(scores, mask, -1, 0)  # mask_type 0: one [sq, sk] mask for every head
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        (probs,) = ctx.saved_tensors
        return torch.ops.aten._softmax_backward_data(grads[0], probs, -1, probs.dtype), None


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """True where a query may not attend: keys after it (the upper triangle, aligned at the end)."""
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return torch.arange(kv_len, device=device)[None, :] > rows


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      bias: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """Megatron's layout: q [sq, b, heads, d], k and v [sk, b, kv heads, d] -> the context [b, sq, heads * d]
    (what the output projection reads). bias: an additive [heads, sq, sk] score bias (ALiBi, carrying the causal
    mask itself) that the scores' GEMM adds, as Megatron-DeepSpeed's ALiBi path does."""
    with torch.autocast(q.device.type, enabled=False):
        return _unfused(q, k.to(q.dtype), v.to(q.dtype), causal, None if bias is None else bias.to(q.dtype),
                        dropout_p)


def _unfused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             bias: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    q_len, batch, heads, head_dim = q.shape
    if k.shape[2] != heads:  # grouped-query attention: Megatron repeats the key and value heads
        k = k.repeat_interleave(heads // k.shape[2], dim=2)
        v = v.repeat_interleave(heads // v.shape[2], dim=2)
    kv_len = k.shape[0]
    # [s, b * heads, d] viewed as b * heads strided matrices: no copy
    q3, k3, v3 = (t.reshape(t.shape[0], batch * heads, head_dim).transpose(0, 1) for t in (q, k, v))
    start = q.new_zeros(()) if bias is None else bias.expand(batch, -1, -1, -1).reshape(batch * heads, q_len, kv_len)
    scores = torch.baddbmm(start, q3, k3.transpose(1, 2), beta=0.0 if bias is None else 1.0,
                           alpha=head_dim ** -0.5).view(batch, heads, q_len, kv_len)
    if causal and bias is None:
        probs = _MaskedSoftmax.apply(scores, causal_mask(q_len, kv_len, q.device))
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = F.dropout(probs, dropout_p, training=dropout_p > 0.0)
    context = torch.bmm(probs.view(batch * heads, q_len, kv_len), v3)  # [b * heads, sq, d]
    return context.view(batch, heads, q_len, head_dim).transpose(1, 2).reshape(batch, q_len, heads * head_dim)
