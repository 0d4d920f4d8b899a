"""Fit the reuse-factor lookup model (Lin et al. Sec. III-E) on EmbeddingBag microbenchmarks and score it on
held-out ones, heavy (L >= 20) and normal tables apart, against a roofline baseline.

Passes: on a shared host other processes only ever add time, and their load comes and goes, so the same
benchmarks may be taken in several passes at different times (`trainsim profile-embedding` with the same
--count and --seed); each benchmark's time is then its fastest over the passes (`merge_passes`), and the spread
between passes (`retest_mape`: one pass taken as the prediction of another) is the floor no model of these
targets can go under.

Split: a seeded 80/20 train/test split (the paper's split factor 0.8). The baseline is the roofline of
cost.embedding_lookup with its one parameter, the effective memory bandwidth, fitted on the training rows (the
median of bytes / time): the best a distribution-blind byte count can do on this machine.
"""

from dataclasses import dataclass, replace

import numpy as np

from trainsim.cost.embedding_lookup import lookup_features
from trainsim.cost.lookup_mlp import Mlp, fit_mlp
from trainsim.embedding.tables import INDEX_BYTES, WEIGHT_BYTES
from trainsim.errors import ConfigError
from trainsim.profile.embedding import LookupBench


@dataclass(frozen=True, slots=True)
class LookupFit:
    mlp: Mlp
    train_rows: int
    test_rows: int
    # (phase, "heavy" | "normal" | "all") -> MAPE on the test rows
    mlp_mape: dict[tuple[str, str], float]
    roofline_mape: dict[tuple[str, str], float]
    roofline_bw_bytes_per_s: dict[str, float]


def _bytes(bench: LookupBench, phase: str) -> float:
    rows_read = bench.lookups * bench.table.dim * WEIGHT_BYTES
    other = bench.batch * bench.table.dim * WEIGHT_BYTES + bench.lookups * INDEX_BYTES
    return (rows_read if phase == "fwd" else 2.0 * rows_read) + other


def _features(bench: LookupBench) -> np.ndarray:
    pooling = bench.lookups / bench.batch  # the batch's own mean L
    return lookup_features(bench.table.rows, bench.table.dim, pooling, bench.batch, np.array(bench.rf))


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured)) if measured.size else float("nan")


def merge_passes(passes: list[list[LookupBench]]) -> list[LookupBench]:
    """One list of benchmarks from several passes over the same ones: each phase's fastest time over the passes."""
    if not passes or not passes[0]:
        raise ConfigError("passes", len(passes), "need at least one pass with benchmarks")
    first = passes[0]
    for k, other in enumerate(passes[1:], 2):
        if len(other) != len(first) or any((a.table.rows, a.table.dim, a.batch, a.lookups, a.rf)
                                           != (b.table.rows, b.table.dim, b.batch, b.lookups, b.rf)
                                           for a, b in zip(first, other, strict=True)):
            raise ConfigError(f"pass {k}", f"{len(other)} benchmarks",
                              f"must repeat the first pass's {len(first)} benchmarks (same --count and --seed)")
    return [replace(b, fwd_s=min(p[i].fwd_s for p in passes), bwd_s=min(p[i].bwd_s for p in passes))
            for i, b in enumerate(first)]


def retest_mape(passes: list[list[LookupBench]], *, seed: int = 0, train_share: float = 0.8
                ) -> dict[tuple[str, str], float]:
    """The pass-to-pass spread on the test rows of fit_lookup_model's split: the MAPE of each pass taken as the
    prediction of each other pass, averaged over the ordered pairs. Empty with one pass."""
    if len(passes) < 2:
        return {}
    test = _split(len(passes[0]), seed, train_share)[1]
    heavy = np.array([passes[0][i].table.heavy for i in test])
    out: dict[tuple[str, str], float] = {}
    for phase in ("fwd", "bwd"):
        times = np.array([[getattr(p[i], f"{phase}_s") for i in test] for p in passes])
        for group, mask in (("heavy", heavy), ("normal", ~heavy), ("all", np.ones_like(heavy))):
            pairs = [_mape(times[a][mask], times[b][mask]) for a in range(len(passes))
                     for b in range(len(passes)) if a != b]
            out[(phase, group)] = float(np.mean(pairs))
    return out


def _split(count: int, seed: int, train_share: float) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(count)
    cut = round(train_share * count)
    return order[:cut], order[cut:]


def fit_lookup_model(benches: list[LookupBench], *, seed: int = 0, train_share: float = 0.8,
                     epochs: int = 3000) -> LookupFit:
    if len(benches) < 10:
        raise ConfigError("benchmarks", len(benches), "need at least 10 microbenchmarks to fit and test")
    train_rows, test_rows = _split(len(benches), seed, train_share)
    train, test = [benches[i] for i in train_rows], [benches[i] for i in test_rows]
    x = np.array([_features(b) for b in train])
    y = np.log(np.array([[b.fwd_s, b.bwd_s] for b in train]))
    mlp = fit_mlp(x, y, seed=seed, epochs=epochs)
    predicted = np.exp(mlp.predict(np.array([_features(b) for b in test])))
    heavy = np.array([b.table.heavy for b in test])
    mlp_mape: dict[tuple[str, str], float] = {}
    roof_mape: dict[tuple[str, str], float] = {}
    bandwidths: dict[str, float] = {}
    for column, phase in enumerate(("fwd", "bwd")):
        measured = np.array([b.fwd_s if phase == "fwd" else b.bwd_s for b in test])
        bw = float(np.median([_bytes(b, phase) / (b.fwd_s if phase == "fwd" else b.bwd_s) for b in train]))
        bandwidths[phase] = bw
        roofline = np.array([_bytes(b, phase) / bw for b in test])
        for group, mask in (("heavy", heavy), ("normal", ~heavy), ("all", np.ones_like(heavy))):
            mlp_mape[(phase, group)] = _mape(predicted[mask, column], measured[mask])
            roof_mape[(phase, group)] = _mape(roofline[mask], measured[mask])
    return LookupFit(mlp, len(train), len(test), mlp_mape, roof_mape, bandwidths)
