"""Speed of the simulation engine on issue 3's acceptance case: GPT-3 175B on 1,024 A100s (tp 8, pp 16, dp 8,
micro-batch 1, global batch 1,536, interleaved 1F1B with 3 virtual stages), and the same job at dp 64.

    python benchmarks/bench_sim.py [--repeat N] [--recompute none|selective|full] [--task-level layer|op]

Per case: seconds to compile the ExecGraph and simulate it (SimEstimator.run: plan, compile, simulate; the
op graph and layer costs are built once beforehand, as the planner's cache would hold them), tasks, engine
events and events per second, best of --repeat runs; then the dp 64 / dp 8 time ratio (acceptance: < 1.2,
and < 10 s per case, the goal 1 s). dp 64 keeps the 192 micro-batches per pipeline (global batch x 8).
Recompute defaults to full, as Narayanan et al. 2021 ran this configuration.
"""

import argparse
import time

from trainsim.catalog import load_cluster, load_model
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import Job, make_job
from trainsim.strategy.parallel import ParallelSpec

CASES = ((8, 1536), (64, 1536 * 8))  # (dp, global batch): 192 micro-batches per pipeline either way


def _job(dp: int, global_batch: int, recompute: str) -> Job:
    par = ParallelSpec.parse({"tp": 8, "pp": 16, "dp": dp, "vpp": 3, "schedule": "interleaved-1f1b",
                              "micro_batch": 1, "global_batch": global_batch, "seq_len": 2048,
                              "recompute": recompute})
    return make_job(load_model("gpt3-175b"), load_cluster("dgx-a100-80gb").with_num_gpus(8 * 16 * dp), par)


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed of the simulation engine.")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--recompute", default="full", choices=("none", "selective", "full"))
    parser.add_argument("--task-level", default="layer", choices=("layer", "op"))
    args = parser.parse_args()

    seconds: dict[int, float] = {}
    for dp, global_batch in CASES:
        job = _job(dp, global_batch, args.recompute)
        analytical = AnalyticalEstimator()
        analytical.estimate(job)  # build the op graph and layer costs once
        estimator = SimEstimator(analytical.cal, analytical=analytical, task_level=args.task_level)
        start = time.perf_counter()
        run = estimator.run(job)
        best = time.perf_counter() - start
        for _ in range(args.repeat - 1):
            start = time.perf_counter()
            run = estimator.run(job)
            best = min(best, time.perf_counter() - start)
        seconds[dp] = best
        tasks, events = len(run.graph.tasks), run.outcome.events
        print(f"dp={dp:<3d} {job.describe()}")
        print(f"  {best:.3f} s (best of {args.repeat})  {tasks:,} tasks  {events:,} events  "
              f"{events / best:,.0f} events/s  iteration {run.outcome.makespan_s:.3f} s")
    ratio = seconds[64] / seconds[8]
    print(f"dp 64 / dp 8 time ratio: {ratio:.3f} (must be < 1.2)")


if __name__ == "__main__":
    main()
