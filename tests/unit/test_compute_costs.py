"""The roofline op-cost model: GEMM efficiency curve properties."""

import pytest

from trainsim.cost.calibration import Calibration, ComputeParams
from trainsim.cost.compute import matmul_efficiency

PEAK = 312e12


@pytest.mark.parametrize("exponent", [0.5, 1.0, 1.48, 3.0])
@pytest.mark.parametrize("dim_exponent", [0.3, 0.7, 1.0])
def test_gemm_time_never_grows_as_work_shrinks(exponent: float, dim_exponent: float) -> None:
    cal = Calibration(compute=ComputeParams(matmul_half_work_flop_per_tflops=3e7, matmul_exponent=exponent,
                                            matmul_half_dim=64.0, matmul_dim_exponent=dim_exponent))
    previous = 0.0
    for step in range(40):
        side = 8 * 1.3**step  # a cube GEMM of growing side: work and smallest dimension both grow
        work = 2.0 * side**3
        seconds = work / (PEAK * matmul_efficiency(work, PEAK, 0.87, cal, 1.0, side))
        assert seconds >= previous * (1 - 1e-12), (side, seconds, previous)
        previous = seconds


def test_large_gemms_approach_the_maximum_efficiency() -> None:
    cal = Calibration(compute=ComputeParams(matmul_half_work_flop_per_tflops=3e7, matmul_exponent=1.5,
                                            matmul_half_dim=32.0, matmul_dim_exponent=1.0))
    assert matmul_efficiency(2.0 * 16384**3, PEAK, 0.87, cal, 1.0, 16384) == pytest.approx(0.87, rel=0.01)
