"""Forward-difference Jacobians of a fit's residuals, their columns evaluated in worker processes.

Each residual evaluation predicts every calibration run (seconds of one core), and a Jacobian takes one per
parameter: with `workers` processes the columns run side by side. The steps are scipy's 2-point ones for a
relative step (finite_steps), so the Jacobian is the one least_squares would take itself.
"""

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager

import numpy as np

Residuals = Callable[[np.ndarray], np.ndarray]

# The residual function of the fit that opened the pool: set before the workers fork, so they inherit it (a
# closure over the fit's runs cannot be pickled to them).
_WORKER_RESIDUALS: list[Residuals] = []


def _column(x: np.ndarray) -> np.ndarray:
    return _WORKER_RESIDUALS[0](x)


class ParallelJacobian(AbstractContextManager["ParallelJacobian"]):
    """jac(x) for least_squares over `residuals`, its columns in `workers` forked processes. f(x) is taken from
    the last evaluation at exactly x (least_squares evaluates f before the Jacobian at the same point)."""

    def __init__(self, residuals: Residuals, bounds: tuple[np.ndarray, np.ndarray], step: float, workers: int,
                 on_column: Callable[[], None] | None = None) -> None:
        self.residuals, self.step, self.on_column = residuals, step, on_column
        self.lower, self.upper = bounds
        self.last: tuple[np.ndarray, np.ndarray] | None = None
        _WORKER_RESIDUALS[:] = [residuals]
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))

    def value(self, x: np.ndarray) -> np.ndarray:
        """residuals(x), remembered for the Jacobian at x."""
        out = self.residuals(x)
        self.last = (x.copy(), out)
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        f0 = self.last[1] if self.last is not None and np.array_equal(self.last[0], x) else self.value(x)
        steps = finite_steps(x, self.lower, self.upper, self.step)
        points = [x + np.eye(len(x))[j] * steps[j] for j in range(len(x))]
        columns = []
        for column in self.pool.map(_column, points):
            columns.append(column)
            if self.on_column is not None:
                self.on_column()
        return np.stack([(c - f0) / h for c, h in zip(columns, steps, strict=True)], axis=1)

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(cancel_futures=True)
        _WORKER_RESIDUALS.clear()


def finite_steps(x: np.ndarray, lower: np.ndarray, upper: np.ndarray, step: float) -> np.ndarray:
    """scipy's 2-point steps for a relative step (scipy/optimize/_numdiff.py, scipy 1.17: _compute_absolute_step
    and _adjust_scheme_to_bounds): step * sign(x) * |x| (at x = 0, sqrt(machine epsilon)), reversed where it
    would leave the bounds, made exactly representable."""
    sign = np.where(x >= 0, 1.0, -1.0)
    h = step * sign * np.abs(x)
    h = np.where((x + h) - x == 0, np.sqrt(np.finfo(float).eps) * sign * np.maximum(1.0, np.abs(x)), h)
    h = np.where((x + h > upper) | (x + h < lower), -h, h)
    return (x + h) - x


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()
