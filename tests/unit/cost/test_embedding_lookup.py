"""Embedding-lookup cost models: the roofline's bytes, the learned model's fit on a known law, its reuse factors."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trainsim.calibrate.lookup_model import fit_lookup_model, merge_passes, retest_mape
from trainsim.catalog import load_cluster
from trainsim.cost.embedding_lookup import MlpLookup, RooflineLookup, lookup_features
from trainsim.cost.lookup_mlp import Mlp, fit_mlp
from trainsim.embedding.sharding import ShardPiece
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError, InputFileError
from trainsim.profile.embedding import LookupBench, read_csv, write_csv

DEVICE = load_cluster("local-cpu").device  # 20 GB/s


def test_roofline_bytes() -> None:
    piece = ShardPiece(Table(0, 100, 8, 10.0), "table-wise", 0, 100, 8, 4, 10.0)
    # fwd: 4 x 10 rows x 8 x 4 B = 1280 + pooled 4 x 8 x 4 = 128 + indices 40 x 8 = 320 -> 1728 B
    assert RooflineLookup(DEVICE).lookup_s(piece, "fwd") == pytest.approx(1728 / 20e9)
    assert RooflineLookup(DEVICE).lookup_s(piece, "bwd") == pytest.approx((2 * 1280 + 128 + 320) / 20e9)


def test_mlp_fits_a_power_law_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, (200, 3))
    y = np.stack([0.5 * x[:, 0] - 0.2 * x[:, 1], np.sin(x[:, 2])], 1)
    mlp = fit_mlp(x, y, epochs=800)  # mean errors 0.021 and 0.094: half the bounds (1,500 epochs: 0.015, 0.078)
    assert np.abs(mlp.predict(x)[:, 0] - y[:, 0]).mean() < 0.05  # the linear part carries it
    assert np.abs(mlp.predict(x)[:, 1] - y[:, 1]).mean() < 0.2  # the network learns the rest
    path = tmp_path / "m.json"
    path.write_text(json.dumps(mlp.to_json()))
    assert np.allclose(Mlp.load(path).predict(x), mlp.predict(x))


def _bench(i: int, rows: int, lookups: int) -> LookupBench:
    rf = tuple([1.0] + [0.0] * 16)
    # a known law: 1 ns per looked-up value forward, 3 ns backward
    return LookupBench(Table(i, rows, 16, lookups / 64, 0.0), 64, lookups, rf, lookups * 16e-9, lookups * 48e-9)


def test_fit_lookup_model_scores_held_out_rows(tmp_path: Path) -> None:
    benches = [_bench(i, 1000 + 37 * i, 100 + 50 * i) for i in range(60)]
    path = tmp_path / "b.csv"
    write_csv(benches, path)
    again = read_csv(path)
    assert [b.fwd_s for b in again] == pytest.approx([b.fwd_s for b in benches])
    fit = fit_lookup_model(again, epochs=500)
    assert fit.train_rows == 48 and fit.test_rows == 12
    assert fit.mlp_mape[("fwd", "all")] < 0.02 and fit.mlp_mape[("bwd", "all")] < 0.02
    with pytest.raises(ConfigError, match="at least 10"):
        fit_lookup_model(benches[:5])


def test_mlp_lookup_draws_reuse_factors_once_per_piece(tmp_path: Path) -> None:
    features = len(lookup_features(10, 4, 1.0, 2, np.zeros(17)))
    mlp = Mlp(np.zeros(features), np.ones(features), (np.zeros((features, 2)),), (np.zeros(2),),
              np.vstack([np.zeros((features, 2)), np.log([[1e-3, 2e-3]])]), np.full(features, -1e9),
              np.full(features, 1e9), np.full(2, -1e9), np.full(2, 1e9))
    model = MlpLookup(mlp, seed=1)
    piece = ShardPiece(Table(0, 1000, 8, 5.0, 1.0), "table-wise", 0, 1000, 8, 64, 5.0)
    assert model.lookup_s(piece, "fwd") == pytest.approx(1e-3)
    assert model.lookup_s(piece, "bwd") == pytest.approx(2e-3)
    rf = model.reuse_factors(piece)
    assert rf.sum() == pytest.approx(1.0) and rf is model.reuse_factors(piece)
    # beyond the benchmarked values read (log2 = 10 here), the time grows with them
    capped = MlpLookup(Mlp(mlp.mean, mlp.scale, mlp.weights, mlp.biases, mlp.linear, mlp.low,
                           np.r_[np.full(5, 1e9), 10.0, np.full(features - 6, 1e9)], mlp.out_low, mlp.out_high))
    values = 64 * 5.0 * 8  # samples x L x D read: 2560 = 2.5 x 2^10
    assert capped.lookup_s(piece, "fwd") == pytest.approx(1e-3 * (values + 8) / 1024)


def test_derived_features_count_the_distinct_rows_the_reuse_factors_imply() -> None:
    # half the distinct rows hit once, half 2-3 times (bin 1, middle 3): 2 hits per distinct row on average;
    # L = 4 over 16 samples -> 65 lookups (+1) -> 32.5 distinct rows (+1)
    rf = np.zeros(17)
    rf[:2] = 0.5
    features = lookup_features(1000, 8, 4.0, 16, rf)
    assert features[-3] == pytest.approx(np.log2(65 / 2 + 1))
    assert features[-2] == pytest.approx(np.log2((65 / 2 + 1) * 8))
    assert features[-1] == pytest.approx(np.log2(65 * np.log2(66)))


def test_mlp_lookup_refuses_a_model_fitted_on_other_features(tmp_path: Path) -> None:
    mlp = fit_mlp(np.arange(40.0).reshape(20, 2), np.arange(20.0).reshape(20, 1), epochs=10)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(mlp.to_json()))
    with pytest.raises(InputFileError, match="takes 2 features"):
        MlpLookup.load(path)


def test_passes_merge_to_the_fastest_time_and_their_spread_is_the_floor() -> None:
    first = [_bench(i, 1000 + i, 100 + 10 * i) for i in range(10)]
    slower = [replace(b, fwd_s=2 * b.fwd_s, bwd_s=b.bwd_s / 2) for b in first]
    merged = merge_passes([first, slower])
    assert [b.fwd_s for b in merged] == [b.fwd_s for b in first]
    assert [b.bwd_s for b in merged] == [b.bwd_s / 2 for b in first]
    spread = retest_mape([first, slower])
    # fwd: |1 - 2| / 2 = 50% one way, |2 - 1| / 1 = 100% the other -> 75%; bwd the same the other way round
    assert spread[("fwd", "all")] == pytest.approx(0.75) and spread[("bwd", "all")] == pytest.approx(0.75)
    assert retest_mape([first]) == {}
    with pytest.raises(ConfigError, match="same --count and --seed"):
        merge_passes([first, first[:9]])
    with pytest.raises(ConfigError, match="same --count and --seed"):
        merge_passes([first, [replace(b, batch=b.batch + 1) for b in first]])


def test_mlp_lookup_scales_linearly_beyond_the_benchmarked_pooling() -> None:
    rng = np.random.default_rng(0)
    benches = []
    for i in range(40):  # L in [1, 100): a law in the values read
        pooling = float(rng.uniform(1.0, 100.0))
        lookups = round(pooling * 64)
        benches.append(LookupBench(Table(i, 5000, 16, pooling, 0.0), 64, lookups, tuple([1.0] + [0.0] * 16),
                                   lookups * 16e-9 + 1e-5, lookups * 48e-9 + 1e-5))
    model = MlpLookup(fit_lookup_model(benches, epochs=200).mlp)
    top = 2.0 ** model.mlp.high[2] - 1.0  # the largest benchmarked L
    table = Table(0, 5000, 16, 4 * top, 0.0)
    edge, beyond = (ShardPiece(table, "table-wise", 0, 5000, 16, 64, pooling) for pooling in (top, 4 * top))
    assert model.within_range(beyond)[1] == pytest.approx(4.0)
    assert model.within_range(edge) == (edge, 1.0)
    for phase in ("fwd", "bwd"):
        assert model.lookup_s(beyond, phase) == pytest.approx(4.0 * model.lookup_s(edge, phase))


def test_benchmark_rows_are_kept_when_a_run_stops_and_renamed_when_it_ends(tmp_path: Path) -> None:
    from trainsim.profile.embedding import CsvRows

    path = tmp_path / "bench.csv"
    with pytest.raises(KeyboardInterrupt), CsvRows(path) as rows:
        rows.add(_bench(0, 1000, 100))
        raise KeyboardInterrupt
    assert not path.exists() and len(read_csv(path.with_name("bench.csv.partial"))) == 1  # what it measured
    with CsvRows(path) as rows:
        for i in range(3):
            rows.add(_bench(i, 1000, 100 + i))
    assert [b.lookups for b in read_csv(path)] == [100, 101, 102]
    assert not path.with_name("bench.csv.partial").exists()


def test_the_gpu_timing_is_named_and_a_host_clock_times_a_phase() -> None:
    from trainsim.profile.embedding import clock_for_device

    with pytest.raises(ConfigError, match="timing"):
        clock_for_device("cuda", "wall")
    value, seconds = clock_for_device("cpu").time_s(lambda: sum(range(1000)))
    assert value == 499500 and seconds >= 0.0
