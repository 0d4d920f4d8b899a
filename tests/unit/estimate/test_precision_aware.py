"""The seed-001 predictor (engine "precision-aware"): Algorithm 1's subgraphs and Eq. 1-4, checked by hand on
a tiny GPT with a constant op cost, plus its precision sensitivity and its use of a profile database."""

from pathlib import Path

import pytest

from conftest import TINY_GPT, ConstantCosts, a100_cluster
from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.model_files import parse_model
from trainsim.estimate.engines import make_engine
from trainsim.estimate.precision_aware import (
    PrecisionAwareEstimator,
    gradient_bytes,
    partition,
    sliced_gradient_bytes,
)
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for, predict
from trainsim.profile.database import Environment, ProfileDB
from trainsim.profile.job import job_graph
from trainsim.profile.ops import optimizer_signature, unique_signatures
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision, policy_for

OP_S = 1e-3


def _job(precision: Precision = "bf16", tp: int = 2, pp: int = 2, dp: int = 2, global_batch: int = 4) -> Job:
    return make_job(parse_model(TINY_GPT), a100_cluster(tp * pp * dp),
                    ParallelSpec(tp=tp, pp=pp, dp=dp, micro_batch=1, seq_len=16, global_batch=global_batch,
                                 precision=precision))


def test_algorithm1_makes_one_subgraph_per_gpu() -> None:
    job = _job()
    subgraphs = partition(graph_for(job), job.parallel)
    assert len(subgraphs) == 8  # PP x DP x TP
    assert {(s.stage, s.dp_rank, s.tp_rank) for s in subgraphs} == {
        (s, d, t) for s in range(2) for d in range(2) for t in range(2)}
    first = [part.layer.kind for part in subgraphs[0].parts]
    last = [part.layer.kind for part in subgraphs[-1].parts]
    assert first == ["embedding", "block"] and last == ["block", "head"]
    assert all(s.sliced for s in subgraphs)


def test_equations_1_to_4_by_hand() -> None:
    job = _job()
    estimator = PrecisionAwareEstimator(op_costs=ConstantCosts(OP_S), optimizer=False)
    result = estimator.estimate(job, graph_for(job))
    graph = graph_for(job)
    subgraphs = partition(graph, job.parallel)

    def ops(stage: int) -> float:
        return sum(p.count * (len(p.layer.fwd) + len(p.layer.bwd)) for p in subgraphs[stage * 4].parts)

    slowest = max((0, 1), key=ops)
    parts = subgraphs[slowest * 4].parts
    t_comp = 2 * ops(slowest) * OP_S  # two micro-batches
    link = 300e9  # nvlink3-nvswitch: both groups stay inside the node
    # bf16: every weight-owning op is a 2-byte op
    v_dp = sum(p.count * p.layer.param_count * 2 for p in parts)
    v_tp = sum(p.count * (p.layer.full_param_count - p.layer.param_count) * 2 for p in parts)  # tp - 1 = 1
    assert gradient_bytes(parts) == pytest.approx(v_dp)
    assert sliced_gradient_bytes(parts, 2) == pytest.approx(v_tp)
    assert result.breakdown == pytest.approx({"compute": t_comp, "dp_comm": v_dp / link, "tp_comm": v_tp / link,
                                              "bubble": t_comp * (2 - 1)})
    assert result.iteration_time_s == pytest.approx(2 * t_comp + (v_dp + v_tp) / link)
    assert result.engine == "precision-aware"


def test_no_parallelism_means_compute_alone() -> None:
    job = _job(tp=1, pp=1, dp=1, global_batch=1)
    result = PrecisionAwareEstimator(op_costs=ConstantCosts(OP_S), optimizer=False).estimate(job, graph_for(job))
    assert result.breakdown["dp_comm"] == result.breakdown["tp_comm"] == result.breakdown["bubble"] == 0.0
    graph = job_graph(parse_model(TINY_GPT), DeviceSlice(1, 16, policy_for("bf16")))
    assert result.iteration_time_s == pytest.approx(graph.num_ops * OP_S)


def test_gradient_volume_follows_operator_precision() -> None:
    estimator = PrecisionAwareEstimator(op_costs=ConstantCosts(OP_S), optimizer=False)
    fp32, amp = (predict(_job(precision), estimator) for precision in ("fp32", "amp-bf16"))
    assert fp32.breakdown["dp_comm"] == pytest.approx(2 * amp.breakdown["dp_comm"])
    assert fp32.breakdown["tp_comm"] == pytest.approx(2 * amp.breakdown["tp_comm"])


def test_roofline_op_times_make_fp32_slower_than_bf16() -> None:
    def job(precision: Precision) -> Job:
        return make_job(load_model("gpt2-124m"), load_cluster("dgx-a100-80gb"),
                        ParallelSpec(tp=2, pp=2, dp=2, micro_batch=4, seq_len=1024, precision=precision))

    fp32 = make_engine("precision-aware").estimate(job("fp32"), graph_for(job("fp32")))
    bf16 = make_engine("precision-aware").estimate(job("bf16"), graph_for(job("bf16")))
    assert fp32.iteration_time_s > 2 * bf16.iteration_time_s  # A100: 19.5 vs 312 TFLOP/s peaks
    assert sum(fp32.breakdown.values()) == pytest.approx(fp32.iteration_time_s)


def test_profile_database_answers_ops_and_optimizer(tmp_path: Path) -> None:
    job = _job("fp32", tp=1, pp=1, dp=1, global_batch=1)
    graph = job_graph(parse_model(TINY_GPT), DeviceSlice(1, 16, policy_for("fp32")))
    path = tmp_path / "p.sqlite"
    env = Environment("a100-sxm4-80gb", "torch test", 1, "test")
    with ProfileDB.open(path) as db:
        for sig in unique_signatures(graph)[0]:
            db.add_op_samples(env, sig, [2e-3])
        db.add_op_samples(env, optimizer_signature(round(graph.param_count())), [0.5])
    result = PrecisionAwareEstimator(db=path).estimate(job, graph_for(job))
    assert result.breakdown["compute"] == pytest.approx(graph.num_ops * 2e-3)
    assert result.breakdown["optimizer"] == pytest.approx(0.5)
    assert any("exact" in note for note in result.notes)
