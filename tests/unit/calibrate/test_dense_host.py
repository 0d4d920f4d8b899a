"""The dense part's host cost of a sharded DLRM (cost.sharded_dlrm.DenseHostCost, Lin et al. Algorithm 1's
CPU-side overheads): the op counts it is charged per, its price in both engines and in the predictive trace
simulation, and its fit from traced spans (calibrate.dense_host)."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import three_table_dlrm_job
from trainsim.calibrate.dense_host import (
    DenseSpanSample,
    fit_dense_host,
    load_dense_host,
    samples_from_trace,
    save_dense_host,
)
from trainsim.catalog import load_cluster
from trainsim.cli.main import app
from trainsim.cost.embedding_lookup import RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import DenseHostCost, DenseOpCounts, dense_op_counts, price_sharded_iteration
from trainsim.errors import ConfigError, InputFileError
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.estimate.trace_predict import simulate_trace
from trainsim.frontends.catalog.sharded_dlrm import ShardedDlrmJob

CPU = load_cluster("local-cpu")
HOST = DenseHostCost(fwd_op_s=1e-3, bwd_op_s=2e-3, step_tensor_s=3e-3)


def _job(batch: int = 16) -> ShardedDlrmJob:
    return three_table_dlrm_job(batch)


def test_op_counts_are_the_graphs_dense_ops_and_the_steps_tensors() -> None:
    # bottom MLP (128, 64, 16): 3 linear + 3 relu forward; backward: 3 relu + 3 dgrad/wgrad pairs, the first
    # layer without dgrad = 8. Interaction (stack, dot, gather) + top MLP (128, 64, 1: 3 linear, 2 relu, the
    # loss) = 9 forward, 4 + 9 backward. Step: weight and bias of 6 linear layers + 1 data-parallel table.
    sjob = _job()
    assert dense_op_counts(sjob.graph, sjob.plan) == DenseOpCounts(6, 9, 13, 8, 13)


def test_host_cost_scales_the_kernels_and_adds_count_times_cost_to_each_dense_span_and_nothing_else() -> None:
    sjob = _job()
    pricer, lookups = Pricer(), RooflineLookup(CPU.device)
    bare = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, lookups)
    hosted = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, lookups, host=HOST)
    scaled = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, lookups,
                                     host=DenseHostCost(1e-3, 2e-3, 3e-3, fwd_kernel_scale=1.5, bwd_kernel_scale=2.0))
    for b, h, s in zip(bare.ranks, hosted.ranks, scaled.ranks, strict=True):
        assert h.bottom_fwd_s == pytest.approx(b.bottom_fwd_s + 6e-3, rel=1e-12)
        assert h.top_fwd_s == pytest.approx(b.top_fwd_s + 9e-3, rel=1e-12)
        assert h.top_bwd_s == pytest.approx(b.top_bwd_s + 26e-3, rel=1e-12)
        assert h.bottom_bwd_s == pytest.approx(b.bottom_bwd_s + 16e-3, rel=1e-12)
        assert (s.bottom_fwd_s, s.top_fwd_s) == pytest.approx((1.5 * b.bottom_fwd_s + 6e-3, 1.5 * b.top_fwd_s + 9e-3),
                                                              rel=1e-12)
        assert (s.top_bwd_s, s.bottom_bwd_s) == pytest.approx((2 * b.top_bwd_s + 26e-3, 2 * b.bottom_bwd_s + 16e-3),
                                                              rel=1e-12)
        assert s.optimizer_s == h.optimizer_s  # the step has no kernel factor
        assert h.optimizer_s == pytest.approx(b.optimizer_s + 39e-3, rel=1e-12)
        assert (h.lookup_fwd_s, h.lookup_bwd_s) == (b.lookup_fwd_s, b.lookup_bwd_s)
    assert (hosted.index_a2a_s, hosted.grad_allreduce_s) == (bare.index_a2a_s, bare.grad_allreduce_s)


def test_both_engines_price_the_host_cost_alike() -> None:
    sjob = _job()
    bare = estimate_sharded(sjob.job, sjob.graph, sjob.plan, "analytical").iteration_time_s
    analytical = estimate_sharded(sjob.job, sjob.graph, sjob.plan, "analytical", host=HOST).iteration_time_s
    sim = estimate_sharded(sjob.job, sjob.graph, sjob.plan, "sim", host=HOST).iteration_time_s
    assert sim == pytest.approx(analytical, rel=1e-12)
    # every dense span is on each rank's critical path (both ranks run the same dense part): + 96 ms
    assert analytical - bare == pytest.approx(6e-3 + 9e-3 + 26e-3 + 16e-3 + 39e-3, rel=1e-9)


def test_the_predictive_trace_simulation_prices_it_too() -> None:
    sjob = _job()
    pricer, lookups = Pricer(), RooflineLookup(CPU.device)
    spans = [("bottom_mlp fwd", 0.0, 1.0), ("embeddings fwd", 1.0, 2.0), ("pooled-a2a-fwd", 2.0, 3.0),
             ("top_mlp fwd", 3.0, 4.0), ("optimizer step", 4.0, 5.0)]
    bare = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, lookups)
    hosted = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, lookups, host=HOST)
    added = simulate_trace([spans, spans], hosted, {}) - simulate_trace([spans, spans], bare, {})
    assert added == pytest.approx(6e-3 + 9e-3 + 39e-3, rel=1e-9)


def test_fit_recovers_the_scale_and_per_op_cost_of_each_phase() -> None:
    # forward: measured = 1.5 x priced + 50 us per op; backward: 1.2 x priced + 40 us per op
    fwd = [DenseSpanSample(span, 1.5 * priced + n * 50e-6, priced, n)
           for span, n, priced in (("bottom_mlp fwd", 6, 1e-4), ("bottom_mlp fwd", 6, 3e-4), ("top_mlp fwd", 9, 2e-3),
                                   ("top_mlp fwd", 9, 5e-3))]
    bwd = [DenseSpanSample(span, 1.2 * priced + n * 40e-6, priced, n)
           for span, n, priced in (("bottom_mlp bwd", 8, 2e-4), ("top_mlp bwd", 13, 4e-3), ("top_mlp bwd", 13, 9e-3))]
    step = [DenseSpanSample("optimizer step", 1e-4 + 12 * t, 1e-4, 12) for t in (30e-6, 38e-6, 90e-6)]  # median
    fit = fit_dense_host(fwd + bwd + step)
    assert (fit.fwd_kernel_scale, fit.fwd_op_s) == pytest.approx((1.5, 50e-6), rel=1e-9)
    assert (fit.bwd_kernel_scale, fit.bwd_op_s) == pytest.approx((1.2, 40e-6), rel=1e-9)
    assert fit.step_tensor_s == pytest.approx(38e-6, rel=1e-9)
    assert fit_dense_host([]) == DenseHostCost()


def test_a_negative_per_op_cost_fits_zero_and_the_scale_alone() -> None:
    # measured = 2 x priced - 10 us per op: the free fit's per-op cost is negative
    samples = [DenseSpanSample("top_mlp fwd", 2.0 * priced - 9 * 10e-6, priced, 9) for priced in (1e-3, 4e-3)]
    samples.append(DenseSpanSample("bottom_mlp fwd", 2.0 * 1e-3 - 6 * 10e-6, 1e-3, 6))
    fit = fit_dense_host([*samples, DenseSpanSample("optimizer step", 1e-4, 2e-4, 12)])
    assert fit.fwd_op_s == 0.0 and 1.9 < fit.fwd_kernel_scale < 2.0
    assert fit.step_tensor_s == 0.0  # priced above the measured step


def test_samples_read_cpu_times_where_the_trace_has_them() -> None:
    sjob = _job()
    it = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, Pricer(), RooflineLookup(CPU.device))
    counts = dense_op_counts(sjob.graph, sjob.plan)
    spans = [[("index-a2a launch", 0.0, 0.1), ("bottom_mlp fwd", 0.1, 0.4), ("optimizer step", 0.4, 0.5)]] * 2
    with_cpu = samples_from_trace(spans, [[0.05, 0.2, 0.07], [0.05, 0.25, 0.08]], it, counts)
    assert [(s.span, s.measured_s, s.count) for s in with_cpu] == [
        ("bottom_mlp fwd", 0.2, 6), ("optimizer step", 0.07, 13), ("bottom_mlp fwd", 0.25, 6),
        ("optimizer step", 0.08, 13)]
    assert with_cpu[0].priced_s == it.ranks[0].bottom_fwd_s
    wall = samples_from_trace(spans, None, it, counts)
    assert [s.measured_s for s in wall] == pytest.approx([0.3, 0.1, 0.3, 0.1])


def test_bad_costs_and_samples_are_refused() -> None:
    for bad in (-1e-6, math.nan, 1.0):
        with pytest.raises(ConfigError, match="fwd_op_s"):
            DenseHostCost(fwd_op_s=bad)
    for scale in (0.0, 101.0):
        with pytest.raises(ConfigError, match="bwd_kernel_scale"):
            DenseHostCost(bwd_kernel_scale=scale)
    for measured, priced in ((math.nan, 0.1), (0.0, 0.1), (0.1, -1.0)):
        with pytest.raises(ConfigError, match="finite"):
            fit_dense_host([DenseSpanSample("top_mlp bwd", measured, priced, 3)])
    with pytest.raises(ConfigError, match="positive count"):
        fit_dense_host([DenseSpanSample("top_mlp bwd", 0.2, 0.1, 0)])


def test_saved_fit_reads_back_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    save_dense_host(HOST, path, "test", 3)
    assert load_dense_host(path) == HOST
    path.write_text(json.dumps({"dense_host": {"fwd_op_s": 1e-3}}))
    with pytest.raises(InputFileError, match=r"host\.json"):
        load_dense_host(path)
    with pytest.raises(ConfigError, match="dense_host"):
        load_dense_host(tmp_path / "missing.json")


def test_predict_and_shard_take_the_fit(tmp_path: Path) -> None:
    runner = CliRunner()
    path = tmp_path / "host.json"
    save_dense_host(HOST, path, "test", 3)
    args = ["predict", "--model", "dlrm-mlperf-terabyte", "--cluster", "dgx-h100-80gb", "--num-gpus", "8",
            "--micro-batch", "512", "--sharder", "size-lookup-greedy", "--json"]
    bare, hosted = (json.loads(runner.invoke(app, [*args, *extra]).output)
                    for extra in ([], ["--dense-host", str(path)]))
    assert hosted["iteration_time_s"] > bare["iteration_time_s"] + 0.05  # 1 ms-scale costs on >= 50 ops
    refused = runner.invoke(app, ["predict", "--model", "gpt2-124m", "--dense-host", str(path)])
    assert refused.exit_code == 2 and "dense_host" in refused.output
    shard = runner.invoke(app, ["shard", "--synthetic", "normal", "--num-ranks", "2", "--dense-host", str(path),
                                "--json", "--no-plans"])
    assert shard.exit_code == 0, shard.output
