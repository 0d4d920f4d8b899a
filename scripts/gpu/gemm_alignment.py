"""The output head's GEMMs on one GPU with the vocabulary as stated and padded to a multiple of 128: what an
unaligned dimension costs (docs/scale-fidelity.md, "Eleventh session": cuBLAS' align1 kernels).

    python scripts/gpu/gemm_alignment.py --out OUT/gemm_alignment.json

bf16, logits = x W^T with x [tokens, hidden] and W [vocab, hidden]: forward, input gradient (dgrad) and weight
gradient (wgrad), as torch.nn.functional.linear and its backward run them. CUDA events, warm-up, median of the
timed repeats; TFLOP/s = 2 * tokens * hidden * vocab / time.
"""

import json
from typing import Any

from cuda_timing import timed_ms, timing_arguments

TOKENS = (8192, 16384)
HIDDEN = (768, 2048, 4096)
VOCAB = (50257, 50304, 32000, 32001, 128256, 128257)  # GPT-2 as stated / padded to 128; LLaMA 2, 3; +1 unaligned


def row(tokens: int, hidden: int, vocab: int, warmup: int, repeats: int) -> dict[str, Any]:
    import torch

    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, device="cuda")
    g = torch.randn(tokens, vocab, dtype=torch.bfloat16, device="cuda")
    flop = 2.0 * tokens * hidden * vocab
    out: dict[str, Any] = {"tokens": tokens, "hidden": hidden, "vocab": vocab}
    for name, fn in (("fwd", lambda: x @ w.t()), ("dgrad", lambda: g @ w), ("wgrad", lambda: g.t() @ x)):
        ms = timed_ms(fn, warmup, repeats)
        out[f"{name}_ms"] = ms
        out[f"{name}_tflops"] = flop / ms / 1e9
    return out


def main() -> None:
    args = timing_arguments()
    import torch

    rows = []
    for t in TOKENS:
        for h in HIDDEN:
            for v in VOCAB:
                rows.append(row(t, h, v, args.warmup, args.repeats))
                torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows}, indent=1))
    for r in rows:
        print(r["tokens"], r["hidden"], r["vocab"], " ".join(f"{k}={r[k]:.0f}" for k in r if k.endswith("tflops")))


if __name__ == "__main__":
    main()
