"""The simulator against the analytical engine on interleaved pipelines whose chunks differ: heavy LM heads
(aligned vocabularies), light first/last stages, the embedding and loss counted, explicit stage lists; pp 2-8,
vpp 2-4, m from p to 8p. Runtime effects off (overlap slow-down and bandwidth sharing), both engines on one
pricer, as tests/validation/test_uneven_pipelines.py builds them; DGX A100 80GB servers, seq 2048, micro-batch
1. Prints one markdown row per job: the simulator's iteration time and sim / analytical - 1.

    python scripts/uneven_agreement.py   (run it on two trees with PYTHONPATH to compare them)
"""

from typing import Any

from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import load_calibration
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

GPT = load_model("gpt3-1.3b")
HEAD = GPT.model_copy(update={"vocab": 301_824, "name": "GPT-3 1.3B, vocab 301,824"})
HUGE = GPT.model_copy(update={"vocab": 1_000_448, "name": "GPT-3 1.3B, vocab 1,000,448"})
HEAD30 = HEAD.model_copy(update={"num_layers": 30, "name": "GPT-3 1.3B 30 layers, vocab 301,824"})
LLAMA = load_model("llama3.1-8b")
SMALL = load_model("gpt3-125m").model_copy(update={"vocab": 301_824, "name": "GPT-3 125M, vocab 301,824"})
ENDS4: dict[str, Any] = {"first_stage_layers": 4, "last_stage_layers": 4}
COUNTED: dict[str, Any] = {"embedding_in_split": True, "loss_in_split": True}
ONES = (1,) * 24

JOBS: list[tuple[ModelSpec, int, dict[str, Any]]] = [
    (GPT, 8, {"pp": 4, "vpp": 2, "global_batch": 32, **ENDS4}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 32, **ENDS4}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 16, **ENDS4}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 64, **ENDS4}),
    (HUGE, 8, {"pp": 4, "vpp": 2, "global_batch": 32, **ENDS4}),
    (HEAD, 8, {"pp": 4, "vpp": 3, "global_batch": 32, **COUNTED}),
    (HEAD, 8, {"pp": 4, "vpp": 3, "global_batch": 16, **COUNTED}),
    (HEAD, 8, {"pp": 2, "vpp": 2, "global_batch": 16, "first_stage_layers": 10, "last_stage_layers": 14}),
    (HEAD, 8, {"pp": 2, "vpp": 4, "global_batch": 24, "stage_layers": (3,) * 8}),
    (HEAD, 8, {"pp": 2, "vpp": 3, "global_batch": 32, "stage_layers": (4,) * 6}),
    (HEAD, 8, {"pp": 2, "vpp": 3, "global_batch": 16, "stage_layers": (4,) * 6}),
    (HEAD30, 8, {"pp": 4, "vpp": 2, "global_batch": 32}),
    (HEAD30, 8, {"pp": 4, "vpp": 2, "global_batch": 16, **COUNTED}),
    (HEAD, 8, {"pp": 8, "vpp": 3, "global_batch": 32, "stage_layers": ONES}),
    (HEAD, 8, {"pp": 8, "vpp": 3, "global_batch": 8, "stage_layers": ONES}),
    (HEAD, 16, {"pp": 8, "vpp": 2, "global_batch": 16, "first_stage_layers": 2, "last_stage_layers": 4}),
    (HUGE, 8, {"pp": 8, "vpp": 3, "global_batch": 16, "stage_layers": ONES}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "stage_layers": (3, 3, 3, 4, 3, 3, 3, 2)}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "stage_layers": (2, 3, 3, 3, 3, 3, 3, 4)}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "stage_layers": (5, 3, 3, 3, 1, 3, 3, 3)}),
    (HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "stage_layers": (1, 3, 3, 3, 5, 3, 3, 3)}),
    (GPT, 8, {"pp": 4, "vpp": 2, "global_batch": 16, "stage_layers": (6, 2, 2, 2, 2, 2, 2, 6)}),
    (LLAMA, 8, {"pp": 4, "vpp": 2, "tp": 2, "global_batch": 4, **COUNTED}),
    (LLAMA, 8, {"pp": 4, "vpp": 2, "tp": 2, "global_batch": 16, "first_stage_layers": 6, "last_stage_layers": 6}),
    (SMALL, 8, {"pp": 4, "vpp": 3, "global_batch": 32, "stage_layers": (1,) * 12}),
    (HEAD, 8, {"pp": 2, "vpp": 4, "global_batch": 32, "first_stage_layers": 8, "last_stage_layers": 16}),
    (HEAD, 8, {"pp": 4, "vpp": 4, "global_batch": 64, **COUNTED}),
    (HEAD, 8, {"pp": 8, "vpp": 2, "global_batch": 64, "first_stage_layers": 2, "last_stage_layers": 2}),
    (HEAD, 8, {"pp": 8, "vpp": 3, "global_batch": 16, **COUNTED}),
    (LLAMA, 16, {"pp": 8, "vpp": 2, "tp": 2, "global_batch": 16, "first_stage_layers": 2, "last_stage_layers": 2}),
    (LLAMA, 16, {"pp": 8, "vpp": 4, "tp": 2, "global_batch": 32, **COUNTED}),
    (HEAD30, 16, {"pp": 8, "vpp": 2, "global_batch": 32, "stage_layers": (1,) + (2,) * 14 + (1,)}),
    (SMALL, 8, {"pp": 4, "vpp": 2, "global_batch": 32}),
]


def main() -> None:
    pricer = Pricer(load_calibration().model_copy(update={"sim_runtime": None}))
    analytical, sim = AnalyticalEstimator(pricer), SimEstimator(pricer, overlap=False, sharing=False)
    print("| # | model | GPUs | settings | m | sim (s) | sim / analytical - 1 |")
    print("|---:|---|---:|---|---:|---:|---:|")
    for index, (model, num_gpus, settings) in enumerate(JOBS):
        par = ParallelSpec(seq_len=2048, schedule="interleaved-1f1b", **settings)
        job = make_job(model, load_cluster("dgx-a100-80gb").with_num_gpus(num_gpus), par)
        graph = graph_for(job)
        sim_s = sim.estimate(job, graph).iteration_time_s
        gap = sim_s / analytical.estimate(job, graph).iteration_time_s - 1.0
        shown = ", ".join(f"{key}={value}" for key, value in settings.items())
        print(f"| {index} | {model.name} | {num_gpus} | {shown} | {job.parallel.num_micro_batches} | {sim_s:.4f} "
              f"| {100 * gap:+.2f}% |")


if __name__ == "__main__":
    main()
