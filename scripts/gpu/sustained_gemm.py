"""Sustained GEMM rate on one GPU: does a minute of back-to-back bf16 matrix products run at the rate of the
first seconds? (docs/scale-fidelity.md, eleventh session: our H200 steps ran a few seconds each; published
training runs run for hours.) Prints and writes one row per second: TFLOP/s, SM clock, power, temperature.

    python scripts/gpu/sustained_gemm.py --out OUT/sustained_gemm.json [--seconds 75]
"""

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

SIZE = 8192  # 8192^3 bf16: ~1.1 TFLOP a product


def smi() -> dict[str, float]:
    fields = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout.strip().split(", ")
    try:
        return {"sm_mhz": float(out[0]), "power_w": float(out[1]), "temp_c": float(out[2]),
                "throttle": int(out[3], 16)}
    except (ValueError, IndexError):
        return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=75.0)
    args = parser.parse_args()
    import torch

    a = torch.randn(SIZE, SIZE, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(SIZE, SIZE, dtype=torch.bfloat16, device="cuda")
    flop = 2.0 * SIZE**3
    rows: list[dict[str, Any]] = []
    begun = time.perf_counter()
    while time.perf_counter() - begun < args.seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        count, second = 0, time.perf_counter()
        while time.perf_counter() - second < 1.0:  # ~1 s of products per row, queued ahead of the GPU
            for _ in range(10):
                torch.mm(a, b)
            count += 10
            torch.cuda.synchronize()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)
        row = {"t_s": round(time.perf_counter() - begun, 2), "tflops": round(count * flop / ms / 1e9, 1), **smi()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "size": SIZE, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
