"""Single-GPU training steps and out-of-memory probes in one process (see docs/measure.md "GPU ground truth").

    python scripts/gpu/probe.py JOBS.txt OUT_DIR --cluster dgx-h100-80gb [--device cuda|cpu] [--budget-s 150]

JOBS.txt: one job per line, "model seq_len micro_batch precision recompute [attention]" (# comments; attention
flash2, the default, or math: Megatron's unfused attention, measure/unfused_attention.py). Each job runs through
`trainsim measure`'s own loop (measure.worker) on one rank: `warmup` untimed and `iterations` timed steps; the
result lands in OUT_DIR/measured/RUN_ID.json as `trainsim measure` writes it (so `trainsim validate` scores
it). A job that runs out of device memory is recorded, not fatal: every job's verdict (fits / oom), CUDA's
max-allocated bytes and trainsim's predicted peak go to OUT_DIR/oom.jsonl, one JSON object per line. Jobs
whose predicted peak is over the device are run too (the point is to check the verdict); `trainsim measure`
itself refuses them.
"""

import argparse
import gc
import json
import time
from datetime import timedelta
from pathlib import Path


def read_jobs(path: Path) -> list[dict[str, object]]:
    jobs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            model, seq, mb, precision, recompute, *attention = line.split()
            jobs.append({"model": model, "seq_len": int(seq), "micro_batch": int(mb), "global_batch": int(mb),
                         "precision": precision, "recompute": recompute, "attention": "".join(attention) or "flash2"})
    return jobs


def _model_name(model: str) -> str:
    """A catalog name as it is; a model file (YAML or JSON) by its file name."""
    return Path(model).stem if model.endswith((".yaml", ".yml", ".json")) else model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=150.0)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from trainsim.cli.measure import job_from_flags
    from trainsim.measure.launch import make_spec
    from trainsim.measure.worker import _measure
    from trainsim.pipeline import predict

    started = time.perf_counter()
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="tcp://127.0.0.1:29531",
                            rank=0, world_size=1, timeout=timedelta(seconds=120),
                            device_id=device if args.device == "cuda" else None)
    measured = args.out / "measured"
    measured.mkdir(parents=True, exist_ok=True)
    capacity = float(torch.cuda.get_device_properties(device).total_memory) if args.device == "cuda" else None
    with (args.out / "oom.jsonl").open("a") as log:
        for flags in read_jobs(args.jobs):
            if time.perf_counter() - started > args.budget_s:
                print("probe: out of time, stopping before", flags, flush=True)
                break
            job = job_from_flags(None, dict(flags, cluster=args.cluster, num_gpus=1))
            run_id = "{model}-s{seq_len}-mb{micro_batch}-{precision}-rc{recompute}".format(
                **dict(flags, model=_model_name(str(flags["model"]))))
            run_id += "-math" if flags["attention"] == "math" else ""
            record: dict[str, object] = {"run_id": run_id, **flags, "cluster": args.cluster,
                                         "device_capacity_bytes": capacity,
                                         "predicted_peak_bytes": predict(job).peak_memory_bytes}
            spec = make_spec(job, measured, run_id=run_id, iterations=args.iterations, warmup=args.warmup,
                             timeout_s=120.0, device=args.device)
            t0 = time.perf_counter()
            try:
                _measure(spec, job, device, 0, 1)
                record["observed"] = "fits"
            except torch.OutOfMemoryError as exc:
                record["observed"] = "oom"
                record["error"] = str(exc).splitlines()[0][:300]
            except RuntimeError as exc:  # cuBLAS / NCCL allocations report running out as a RuntimeError
                first = (str(exc).splitlines() or [""])[0][:300]
                record["observed"] = "oom" if "out of memory" in first.lower() else "error"
                record["error"] = first
            if args.device == "cuda":
                record["max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
            record["seconds"] = round(time.perf_counter() - t0, 2)
            print("probe:", json.dumps(record), flush=True)
            log.write(json.dumps(record) + "\n")
            log.flush()
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
