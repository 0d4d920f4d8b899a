"""Where one training step's GPU time goes, by kernel category, for jobs as `trainsim measure` builds them (any
precision: bf16, amp-bf16, ...): torch.profiler's kernel totals of two steps of the measure harness' Trainer on one
GPU, summed into GEMMs, attention, the optimizer and the other (memory-bound) kernels, with the top kernels kept.

    python scripts/gpu/step_kernels.py JOBS.txt --out OUT/step_kernels.json

JOBS.txt as probe.py reads it ("model seq_len micro_batch precision recompute [attention]").
"""

import argparse
import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from probe import read_jobs  # NB: a sibling script, not a package

CATEGORIES = (  # first match wins; kernel names of cuBLAS / cuDNN / FlashAttention / PyTorch on Hopper
    ("attention", re.compile(r"flash|fmha|attn|cudnn_generated|sdpa", re.I)),
    ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|s1688|s16816", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
)


def category(kernel: str) -> str:
    return next((name for name, pattern in CATEGORIES if pattern.search(kernel)), "memory-bound")


def profile_job(flags: dict[str, Any], cluster: str, steps: int = 2) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trainsim.cli.measure import job_from_flags
    from trainsim.measure.parallelize import Trainer, make_topology

    job = job_from_flags(None, dict(flags, cluster=cluster, num_gpus=1))
    trainer = Trainer(job, make_topology(job, "cuda"), torch.device("cuda", 0))
    for _ in range(3):
        trainer.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.step()
        torch.cuda.synchronize()
    kernels = sorted(((e.key, e.device_time_total / steps / 1e3, e.count // steps) for e in prof.key_averages()
                      if e.device_time_total > 0), key=lambda k: -k[1])
    by_category: dict[str, float] = {}
    for name, ms, _ in kernels:
        by_category[category(name)] = by_category.get(category(name), 0.0) + ms
    del trainer
    torch.cuda.empty_cache()
    return {**flags, "kernel_ms_per_step": round(sum(k[1] for k in kernels), 3),
            "ms_by_category": {k: round(v, 3) for k, v in sorted(by_category.items())},
            "top": [{"kernel": k[:160], "ms": round(ms, 4), "calls": n, "category": category(k)}
                    for k, ms, n in kernels[:40]]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cluster", default="dgx-h200")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1,
                            timeout=timedelta(seconds=120), device_id=torch.device("cuda", 0))
    rows = []
    for flags in read_jobs(args.jobs):
        row = profile_job(flags, args.cluster)
        print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
        rows.append(row)
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "steps": rows}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
