"""Do the CPU-clock collective samples (profile/collectives.py, each call after COLLECTIVE_GAP_S of compute on the
calling thread) follow the machine's speed phases as the ops do? Two gloo ranks time samples of 16 calls (16 KiB;
all-gather, reduce-scatter, all-reduce), each sample between two timings of the reference probe
(measure/phase.py), and a control: a fixed compute (matrix products on the calling thread) between two probes.
Per series: the correlation of log sample with log probe (mean of the two around it) and the samples' spread
(coefficient of variation) raw and phase-normalised. Under the timing lock:

    flock /tmp/trainsim-timing.lock python scripts/proteus_phase_collectives.py --out OUT
"""

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proteus_phase_premise import pearson
from proteus_table4 import COLLECTIVE_GAP_S, CPU_CALLS_PER_SAMPLE

from trainsim.measure.phase import fast_reference_s, pair_means_s, phase_scaled_s
from trainsim.profile.collectives import (
    GAP_MATRIX_SIZE,
    _collective_fn,  # pyright: ignore[reportPrivateUsage]  # NB: the sweep's own call, reused
    _compute_for,  # pyright: ignore[reportPrivateUsage]
    interleaved_call_cost_s,
)

SERIES = ("all-gather", "reduce-scatter", "all-reduce")
MESSAGE_BYTES = 16384
CONTROL_PRODUCTS = 400  # the control's fixed compute: 64 x 64 fp32 products, ~ a few ms


def _rank(rank: int, world: int, port: int, samples: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.measure.phase import ProbeLog, ReferenceProbe

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    a, b = torch.randn(GAP_MATRIX_SIZE, GAP_MATRIX_SIZE), torch.randn(GAP_MATRIX_SIZE, GAP_MATRIX_SIZE)
    result: dict[str, Any] = {}
    for name in ("control", *SERIES):
        probe = ProbeLog(ReferenceProbe())
        fn = _collective_fn(name, MESSAGE_BYTES, rank, world) if name != "control" else None
        values = []
        for index in range(samples + 2):
            probe.before()
            dist.barrier()
            if fn is None:
                begun = time.thread_time()
                for _ in range(CONTROL_PRODUCTS):
                    torch.mm(a, b)
                value = time.thread_time() - begun
            else:
                start, gaps = time.process_time(), 0.0
                for _ in range(CPU_CALLS_PER_SAMPLE):
                    gaps += _compute_for(COLLECTIVE_GAP_S, a, b)
                    fn()
                value = interleaved_call_cost_s(time.process_time() - start, gaps, CPU_CALLS_PER_SAMPLE)
            probe.after()
            if index >= 2:  # two warm-up samples
                values.append(value)
        result[name] = {"samples_s": values, "probe_pairs_s": probe.pairs_s[2:]}
    out.put((rank, result))
    dist.barrier()
    dist.destroy_process_group()


def check(samples: int) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(rank, 2, port, samples, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    per_rank = dict(queue.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    fast_s = fast_reference_s([t for r in per_rank.values() for s in r.values() for p in s["probe_pairs_s"]
                               for t in p])
    report: dict[str, Any] = {"fast_probe_s": fast_s, "samples": samples, "message_bytes": MESSAGE_BYTES,
                              "gap_s": COLLECTIVE_GAP_S, "series": {}}
    for rank, series in sorted(per_rank.items()):
        for name, data in series.items():
            values, probes = data["samples_s"], pair_means_s(data["probe_pairs_s"])
            scaled = phase_scaled_s(values, probes, fast_s)
            report["series"][f"{name} rank{rank}"] = {
                "median_s": statistics.median(values), "normalised_median_s": statistics.median(scaled),
                "cv_raw": statistics.stdev(values) / statistics.fmean(values),
                "cv_normalised": statistics.stdev(scaled) / statistics.fmean(scaled),
                "corr_log_sample_log_probe": pearson([math.log(v) for v in values], [math.log(p) for p in probes]),
                "probe_range_s": [min(probes), max(probes)]}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    load = [Path("/proc/loadavg").read_text().split()[:3]]
    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report = check(args.samples)
    load.append(Path("/proc/loadavg").read_text().split()[:3])
    report.update(began_utc=began, load_average_before_after=load)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phase-collectives.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, row in report["series"].items():
        print(f"{name:<22} median {row['median_s'] * 1e3:.3f} ms  corr {row['corr_log_sample_log_probe']:+.2f}  "
              f"CV {row['cv_raw'] * 100:.1f}% -> {row['cv_normalised'] * 100:.1f}%")


if __name__ == "__main__":
    main()
