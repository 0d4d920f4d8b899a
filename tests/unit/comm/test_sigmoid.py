"""Sigmoid-fitted collective curves (Lin et al. Eq. 2-4): the three regions, fits that recover known curves, and
the CommCostModel around them."""

import math

import pytest

from trainsim.catalog import load_cluster
from trainsim.comm.sigmoid import AlphaBetaCurve, SigmoidComm, SigmoidCurve, fit_alpha_beta, fit_sigmoid
from trainsim.errors import ConfigError, UnknownNameError
from trainsim.hardware.cluster import GroupLayout

CURVE = SigmoidCurve(startup_s=20e-6, m1_bytes=4096.0, m2_bytes=2**22, height=2.0, x0=5.0, k=2.0, base=8.0,
                     bw_max_bytes_per_s=1e10)


def test_three_regions() -> None:
    assert CURVE.time_s(1024.0) == 20e-6  # latency bound
    assert CURVE.time_s(2.0**23) == pytest.approx(20e-6 + 2**23 / 1e10)  # bandwidth bound
    # middle: bandwidth 10 ** (2 / (1 + e^0) + 8) = 10^9 at 10^5 bytes
    assert CURVE.time_s(1e5) == pytest.approx(1e5 / 1e9)
    assert CURVE.time_s(0.0) == 0.0


def test_fit_recovers_a_sampled_curve() -> None:
    sizes = [4.0 * 2**i for i in range(24)]
    times = [CURVE.time_s(m) for m in sizes]
    fitted = fit_sigmoid(sizes, times)
    for m, t in zip(sizes, times, strict=True):
        assert fitted.time_s(m) == pytest.approx(t, rel=0.05)


def test_alpha_beta_fit_is_exact_on_a_line() -> None:
    line = AlphaBetaCurve(10e-6, 5e9)
    sizes = [1e3, 1e4, 1e5, 1e6]
    fitted = fit_alpha_beta(sizes, [line.time_s(m) for m in sizes])
    assert fitted.alpha_s == pytest.approx(10e-6) and fitted.bw_bytes_per_s == pytest.approx(5e9)


def test_sigmoid_beats_alpha_beta_on_an_s_curve() -> None:
    sizes = [4.0 * 2**i for i in range(24)]
    times = [CURVE.time_s(m) for m in sizes]
    ab = fit_alpha_beta(sizes, times)
    sig = fit_sigmoid(sizes, times)

    def mape(model: SigmoidCurve | AlphaBetaCurve) -> float:
        return sum(abs(model.time_s(m) - t) / t for m, t in zip(sizes, times, strict=True)) / len(sizes)

    assert mape(sig) < 0.5 * mape(ab)


def test_comm_model_uses_curves_and_falls_back() -> None:
    cluster = load_cluster("local-cpu")
    model = SigmoidComm({("all-to-all", 4): CURVE})
    four = GroupLayout(size=4, ranks_per_node=4, num_nodes=1)
    assert model.collective_time_s("all-to-all", 1e5, four, cluster) == pytest.approx(1e-4)
    assert model.collective_time_s("all-to-all", 1e5, GroupLayout(size=1, ranks_per_node=1, num_nodes=1),
                                   cluster) == 0.0
    with pytest.raises(UnknownNameError, match="all-reduce x4"):
        model.collective_time_s("all-reduce", 1e5, four, cluster)
    fallback = SigmoidComm({}, SigmoidComm({("all-reduce", 4): CURVE}))
    assert math.isclose(fallback.collective_time_s("all-reduce", 1e5, four, cluster), 1e-4)


def test_fit_refuses_too_few_or_bad_points() -> None:
    with pytest.raises(ConfigError, match="at least 4"):
        fit_sigmoid([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match="at least 4"):
        fit_sigmoid([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, float("nan"), 3.0])
