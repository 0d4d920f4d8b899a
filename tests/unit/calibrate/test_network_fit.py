"""The scale-out network's fit per fabric (calibrate.microbenchmarks.fit_networks): the fabrics with multi-node
measurements get their own extra step latency (over NCCL's hwLatencies[NET] and the link's) and bandwidth
efficiency; every other fabric NCCL's own step latency (no extra) and the measured fabrics' bandwidth efficiency.
The package's collectives.csv has multi-node rows on EFA only."""

import pytest

from trainsim.calibrate.microbenchmarks import (
    NCCL_NET_EXTRA_STEP_LATENCY_S,
    CollectiveSample,
    collective_samples,
    fit_networks,
)
from trainsim.catalog.calibration import MEASUREMENTS_DIR, Calibration, load_calibration
from trainsim.comm import nccl_tuning as nccl


@pytest.fixture(scope="module")
def across() -> list[CollectiveSample]:
    """The collectives.csv rows whose group crosses NVLink domains."""
    return [s for s in collective_samples(MEASUREMENTS_DIR / "collectives.csv") if s.layout.num_domains > 1]


def test_only_efa_is_measured_across_servers(across: list[CollectiveSample]) -> None:
    assert len(across) == 20 and {s.cluster.inter_node.kind for s in across} == {"efa"}


def test_a_fabric_without_measurements_takes_nccls_step_latency(across: list[CollectiveSample]) -> None:
    default, by_fabric = fit_networks(across, Calibration())
    assert set(by_fabric) == {"efa"}
    assert default.latency_s == NCCL_NET_EXTRA_STEP_LATENCY_S == 0.0
    assert default.bw_efficiency == by_fabric["efa"].bw_efficiency
    # EFA's measured steps are far slower than NCCL's 14 us Simple ring step over the network
    assert by_fabric["efa"].latency_s > 3 * nccl.NET_RING_STEP_S[nccl.SIMPLE]
    none, nothing = fit_networks([], Calibration())
    assert nothing == {} and none.latency_s == NCCL_NET_EXTRA_STEP_LATENCY_S


def test_the_package_fit_holds_the_collective_fit(package_micro_fit: Calibration) -> None:
    """fitted.yaml's collective parameters are what fit_collectives gives today (scripts/refit_collectives.py
    wrote them), to the six digits the file keeps (fit_micro's collective parameters are fit_collectives')."""
    fit, package = package_micro_fit, load_calibration()
    assert package.comm_network.latency_s == pytest.approx(fit.comm_network.latency_s, rel=1e-5)
    assert package.comm_network.bw_efficiency == pytest.approx(fit.comm_network.bw_efficiency, rel=1e-5)
    assert set(package.comm_network_by_fabric) == set(fit.comm_network_by_fabric) == {"efa"}
    for name, params in fit.comm_network_by_fabric.items():
        assert package.comm_network_by_fabric[name].latency_s == pytest.approx(params.latency_s, rel=1e-5)
    for name, params in fit.comm.items():
        assert package.comm[name].bw_efficiency == pytest.approx(params.bw_efficiency, rel=1e-5)
