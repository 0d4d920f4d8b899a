"""The attention core alone on one GPU, fused against unfused, forward + backward: what the s x s scores cost when
they go through memory (docs/scale-fidelity.md, "Unfused attention on the H200").

    python scripts/gpu/math_attention.py --out OUT/math_attention.json

Causal, bf16, 16,384 tokens a call, hidden 2,048 (16 heads of 128, GPT-3 1.3B's), sequences of 1,024-4,096. Cases:
`sdpa` (torch SDPA's pick: its flash kernel), `math` (measure/unfused_attention.py as the measured model runs it:
Megatron's CoreAttention, fused masked softmax, attention dropout 0.1), `math-nodrop` (the same, no dropout),
`math-eager` (Megatron's non-fused fallback: masked_fill_ then softmax), and `copy` (one bf16 copy of a score
matrix's size: bytes read + written per second, the memory rate a score pass runs at). Each is timed with CUDA
events: warm-up, then the median of the timed repeats; a case that fails is recorded with its error.
"""

import json
from typing import Any

from cuda_timing import timed_ms, timing_arguments

TOKENS, HIDDEN, HEAD_DIM = 16_384, 2_048, 128
SEQ_LENS = (1024, 2048, 4096)


def core(case: str) -> Any:
    import torch
    import torch.nn.functional as F

    from trainsim.measure.unfused_attention import causal_mask, unfused_attention

    def sdpa(q: Any, k: Any, v: Any) -> Any:  # [s, b, h, d] -> [b, h, s, d] views
        return F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)

    def eager(q: Any, k: Any, v: Any) -> Any:
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill_(causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
        return torch.matmul(F.dropout(torch.softmax(scores, dim=-1), 0.1), v)

    return {"sdpa": sdpa,
            "math": lambda q, k, v: unfused_attention(q, k, v, True, None, 0.1),
            "math-nodrop": lambda q, k, v: unfused_attention(q, k, v, True, None, 0.0),
            "math-eager": eager}[case]


def case_row(case: str, seq: int, warmup: int, repeats: int) -> dict[str, Any]:
    import torch

    batch, heads = TOKENS // seq, HIDDEN // HEAD_DIM
    row: dict[str, Any] = {"case": case, "seq": seq, "batch": batch, "heads": heads, "head_dim": HEAD_DIM,
                           "score_elements": batch * heads * seq * seq}
    try:
        if case == "copy":
            src = torch.empty(batch * heads * seq * seq, dtype=torch.bfloat16, device="cuda")
            dst = torch.empty_like(src)
            row["ms"] = timed_ms(lambda: dst.copy_(src), warmup, repeats)
            row["bytes_per_s"] = 2 * src.numel() * 2 / (row["ms"] / 1e3)
            return row
        shape = (seq, batch, heads, HEAD_DIM)  # Megatron's layout
        q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda").requires_grad_() for _ in range(3))
        fn = core(case)
        grad = torch.randn_like(fn(q, k, v))
        row["fwd_ms"] = timed_ms(lambda: fn(q, k, v), warmup, repeats)
        row["fwd_bwd_ms"] = timed_ms(lambda: torch.autograd.backward(fn(q, k, v), grad), warmup, repeats)
    except Exception as exc:  # recorded, never dropped (out of memory, a kernel not built for this GPU)
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    finally:
        torch.cuda.empty_cache()
    return row


def main() -> None:
    args = timing_arguments()
    import torch

    rows = [case_row(case, seq, args.warmup, args.repeats) for seq in SEQ_LENS
            for case in ("copy", "sdpa", "math", "math-nodrop", "math-eager")]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "tokens": TOKENS, "hidden": HIDDEN, "rows": rows}
    args.out.write_text(json.dumps(out, indent=1))
    for row in rows:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
