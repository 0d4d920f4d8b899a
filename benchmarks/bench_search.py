"""Speed of `trainsim search` on the acceptance case: LLaMA-3.1-70B, 1,024 H100s, global batch 1,024 x 8,192.

    python benchmarks/bench_search.py [--model NAME] [--cluster NAME_OR_YAML] [--num-gpus N] [--profile]

Prints the plans evaluated, the seconds the search took (enumeration + make_job + estimate, one fresh
AnalyticalEstimator, imports and catalog loading excluded), plans per second and the best plan.
"""

import argparse
import cProfile
import pstats
import time

from trainsim.catalog import load_cluster, load_model
from trainsim.search import Planner, SearchSpace


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed of the strategy search.")
    parser.add_argument("--model", default="llama3.1-70b")
    parser.add_argument("--cluster", default="dgx-h100-80gb")
    parser.add_argument("--num-gpus", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--profile", action="store_true",
                        help="also print the top 15 functions by cumulative time")
    args = parser.parse_args()

    model = load_model(args.model)
    cluster = load_cluster(args.cluster).with_num_gpus(args.num_gpus)
    space = SearchSpace(global_batch=args.global_batch, seq_len=args.seq_len)
    profiler = cProfile.Profile() if args.profile else None

    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    report = Planner().search(model, cluster, space, top_k=1)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - start

    print(f"case            {model.name} on {cluster.name} ({cluster.num_gpus} GPUs), "
          f"global batch {space.global_batch} x {space.seq_len}")
    print(f"plans evaluated {report.tried} ({report.feasible} feasible; "
          + ", ".join(f"{reason}: {count}" for reason, count in report.infeasible.items()) + ")")
    print(f"seconds         {seconds:.3f}")
    print(f"plans/s         {report.tried / seconds:,.0f}")
    if report.plans:
        best = report.plans[0]
        print(f"best plan       {best.parallel.describe()}")
        result = best.result
        print(f"                {result.tokens_per_s:,.0f} tokens/s, {result.iteration_time_s:.3f} s per "
              f"iteration, MFU {result.mfu * 100:.1f}%, peak {result.peak_memory_gib:.1f} GiB")
    else:
        print("best plan       none feasible")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
