"""Reuse factors (Lin et al. Fig. 6) and index batches."""

import numpy as np
import pytest

from trainsim.embedding.indices import access_histogram, popularity_cdf, rank_to_row, reuse_factors, sample_batch
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError

# Fig. 6 (a): four samples' lookups on one table of eight rows.
FIG6 = np.array([0, 1, 4, 6, 1, 2, 3, 5, 7, 0, 5, 7, 1, 6], dtype=np.int64)


def test_fig6_access_histogram() -> None:
    # Fig. 6 (b): rows 2, 3, 4 hit once; 0, 5, 6, 7 twice; 1 three times -> (c): 3 x once, 4 x twice, 1 x thrice.
    assert access_histogram(FIG6) == {1: 3, 2: 4, 3: 1}


def test_fig6_reuse_factors_binned_by_powers_of_two() -> None:
    rf = reuse_factors(FIG6)
    assert rf.shape == (17,)
    assert rf[0] == pytest.approx(3 / 8)  # hit once: [1, 2)
    assert rf[1] == pytest.approx(5 / 8)  # hit twice or thrice: [2, 4)
    assert rf[2:].sum() == 0.0


def test_reuse_factors_last_bin_is_open_and_empty_batch_is_zero() -> None:
    hot = np.zeros(70_000, dtype=np.int64)
    assert reuse_factors(hot)[16] == 1.0
    assert reuse_factors(np.array([], dtype=np.int64)).sum() == 0.0


def test_zipf_cdf_and_hash_spread() -> None:
    cdf = popularity_cdf(4, 1.0)
    weights = np.array([1, 1 / 2, 1 / 3, 1 / 4])
    assert cdf == pytest.approx(np.cumsum(weights) / weights.sum())
    rows = rank_to_row(np.arange(1000, dtype=np.int64), 1000)
    assert sorted(rows.tolist()) == list(range(1000))  # a bijection


def test_sample_batch_is_seeded_and_skewed() -> None:
    table = Table(0, 10_000, 8, 20.0, 1.2)
    a = sample_batch(table, 256, np.random.default_rng(3))
    b = sample_batch(table, 256, np.random.default_rng(3))
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    assert a[1].min() >= 0 and a[1].max() < 10_000 and a[0].sum() == a[1].size
    uniform = sample_batch(Table(0, 10_000, 8, 20.0, 0.0), 256, np.random.default_rng(3))
    # skew: far fewer distinct rows for the same number of lookups
    assert np.unique(a[1]).size < 0.7 * np.unique(uniform[1]).size


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="batch"):
        sample_batch(Table(0, 10, 8, 1.0), 0, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="pooling"):
        Table(0, 10, 8, 0.0)
    with pytest.raises(ConfigError, match="zipf_alpha"):
        Table(0, 10, 8, 1.0, -1.0)
