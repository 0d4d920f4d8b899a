"""Time of an EmbeddingBag lookup (forward) and its backward with the sparse update, per sharded piece.

Two models behind one protocol (and InSituLookup, either of them scaled to the lookups inside an iteration):
- roofline: the bytes of the rows read (samples x L x D x 4) and the pooled output written, over the device's
  memory bandwidth; the backward reads the output gradient and reads and writes every looked-up row (2x the
  rows). Blind to the index distribution (the baseline of Lin et al. Sec. III-E).
- mlp: Lin et al. Sec. III-E: a small MLP of (E, D, L, batch, reuse-factor histogram of the batch) -> forward
  and backward time, trained on microbenchmarks of this device (`trainsim profile embedding`).

The reuse factors of a piece come from a batch drawn from its table's index distribution
(embedding.indices.sample_batch, seeded), or from the real batch where the caller has it.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from trainsim.cost.lookup_mlp import Mlp
from trainsim.embedding.indices import RF_BINS, popularity_cdf, reuse_factors, sample_batch
from trainsim.embedding.lookup_model import LookupCostModel, LookupPhase
from trainsim.embedding.sharding import ShardPiece
from trainsim.embedding.tables import INDEX_BYTES, WEIGHT_BYTES, Table
from trainsim.errors import ConfigError, InputFileError
from trainsim.hardware.device import DeviceSpec

_VALUES_READ_FEATURE = 5  # log2(lookups x D) in lookup_features
MAX_IN_SITU_SCALE = 100.0  # a bound on a fitted in-situ factor, so a broken fit is refused, not used


# Mean hit count of a row in each reuse-factor bin [2^b, 2^(b+1)): 1 for the first bin, the bin's middle after.
_BIN_HITS = np.array([1.0] + [1.5 * 2.0**b for b in range(1, RF_BINS)])
FEATURES = 27  # the length of lookup_features' vector: a fitted model with another length is refused


def lookup_features(rows: int, dim: int, pooling: float, samples: int, rf: NDArray[np.float64]) -> NDArray[np.float64]:
    """The model's inputs: log2 of E, D, L (+1), the batch, the lookups, the values read (lookups x D) and the
    table's size (E x D, against the caches), then the 17 reuse factors, then three that the reuse factors imply:
    log2 of the distinct rows the batch touches (lookups / mean hits per row), of the values of those rows
    (distinct x D: the scattered read-modify-writes of the sparse update, which on a CPU cost a cache and TLB miss
    each once the table outgrows the caches) and of lookups x log2(lookups) (the sort that coalesces the sparse
    gradient). NB: the derived three are ours (feature engineering, not in Lin et al.); they are functions of the
    paper's inputs (E, D, L, batch, RF)."""
    lookups = pooling * samples + 1.0
    head = np.log2([max(rows, 1), max(dim, 1), pooling + 1.0, max(samples, 1), lookups, lookups * max(dim, 1),
                    max(rows, 1) * max(dim, 1)])
    distinct = lookups / max(float(np.dot(rf, _BIN_HITS)), 1.0) + 1.0
    derived = np.log2([distinct, distinct * max(dim, 1), lookups * np.log2(lookups + 1.0)])
    return np.concatenate([head, rf, derived])



@dataclass(frozen=True, slots=True)
class RooflineLookup:
    device: DeviceSpec
    name: str = "roofline"

    def lookup_s(self, piece: ShardPiece, phase: LookupPhase) -> float:
        rows_read = piece.samples * piece.pooling * piece.dim * WEIGHT_BYTES
        pooled = piece.samples * piece.dim * WEIGHT_BYTES
        indices = piece.samples * piece.pooling * INDEX_BYTES
        moved = rows_read + pooled + indices if phase == "fwd" else 2.0 * rows_read + pooled + indices
        return moved / self.device.hbm_bw_bytes_per_s


@dataclass(slots=True)
class MlpLookup:
    """The learned model; reuse factors of each piece drawn once per (table, rows, samples, pooling) with `seed`."""

    mlp: Mlp
    seed: int = 0
    name: str = "mlp"
    _rf: dict[tuple[Table, int, int, float], NDArray[np.float64]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, seed: int = 0) -> "MlpLookup":
        mlp = Mlp.load(path)
        if mlp.mean.shape != (FEATURES,):
            raise InputFileError(f"the lookup model {path} takes {mlp.mean.shape[0]} features, this version "
                                 f"{FEATURES}: refit it with `trainsim profile-embedding --no-measure --fit`")
        return cls(mlp, seed)

    def reuse_factors(self, piece: ShardPiece) -> NDArray[np.float64]:
        key = (piece.table, piece.rows, piece.samples, piece.pooling)
        if key not in self._rf:
            # The piece as a table of its own: its rows, its share of the lookups, the table's skew.
            table = Table(piece.table.index, piece.rows, piece.dim, piece.pooling, piece.table.zipf_alpha)
            cdf = popularity_cdf(table.rows, table.zipf_alpha) if table.zipf_alpha else None
            _, indices = sample_batch(table, piece.samples, np.random.default_rng(self.seed + piece.table.index), cdf)
            self._rf[key] = reuse_factors(indices)
        return self._rf[key]

    def within_range(self, piece: ShardPiece) -> tuple[ShardPiece, float]:
        """The piece brought inside the benchmarked range, and the factor its time is scaled by: a pooling
        factor, a batch or a count of values read (lookups x D) beyond the largest benchmarked is priced at that
        largest and scaled linearly in the lookups. NB: the model is never evaluated outside its training range
        (an MLP extrapolates arbitrarily: unscaled, L = 800 came out cheaper than L = 200); beyond it a lookup's
        work grows with its lookups, which is what the linear scaling assumes."""
        high = self.mlp.high  # log2 of the largest benchmarked L + 1, batch, (lookups + 1) x D (lookup_features)
        pooling, samples, dim, scale = piece.pooling, piece.samples, max(piece.dim, 1), 1.0
        if np.log2(pooling + 1.0) > high[2]:
            inside = 2.0 ** high[2] - 1.0
            scale, pooling = scale * pooling / inside, inside
        if np.log2(max(samples, 1)) > high[3]:
            inside = 2.0 ** high[3]
            scale, samples = scale * samples / inside, max(1, int(inside))
        beyond = np.log2((pooling * samples + 1.0) * dim) - high[_VALUES_READ_FEATURE]
        if beyond > 0.0:
            scale, pooling = scale * 2.0**beyond, (2.0 ** high[_VALUES_READ_FEATURE] / dim - 1.0) / samples
        if scale == 1.0:
            return piece, 1.0
        return replace(piece, pooling=pooling, samples=samples), scale

    def lookup_s(self, piece: ShardPiece, phase: LookupPhase) -> float:
        """NB: inside the benchmarked range, the remaining inputs (E, reuse factors) are clamped to it."""
        inside, scale = self.within_range(piece)
        features = lookup_features(inside.rows, inside.dim, inside.pooling, inside.samples, self.reuse_factors(inside))
        log_fwd, log_bwd = self.mlp.predict(features)[0]
        return float(np.exp(log_fwd if phase == "fwd" else log_bwd)) * scale


@dataclass(frozen=True, slots=True)
class InSituLookup:
    """A lookup model's price scaled per phase to what the lookups take inside a training iteration: the
    microbenchmarks time one table alone (cold caches, the fastest of their repeats); in an iteration a rank runs
    its pieces back to back beside the other ranks, the dense part and the collectives' threads. The factors are
    fitted from measured traces (calibrate.lookup_in_situ: Lin et al.'s Algorithm 1 takes what the kernel models
    miss from collected traces, Sec. III-D); 1.0 prices the microbenchmarks as they are."""

    model: LookupCostModel
    fwd_scale: float = 1.0
    bwd_scale: float = 1.0

    def __post_init__(self) -> None:
        for phase in ("fwd_scale", "bwd_scale"):
            value = getattr(self, phase)
            if not 0.0 < value <= MAX_IN_SITU_SCALE:  # NB: also refuses NaN
                raise ConfigError(f"lookup_in_situ.{phase}", value, f"must be in (0, {MAX_IN_SITU_SCALE:g}]")

    @property
    def name(self) -> str:
        return f"{self.model.name} in situ"

    def lookup_s(self, piece: ShardPiece, phase: LookupPhase) -> float:
        return self.model.lookup_s(piece, phase) * (self.fwd_scale if phase == "fwd" else self.bwd_scale)
