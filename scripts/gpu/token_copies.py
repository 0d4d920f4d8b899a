"""One MPT-style transformer block, forward + backward on one GPU, with and without llm-foundry's per-token copies
around the attention kernel (llm-foundry 0.10.0 flash_attn_fn: q, k, v through bert_padding.index_first_axis,
the output through bert_padding.pad_input), and with unfused (math) attention: the ground truth for the
`attention_token_copies` behaviour and the math kernel's pricing (docs/scale-fidelity.md).

    python scripts/gpu/token_copies.py --out OUT/token_copies.json

bf16 weights and activations, no bias (MPT), LayerNorm, GELU MLP of 4 x hidden, causal attention through torch
SDPA with one backend forced. Each case: warm-up, then the median of the timed repeats (CUDA events).
"""

import argparse
import json
from pathlib import Path

from attention_kernels import timed_ms  # scripts/gpu/attention_kernels.py: warm-up, then the median

SHAPES = ((2048, 16, 2048, 8), (4096, 32, 2048, 4), (4096, 32, 8192, 1), (2560, 20, 2048, 8))


def block_case(hidden: int, heads: int, seq: int, batch: int, copies: bool, backend_name: str,
               warmup: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev, dt = "cuda", torch.bfloat16
    d = hidden // heads
    norm1 = torch.nn.LayerNorm(hidden, device=dev, dtype=dt)
    norm2 = torch.nn.LayerNorm(hidden, device=dev, dtype=dt)
    wqkv = torch.nn.Linear(hidden, 3 * hidden, bias=False, device=dev, dtype=dt)
    wo = torch.nn.Linear(hidden, hidden, bias=False, device=dev, dtype=dt)
    fc1 = torch.nn.Linear(hidden, 4 * hidden, bias=False, device=dev, dtype=dt)
    fc2 = torch.nn.Linear(4 * hidden, hidden, bias=False, device=dev, dtype=dt)
    x = torch.randn(batch, seq, hidden, device=dev, dtype=dt, requires_grad=True)
    grad = torch.randn_like(x)
    index = torch.arange(batch * seq, device=dev)  # no padding: every token kept, as in the benchmarks
    backend = getattr(SDPBackend, backend_name)

    def attention(h: torch.Tensor) -> torch.Tensor:
        q, k, v = wqkv(h).split(hidden, dim=-1)
        if copies:  # index_first_axis: a gather of the (b s) rows
            q, k, v = (t.reshape(batch * seq, hidden).index_select(0, index) for t in (q, k, v))
        q, k, v = (t.reshape(batch, seq, heads, d).transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(batch * seq, hidden)
        if copies:  # pad_input: the rows scattered into a zero-filled (b s) tensor
            padded = torch.zeros_like(out)
            padded[index] = out
            out = padded
        return wo(out.reshape(batch, seq, hidden))

    def step() -> None:
        h = x + attention(norm1(x))
        y = h + fc2(F.gelu(fc1(norm2(h))))
        y.backward(grad)

    return {"hidden": hidden, "heads": heads, "seq": seq, "batch": batch, "copies": copies,
            "backend": backend_name, "ms": timed_ms(step, warmup, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    rows = []
    for hidden, heads, seq, batch in SHAPES:
        for backend, copies in (("FLASH_ATTENTION", False), ("FLASH_ATTENTION", True), ("MATH", False)):
            if backend == "MATH" and seq > 2048:
                continue
            try:
                row = block_case(hidden, heads, seq, batch, copies, backend, 3, 15)
            except Exception as error:  # recorded, never dropped (out of memory, say)
                row = {"hidden": hidden, "seq": seq, "backend": backend, "copies": copies,
                       "error": f"{type(error).__name__}: {str(error)[:200]}"}
            rows.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_properties(0).name, "torch": torch.__version__, "blocks": rows}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
