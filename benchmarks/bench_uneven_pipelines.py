"""Speed of the analytical engine on interleaved pipelines whose chunks differ (uneven splits, heavy LM heads):
microseconds per plan priced (AnalyticalEstimator.price), its caches warm (what another pricing of the same
stages costs: another batch size or data-parallel degree), and with the chunks' terms recomputed
(estimate.interleaved_rounds.interleaved_terms_s's cache cleared before each pricing: a plan whose stage times
are new), and with the gather indices of its pipeline shape rebuilt too (estimate.steady_waits's caches
cleared: the first plan of a shape, p, v and the ranks whose chunks differ; a twentieth of the repeats); in CPU
time (time.process_time, this process only), the best of 5 repeats.

    python benchmarks/bench_uneven_pipelines.py [--repeats N]
"""

import argparse
import time
import timeit
from typing import Any

from trainsim.catalog import load_cluster, load_model
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.interleaved_rounds import interleaved_terms_s
from trainsim.estimate.steady_waits import clear_layouts
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

INTERLEAVED: dict[str, Any] = {"schedule": "interleaved-1f1b", "seq_len": 2048}
GPT = load_model("gpt3-1.3b")
GPT_HEAD = GPT.model_copy(update={"vocab": 301_824, "name": "gpt3-1.3b-vocab-301824"})
LLAMA = load_model("llama3.1-8b")
CASES: list[tuple[str, Any, int, dict[str, Any]]] = [
    ("gpt3-1.3b vocab 301,824, pp 4 x vpp 2, first/last 4, m 16", GPT_HEAD, 8,
     {"pp": 4, "vpp": 2, "global_batch": 32, "first_stage_layers": 4, "last_stage_layers": 4}),
    ("gpt3-1.3b vocab 301,824, pp 8 x vpp 3, one layer per chunk, m 32", GPT_HEAD, 8,
     {"pp": 8, "vpp": 3, "global_batch": 32, "stage_layers": (1,) * 24}),
    ("gpt3-1.3b, pp 4 x vpp 2, stage layers 6,2,...,2,6, m 8", GPT, 8,
     {"pp": 4, "vpp": 2, "global_batch": 16, "stage_layers": (6, 2, 2, 2, 2, 2, 2, 6)}),
    ("llama3.1-8b, tp 2, pp 8 x vpp 2, first/last 2, m 16", LLAMA, 16,
     {"pp": 8, "vpp": 2, "tp": 2, "global_batch": 16, "first_stage_layers": 2, "last_stage_layers": 2}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description="Speed of the analytical engine on uneven interleaved pipelines.")
    parser.add_argument("--repeats", type=int, default=2000, help="pricings per timing (default 2000)")
    args = parser.parse_args()
    engine = AnalyticalEstimator()
    for label, model, num_gpus, settings in CASES:
        job = make_job(model, load_cluster("dgx-a100-80gb").with_num_gpus(num_gpus),
                       ParallelSpec(**INTERLEAVED, **settings))
        graph = graph_for(job)
        engine.price(job, graph)
        warm = timeit.Timer(lambda job=job, graph=graph: engine.price(job, graph), timer=time.process_time)
        fresh = timeit.Timer(lambda job=job, graph=graph: (interleaved_terms_s.cache_clear(), engine.price(job, graph)),
                             timer=time.process_time)
        shape = timeit.Timer(lambda job=job, graph=graph: (interleaved_terms_s.cache_clear(), clear_layouts(),
                                                           engine.price(job, graph)), timer=time.process_time)
        warm_s = min(warm.repeat(5, args.repeats)) / args.repeats
        fresh_s = min(fresh.repeat(5, args.repeats)) / args.repeats
        shape_repeats = max(1, args.repeats // 20)
        shape_s = min(shape.repeat(5, shape_repeats)) / shape_repeats
        print(f"{warm_s * 1e6:8.1f} us/plan warm {fresh_s * 1e6:8.1f} us/plan terms recomputed "
              f"{shape_s * 1e6:8.1f} us/plan new shape  {label}")


if __name__ == "__main__":
    main()
