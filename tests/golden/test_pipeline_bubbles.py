"""Pipeline bubbles of the analytical engine against the textbook formulas.

GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021, sec. 2.2.1): with p equal stages that take t per
micro-batch (forward + backward), the bubble is (p - 1) t; the interleaved schedule with v model chunks per
stage cuts it to (p - 1) t / v (Narayanan et al. 2021, sec. 2.2.2). As a fraction of the ideal time m t it is
(p - 1) / (v m). With unequal stages (embedding on the first, head on the last) the engine uses
(sum_i t_i - max_j t_j) / v, and for v = 1 the pipeline takes sum_i t_i + (m - 1) max_j t_j (PredTOP).
"""

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration, ComputeParams
from trainsim.catalog.model_files import parse_model
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec, Schedule
from trainsim.strategy.stages import partition_stages

P = 4
M = 8
# A 16-layer GPT with a 128-token vocabulary: the embedding and the head are ~0.5% of a stage.
MODEL = parse_model({"name": "tiny-gpt", "num_layers": 16, "hidden": 2048, "ffn_hidden": 8192,
                     "num_heads": 16, "vocab": 128, "max_seq_len": 2048})
SCHEDULES: list[tuple[Schedule, int]] = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)]


def _job(schedule: Schedule, v: int, m: int = M) -> Job:
    cluster = a100_cluster(P)
    par = ParallelSpec(pp=P, vpp=v, schedule=schedule, micro_batch=1, global_batch=m, seq_len=2048)
    return make_job(MODEL, cluster, par)


def _estimator() -> AnalyticalEstimator:
    # No per-kernel launch overhead, so the tiny embedding and head stay negligible.
    return AnalyticalEstimator(Pricer(Calibration(compute=ComputeParams(kernel_overhead_s=0.0))))


def _stage_times(est: AnalyticalEstimator, job: Job) -> list[float]:
    stages = partition_stages(graph_for(job), P)
    return [est.pricer.stage_cost(stage, job).total_s for stage in stages]


@pytest.mark.parametrize(("schedule", "v"), SCHEDULES)
def test_bubble_is_p_minus_1_over_v_stage_times(schedule: Schedule, v: int) -> None:
    est = _estimator()
    job = _job(schedule, v)
    bubble = est.estimate(job, graph_for(job)).breakdown["bubble"]
    times = _stage_times(est, job)
    t_mid = times[1]
    assert times[1] == times[2]  # the middle stages hold blocks only
    # Equal stages: (p - 1) t / v (Narayanan et al. 2021); the embedding / head add < 0.5% here.
    assert bubble == pytest.approx((P - 1) * t_mid / v, rel=5e-3)
    # Exactly: (sum_i t_i - max_j t_j) / v = ((p - 1) t + min(first extra, last extra)) / v.
    extra_first, extra_last = times[0] - t_mid, times[-1] - t_mid
    assert extra_first > 0 and extra_last > 0
    assert bubble == pytest.approx(((P - 1) * t_mid + min(extra_first, extra_last)) / v, rel=1e-12)


@pytest.mark.parametrize(("schedule", "v"), SCHEDULES)
@pytest.mark.parametrize("m", [4, 8, 32])
def test_bubble_fraction_p_minus_1_over_v_m(schedule: Schedule, v: int, m: int) -> None:
    est = _estimator()
    job = _job(schedule, v, m)
    bubble = est.estimate(job, graph_for(job)).breakdown["bubble"]
    t_mid = _stage_times(est, job)[1]
    # Textbook bubble fraction: bubble / (m t) = (p - 1) / (v m).
    assert bubble / (m * t_mid) == pytest.approx((P - 1) / (v * m), rel=5e-3)


def test_interleaving_divides_the_bubble_by_v() -> None:
    est = _estimator()
    plain_job = _job("1f1b", 1)
    plain = est.estimate(plain_job, graph_for(plain_job)).breakdown["bubble"]
    t_plain = _stage_times(est, plain_job)[1]
    for v in (2, 4):
        job = _job("interleaved-1f1b", v)
        t_v = _stage_times(est, job)[1]
        # v * bubble_v = (p - 1) t_v + the same min(first, last) extra as v = 1; t_v - t differs only by the
        # v-fold pipeline sends of the interleaved schedule.
        bubble_v = est.estimate(job, graph_for(job)).breakdown["bubble"]
        assert v * bubble_v - plain == pytest.approx((P - 1) * (t_v - t_plain), rel=1e-9)


def test_gpipe_and_1f1b_have_the_same_bubble() -> None:
    est = _estimator()
    gpipe = est.estimate(_job("gpipe", 1), graph_for(_job("gpipe", 1))).breakdown
    one_f_one_b = est.estimate(_job("1f1b", 1), graph_for(_job("1f1b", 1))).breakdown
    # Both fill and drain a p-stage pipeline once per iteration: (p - 1) t.
    assert gpipe["bubble"] == one_f_one_b["bubble"]


def test_pipeline_time_is_sum_plus_m_minus_1_max() -> None:
    est = _estimator()
    job = _job("1f1b", 1)
    breakdown = est.estimate(job, graph_for(job)).breakdown
    times = _stage_times(est, job)
    outside = ("dp_comm", "optimizer", "overhead")
    pipeline = sum(value for key, value in breakdown.items() if key not in outside)
    assert breakdown["dp_comm"] == 0.0  # dp = 1: no gradient reduction
    # PredTOP: T = sum_i t_i + (m - 1) max_j t_j.
    assert pipeline == pytest.approx(sum(times) + (M - 1) * max(times), rel=1e-12)
