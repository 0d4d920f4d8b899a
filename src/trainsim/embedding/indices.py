"""Lookup index batches and their reuse factors.

A batch of one table is a (lengths, indices) pair as EmbeddingBag takes it: lengths[s] lookups for sample s
(Poisson with mean L), indices drawn from a Zipf law over the rows (row popularity rank r has probability
proportional to (r + 1) ** -alpha; alpha = 0 is uniform). Popularity ranks map to row ids through a fixed
multiplicative hash so that hot rows are spread over the table, as hashed categorical ids are.

Reuse factors (Lin et al. Sec. III-E, Fig. 6): the histogram of how often each accessed row is hit in the batch,
binned by powers of two ([1, 2), [2, 4), ..., [2^16, inf): 17 bins, the count the open DLRM dataset uses) and
normalized to [0, 1]. NB: normalized over the distinct rows the batch hits (Fig. 6's 3/8, 1/2, 1/8 over eight
rows hit); rows never hit carry no bin, so a sparse batch of a huge table does not drown every other bin.
"""

import math

import numpy as np
from numpy.typing import NDArray

from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError

RF_BINS = 17
_HASH_MULTIPLIER = 2_654_435_761  # Knuth's multiplicative hash constant (a prime near 2^32 / phi)


def popularity_cdf(rows: int, alpha: float) -> NDArray[np.float64]:
    """Cumulative probability of the popularity ranks 0..rows-1 under Zipf(alpha)."""
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def rank_to_row(ranks: NDArray[np.int64], rows: int) -> NDArray[np.int64]:
    """Spread popularity ranks over the row ids. A bijection when gcd(multiplier, rows) = 1; otherwise the
    identity (rare table sizes sharing a factor with the prime)."""
    if math.gcd(_HASH_MULTIPLIER, rows) != 1:
        return ranks
    return (ranks * _HASH_MULTIPLIER) % rows


def sample_batch(table: Table, batch: int, rng: np.random.Generator,
                 cdf: NDArray[np.float64] | None = None) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(lengths, indices) of one batch of `batch` samples for `table`."""
    if batch < 1:
        raise ConfigError("batch", batch, "must be at least 1")
    lengths = rng.poisson(table.pooling, size=batch).astype(np.int64)
    total = int(lengths.sum())
    if table.zipf_alpha == 0.0:
        ranks = rng.integers(0, table.rows, size=total, dtype=np.int64)
    else:
        table_cdf = cdf if cdf is not None else popularity_cdf(table.rows, table.zipf_alpha)
        ranks = np.minimum(np.searchsorted(table_cdf, rng.random(total)), table.rows - 1).astype(np.int64)
    return lengths, rank_to_row(ranks, table.rows)


def access_histogram(indices: NDArray[np.int64]) -> dict[int, int]:
    """Fig. 6 (b) -> (c) before binning: hit count -> number of distinct rows hit that many times."""
    if indices.size == 0:
        return {}
    _, counts = np.unique(indices, return_counts=True)
    hits, rows = np.unique(counts, return_counts=True)
    return {int(h): int(r) for h, r in zip(hits, rows, strict=True)}


def reuse_factors(indices: NDArray[np.int64], bins: int = RF_BINS) -> NDArray[np.float64]:
    """The RF vector of one batch: bin b holds the share of distinct rows hit [2^b, 2^(b+1)) times (the last bin
    is open-ended). All zeros for an empty batch."""
    out = np.zeros(bins, dtype=np.float64)
    histogram = access_histogram(indices)
    distinct = sum(histogram.values())
    for hits, rows in histogram.items():
        out[min(int(math.log2(hits)), bins - 1)] += rows
    return out / distinct if distinct else out
