"""FLOPs of the analytic transformer builder against Megatron-LM's closed form.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
eq. 3: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration of B sequences of s tokens, with full
activation recomputation (4 passes over the transformer layers: forward, recompute forward, 2x backward).
Without recomputation the transformer part is 3/4 of that: 72 B s l h^2 (1 + s/(6h)). The logit layer
(2 B s h V forward, 4 B s h V backward) is never recomputed, so its 6 B s h V stays whole:

    F_no_recompute = 72 B s l h^2 (1 + s/(6h)) + 6 B s h V,

which differs from F * 3/4 only by 1.5 B s h V (< 0.1% for GPT-3 175B).

Per layer, the standard (unfused) attention kernel computes the full s x s score matrix even under a causal
mask, which is what eq. 3's s/(6h) term assumes: 2 B s^2 h for Q K^T and 2 B s^2 h for P V forward.
"""

import pytest

from trainsim.catalog import load_model
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for

BATCH = 4
SEQ = 2048


def _gpt3_175b() -> TransformerSpec:
    spec = load_model("gpt3-175b")
    assert isinstance(spec, TransformerSpec)
    return spec


def _dense_flops(graph: OpGraph) -> float:
    """Matmul + attention FLOPs of the whole graph, forward and backward, times each layer's repeat count."""
    return sum(layer.count * op.flops for layer in graph.layers for op in layer.fwd + layer.bwd
               if op.kind in ("matmul", "attention"))


def _graph(fused: bool) -> OpGraph:
    dev = DeviceSlice(BATCH, SEQ, policy_for("bf16"), attention="flash2" if fused else "math")
    return build_transformer(_gpt3_175b(), dev)


def test_gpt3_175b_matches_megatron_eq3_without_recompute() -> None:
    spec = _gpt3_175b()
    b, s, n, h, v = BATCH, SEQ, spec.num_layers, spec.hidden, spec.vocab
    assert (n, h, spec.num_heads, v) == (96, 12288, 96, 50257)
    # Narayanan et al. 2021 eq. 3 with l = n layers (includes the recompute forward); no recompute = 3/4.
    f_eq3 = 96 * b * s * n * h**2 * (1 + s / (6 * h) + v / (16 * n * h))
    assert _dense_flops(_graph(fused=False)) == pytest.approx(f_eq3 * 3 / 4, rel=0.01)


def test_gpt3_175b_exact_no_recompute_count() -> None:
    spec = _gpt3_175b()
    b, s, n, h, v = BATCH, SEQ, spec.num_layers, spec.hidden, spec.vocab
    # 72 B s l h^2 (1 + s/(6h)) for the layers (24 B s h^2 GEMM + 4 B s^2 h attention forward, x3 with
    # backward) + 6 B s h V for the logits (2 forward, 4 backward); the embedding lookup is not a matmul.
    exact = 72 * b * s * n * h**2 * (1 + s / (6 * h)) + 6 * b * s * h * v
    assert _dense_flops(_graph(fused=False)) == pytest.approx(exact, rel=1e-12)


def _block_flops(fused: bool, kind: str) -> tuple[float, float]:
    """Forward and backward FLOPs of one block's ops of `kind` (GPT-3 175B, BATCH x SEQ)."""
    block = next(layer for layer in _graph(fused=fused).layers if layer.kind == "block")
    return (sum(op.flops for op in block.fwd if op.kind == kind), sum(op.flops for op in block.bwd if op.kind == kind))


def test_unfused_attention_computes_the_full_causal_score_matrix() -> None:
    spec = _gpt3_175b()
    b, s, h = BATCH, SEQ, spec.hidden
    attn_fwd, attn_bwd = _block_flops(fused=False, kind="attention")
    # Q K^T and P V over all s x s scores: 2 * (2 b s^2 h) forward, twice that backward.
    assert attn_fwd == 4 * b * s * s * h
    assert attn_bwd == 2 * attn_fwd


def test_fused_causal_attention_skips_the_masked_half() -> None:
    spec = _gpt3_175b()
    b, s, h = BATCH, SEQ, spec.hidden
    attn_fwd, attn_bwd = _block_flops(fused=True, kind="attention")
    # Flash attention (Dao et al. 2022): only the lower triangle, 2 b s^2 h forward; the backward recomputes
    # the scores: 5 matmuls against 2 -> 2.5x the forward.
    assert attn_fwd == 2 * b * s * s * h
    assert attn_bwd == 2.5 * attn_fwd


def test_block_gemm_flops_per_layer() -> None:
    spec = _gpt3_175b()
    b, s, h = BATCH, SEQ, spec.hidden
    gemm_fwd, gemm_bwd = _block_flops(fused=False, kind="matmul")
    # QKV 6bsh^2 + out 2bsh^2 + fc1 8bsh^2 + fc2 8bsh^2 = 24 b s h^2 forward; dgrad + wgrad = 2x backward.
    assert gemm_fwd == 24 * b * s * h**2
    assert gemm_bwd == 2 * gemm_fwd
