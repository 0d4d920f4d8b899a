"""Speed and best plans of `trainsim search` on two mixture-of-experts cases (the expert-parallel degree searched):

    python benchmarks/bench_moe_search.py [--repeats R] [--top T]

Mixtral 8x7B on 64 H100 (global batch 256 x 4,096) and DeepSeek-V3 on 2,048 H100 (4,096 x 4,096), both on
dgx-h100-80gb with the default stack. Each repeat is one whole search with a fresh Planner (enumeration, make_job,
the analytical engine over the grid; imports and catalog loading excluded). Prints, per case: the plans tried and
how many were priced at ep > 1, the median wall and CPU seconds, and the best plans with their tokens/s and peak
memory to the digit, for comparing two trees' rankings.
"""

import argparse
import statistics
import time

from trainsim.catalog import load_cluster, load_model
from trainsim.search import Planner, SearchReport, SearchSpace

CASES = (("mixtral-8x7b", 64, 256), ("deepseek-v3", 2048, 4096))


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed and best plans of two MoE searches.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    for name, gpus, global_batch in CASES:
        model = load_model(name)
        cluster = load_cluster("dgx-h100-80gb").with_num_gpus(gpus)
        space = SearchSpace(global_batch=global_batch, seq_len=4096)
        runs: list[tuple[SearchReport, float, float]] = []
        for _ in range(args.repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            report = Planner().search(model, cluster, space, top_k=args.top)
            runs.append((report, time.perf_counter() - wall, time.process_time() - cpu))
        report = runs[0][0]
        ep_plans = sum(1 for plan in report.priced if plan.parallel.ep > 1)
        print(f"{name} on {gpus} H100: {report.tried} plans tried, {len(report.priced)} priced ({ep_plans} at "
              f"ep > 1), {report.feasible} feasible; search {statistics.median(r[1] for r in runs):.2f} s wall, "
              f"{statistics.median(r[2] for r in runs):.2f} s CPU (median of {args.repeats}: "
              + ", ".join(f"{r[1]:.2f}" for r in runs) + " s wall)")
        for ranked in report.plans:
            result = ranked.result
            print(f"  {ranked.rank}. {ranked.parallel.describe()}: {result.tokens_per_s:,.3f} tokens/s, "
                  f"peak {result.peak_memory_bytes:,.0f} B")


if __name__ == "__main__":
    main()
