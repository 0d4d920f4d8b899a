"""Out-of-memory verdicts against a GPU: every job of an oom_verdicts.jsonl (written by scripts/gpu/probe.py on a
lent GPU: the job, whether it ran or ran out of memory, CUDA's max-allocated bytes) predicted again with the
current code, and the verdicts compared (Proteus reports 2 wrong of 180).

    python scripts/oom_verdicts.py data/ground-truth/h100/oom_verdicts.jsonl [--json]
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsim.cli.measure import job_from_flags
from trainsim.measure.results import measured_stack
from trainsim.pipeline import predict

FLAG_KEYS = ("model", "seq_len", "micro_batch", "global_batch", "precision", "recompute", "cluster")


def verdicts(path: Path) -> list[dict[str, Any]]:
    """One row per distinct job: observed and predicted verdicts, and the peaks in GiB."""
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["observed"] not in ("fits", "oom"):
            continue
        job = job_from_flags(None, {key: record[key] for key in FLAG_KEYS} | {"num_gpus": 1})
        job = replace(job, stack=measured_stack(job.parallel))  # the stack `trainsim measure` runs (validate's)
        result = predict(job)
        rows[record["run_id"]] = {
            "job": record["run_id"], "observed": record["observed"],
            "predicted": "oom" if result.oom else "fits",
            "predicted_peak_gib": result.peak_memory_bytes / 2**30,
            "capacity_gib": result.memory_capacity_bytes / 2**30,
            "observed_max_allocated_gib": record.get("max_allocated_bytes", 0) / 2**30,
        }
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("verdicts", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = verdicts(args.verdicts)
    wrong = [row for row in rows if row["observed"] != row["predicted"]]
    if args.json:
        print(json.dumps({"jobs": len(rows), "wrong": len(wrong), "rows": rows}, indent=1))
        return
    print("| job | observed | predicted | predicted peak GiB | capacity GiB | observed max allocated GiB |")
    print("|---|---|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['job']} | {row['observed']} | {row['predicted']} | {row['predicted_peak_gib']:.1f} | "
              f"{row['capacity_gib']:.1f} | {row['observed_max_allocated_gib']:.1f} |")
    print(f"\n{len(wrong)} wrong of {len(rows)} verdicts: {', '.join(r['job'] for r in wrong) or 'none'}")


if __name__ == "__main__":
    main()
