"""Attention-kernel, GEMM and memory-bound-kernel rates on one GPU: the facts behind the attention efficiency per
kernel and GPU generation and the memory efficiency (docs/scale-fidelity.md, "Attention and memory-bound kernels
as measured").

    python scripts/gpu/attention_kernels.py --out OUT/attention_kernels.json [--quick]

Every case is timed with CUDA events: warm-up, then the median of the timed repeats. Attention runs through torch's
scaled_dot_product_attention with one backend forced at a time (FLASH_ATTENTION is FlashAttention-2 in torch,
CUDNN_ATTENTION is cuDNN's fused kernel, the one Transformer Engine picks on Hopper, MATH is the unfused
scores-through-memory path), causal, bf16, 16,384 tokens a call, hidden 4,096. FLOPs are counted afterwards
(FlashAttention-2, section 4.1: causal forward 2 * 2 * b * h * s^2 * d / 2, backward 2.5 times the forward).
A case that fails (out of memory, backend not built for this GPU) is recorded with its error, never dropped.
"""

import argparse
import json
import time
from pathlib import Path

from cuda_timing import timed_ms

TOKENS, HIDDEN = 16_384, 4_096
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
MATH_MAX_SEQ = 4096  # the unfused path holds b * h * s^2 scores: 4.3 GB at 4,096 tokens a sequence here


def gemm_cases(warmup: int, repeats: int) -> list[dict]:
    import torch

    rows = []
    for m, n, k in ((8192, 8192, 8192), (TOKENS, 3 * HIDDEN, HIDDEN), (TOKENS, HIDDEN, HIDDEN),
                    (TOKENS, 4 * HIDDEN, HIDDEN), (TOKENS, HIDDEN, 4 * HIDDEN)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = timed_ms(lambda a=a, b=b: a @ b, warmup, repeats)
        rows.append({"m": m, "n": n, "k": k, "dtype": "bf16", "ms": ms, "tflops": 2 * m * n * k / ms / 1e9})
    return rows


def attention_case(backend_name: str, head_dim: int, seq: int, warmup: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads = TOKENS // seq, HIDDEN // head_dim
    row: dict = {"backend": backend_name, "head_dim": head_dim, "seq": seq, "batch": batch, "heads": heads}
    backend = getattr(SDPBackend, backend_name)
    try:
        q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
        with sdpa_kernel(backend):
            row["fwd_ms"] = timed_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                     warmup, repeats)

            def fwd_bwd() -> None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(grad)

            row["fwd_bwd_ms"] = timed_ms(fwd_bwd, warmup, repeats)
        fwd_flop = 4 * batch * heads * seq * seq * head_dim / 2
        row["fwd_tflops"] = fwd_flop / row["fwd_ms"] / 1e9
        row["fwd_bwd_tflops"] = 3.5 * fwd_flop / row["fwd_bwd_ms"] / 1e9
    except Exception as error:  # recorded: a backend not built for this GPU or shape, or out of memory
        row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
    torch.cuda.empty_cache()
    return row


def memory_cases(warmup: int, repeats: int) -> list[dict]:
    """Memory-bound kernels of an eager transformer block; bytes are the tensors read and written once."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    y = torch.randn_like(x)
    elem = x.numel() * 2
    ln = torch.nn.LayerNorm(HIDDEN, device="cuda", dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    g = torch.randn_like(x)
    index = torch.arange(TOKENS, device="cuda")
    scores = torch.randn(8, 32, 1024, 1024, device="cuda", dtype=torch.float32)

    def ln_fwd_bwd() -> None:
        ln(xg).backward(g)

    def scatter_back() -> None:  # flash-attn's pad_input: a zero-filled output, rows put back by index
        out = torch.zeros_like(x)
        out[index] = y

    cases = {
        "copy": (lambda: x.clone(), 2 * elem),
        "add": (lambda: x + y, 3 * elem),
        "gelu": (lambda: F.gelu(x), 2 * elem),
        "dropout": (lambda: F.dropout(x, 0.1, training=True), 2 * elem + x.numel()),
        "layer_norm_fwd": (lambda: ln(x), 2 * elem),
        "layer_norm_fwd_bwd": (ln_fwd_bwd, 7 * elem),
        "softmax_fp32_scores": (lambda: torch.softmax(scores, -1), 2 * scores.numel() * 4),
        "gather_rows": (lambda: x.index_select(0, index), 2 * elem),
        "scatter_rows_zero_filled": (scatter_back, 3 * elem),
    }
    rows = []
    for name, (fn, nbytes) in cases.items():
        ms = timed_ms(fn, warmup, repeats)
        rows.append({"kernel": name, "bytes": nbytes, "ms": ms, "gb_per_s": nbytes / ms / 1e6})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="one warm-up, three repeats (a smoke run)")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--backends", nargs="+",
                        default=["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"])
    args = parser.parse_args()
    import torch

    warmup, repeats = (1, 3) if args.quick else (3, 10)
    started = time.time()
    props = torch.cuda.get_device_properties(0)
    result: dict = {"device": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
                    "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "gemm": [],
                    "attention": [], "memory": []}
    result["gemm"] = gemm_cases(warmup, repeats)
    print("gemm", [round(r["tflops"]) for r in result["gemm"]], flush=True)
    for backend in args.backends:
        for head_dim in args.head_dims:
            for seq in SEQ_LENS:
                if backend == "MATH" and seq > MATH_MAX_SEQ:
                    continue
                row = attention_case(backend, head_dim, seq, warmup, repeats)
                result["attention"].append(row)
                print(backend, head_dim, seq, round(row.get("fwd_bwd_tflops", 0)), row.get("error", ""), flush=True)
    result["memory"] = memory_cases(warmup, repeats)
    print("memory", [(r["kernel"], round(r["gb_per_s"])) for r in result["memory"]], flush=True)
    result["wall_s"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
