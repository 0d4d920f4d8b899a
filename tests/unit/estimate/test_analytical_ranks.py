"""The closed-form engines where the cluster's ranks differ (cost/rank_classes.py): every collective waits for its
slowest member, so each device class is a pipeline column at its stages' slowest kind of rank, and the iteration
is the slowest column's (analytical); precision-aware's T_comp is the slowest subgraph's, on its rank;
the search's grid engine leaves such clusters to the plain engine."""

import dataclasses

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_device, load_model
from trainsim.catalog.calibration import Calibration
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.precision_aware import PrecisionAwareEstimator
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for, predict
from trainsim.search.grid import GridEngine
from trainsim.strategy.parallel import ParallelSpec

GPT = load_model("gpt3-125m")
MOE = TransformerSpec(name="tiny-moe", arch="gpt", num_layers=8, hidden=128, ffn_hidden=256, num_heads=8,
                      vocab=1000, max_seq_len=2048, num_experts=4, top_k=2, moe_every=2)


def _job(num_gpus: int, **strategy: object) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 4 * num_gpus, **strategy})
    return make_job(GPT, a100_cluster(num_gpus), par)


def _with(job: Job, **update: object) -> Job:
    return dataclasses.replace(job, cluster=job.cluster.model_copy(update=update))


def _analytical() -> AnalyticalEstimator:
    return AnalyticalEstimator(Pricer(Calibration()))


def test_a_straggler_of_a_data_parallel_pair_doubles_the_compute_and_the_step() -> None:
    """dp 2, rank 1 at 2x: the iteration is the slow rank's: its compute, host overheads and optimizer step are
    twice the plain job's, its gradient all-reduce the same collective."""
    plain = _job(2, dp=2)
    base = _analytical().estimate(plain, graph_for(plain)).breakdown
    slow = _analytical().estimate(_with(plain, compute_slowdown={1: 2.0}), graph_for(plain)).breakdown
    assert slow["compute"] == pytest.approx(2.0 * base["compute"], rel=1e-12)
    assert slow["optimizer"] == pytest.approx(2.0 * base["optimizer"], rel=1e-12)
    assert slow["overhead"] == pytest.approx(2.0 * base["overhead"], rel=1e-12)
    assert slow["dp_comm"] <= base["dp_comm"]  # the longer backward hides at least as much of it


def test_a_slow_rank_slows_its_own_stage_not_the_others() -> None:
    """pp 2 (dp 1), rank 0 (stage 0) at 1.5x: stage 0's compute is 1.5x, stage 1's is unchanged (the same price),
    and the pipeline's bottleneck is stage 0 at its slow pace."""
    plain = _job(2, pp=2)
    job = _with(plain, compute_slowdown={0: 1.5})
    pricer = Pricer(Calibration())
    graph = graph_for(job)
    partition = pricer.plan_partition(graph, job.parallel)
    base = pricer.stage_costs(partition, plain)
    [column] = pricer.class_stage_costs(partition, job, pricer.device_classes(job))
    assert column[0].compute_s == pytest.approx(1.5 * base[0].compute_s, rel=1e-12)
    assert column[0].comm_s == base[0].comm_s != {}
    assert column[1] is base[1]
    breakdown = AnalyticalEstimator(pricer).estimate(job, graph).breakdown
    m = job.parallel.num_micro_batches
    assert breakdown["compute"] == pytest.approx(m * max(column[0].compute_s, base[1].compute_s), rel=1e-12)


def test_the_slowest_column_sets_the_iteration() -> None:
    """pp 2 x dp 2: a straggler in replica 1 (stage 0) makes its column the slow one; a second, slower one in
    replica 0's stage 1 makes replica 0's column the slowest: the pipeline follows it (its compute and bubble);
    the step after the barrier is the slowest (stage, rank)'s, which may be the first straggler's."""
    plain = _job(4, dp=2, pp=2)
    one = _analytical().estimate(_with(plain, compute_slowdown={1: 1.5}), graph_for(plain)).breakdown
    two = _analytical().estimate(_with(plain, compute_slowdown={1: 1.5, 2: 2.0}), graph_for(plain)).breakdown
    replica0 = _analytical().estimate(_with(plain, compute_slowdown={2: 2.0}), graph_for(plain)).breakdown
    for key in ("compute", "bubble", "dp_comm"):
        assert two[key] == replica0[key]
    assert two["compute"] > one["compute"]
    assert two["optimizer"] >= replica0["optimizer"] and two["optimizer"] >= one["optimizer"]


def test_columns_that_meet_every_micro_batch_move_in_lockstep() -> None:
    """pp 2 x dp 2, stragglers in replica 1's stage 0 (rank 1) and replica 0's stage 1 (rank 2). A MoE with
    expert parallelism over the data-parallel ranks: every micro-batch's all-to-alls join the columns, which move
    in lockstep, each stage at its slowest class, as if one column held both stragglers (ranks 1 and 3). A dense
    model's columns meet once, at the gradient reduction: the iteration is the slower column's, faster than one
    column with both."""
    for model, strategy, lockstep in ((MOE, {"ep": 2}, True), (GPT, {}, False)):
        par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 16, "dp": 2, "pp": 2,
                                  **strategy})
        plain = make_job(model, a100_cluster(4), par)
        apart = _analytical().estimate(_with(plain, compute_slowdown={1: 1.5, 2: 1.5}), graph_for(plain))
        together = _analytical().estimate(_with(plain, compute_slowdown={1: 1.5, 3: 1.5}), graph_for(plain))
        alone = _analytical().estimate(_with(plain, compute_slowdown={1: 1.5}), graph_for(plain))
        if lockstep:
            assert apart.breakdown == together.breakdown
            assert apart.iteration_time_s > alone.iteration_time_s
        else:
            assert alone.iteration_time_s < apart.iteration_time_s < together.iteration_time_s


def test_ranks_alike_price_as_today() -> None:
    """Overrides equal to the cluster's own device and no slow-down: the same breakdown, exactly."""
    plain = _job(4, dp=2, pp=2)
    same = _with(plain, compute_slowdown={0: 1.0, 3: 1.0}, rank_devices={2: plain.cluster.device})
    for engine in (_analytical(), PrecisionAwareEstimator(Calibration())):
        assert engine.estimate(same, graph_for(same)).breakdown == engine.estimate(plain, graph_for(plain)).breakdown


def test_a_smaller_rank_sets_the_memory_verdict() -> None:
    """A 16 GB V100 among 80 GB A100s: the verdict reads its capacity, in both closed-form engines."""
    plain = _job(2, dp=2)
    small = load_device("v100-sxm2-16gb")
    job = _with(plain, rank_devices={1: small})
    for engine in (_analytical(), PrecisionAwareEstimator(Calibration())):
        result = engine.estimate(job, graph_for(job))
        assert result.memory_capacity_bytes == small.hbm_bytes
        assert result.peak_memory_bytes == engine.estimate(plain, graph_for(plain)).peak_memory_bytes


def test_precision_aware_prices_the_slowest_subgraph_on_its_rank() -> None:
    """Seed 001's T_comp is m x the slowest subgraph: a rank at 2x doubles it, and a V100 takes what the
    subgraph's ops take on a V100."""
    plain = _job(2, dp=2)
    engine = PrecisionAwareEstimator(Calibration())
    base = engine.estimate(plain, graph_for(plain)).breakdown["compute"]
    slow = engine.estimate(_with(plain, compute_slowdown={1: 2.0}), graph_for(plain)).breakdown["compute"]
    v100 = load_device("v100-sxm2-32gb")
    on_v100 = engine.estimate(_with(plain, device=v100), graph_for(plain)).breakdown["compute"]
    mixed = engine.estimate(_with(plain, rank_devices={1: v100}), graph_for(plain)).breakdown["compute"]
    assert slow == pytest.approx(2.0 * base, rel=1e-12)
    assert mixed == pytest.approx(on_v100, rel=1e-12) and mixed > base


def test_no_engine_notes_that_it_prices_every_rank_alike() -> None:
    """The mechanism replaced the note: every shape engine prices the straggler slower, none says it cannot."""
    plain = _job(2, dp=2)
    straggler = _with(plain, compute_slowdown={1: 2.0})
    for engine in ("analytical", "precision-aware", "sim"):
        result = predict(straggler, engine)
        assert not any("compute_slowdown" in note for note in result.notes)
        assert result.iteration_time_s > predict(plain, engine).iteration_time_s


def test_the_grid_engine_leaves_a_cluster_whose_ranks_differ_to_the_plain_engine() -> None:
    """A search on a cluster with a straggler gets the plain engine's figures for every plan."""
    cluster = a100_cluster(8).model_copy(update={"compute_slowdown": {3: 1.5}})
    plans = []
    for strategy in ({"dp": 8}, {"dp": 4, "pp": 2}, {"tp": 2, "dp": 4}, {"tp": 2, "pp": 2, "dp": 2, "zero": 1}):
        par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 32, **strategy})
        job = make_job(GPT, cluster, par)
        plans.append((job, graph_for(job)))
    engine = AnalyticalEstimator()
    prices = GridEngine(engine).price(plans)
    assert not prices.errors
    for index, (job, graph) in enumerate(plans):
        plain = engine.price(job, graph)
        assert prices.iteration_time_s[index] == plain.iteration_time_s
        assert prices.peak_memory_bytes[index] == plain.peak_memory_bytes
        alike = _with(job, compute_slowdown={})
        assert plain.iteration_time_s > engine.price(alike, graph_for(alike)).iteration_time_s
