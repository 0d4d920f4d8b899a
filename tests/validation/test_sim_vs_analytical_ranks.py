"""The fidelity ladder where the cluster's ranks differ (rank_devices, compute_slowdown): with the overlap
slow-down and bandwidth sharing off, the analytical engine's device classes (Pricer.class_stage_costs: each
class a pipeline column at its stages' slowest kind of rank, the iteration the slowest column's) agree with the
simulator's per-class timelines within the 2% of the homogeneous ladder (test_sim_vs_analytical.py).

The cases: a straggler in a data-parallel pair, a V100 among A100s, a straggler in the first and in the last
stage of a pipeline, two stragglers in different columns and stages, each schedule (GPipe, 1F1B, interleaved,
ZB-H1), full recompute, ZeRO 1 and 3, context parallelism, two nodes with both fields, and a MoE with expert
parallelism (its all-to-alls join the columns every micro-batch: one lockstep column of each stage's slowest
class), two stragglers in different columns and stages with and without ZeRO-3 (whose prefetched gathers
leave the columns apart in both engines). Measured: within 1.7% (ZeRO-3 dp 4 -1.6%, ZB-H1 -1.6%, the others
within 0.9%)."""

import dataclasses

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_device, load_model
from trainsim.catalog.calibration import load_calibration
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

TOLERANCE = 0.02
V100 = load_device("v100-sxm2-32gb")
A100_40 = load_device("a100-sxm4-40gb")

CASES: list[tuple[str, int, dict[str, object], dict[str, object]]] = [
    ("gpt3-125m", 2, {"compute_slowdown": {1: 2.0}}, {"dp": 2}),
    ("gpt3-125m", 2, {"rank_devices": {1: V100}}, {"dp": 2}),
    ("gpt3-125m", 4, {"compute_slowdown": {1: 1.5}}, {"dp": 2, "pp": 2}),
    ("gpt3-125m", 4, {"compute_slowdown": {3: 1.5}}, {"dp": 2, "pp": 2}),
    ("gpt3-125m", 8, {"compute_slowdown": {0: 1.5, 5: 1.5}}, {"dp": 2, "pp": 4}),
    ("gpt3-125m", 8, {"compute_slowdown": {1: 1.3, 6: 1.5}}, {"dp": 2, "pp": 2, "tp": 2}),
    ("gpt3-125m", 8, {"rank_devices": {5: V100}}, {"dp": 4, "pp": 2}),
    ("gpt3-125m", 8, {"compute_slowdown": {2: 1.4}}, {"dp": 2, "pp": 4, "schedule": "gpipe"}),
    ("gpt3-125m", 8, {"compute_slowdown": {2: 1.4}}, {"dp": 2, "pp": 4, "vpp": 2, "schedule": "interleaved-1f1b"}),
    ("gpt3-125m", 8, {"compute_slowdown": {2: 1.4}}, {"dp": 2, "pp": 4, "schedule": "zb-h1"}),
    ("gpt3-125m", 4, {"compute_slowdown": {1: 1.5}}, {"dp": 2, "pp": 2, "recompute": "full"}),
    ("gpt3-125m", 8, {"compute_slowdown": {1: 1.2}}, {"dp": 8, "zero": 1}),
    ("gpt3-125m", 4, {"compute_slowdown": {1: 1.5}}, {"dp": 4, "zero": 3}),
    ("gpt3-125m", 4, {"compute_slowdown": {1: 1.5, 2: 1.5}}, {"dp": 2, "pp": 2}),
    ("gpt3-125m", 4, {"compute_slowdown": {1: 1.5, 2: 1.5}}, {"dp": 2, "pp": 2, "zero": 3}),
    ("gpt3-125m", 8, {"compute_slowdown": {7: 1.2}}, {"dp": 4, "cp": 2}),
    ("gpt3-125m", 16, {"compute_slowdown": {5: 1.3}, "rank_devices": {9: A100_40}}, {"tp": 2, "pp": 2, "dp": 4}),
    ("mixtral-8x7b", 32, {"compute_slowdown": {3: 1.3, 21: 1.5}}, {"tp": 2, "pp": 2, "dp": 8, "ep": 4}),
]


def _job(model: str, num_gpus: int, ranks: dict[str, object], strategy: dict[str, object]) -> Job:
    batch = 64 if model == "mixtral-8x7b" else 4 * num_gpus
    seq = 1024 if model == "mixtral-8x7b" else 512
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": seq, "global_batch": batch, **strategy})
    job = make_job(load_model(model), a100_cluster(num_gpus), par)
    return dataclasses.replace(job, cluster=job.cluster.model_copy(update=ranks))


def _case_id(model: str, num_gpus: int, ranks: dict[str, object], strategy: dict[str, object]) -> str:
    return f"{model}-{num_gpus}-{'-'.join(f'{k}{v}' for k, v in strategy.items())}-{'-'.join(ranks)}"


@pytest.mark.parametrize(("model", "num_gpus", "ranks", "strategy"), CASES, ids=[_case_id(*c) for c in CASES])
def test_analytical_agrees_with_the_simulator_where_ranks_differ(model: str, num_gpus: int,
                                                                 ranks: dict[str, object],
                                                                 strategy: dict[str, object]) -> None:
    pricer = Pricer(load_calibration().model_copy(update={"sim_runtime": None}))
    analytical = AnalyticalEstimator(pricer)
    sim = SimEstimator(pricer, overlap=False, sharing=False)
    job = _job(model, num_gpus, ranks, strategy)
    plain = dataclasses.replace(job, cluster=job.cluster.model_copy(update={"rank_devices": {},
                                                                             "compute_slowdown": {}}))
    expected = analytical.estimate(job, graph_for(job))
    got = sim.estimate(job, graph_for(job))
    assert got.iteration_time_s == pytest.approx(expected.iteration_time_s, rel=TOLERANCE)
    # the ranks matter: both engines price the job slower than with every rank alike
    assert expected.iteration_time_s > analytical.estimate(plain, graph_for(plain)).iteration_time_s
    assert got.iteration_time_s > sim.estimate(plain, graph_for(plain)).iteration_time_s
    assert expected.memory_capacity_bytes == got.memory_capacity_bytes
