"""The parallel Jacobian equals scipy's own 2-point Jacobian for the same relative step."""

import numpy as np
import pytest

from trainsim.calibrate.jacobian import ParallelJacobian, can_fork, finite_steps


def _residuals(x: np.ndarray) -> np.ndarray:
    return np.array([x[0] ** 2 - x[1], np.sin(x[1]) * x[2], x[0] * x[1] * x[2] - 1.0, np.exp(0.1 * x[2])])


@pytest.mark.skipif(not can_fork(), reason="worker processes are forked")
def test_parallel_columns_equal_scipys_two_point_jacobian() -> None:
    from scipy.optimize._numdiff import approx_derivative

    x = np.array([0.7, -2.0, 2.95])
    lower, upper = np.array([-5.0, -5.0, 0.0]), np.array([5.0, 5.0, 2.951])  # x[2]'s forward step leaves
    expected = np.asarray(approx_derivative(_residuals, x, method="2-point", rel_step=1e-3, bounds=(lower, upper)))
    counted: list[int] = []
    with ParallelJacobian(_residuals, (lower, upper), 1e-3, 2, lambda: counted.append(1)) as jac:
        f0 = jac.value(x)
        got = jac(x)
    assert f0 == pytest.approx(_residuals(x))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert len(counted) == 3  # one per column


def test_steps_turn_back_at_a_bound_and_follow_the_sign() -> None:
    steps = finite_steps(np.array([2.0, -3.0, 0.9995, 0.0]), np.full(4, -10.0), np.array([10.0, 10.0, 1.0, 1.0]),
                         1e-3)
    assert steps[0] == pytest.approx(2e-3)
    assert steps[1] == pytest.approx(-3e-3)
    assert steps[2] == pytest.approx(-0.9995e-3)
    assert steps[3] == pytest.approx(np.sqrt(np.finfo(float).eps))
