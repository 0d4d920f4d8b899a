"""Speed and best plans of `trainsim search` on two mixture-of-experts cases (the expert-parallel degree searched)
and a dense model whose layers the pipeline degrees do not divide (uneven splits searched):

    python benchmarks/bench_moe_search.py [--repeats R] [--top T] [--check-every K] [--models NAME ...]

Mixtral 8x7B on 64 H100 (global batch 256 x 4,096) and DeepSeek-V3 on 2,048 H100 (4,096 x 4,096), the default
models; LLaMA-3.1-405B on 1,024 H100 (1,024 x 8,192); all on dgx-h100-80gb with the default stack. Each repeat is
one whole search with a fresh Planner (enumeration, make_job, the analytical engine over the grid; imports and
catalog loading excluded). Prints, per case: the plans tried and how many were priced at ep > 1, the median wall
and CPU seconds, and the best plans with their tokens/s and peak memory to the digit, for comparing two trees'
rankings. With --check-every K: the largest relative difference between the grid engine's figures (iteration
time, peak memory) and the plain engine's (AnalyticalEstimator.price) over every K-th plan make_job accepts, and
how many OOM verdicts differ (untimed).
"""

import argparse
import statistics
import time

from trainsim.catalog import load_cluster, load_model
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec
from trainsim.search import Planner, SearchReport, SearchSpace
from trainsim.search.grid import GridEngine
from trainsim.search.planner import build_plans
from trainsim.search.space import plan_grid

CASES = {"mixtral-8x7b": (64, 256, 4096), "deepseek-v3": (2048, 4096, 4096), "llama3.1-405b": (1024, 1024, 8192)}


def check(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, every: int) -> str:
    """The grid engine's figures against the plain engine's on every `every`-th accepted plan."""
    plans, columns = plan_grid(model, cluster, space)
    grid = build_plans(model, cluster, plans, space.stack)
    prices = GridEngine().price(grid.jobs, columns.take(grid.index))
    plain = AnalyticalEstimator()
    time_rel = peak_rel = 0.0
    verdicts = checked = 0
    for index in range(0, len(grid.jobs), every):
        price = plain.price(*grid.jobs[index])
        time_rel = max(time_rel, abs(prices.iteration_time_s[index] / price.iteration_time_s - 1.0))
        peak_rel = max(peak_rel, abs(prices.peak_memory_bytes[index] / price.peak_memory_bytes - 1.0))
        verdicts += bool(prices.oom[index]) != price.oom
        checked += 1
    return (f"  grid vs plain engine on {checked} plans: iteration time {time_rel:.2g}, peak memory {peak_rel:.2g} "
            f"relative at most; {verdicts} OOM verdicts differ")


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed and best plans of two MoE searches.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--check-every", type=int, default=0, help="compare every K-th plan with the plain engine")
    parser.add_argument("--models", nargs="+", choices=sorted(CASES), default=["mixtral-8x7b", "deepseek-v3"])
    args = parser.parse_args()
    for name in args.models:
        gpus, global_batch, seq_len = CASES[name]
        model = load_model(name)
        cluster = load_cluster("dgx-h100-80gb").with_num_gpus(gpus)
        space = SearchSpace(global_batch=global_batch, seq_len=seq_len)
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
        if args.check_every > 0:
            print(check(model, cluster, space, args.check_every))


if __name__ == "__main__":
    main()
