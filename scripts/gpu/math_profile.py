"""Where a training step's time goes with fused and with unfused attention: torch.profiler's GPU kernel totals of
one step of each of STEPS (amp-bf16; the model `trainsim measure` builds; every kernel kept), and the attention
core alone with and without autocast (docs/scale-fidelity.md, "Unfused attention on the H200").

    python scripts/gpu/math_profile.py --out OUT/math_profile.json
"""

import argparse
import json
from pathlib import Path
from typing import Any

# (model, attention, micro-batch, sequence): the H200 ground truth's shapes (data/ground-truth/h200-math)
STEPS = (("gpt3-1.3b", "flash2", 8, 1024), ("gpt3-1.3b", "math", 8, 1024), ("gpt3-125m", "flash2", 8, 1024),
         ("gpt3-2.7b", "flash2", 2, 2048), ("llama3.2-1b", "flash2", 4, 2048))


def step_kernels(model_name: str, attention: str, micro_batch: int, seq_len: int, steps: int = 2) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trainsim.catalog import load_model
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.measure.model import build_model, lm_loss

    spec = load_model(model_name)
    assert isinstance(spec, TransformerSpec)
    with torch.device("cuda"):
        model = build_model(spec, attention=attention)  # type: ignore[arg-type]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, spec.vocab, (micro_batch, seq_len), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = sorted(((e.key, e.device_time_total / steps / 1e3, e.count // steps) for e in prof.key_averages()
                      if e.device_time_total > 0), key=lambda k: -k[1])
    total_ms = sum(k[1] for k in kernels)
    return {"model": model_name, "micro_batch": micro_batch, "seq_len": seq_len, "attention": attention,
            "kernel_ms_per_step": total_ms,
            "top": [{"kernel": k[:160], "ms": round(ms, 4), "calls": n} for k, ms, n in kernels]}


def core_autocast() -> list[dict[str, Any]]:
    import torch

    from trainsim.measure.unfused_attention import unfused_attention

    rows = []
    for autocast in (False, True):
        q, k, v = (torch.randn(1024, 8, 16, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
                   for _ in range(3))

        def run(q: Any = q, k: Any = k, v: Any = v, autocast: bool = autocast) -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                y = unfused_attention(q, k, v, True, None, 0.1)
            y.float().sum().backward()

        for _ in range(3):
            run()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(10):
            run()
        end.record()
        torch.cuda.synchronize()
        rows.append({"autocast": autocast, "fwd_bwd_ms": start.elapsed_time(end) / 10})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    out: dict[str, Any] = {"core": core_autocast(), "steps": []}
    for model_name, attention, micro_batch, seq_len in STEPS:
        out["steps"].append(step_kernels(model_name, attention, micro_batch, seq_len))
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["core"]))
    for s in out["steps"]:
        print(s["model"], s["attention"], round(s["kernel_ms_per_step"], 2), "ms of kernels per step")
        for row in s["top"][:18]:
            print(f"  {row['ms']:8.3f} ms {row['calls']:5d}  {row['kernel'][:110]}")


if __name__ == "__main__":
    main()
