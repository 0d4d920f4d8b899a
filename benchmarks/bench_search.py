"""Speed of `trainsim search` on the acceptance case: LLaMA-3.1-70B, 1,024 H100s, global batch 1,024 x 8,192.

    python benchmarks/bench_search.py [--model NAME] [--cluster NAME_OR_YAML] [--num-gpus N] [--repeats R]
                                      [--profile]

Each repeat runs one whole search with a fresh Planner (enumeration + make_job + the analytical engine over
the grid, its caches cold; imports and catalog loading excluded), then prices the same jobs again to time the
engine alone. Prints medians over the repeats of:

- search plans/s: plans tried / seconds of the whole search (the figure `trainsim search` users see);
- engine plans/s, cold: the plans make_job accepts / seconds of a fresh GridEngine pricing them all (make_job
  and graph building excluded; every layer, collective and stage price made anew), handed the enumeration's
  columns of the plans as Planner.search hands them (search.space.plan_grid), and without them (each plan's
  settings read back from its spec);
- engine plans/s, warm: the same grid again on the same GridEngine (what a second search over the same graphs
  costs: another global batch, other ZeRO stages or recompute modes);
- plain engine plans/s: the same plans one by one through a fresh AnalyticalEstimator.price (the engine before
  the grid engine; the figures the grid engine must equal);
- figures: a digest of the grid's figures (iteration time, peak memory, OOM per plan), for telling two trees'
  figures equal bit for bit.

Both in wall time and in CPU time (time.process_time: this process's CPU seconds, so waiting for a core on a
loaded machine does not count). The CPU-time figure is the nearest to "plans/s on one idle core": the process
is one thread, pinned to one CPU (os.sched_setaffinity where the OS allows). It still runs slower per CPU
second on a busy host (shared caches and memory bandwidth), so a reference loop's CPU time is printed too:
compare figures taken at different loads by it.
"""

import argparse
import cProfile
import hashlib
import os
import pstats
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from typing import TypeVar

from trainsim.catalog import load_cluster, load_model
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.search import Planner, SearchReport, SearchSpace
from trainsim.search.grid import GridEngine
from trainsim.search.planner import build_plans
from trainsim.search.space import PlanColumns, plan_grid

T = TypeVar("T")


def timed(run: Callable[[], T]) -> tuple[T, float, float]:
    """run()'s value, wall seconds and CPU seconds of this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = run()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def priced_jobs(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace) -> list[tuple[Job, OpGraph]]:
    """The plans of the space that make_job accepts, with their graphs: what the engine prices in a search."""
    return priced_grid(model, cluster, space)[0]


def priced_grid(model: ModelSpec, cluster: ClusterSpec,
                space: SearchSpace) -> tuple[list[tuple[Job, OpGraph]], PlanColumns]:
    """priced_jobs, with the enumeration's columns of those plans (what Planner.search hands the engine)."""
    plans, columns = plan_grid(model, cluster, space)
    grid = build_plans(model, cluster, plans, space.stack)
    return grid.jobs, columns.take(grid.index)


def figures_digest(jobs: list[tuple[Job, OpGraph]], columns: PlanColumns) -> str:
    """The first 12 hex digits of the sha256 of a fresh GridEngine's iteration times, peak memories and OOM
    verdicts of the plans (their bytes, in order): equal digests, bit-identical figures (compare two trees)."""
    prices = GridEngine().price(jobs, columns)
    digest = hashlib.sha256()
    for values in (prices.iteration_time_s, prices.peak_memory_bytes, prices.oom):
        digest.update(values.tobytes())
    return digest.hexdigest()[:12]


def price_one_by_one(jobs: list[tuple[Job, OpGraph]]) -> int:
    engine = AnalyticalEstimator()
    for job, graph in jobs:
        engine.price(job, graph)
    return len(jobs)


def price_grid(jobs: list[tuple[Job, OpGraph]], engine: GridEngine | None = None,
               columns: PlanColumns | None = None) -> int:
    (engine or GridEngine()).price(jobs, columns)
    return len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed of the strategy search.")
    parser.add_argument("--model", default="llama3.1-70b")
    parser.add_argument("--cluster", default="dgx-h100-80gb")
    parser.add_argument("--num-gpus", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5, help="searches to time; medians are printed")
    parser.add_argument("--profile", action="store_true",
                        help="also print the top 15 functions by cumulative time (one more search)")
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    model = load_model(args.model)
    cluster = load_cluster(args.cluster).with_num_gpus(args.num_gpus)
    space = SearchSpace(global_batch=args.global_batch, seq_len=args.seq_len)
    jobs, columns = priced_grid(model, cluster, space)

    def search() -> SearchReport:
        return Planner().search(model, cluster, space, top_k=1)

    searches = [timed(search) for _ in range(args.repeats)]
    engines = [timed(lambda: price_grid(jobs, columns=columns)) for _ in range(args.repeats)]
    read_back = [timed(lambda: price_grid(jobs)) for _ in range(args.repeats)]
    warm_engine = GridEngine()
    price_grid(jobs, warm_engine, columns)
    warm = [timed(lambda: price_grid(jobs, warm_engine, columns)) for _ in range(args.repeats)]
    plain = [timed(lambda: price_one_by_one(jobs)) for _ in range(args.repeats)]
    report = searches[0][0]

    def median(runs: Sequence[tuple[object, float, float]], column: int) -> float:
        return statistics.median(run[1] if column == 1 else run[2] for run in runs)

    def rate(count: int, runs: Sequence[tuple[object, float, float]], column: int) -> str:
        return f"{count / median(runs, column):>9,.0f}"

    print(f"case            {model.name} on {cluster.name} ({cluster.num_gpus} GPUs), "
          f"global batch {space.global_batch} x {space.seq_len}")
    print(f"plans evaluated {report.tried} ({report.feasible} feasible; "
          + ", ".join(f"{reason}: {count}" for reason, count in report.infeasible.items()) + ")")
    print(f"figures         sha256 {figures_digest(jobs, columns)} (iteration times, peaks, OOM of the grid's plans)")
    print(f"repeats         {args.repeats} (medians; CPU = time.process_time, wall = time.perf_counter)")
    reference_us = min(timeit.repeat("sum(range(100))", number=20000, repeat=3)) / 20000 * 1e6
    print(f"reference loop  sum(range(100)) takes {reference_us:.2f} us of CPU here")
    print(f"search seconds  {statistics.median(s[2] for s in searches):.3f} CPU, "
          f"{statistics.median(s[1] for s in searches):.3f} wall")
    print(f"search plans/s  {rate(report.tried, searches, 2)} CPU, "
          f"{rate(report.tried, searches, 1)} wall")
    print(f"engine plans/s  {rate(len(jobs), engines, 2)} CPU, "
          f"{rate(len(jobs), engines, 1)} wall ({len(jobs)} plans priced, make_job and graphs excluded; "
          "cold: a fresh GridEngine, handed the enumeration's columns as Planner.search does)")
    print(f"  no columns    {rate(len(jobs), read_back, 2)} CPU, {rate(len(jobs), read_back, 1)} wall (the same, "
          "each plan's settings read back from its spec)")
    print(f"  warm          {rate(len(jobs), warm, 2)} CPU, {rate(len(jobs), warm, 1)} wall (the same grid again "
          "on the same GridEngine)")
    print(f"  plain         {rate(len(jobs), plain, 2)} CPU, {rate(len(jobs), plain, 1)} wall "
          "(AnalyticalEstimator.price plan by plan, fresh)")
    if report.plans:
        best = report.plans[0]
        print(f"best plan       {best.parallel.describe()}")
        result = best.result
        print(f"                {result.tokens_per_s:,.0f} tokens/s, {result.iteration_time_s:.3f} s per "
              f"iteration, MFU {result.mfu * 100:.1f}%, peak {result.peak_memory_gib:.1f} GiB")
    else:
        print("best plan       none feasible")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(search)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
