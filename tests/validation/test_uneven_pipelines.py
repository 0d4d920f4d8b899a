"""Uneven pipeline stages (strategy.stages): with the overlap slow-down and bandwidth sharing off, the simulator
agrees with the analytical engine within 2% on iteration time (as tests/validation/test_sim_vs_analytical.py
asks of the calibration runs) and stage by stage on peak memory; a Llama-3.1-405B job on pp 8 x vpp 4 with
the embedding and the loss counted predicts through `trainsim predict` with both engines.

Interleaved pipelines whose ranks' chunks differ (a heavy LM head on the last chunk: an aligned vocabulary of
301,824 on GPT-3 1.3B is a head of about ten layers; light first/last stages; the embedding and loss counted)
were up to 12% slower simulated than the closed form before it modelled their warm-up, drain and steady
rounds (estimate.interleaved_rounds); INTERLEAVED_UNEVEN holds them. What remains between the engines on these
cases (measured maximum 1.4%, the analytical engine the slower): a stage's forward/backward split and host
overhead spread over its chunks by their compute (the head's forward share differs from the blocks'); the
engines' known differences on even splits (the last data-parallel bucket, one-way sends at the end stages).
"""

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import load_calibration
from trainsim.cli.main import app
from trainsim.cost.memory import chunk_shares, stage_in_flight, stage_memory_base, stage_memory_values
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

TOLERANCE = 0.02
INTERLEAVED: dict[str, Any] = {"schedule": "interleaved-1f1b"}
GPT = load_model("gpt3-1.3b")  # 24 layers
GPT30 = GPT.model_copy(update={"num_layers": 30, "name": "gpt3-1.3b-30-layers"})
LLAMA = load_model("llama3.1-8b")  # 32 layers

# (model, GPUs, strategy) on DGX A100-80GB nodes, seq 2048
CASES: list[tuple[ModelSpec, int, dict[str, Any]]] = [
    (GPT30, 8, {"pp": 4, "global_batch": 32}),  # 30 layers on pp 4: 8, 8, 7, 7
    (GPT30, 8, {"pp": 4, "vpp": 2, "global_batch": 32, **INTERLEAVED}),
    (GPT30, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "embedding_in_split": True, "loss_in_split": True,
                **INTERLEAVED}),
    (GPT30, 8, {"pp": 4, "global_batch": 32, "embedding_in_split": True, "loss_in_split": True,
                "recompute": "full"}),
    (GPT30, 8, {"pp": 4, "global_batch": 32, "schedule": "zb-h1"}),
    (GPT, 8, {"pp": 4, "global_batch": 32, "first_stage_layers": 4, "last_stage_layers": 4}),
    (GPT, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "first_stage_layers": 4, "last_stage_layers": 4,
              **INTERLEAVED}),
    (GPT, 8, {"pp": 4, "global_batch": 32, "stage_layers": (9, 5, 5, 5)}),  # the first stage is the slowest
    (GPT, 8, {"pp": 4, "global_batch": 32, "stage_layers": (5, 5, 5, 9)}),
    (GPT, 8, {"pp": 4, "vpp": 2, "global_batch": 32, "stage_layers": (3, 3, 3, 4, 3, 3, 3, 2), **INTERLEAVED}),
    (GPT, 8, {"pp": 4, "global_batch": 64, "vpp": 3, "embedding_in_split": True, "loss_in_split": True,
              **INTERLEAVED}),
    (LLAMA, 8, {"pp": 4, "tp": 2, "global_batch": 16, "stage_layers": (7, 9, 9, 7)}),
    (LLAMA, 16, {"pp": 4, "tp": 2, "global_batch": 32, "schedule": "gpipe", "embedding_in_split": True}),
]

GPT_HEAD = GPT.model_copy(update={"vocab": 301_824, "name": "gpt3-1.3b-vocab-301824"})  # a head of ~10 layers
FIRST_LAST_4: dict[str, Any] = {"first_stage_layers": 4, "last_stage_layers": 4}
FIRST_LAST_2: dict[str, Any] = {"first_stage_layers": 2, "last_stage_layers": 2}
COUNTED: dict[str, Any] = {"embedding_in_split": True, "loss_in_split": True}
# interleaved, chunks that differ; sim / analytical - 1 before the closed form modelled them in brackets
INTERLEAVED_UNEVEN: list[tuple[ModelSpec, int, dict[str, Any]]] = [
    (GPT_HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 32, **FIRST_LAST_4, **INTERLEAVED}),  # +6.8%
    (GPT_HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 16, **FIRST_LAST_4, **INTERLEAVED}),  # +7.8%, m = 2p
    (GPT_HEAD, 8, {"pp": 4, "vpp": 2, "global_batch": 64, **FIRST_LAST_4, **INTERLEAVED}),  # +6.3%, m = 8p
    (GPT.model_copy(update={"vocab": 1_000_448, "name": "gpt3-1.3b-vocab-1000448"}), 8,
     {"pp": 4, "vpp": 2, "global_batch": 32, **FIRST_LAST_4, **INTERLEAVED}),  # +2.6%: a head of ~33 layers
    (GPT_HEAD, 8, {"pp": 8, "vpp": 2, "global_batch": 64, **FIRST_LAST_2, **INTERLEAVED}),  # +4.2%
    (GPT_HEAD, 8, {"pp": 8, "vpp": 3, "global_batch": 16, **COUNTED, **INTERLEAVED}),  # +2.7%
    (GPT, 8, {"pp": 4, "vpp": 2, "global_batch": 16, "stage_layers": (6, 2, 2, 2, 2, 2, 2, 6),
              **INTERLEAVED}),  # +12.0%: heavy first and last chunks
    (LLAMA, 8, {"pp": 4, "vpp": 2, "tp": 2, "global_batch": 4, **COUNTED, **INTERLEAVED}),  # +5.2%, m = p
    (LLAMA, 16, {"pp": 8, "vpp": 2, "tp": 2, "global_batch": 16, **FIRST_LAST_2, **INTERLEAVED}),  # +12.0%
    (LLAMA, 16, {"pp": 8, "vpp": 4, "tp": 2, "global_batch": 32, **COUNTED, **INTERLEAVED}),  # +3.4%
]


def _job(model: ModelSpec, num_gpus: int, settings: dict[str, Any]) -> Job:
    par = ParallelSpec(seq_len=2048, **settings)
    return make_job(model, load_cluster("dgx-a100-80gb").with_num_gpus(num_gpus), par)


def _engines() -> tuple[AnalyticalEstimator, SimEstimator]:
    # Same costs and the same runtime parameters (not the simulator's own fit): the engines must agree.
    pricer = Pricer(load_calibration().model_copy(update={"sim_runtime": None}))
    return AnalyticalEstimator(pricer), SimEstimator(pricer, overlap=False, sharing=False)


@pytest.mark.parametrize(("model", "num_gpus", "settings"), CASES + INTERLEAVED_UNEVEN)
def test_sim_agrees_with_analytical_on_uneven_splits(model: ModelSpec, num_gpus: int,
                                                     settings: dict[str, Any]) -> None:
    analytical, sim = _engines()
    job = _job(model, num_gpus, settings)
    graph = graph_for(job)
    expected = analytical.estimate(job, graph).iteration_time_s
    got = sim.estimate(job, graph).iteration_time_s
    assert got == pytest.approx(expected, rel=TOLERANCE)


MEMORY_CASES = [CASES[0], CASES[2], CASES[3], CASES[6], CASES[7], CASES[10], CASES[11]]


@pytest.mark.parametrize(("model", "num_gpus", "settings"), MEMORY_CASES)
def test_peak_memory_per_stage_agrees_with_the_simulator(model: ModelSpec, num_gpus: int,
                                                         settings: dict[str, Any]) -> None:
    analytical, sim = _engines()
    job = _job(model, num_gpus, settings)
    graph = graph_for(job)
    partition = analytical.pricer.plan_partition(graph, job.parallel)
    run = sim.run(job, graph)
    par, reserved = job.parallel, job.cluster.device.runtime_reserved_bytes
    # NB: the stage of the head is left out: there the engines differ on even splits too (the analytical
    # engine's working buffer for the logits' gradient; up to 5% of that stage's memory on GPT-3 1.3B)
    for index, stage in enumerate(partition.stages[:-1]):
        shares = chunk_shares(stage, partition.chunk_blocks[index], par.recompute) if partition.chunk_blocks else None
        values = stage_memory_values(stage_memory_base(stage, par), stage_in_flight(par, index, shares), reserved)
        assert sum(values) == pytest.approx(run.outcome.memory[index].peak_bytes, rel=1e-3), index


LLAMA_405B_FLAGS = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--num-gpus", "512", "--tp", "8",
                    "--sp", "--pp", "8", "--vpp", "4", "--embedding-in-split", "--loss-in-split", "--zero", "1",
                    "--recompute", "full", "--micro-batch", "1", "--global-batch", "128", "--seq-len", "8192",
                    "--json"]


def test_llama_405b_on_pp8_vpp4_with_embedding_and_loss_counted_predicts_with_both_engines() -> None:
    """126 blocks + the embedding + the loss = 128 = 8 x 4 x 4 layers (Megatron-Core's split of Llama 3.1
    405B); tp 8 x pp 8 x dp 8 on 512 H100s. Predicted, not refused, by both engines, within 2% of each
    other (each with its own calibration, runtime effects on)."""
    runner = CliRunner()
    times = {}
    for engine in ("analytical", "sim"):
        result = runner.invoke(app, ["predict", *LLAMA_405B_FLAGS, "--engine", engine])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["oom"] is False
        times[engine] = data["iteration_time_s"]
    assert times["sim"] == pytest.approx(times["analytical"], rel=TOLERANCE)
