"""The engines against real runs measured with `trainsim measure` (data/ground-truth, README "Real runs"):
the local suite on the 2-core development machine (3 repeats, quiet machine, with its own op profile) and
single-GPU training steps on an H200 and on an H100 (with theirs; neither set was in any fit). Bounds are the
measured figures rounded up, so a change that makes any engine worse fails here. Issue 5's target (15% with
profiled costs on the local suite) is met since ranks sharing cores are modeled; the README says where single
jobs still fall short and why."""

from functools import cache
from pathlib import Path

import pytest

from trainsim.validate.compare import by_job, compare, engine_choices, summaries
from trainsim.validate.measured import read_measured
from trainsim.validate.predict_runs import RowPrediction

DATA = Path(__file__).resolve().parents[2] / "data" / "ground-truth"
# (folder, engine label, metric) -> bound on the MAPE in percent
BOUNDS = {
    # issue 5's target (15%), met since ranks sharing cores are modeled (14.3% / 14.4%; 16.2% / 16.3% before)
    ("local-2core", "analytical+profiled", "iteration_time_s"): 15.0,
    ("local-2core", "sim+profiled", "iteration_time_s"): 15.0,
    # the roofline fitted on GPU runs, applied to a CPU: 34.4%
    ("local-2core", "analytical", "iteration_time_s"): 35.0,
    ("h200", "analytical", "iteration_time_s"): 9.5,
    ("h200", "sim", "iteration_time_s"): 9.5,
    ("h200", "analytical+profiled", "iteration_time_s"): 4.5,
    ("h200", "sim+profiled", "iteration_time_s"): 4.5,
    # torch's foreach AdamW temporary in the memory model: 7.3% -> 5.4% (analytical), 8.4% -> 5.9% (sim); then
    # selective recompute's working memory, torch's two loss-gradient buffers (the ddp stack) and the head's
    # logits no longer in full recompute's working set: 3.3%
    ("h200", "analytical", "peak_allocated_gib"): 3.5,
    ("h200", "sim", "peak_allocated_gib"): 3.5,  # the simulator reads the same rebuilt and loss bytes: 3.2%
    # an H100 80GB, 19 steps (2026-11-26): 6.9% / 5.4% profiled; peak memory 3.1% (sim 3.0%)
    ("h100", "analytical", "iteration_time_s"): 7.5,
    ("h100", "sim", "iteration_time_s"): 7.5,
    ("h100", "analytical+profiled", "iteration_time_s"): 6.0,
    ("h100", "sim+profiled", "iteration_time_s"): 6.0,
    ("h100", "analytical", "peak_allocated_gib"): 3.5,
    ("h100", "sim", "peak_allocated_gib"): 3.5,  # 3.0%
}


def _mape(folder: str) -> dict[tuple[str, str], float]:
    rows = read_measured(DATA / folder)
    predictions = compare(rows, engine_choices("analytical,sim", "both"), DATA / folder / "profile.db")
    return {(str(s["engine"]), str(s["metric"])): float(s["mape_pct"]) for s in summaries(predictions)
            if s["source"] == "ALL"}


@pytest.mark.parametrize("folder", ["local-2core", "h200", "h100"])
def test_engines_keep_their_measured_accuracy(folder: str) -> None:
    mape = _mape(folder)
    for (where, engine, metric), bound in BOUNDS.items():
        if where == folder:
            assert mape[(engine, metric)] <= bound, (engine, metric, mape[(engine, metric)])


# H200, 2026-11-27: 7 GPT shapes with torch SDPA and with Megatron's unfused attention (measure --attention math),
# and one unfused LLaMA (scripts/gpu/h200_math.sh); the calibrated roofline only (no op profile of the unfused core)
MATH_BOUNDS = {("analytical", "iteration_time_s"): 8.5, ("sim", "iteration_time_s"): 8.5,  # 8.06% / 8.06%
               ("analytical", "peak_allocated_gib"): 3.0, ("sim", "peak_allocated_gib"): 3.0}  # 2.69% / 2.58%


def test_unfused_attention_steps_keep_their_measured_accuracy() -> None:
    rows = read_measured(DATA / "h200-math")
    runs = {row.run_id for row in rows}
    assert len(runs) == 15 and sum(run.endswith("-math") for run in runs) == 8
    predictions = compare(rows, engine_choices("analytical,sim", "roofline"), None)
    mape = {(str(s["engine"]), str(s["metric"])): float(s["mape_pct"]) for s in summaries(predictions)
            if s["source"] == "ALL"}
    for key, bound in MATH_BOUNDS.items():
        assert mape[key] <= bound, (key, mape[key])


def test_unfused_attention_costs_what_was_measured_against_fused() -> None:
    """Each shape's step with unfused attention over its step with SDPA: measured 1.24-1.63x on the H200, the
    analytical engine 1.18-1.58x; the predicted ratio within 16% of the measured one for every shape (the
    largest gap, 125M and 350M at 1,024 tokens: the unfused kernels' measured ~15 ps per score element against
    9-11 ps priced)."""
    rows = read_measured(DATA / "h200-math")
    predictions = compare(rows, engine_choices("analytical", "roofline"), None)["analytical"]
    times = {p.run_id: (p.measured, p.predicted or 0.0) for p in predictions if p.metric == "iteration_time_s"}
    pairs = [(times[run], times[run.removesuffix("-math")]) for run in times
             if run.endswith("-math") and run.removesuffix("-math") in times]
    assert len(pairs) == 7
    for (math_measured, math_predicted), (fused_measured, fused_predicted) in pairs:
        measured, predicted = math_measured / fused_measured, math_predicted / fused_predicted
        assert measured > 1.2 and predicted > 1.1
        assert abs(predicted / measured - 1.0) < 0.16, (measured, predicted)


# 2026-11-27 (twelfth session): steps of 16-bit models with fp32 main parameters (measure --precision bf16, as
# Megatron and FSDP2 hold their weights) and 2 autocast twins each, on an H200 (17 steps) and an H100 80GB (16;
# GPT-3 6.7B with full recompute ran out of memory there, as predicted): scripts/gpu/h200_bf16.sh, h200_bf16b.sh
BF16_BOUNDS = {  # folder -> (steps, {(engine, metric): bound})
    "h200-bf16": (17, {("analytical", "iteration_time_s"): 8.5, ("sim", "iteration_time_s"): 8.5,  # 8.32% / 8.32%
                       ("analytical", "peak_allocated_gib"): 5.5, ("sim", "peak_allocated_gib"): 5.5}),  # 5.24 / 5.36
    "h100-bf16": (16, {("analytical", "iteration_time_s"): 11.0, ("sim", "iteration_time_s"): 11.0,  # 10.71 / 10.71
                       ("analytical", "peak_allocated_gib"): 5.5, ("sim", "peak_allocated_gib"): 5.5}),  # 5.00 / 5.12
}


@cache  # NB: both bf16 tests of a folder read the same predictions
def _bf16_predictions(folder: str) -> dict[str, list[RowPrediction]]:
    return compare(read_measured(DATA / folder), engine_choices("analytical,sim", "roofline"), None)


@pytest.mark.parametrize("folder", sorted(BF16_BOUNDS))
def test_16_bit_steps_keep_their_measured_accuracy(folder: str) -> None:
    steps, bounds = BF16_BOUNDS[folder]
    predictions = _bf16_predictions(folder)
    runs = {p.run_id for p in predictions["analytical"]}
    assert len(runs) == steps and sum("-amp-bf16-" in run for run in runs) == 2
    mape = {(str(s["engine"]), str(s["metric"])): float(s["mape_pct"]) for s in summaries(predictions)
            if s["source"] == "ALL"}
    for key, bound in bounds.items():
        assert mape[key] <= bound, (key, mape[key])


@pytest.mark.parametrize("folder", sorted(BF16_BOUNDS))
def test_autocast_costs_what_was_measured_against_a_16_bit_model(folder: str) -> None:
    """Each autocast step over its 16-bit twin: measured 1.071 / 1.091 (H200 / H100; GPT-3 1.3B, s2048 mb4) and
    1.020 / 1.014 (Llama 3.1 8B's shape with 8 layers, s8192 mb1); the analytical engine 1.015 / 1.019 and
    1.017 / 1.017: autocast's casts of the fp32 weights and activations are not in the graph. The predicted ratio
    within 8% of the measured one."""
    predictions = _bf16_predictions(folder)["analytical"]
    times = {p.run_id: (p.measured, p.predicted or 0.0) for p in predictions if p.metric == "iteration_time_s"}
    pairs = [(times[run], times[run.replace("-amp-bf16-", "-bf16-")]) for run in times if "-amp-bf16-" in run]
    assert len(pairs) == 2
    for (amp_measured, amp_predicted), (bf16_measured, bf16_predicted) in pairs:
        measured, predicted = amp_measured / bf16_measured, amp_predicted / bf16_predicted
        assert measured > 1.0 and predicted >= 1.0
        assert abs(predicted / measured - 1.0) < 0.08, (measured, predicted)


def test_profiled_costs_beat_the_roofline_on_this_cpu() -> None:
    """The roofline of the placeholder cpu-local device is no model of this CPU; the profile is."""
    mape = _mape("local-2core")
    assert mape[("analytical+profiled", "iteration_time_s")] < mape[("analytical", "iteration_time_s")] / 2


def test_the_local_suite_was_measured_quietly() -> None:
    """Every job measured 3 times; the spread of the repeats' medians stays within the machine's noise."""
    rows = read_measured(DATA / "local-2core")
    jobs = by_job(compare(rows, engine_choices("analytical", "roofline"), None))
    assert len(jobs) == 18 and all(job["repeats"] == 3 for job in jobs)
    assert max(job["spread_pct"] for job in jobs) < 15.0


def test_measured_jobs_name_the_adam_step_they_ran() -> None:
    """The committed runs predate measure's --optimizer-impl and ran torch.optim.AdamW's defaults: foreach on
    the GPU, one tensor at a time on the CPU."""
    for folder, impl in (("h200", "foreach"), ("local-2core", "loop")):
        jobs = [row.job for row in read_measured(DATA / folder)]
        assert jobs and all(job is not None and job.parallel.optimizer_impl == impl for job in jobs)


def test_only_the_oversubscribed_local_run_shares_cores() -> None:
    """The local suite's dp2-pp2 job ran 4 single-threaded ranks on the 2 usable cores; every other job had a
    core per rank, and the GPU steps a GPU each."""
    shares = {row.run_id.split(".")[0]: row.job.cluster.device.compute_share
              for row in read_measured(DATA / "local-2core") + read_measured(DATA / "h200") if row.job}
    assert shares.pop("gpt-dp2-pp2-fp32") == 0.5
    assert set(shares.values()) == {1.0}
