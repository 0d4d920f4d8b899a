"""Sigmoid-fitted collective curves (Lin et al. Sec. III-C, Eq. 2-4) as a CommCostModel.

The time of a collective of message size m falls in three regions (Fig. 4):
  m <= m1:       t = t_s                       (latency bound: constant)
  m1 < m < m2:   t = m / 10 ** sigmoid(log10 m) (the S-shaped bandwidth curve)
  m >= m2:       t = t_s + m / BW_max           (bandwidth bound: linear)
with sigmoid(x) = L / (1 + exp(-k (x - x0))) + b: 8 parameters per collective (4 of the sigmoid, 2 boundaries,
the startup latency, the peak bandwidth). NB: the paper's Eq. 3 is garbled in our copy; we read its middle region
as log10 of the bandwidth following the sigmoid of log10 of the size, which is the S-curve of Fig. 4.

Fitting (fit_sigmoid): pairs of boundaries among the measured sizes are tried (all, or 24 quantiles of them);
t_s is the median time at or below m1, BW_max the least-squares slope of (t - t_s) against m at or above m2,
and the sigmoid the best of a grid over (k, x0) with L and b solved linearly for each; the four best boundary
pairs' sigmoids are then polished by a local least-squares search (in log10 bandwidth, on the points inside the
region, or with its boundaries where fewer than 4 lie inside); the least squared log error wins.
Deterministic, no random restarts.
Sizes follow the data they were fitted on (Comm.buffer_bytes for trainsim's own microbenchmarks, the nccl-tests
message size for collectives.csv); curves are per (collective, group size).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.comm.collectives import CommCostModel
from trainsim.errors import ConfigError, UnknownNameError
from trainsim.hardware.cluster import ClusterSpec, GroupLayout


@dataclass(frozen=True, slots=True)
class SigmoidCurve:
    startup_s: float
    m1_bytes: float
    m2_bytes: float
    height: float  # L
    x0: float
    k: float
    base: float  # b
    bw_max_bytes_per_s: float

    def sigmoid(self, x: float) -> float:
        return self.height / (1.0 + math.exp(min(700.0, max(-700.0, -self.k * (x - self.x0))))) + self.base

    def time_s(self, message_bytes: float) -> float:
        if message_bytes <= 0:
            return 0.0
        if message_bytes <= self.m1_bytes:
            return self.startup_s
        if message_bytes >= self.m2_bytes:
            return self.startup_s + message_bytes / self.bw_max_bytes_per_s
        return message_bytes / 10.0 ** self.sigmoid(math.log10(message_bytes))


_K_GRID = np.geomspace(0.3, 30.0, 15)
_BOUNDARY_CANDIDATES = 24  # boundaries tried at up to this many sizes (quantiles of the measured ones)


def _fit_sigmoid_part(x: np.ndarray, y: np.ndarray, refine: bool = True) -> tuple[float, float, float, float, float]:
    """(L, x0, k, b, squared error) of y ~ L sigmoid(k (x - x0)) + b: a grid, then (refine) a local search."""
    best = (0.0, float(x.mean()), 1.0, float(y.mean()), float(((y - y.mean()) ** 2).sum()))
    if len(x) < 3:
        return best
    x0s, ks = np.meshgrid(np.linspace(x.min(), x.max(), 15), _K_GRID, indexing="ij")
    x0s, ks = x0s.ravel(), ks.ravel()
    sig = 1.0 / (1.0 + np.exp(np.clip(-ks[:, None] * (x[None, :] - x0s[:, None]), -500.0, 500.0)))
    # y ~ L s + b for every grid point at once: the normal equations of a straight line in s
    n, s_sum, y_sum = len(x), sig.sum(1), y.sum()
    ss, sy = (sig * sig).sum(1), (sig * y[None, :]).sum(1)
    det = n * ss - s_sum**2
    ok = det > 1e-12
    height = np.where(ok, (n * sy - s_sum * y_sum) / np.where(ok, det, 1.0), 0.0)
    base = np.where(ok, (y_sum - height * s_sum) / n, y_sum / n)
    errors = ((height[:, None] * sig + base[:, None] - y[None, :]) ** 2).sum(1)
    g = int(np.argmin(errors))
    if errors[g] < best[4]:
        best = (float(height[g]), float(x0s[g]), float(ks[g]), float(base[g]), float(errors[g]))
    return _refine(x, y, best) if refine else best


def _refine(x: np.ndarray, y: np.ndarray,
            start: tuple[float, float, float, float, float]) -> tuple[float, float, float, float, float]:
    """Polish the grid's best with a local least-squares search over all four parameters."""
    from scipy.optimize import least_squares

    def residual(p: np.ndarray) -> np.ndarray:
        return p[0] / (1.0 + np.exp(np.clip(-p[2] * (x - p[1]), -500.0, 500.0))) + p[3] - y

    fit = least_squares(residual, np.array(start[:4]), method="lm" if len(x) >= 4 else "trf")
    error = float((residual(fit.x) ** 2).sum())
    if not fit.success or not error < start[4] or not np.all(np.isfinite(fit.x)):
        return start
    height, x0, k, base = (float(v) for v in fit.x)
    return height, x0, k, base, error


def fit_sigmoid(sizes: Sequence[float], times_s: Sequence[float]) -> SigmoidCurve:
    """Fit the curve to measured (message bytes, seconds); at least 4 distinct sizes."""
    order = np.argsort(np.asarray(sizes, dtype=float))
    m = np.asarray(sizes, dtype=float)[order]
    t = np.asarray(times_s, dtype=float)[order]
    if len(m) < 4 or not (np.all(m > 0) and np.all(t > 0) and np.all(np.isfinite(t))):
        raise ConfigError("sizes/times", len(m), "need at least 4 positive, finite (size, time) points")
    n = len(m)
    candidates = sorted({round(float(q)) for q in np.linspace(0, n - 1, min(n, _BOUNDARY_CANDIDATES))})
    pairs = sorted((_log_error(_curve_for(m, t, i1, i2, refine=False), m, t), i1, i2)
                   for a, i1 in enumerate(candidates) for i2 in candidates[a + 1:])
    # the grid's best few boundary pairs, each polished; the least error wins
    polished = [_curve_for(m, t, i1, i2, refine=True) for _, i1, i2 in pairs[:4]]
    return min(polished, key=lambda curve: _log_error(curve, m, t))


def _log_error(curve: SigmoidCurve, m: np.ndarray, t: np.ndarray) -> float:
    predicted = np.array([curve.time_s(v) for v in m])
    return float((np.log10(predicted / t) ** 2).sum())


def _curve_for(m: np.ndarray, t: np.ndarray, i1: int, i2: int, refine: bool) -> SigmoidCurve:
    startup = float(np.median(t[: i1 + 1]))
    tail_m, tail_t = m[i2:], t[i2:] - startup
    slope = float((tail_m * tail_t).sum() / (tail_m**2).sum())  # seconds per byte
    if slope <= 0:
        slope = float((m[-1] / t[-1]) ** -1)
    lo, hi = (i1 + 1, i2) if i2 - i1 - 1 >= 4 else (i1, i2 + 1)  # inside the region; boundaries if too few
    x, y = np.log10(m[lo:hi]), np.log10(m[lo:hi] / t[lo:hi])
    height, x0, k, base, _ = _fit_sigmoid_part(x, y, refine)
    return SigmoidCurve(startup, float(m[i1]), float(m[i2]), height, x0, k, base, 1.0 / slope)


@dataclass(frozen=True, slots=True)
class AlphaBetaCurve:
    """t = alpha + m / beta fitted by least squares in relative error: the baseline the sigmoid improves on
    (Lin et al. Eq. 1)."""

    alpha_s: float
    bw_bytes_per_s: float

    def time_s(self, message_bytes: float) -> float:
        return self.alpha_s + message_bytes / self.bw_bytes_per_s if message_bytes > 0 else 0.0


def fit_alpha_beta(sizes: Sequence[float], times_s: Sequence[float]) -> AlphaBetaCurve:
    m, t = np.asarray(sizes, dtype=float), np.asarray(times_s, dtype=float)
    if len(m) < 2:
        raise ConfigError("sizes/times", len(m), "need at least 2 (size, time) points")
    design = np.stack([np.ones_like(m), m], 1) / t[:, None]  # rows scaled by 1/t: relative error
    (alpha, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    per_byte = max(float(per_byte), 1e-15)
    return AlphaBetaCurve(max(float(alpha), 0.0), 1.0 / per_byte)


class SigmoidComm:
    """CommCostModel from fitted curves keyed by (collective, group size); other collectives and sizes go to
    `fallback` (the alpha-beta model) when given, else refuse."""

    name = "sigmoid"

    def __init__(self, curves: dict[tuple[str, int], SigmoidCurve], fallback: CommCostModel | None = None) -> None:
        self.curves = curves
        self.fallback = fallback

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout,
                          cluster: ClusterSpec) -> float:
        if layout.size <= 1 or buffer_bytes <= 0:
            return 0.0
        curve = self.curves.get((collective, layout.size))
        if curve is not None:
            return curve.time_s(buffer_bytes)
        if self.fallback is not None:
            return self.fallback.collective_time_s(collective, buffer_bytes, layout, cluster)
        raise UnknownNameError("collective", f"{collective} x{layout.size}",
                               [f"{c} x{n}" for c, n in sorted(self.curves)])
