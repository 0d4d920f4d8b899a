"""Synthetic DLRM tasks: table sets drawn from the distributions in catalog/data/recsys/synthetic_tables.yaml
(Lin et al. Sec. III-A and IV-B1; see the file for what comes from the paper and what does not).

A heavy task holds heavy tables only (L >= 20); a normal task draws every table from the whole distribution.
Everything is drawn from one seeded generator: the same (kind, num_ranks, seed) gives the same task.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np

from trainsim.catalog.files import DATA_DIR, read_mapping
from trainsim.embedding.tables import HEAVY_POOLING, Table
from trainsim.errors import ConfigError

TaskKind = Literal["heavy", "normal"]


@dataclass(frozen=True, slots=True)
class TableDistribution:
    bins: tuple[tuple[float, float, float], ...]  # (low, high, share)
    rows_log10: tuple[float, float]
    dims: tuple[int, ...]
    zipf_alpha: tuple[float, float]
    tables_per_rank: tuple[float, float, int]  # (low factor, high factor, tables per GPU)


def load_distribution() -> TableDistribution:
    data = read_mapping(DATA_DIR / "recsys" / "synthetic_tables.yaml")
    bins = tuple((float(b["low"]), float(b["high"]), float(b["share"])) for b in data["pooling_bins"])
    low, high, per = data["tables_per_rank"]
    return TableDistribution(bins, tuple(data["rows_log10"]), tuple(int(d) for d in data["dims"]),
                             tuple(data["zipf_alpha"]), (float(low), float(high), int(per)))


def _pooling(rng: np.random.Generator, bins: tuple[tuple[float, float, float], ...]) -> float:
    shares = np.array([share for _, _, share in bins])
    low, high, _ = bins[int(rng.choice(len(bins), p=shares / shares.sum()))]
    if high <= low:
        return low
    if high / low > 5.0:  # a wide bin (the last one): log-uniform inside it
        return float(np.exp(rng.uniform(np.log(low), np.log(high))))
    return float(rng.uniform(low, high))


def generate_task(kind: TaskKind, num_ranks: int, seed: int,
                  distribution: TableDistribution | None = None) -> tuple[Table, ...]:
    """One task's tables: (0.7 ~ 1.3) x num_ranks x 13 tables (Sec. IV-B1), one dim for all."""
    if kind not in ("heavy", "normal"):
        raise ConfigError("kind", kind, "choose one of: heavy, normal")
    if num_ranks < 1:
        raise ConfigError("num_ranks", num_ranks, "must be at least 1")
    dist = distribution or load_distribution()
    rng = np.random.default_rng(seed)
    low, high, per = dist.tables_per_rank
    count = max(1, round(rng.uniform(low, high) * num_ranks * per))
    bins = dist.bins if kind == "normal" else tuple(b for b in dist.bins if b[0] >= HEAVY_POOLING)
    dim = int(rng.choice(dist.dims))
    tables = []
    for index in range(count):
        rows = round(float(10 ** rng.uniform(*dist.rows_log10)))
        alpha = float(round(rng.uniform(*dist.zipf_alpha), 3))
        tables.append(Table(index, rows, dim, round(_pooling(rng, bins), 3), alpha))
    return tuple(tables)
