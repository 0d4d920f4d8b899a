"""The lookups' in-situ factors of a sharded DLRM (cost.embedding_lookup.InSituLookup): what they scale in the
priced iteration and in both engines, and their fit from traced spans (calibrate.lookup_in_situ)."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import three_table_dlrm_job
from trainsim.calibrate.lookup_in_situ import (
    LookupSpanSample,
    fit_lookup_in_situ,
    load_lookup_in_situ,
    samples_from_trace,
    save_lookup_in_situ,
)
from trainsim.catalog import load_cluster
from trainsim.cli.main import app
from trainsim.cost.embedding_lookup import InSituLookup, RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import price_sharded_iteration
from trainsim.embedding.sharding import ShardPiece
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError, InputFileError
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import ShardedDlrmJob

CPU = load_cluster("local-cpu")
ROOFLINE = RooflineLookup(CPU.device)


def _job(batch: int = 16) -> ShardedDlrmJob:
    return three_table_dlrm_job(batch)


def test_in_situ_scales_each_phase_of_the_wrapped_model() -> None:
    piece = ShardPiece(Table(0, 1000, 16, 4.0), "table-wise", 0, 1000, 16, 32, 4.0)
    scaled = InSituLookup(ROOFLINE, fwd_scale=0.5, bwd_scale=3.0)
    assert scaled.lookup_s(piece, "fwd") == 0.5 * ROOFLINE.lookup_s(piece, "fwd")
    assert scaled.lookup_s(piece, "bwd") == 3.0 * ROOFLINE.lookup_s(piece, "bwd")
    assert InSituLookup(ROOFLINE).lookup_s(piece, "bwd") == ROOFLINE.lookup_s(piece, "bwd")
    assert scaled.name == "roofline in situ"


def test_the_iteration_scales_the_lookups_and_nothing_else_and_both_engines_agree() -> None:
    sjob = _job()
    pricer = Pricer()
    bare = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, ROOFLINE)
    scaled = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, pricer, InSituLookup(ROOFLINE, 0.5, 2.0))
    for b, s in zip(bare.ranks, scaled.ranks, strict=True):
        assert (s.lookup_fwd_s, s.lookup_bwd_s) == pytest.approx((0.5 * b.lookup_fwd_s, 2.0 * b.lookup_bwd_s),
                                                                 rel=1e-12)
        assert (s.bottom_fwd_s, s.top_fwd_s, s.top_bwd_s, s.optimizer_s) == (
            b.bottom_fwd_s, b.top_fwd_s, b.top_bwd_s, b.optimizer_s)
    assert (scaled.index_a2a_s, scaled.pooled_fwd_a2a_s) == (bare.index_a2a_s, bare.pooled_fwd_a2a_s)
    lookups = InSituLookup(ROOFLINE, 0.5, 2.0)
    analytical = estimate_sharded(sjob.job, sjob.graph, sjob.plan, "analytical", pricer, lookups).iteration_time_s
    sim = estimate_sharded(sjob.job, sjob.graph, sjob.plan, "sim", pricer, lookups).iteration_time_s
    assert sim == pytest.approx(analytical, rel=1e-12)


def test_fit_is_the_geometric_mean_of_measured_over_priced_per_phase() -> None:
    samples = [LookupSpanSample("embeddings fwd", 2e-3, 1e-3), LookupSpanSample("embeddings fwd", 8e-3, 1e-3),
               LookupSpanSample("embeddings bwd", 1e-3, 2e-3)]
    fitted = fit_lookup_in_situ(samples, ROOFLINE)
    assert (fitted.fwd_scale, fitted.bwd_scale) == pytest.approx((4.0, 0.5), rel=1e-12)
    assert fitted.model is ROOFLINE
    only_fwd = fit_lookup_in_situ(samples[:1], ROOFLINE)
    assert (only_fwd.fwd_scale, only_fwd.bwd_scale) == (pytest.approx(2.0, rel=1e-12), 1.0)


def test_samples_pair_each_ranks_lookup_spans_with_its_priced_lookups() -> None:
    sjob = _job()
    it = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, Pricer(), ROOFLINE)
    spans = [[("bottom_mlp fwd", 0.0, 0.1), ("embeddings fwd", 0.1, 0.4), ("embeddings bwd", 0.4, 0.9)]] * 2
    with_cpu = samples_from_trace(spans, [[0.1, 0.2, 0.3], [0.1, 0.25, 0.35]], it)
    assert [(s.span, s.measured_s) for s in with_cpu] == [
        ("embeddings fwd", 0.2), ("embeddings bwd", 0.3), ("embeddings fwd", 0.25), ("embeddings bwd", 0.35)]
    assert [s.priced_s for s in with_cpu] == [it.ranks[0].lookup_fwd_s, it.ranks[0].lookup_bwd_s,
                                              it.ranks[1].lookup_fwd_s, it.ranks[1].lookup_bwd_s]
    wall = samples_from_trace(spans, None, it)
    assert [s.measured_s for s in wall] == pytest.approx([0.3, 0.5, 0.3, 0.5])


def test_a_rank_priced_without_lookups_gives_no_sample() -> None:
    sjob = _job()
    it_spans = [[("embeddings fwd", 0.0, 0.1)]]
    priced = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, Pricer(), ROOFLINE)
    assert len(samples_from_trace(it_spans, None, priced)) == 1

    class _Free:
        name = "free"

        def lookup_s(self, piece: ShardPiece, phase: str) -> float:
            return 0.0

    free = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, Pricer(), _Free())  # type: ignore[arg-type]
    assert samples_from_trace(it_spans, None, free) == []


def test_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "in_situ.json"
    save_lookup_in_situ(InSituLookup(ROOFLINE, 0.9, 1.25), path, "a test", 4)
    loaded = load_lookup_in_situ(path, ROOFLINE)
    assert (loaded.fwd_scale, loaded.bwd_scale, loaded.model) == (0.9, 1.25, ROOFLINE)
    assert json.loads(path.read_text())["samples"] == 4
    with pytest.raises(ConfigError, match="lookup_in_situ"):
        load_lookup_in_situ(tmp_path / "missing.json", ROOFLINE)
    path.write_text(json.dumps({"dense_host": {}}))
    with pytest.raises(InputFileError, match="not a lookup in-situ fit"):
        load_lookup_in_situ(path, ROOFLINE)


def test_bad_factors_and_samples_are_refused() -> None:
    for bad in (0.0, -1.0, math.nan, 101.0):
        with pytest.raises(ConfigError, match=r"lookup_in_situ\.bwd_scale"):
            InSituLookup(ROOFLINE, bwd_scale=bad)
    for measured, priced in ((0.0, 1e-3), (1e-3, 0.0), (math.inf, 1e-3)):
        with pytest.raises(ConfigError, match="embeddings fwd"):
            fit_lookup_in_situ([LookupSpanSample("embeddings fwd", measured, priced)], ROOFLINE)


def test_predict_and_shard_take_the_fit(tmp_path: Path) -> None:
    runner = CliRunner()
    unit, doubled = tmp_path / "unit.json", tmp_path / "doubled.json"
    save_lookup_in_situ(InSituLookup(ROOFLINE), unit, "test", 1)
    save_lookup_in_situ(InSituLookup(ROOFLINE, 2.0, 2.0), doubled, "test", 1)
    args = ["predict", "--model", "dlrm-mlperf-terabyte", "--cluster", "dgx-h100-80gb", "--num-gpus", "8",
            "--micro-batch", "512", "--sharder", "size-lookup-greedy", "--json"]
    bare, same, slower = (json.loads(runner.invoke(app, [*args, *extra]).output)["iteration_time_s"]
                          for extra in ([], ["--lookup-in-situ", str(unit)], ["--lookup-in-situ", str(doubled)]))
    assert same == bare and slower > bare
    refused = runner.invoke(app, ["predict", "--model", "gpt2-124m", "--lookup-in-situ", str(unit)])
    assert refused.exit_code == 2 and "lookup_in_situ" in refused.output
    missing = runner.invoke(app, [*args, "--lookup-in-situ", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "lookup_in_situ" in missing.output
    shard = runner.invoke(app, ["shard", "--synthetic", "normal", "--num-ranks", "2", "--lookup-in-situ",
                                str(doubled), "--json", "--no-plans"])
    assert shard.exit_code == 0, shard.output
