"""Speed of the simulation engine on issue 3's acceptance case: GPT-3 175B on 1,024 A100s (tp 8, pp 16, dp 8,
micro-batch 1, global batch 1,536, interleaved 1F1B with 3 virtual stages), and the same job at dp 64.

    python benchmarks/bench_sim.py [--repeat N] [--recompute none|selective|full] [--task-level layer|op]

Per case: CPU seconds to compile the ExecGraph (plan and compile passes), to simulate it (the event loop,
flattening included) and to derive the breakdown and memory from the outcome, each the median of --repeat
runs, and the median wall seconds of the three (CPU time is steadier where other work shares the cores);
the op graph and layer costs are built once beforehand, as the planner's cache would hold them. Then tasks,
engine events and events per second; then the dp 64 / dp 8 time ratio (acceptance: < 1.2, and < 10 s per
case, the goal 1 s). dp 64 keeps the 192 micro-batches per pipeline (global batch x 8).
Recompute defaults to full, as Narayanan et al. 2021 ran this configuration. --straggler X makes rank 9 X times
slower: its pipeline column gets timelines of its own (compile/device_classes.py), at dp 8 and at dp 64 alike.
"""

import argparse
import gc
import statistics
import time

from trainsim.catalog import load_cluster, load_model
from trainsim.compile.build import compile_job
from trainsim.estimate.simulation import SimEstimator, bottleneck_device, busy_by_device, sim_breakdown, sim_memory
from trainsim.ir.graph import OpGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.sim import simulate
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec

CASES = ((8, 1536), (64, 1536 * 8))  # (dp, global batch): 192 micro-batches per pipeline either way


def _job(dp: int, global_batch: int, recompute: str, straggler: float) -> Job:
    par = ParallelSpec.parse({"tp": 8, "pp": 16, "dp": dp, "vpp": 3, "schedule": "interleaved-1f1b",
                              "micro_batch": 1, "global_batch": global_batch, "seq_len": 2048,
                              "recompute": recompute})
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(8 * 16 * dp)
    if straggler != 1.0:  # rank 9 (stage 0, replica 1) slow: two device classes (compile/device_classes.py)
        cluster = cluster.model_copy(update={"compute_slowdown": {9: straggler}})
    return make_job(load_model("gpt3-175b"), cluster, par)


def _phases(estimator: SimEstimator, job: Job, op_graph: OpGraph) -> tuple[float, float, float, float, int, int, float]:
    """One run as SimEstimator.estimate does it, timed per phase in CPU seconds: (compile, simulate, breakdown,
    wall seconds of the three, tasks, events, iteration s)."""
    gc.disable()  # as SimEstimator.run does
    try:
        wall, start = time.perf_counter(), time.process_time()
        plan = default_plan(op_graph, job.parallel)
        graph = compile_job(job, plan, estimator.pricer, estimator.task_level)
        compiled = time.process_time()
        outcome = simulate(graph, estimator.options)
        simulated = time.process_time()
        busy = busy_by_device(graph, outcome)  # as SimEstimator.run and estimate share it
        device = bottleneck_device(graph, outcome, busy)
        sim_breakdown(graph, outcome, device, busy)
        sim_memory(outcome)
        accounted, wall = time.process_time(), time.perf_counter() - wall
    finally:
        gc.enable()
    return (compiled - start, simulated - compiled, accounted - simulated, wall, graph.num_tasks, outcome.events,
            outcome.makespan_s)


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed of the simulation engine.")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--recompute", default="full", choices=("none", "selective", "full"))
    parser.add_argument("--task-level", default="layer", choices=("layer", "op"))
    parser.add_argument("--straggler", type=float, default=1.0,
                        help="compute slow-down of rank 9 (1: all ranks alike, one timeline per stage)")
    args = parser.parse_args()

    seconds: dict[int, float] = {}
    for dp, global_batch in CASES:
        job = _job(dp, global_batch, args.recompute, args.straggler)
        op_graph = graph_for(job)
        estimator = SimEstimator(task_level=args.task_level)  # as `trainsim predict --engine sim` builds it
        estimator.estimate(job, op_graph)  # price the layers once
        runs = [_phases(estimator, job, op_graph) for _ in range(args.repeat)]
        compile_s, simulate_s, account_s, wall_s = (statistics.median(run[i] for run in runs) for i in range(4))
        total_s = statistics.median(run[0] + run[1] + run[2] for run in runs)
        tasks, events, makespan_s = runs[-1][4], runs[-1][5], runs[-1][6]
        seconds[dp] = total_s
        print(f"dp={dp:<3d} {job.describe()}")
        print(f"  {total_s:.3f} s CPU (median of {args.repeat}; wall {wall_s:.3f} s): compile {compile_s:.3f} s, "
              f"simulate {simulate_s:.3f} s, breakdown and memory {account_s:.3f} s")
        print(f"  {tasks:,} tasks  {events:,} events  {events / simulate_s:,.0f} events/s  "
              f"iteration {makespan_s:.3f} s")
    ratio = seconds[64] / seconds[8]
    print(f"dp 64 / dp 8 time ratio: {ratio:.3f} (must be < 1.2)")


if __name__ == "__main__":
    main()
