"""One embedding table as the sharders and cost models see it: rows E, dim D, pooling factor L (mean lookups per
sample) and the index skew (Zipf exponent). Lin et al. Sec. III-A: a table is heavy when its mean L >= 20."""

from collections.abc import Iterable
from dataclasses import dataclass

from trainsim.errors import ConfigError
from trainsim.ir.model_spec import EmbeddingTable

HEAVY_POOLING = 20.0  # Lin et al. Sec. III-A: "heavy tables" have an average L of 20 or more
WEIGHT_BYTES = 4  # fp32 rows (FBGEMM's training tables in the paper's setup, Sec. V-B: FP32 only)
INDEX_BYTES = 8  # int64 lookup indices
OFFSET_BYTES = 8  # int64 per-sample offsets (lengths) sent with the indices


@dataclass(frozen=True, slots=True)
class Table:
    index: int
    rows: int
    dim: int
    pooling: float
    zipf_alpha: float = 0.0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.dim < 1:
            raise ConfigError(f"table{self.index}.rows/dim", (self.rows, self.dim), "must both be at least 1")
        if not 0.0 < self.pooling < 1e6:
            raise ConfigError(f"table{self.index}.pooling", self.pooling, "must be in (0, 1e6)")
        if not 0.0 <= self.zipf_alpha <= 4.0:
            raise ConfigError(f"table{self.index}.zipf_alpha", self.zipf_alpha, "must be in [0, 4]")

    @property
    def heavy(self) -> bool:
        return self.pooling >= HEAVY_POOLING

    @property
    def weight_bytes(self) -> float:
        return float(self.rows) * self.dim * WEIGHT_BYTES

    def describe(self) -> str:
        return f"t{self.index}(E={self.rows}, D={self.dim}, L={self.pooling:g}, a={self.zipf_alpha:g})"


def tables_from_spec(tables: Iterable[EmbeddingTable]) -> tuple[Table, ...]:
    """The model's tables, one entry per physical table (count expanded), indexed in order."""
    out: list[Table] = []
    for spec in tables:
        for _ in range(spec.count):
            out.append(Table(len(out), spec.rows, spec.dim, spec.pooling_factor, spec.zipf_alpha))
    return tuple(out)
