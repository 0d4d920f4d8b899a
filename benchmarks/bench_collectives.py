"""Per-call cost of the collective model's fast path (NcclComm.collective_time_s, what the engines call).

    python benchmarks/bench_collectives.py [--calls N] [--repeats R]

Prices a fixed mix of collectives (all-reduce, all-gather, reduce-scatter, all-to-all and send-recv inside one
DGX H100 and across 4 and 32 of them, buffers of 1 kB to 1 GB) N times with the package's fit, and prints the
best and median CPU microseconds per call over R repeats (thread CPU time: steadier than wall time on shared
cores).
"""

import argparse
import statistics
import time

from trainsim.catalog import load_cluster
from trainsim.catalog.calibration import load_calibration
from trainsim.comm.collectives import NcclComm

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
BUFFERS_BYTES = (1e3, 1e5, 1e7, 1e9)
SHAPES = ((8, 1), (32, 1), (4, 8), (256, 1))  # (group size, stride)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(256)
    model = NcclComm(load_calibration())
    mix = [(c, b, cluster.group_layout(*shape)) for c in COLLECTIVES for b in BUFFERS_BYTES for shape in SHAPES]
    rounds = max(1, args.calls // len(mix))
    per_call_us = []
    for _ in range(args.repeats):
        start = time.thread_time()
        for _ in range(rounds):
            for collective, buffer_bytes, layout in mix:
                model.collective_time_s(collective, buffer_bytes, layout, cluster)
        per_call_us.append((time.thread_time() - start) / (rounds * len(mix)) * 1e6)
    print(f"{rounds * len(mix)} calls x {args.repeats}: best {min(per_call_us):.2f} us, "
          f"median {statistics.median(per_call_us):.2f} us a call (CPU)")


if __name__ == "__main__":
    main()
