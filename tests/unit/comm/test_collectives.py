"""Alpha-beta collective times against their closed forms (Thakur et al. 2005, ring algorithms).

For n ranks, a buffer of S bytes, link bandwidth B and per-step latency alpha:
    ring all-reduce                 2(n-1)/n * S/B + 2(n-1) alpha
    ring all-gather / reduce-scatter  (n-1)/n * S/B + (n-1) alpha   (S = the full gathered buffer)
    send-recv                        S/B + alpha
Across N nodes of l ranks each the all-reduce is hierarchical: reduce-scatter inside the node, all-reduce of
the S/l shard across nodes over the NICs (each GPU gets nic_bw * nics_per_node / gpus_per_node), all-gather
inside.
The calibration is set to bw_efficiency=1 and no extra latency, so B and alpha are the link's own numbers.
"""

import pytest

from trainsim.catalog import load_device
from trainsim.catalog.calibration import Calibration, CommParams
from trainsim.comm.collectives import collective_time_s
from trainsim.cost.pricing import axis_layout
from trainsim.hardware.cluster import ClusterSpec, GroupLayout, LinkSpec
from trainsim.strategy.parallel import ParallelSpec

INTRA_BW, INTRA_LAT = 100e9, 1e-6  # bytes/s per GPU, s
NIC_BW, INTER_LAT = 25e9, 4e-6  # bytes/s per NIC, s
GPUS_PER_NODE, NICS_PER_NODE = 8, 4
NIC_BW_PER_GPU = NIC_BW * NICS_PER_NODE / GPUS_PER_NODE
S = 1.0e9
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
EXACT = Calibration(comm={name: CommParams(latency_s=0.0, bw_efficiency=1.0) for name in COLLECTIVES})


def _cluster(num_nodes: int = 4) -> ClusterSpec:
    return ClusterSpec(
        name="test", device=load_device("a100-sxm4-80gb"), gpus_per_node=GPUS_PER_NODE, num_nodes=num_nodes,
        intra_node=LinkSpec(name="intra", kind="nvswitch", bw_bytes_per_s=INTRA_BW, latency_s=INTRA_LAT),
        inter_node=LinkSpec(name="inter", kind="infiniband", bw_bytes_per_s=NIC_BW, latency_s=INTER_LAT),
        nics_per_node=NICS_PER_NODE,
    )


def _time(collective: str, size: int, stride: int, buffer_bytes: float = S,
          cal: Calibration = EXACT) -> float:
    cluster = _cluster()
    return collective_time_s(collective, buffer_bytes, cluster.group_layout(size, stride), cluster, cal)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_single_node(n: int) -> None:
    # 2(n-1)/n * S/B + 2(n-1) alpha
    expected = 2 * (n - 1) / n * S / INTRA_BW + 2 * (n - 1) * INTRA_LAT
    assert _time("all-reduce", n, 1) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", ["all-gather", "reduce-scatter"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_gather_reduce_scatter_single_node(collective: str, n: int) -> None:
    # (n-1)/n * S/B + (n-1) alpha
    expected = (n - 1) / n * S / INTRA_BW + (n - 1) * INTRA_LAT
    assert _time(collective, n, 1) == pytest.approx(expected, rel=1e-12)


def test_calibration_scales_bandwidth_and_adds_latency_per_step() -> None:
    n, eff, extra = 8, 0.5, 3e-6
    cal = Calibration(comm={"all-reduce": CommParams(latency_s=extra, bw_efficiency=eff)})
    # B -> eff * B; alpha -> link latency + calibrated latency per step.
    expected = 2 * (n - 1) / n * S / (eff * INTRA_BW) + 2 * (n - 1) * (INTRA_LAT + extra)
    assert _time("all-reduce", n, 1, cal=cal) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("size", "stride", "local", "nodes"), [(16, 1, 8, 2), (32, 1, 8, 4), (8, 4, 2, 4)])
def test_hierarchical_all_reduce_across_nodes(size: int, stride: int, local: int, nodes: int) -> None:
    layout = _cluster().group_layout(size, stride)
    assert (layout.ranks_per_node, layout.num_nodes) == (local, nodes)
    # reduce-scatter + all-gather inside the node, each (l-1)/l * S/B_intra + (l-1) alpha_intra,
    # then all-reduce of S/l across N nodes: 2(N-1)/N * (S/l)/B_nic_per_gpu + 2(N-1) alpha_inter.
    inside = 2 * ((local - 1) / local * S / INTRA_BW + (local - 1) * INTRA_LAT)
    across = 2 * (nodes - 1) / nodes * (S / local) / NIC_BW_PER_GPU + 2 * (nodes - 1) * INTER_LAT
    assert _time("all-reduce", size, stride) == pytest.approx(inside + across, rel=1e-12)


def test_all_reduce_one_rank_per_node_is_a_flat_ring_over_the_nics() -> None:
    # dp across 4 nodes with tp=8 inside each: l=1, so only the inter-node ring remains.
    n = 4
    expected = 2 * (n - 1) / n * S / NIC_BW_PER_GPU + 2 * (n - 1) * INTER_LAT
    assert _time("all-reduce", n, GPUS_PER_NODE) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", ["all-gather", "reduce-scatter"])
def test_hierarchical_all_gather_is_half_an_all_reduce(collective: str) -> None:
    local, nodes = 8, 2
    # Ring decomposition: all-reduce = reduce-scatter + all-gather, so an all-gather of S across nodes is the
    # inter-node all-gather of the S/l shard plus the intra-node all-gather of S:
    # (N-1)/N * (S/l)/B_nic_per_gpu + (N-1) alpha_inter + (l-1)/l * S/B_intra + (l-1) alpha_intra.
    expected = ((nodes - 1) / nodes * (S / local) / NIC_BW_PER_GPU + (nodes - 1) * INTER_LAT
                + (local - 1) / local * S / INTRA_BW + (local - 1) * INTRA_LAT)
    assert _time(collective, local * nodes, 1) == pytest.approx(expected, rel=1e-12)
    assert _time("reduce-scatter", 16, 1) + _time("all-gather", 16, 1) == pytest.approx(
        _time("all-reduce", 16, 1), rel=1e-12)


def test_send_recv_inside_and_across_nodes() -> None:
    cluster = _cluster()
    inside = cluster.group_layout(2, 4)  # neighbours 4 ranks apart on one 8-GPU node
    across = cluster.group_layout(2, 8)  # the next pipeline stage is on the next node
    assert inside.num_nodes == 1 and across.num_nodes == 2
    # S/B + alpha
    assert collective_time_s("send-recv", S, inside, cluster, EXACT) == pytest.approx(
        S / INTRA_BW + INTRA_LAT, rel=1e-12)
    assert collective_time_s("send-recv", S, across, cluster, EXACT) == pytest.approx(
        S / NIC_BW_PER_GPU + INTER_LAT, rel=1e-12)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_size_one_group_and_empty_buffer_cost_nothing(collective: str) -> None:
    cluster = _cluster()
    single = GroupLayout(size=1, ranks_per_node=1, num_nodes=1)
    assert collective_time_s(collective, S, single, cluster, EXACT) == 0.0
    assert collective_time_s(collective, S, cluster.group_layout(1, 8), cluster, EXACT) == 0.0
    assert collective_time_s(collective, 0.0, cluster.group_layout(8, 1), cluster, EXACT) == 0.0


@pytest.mark.parametrize(("size", "stride", "local", "nodes"), [
    (8, 1, 8, 1),  # tp=8: one full node
    (4, 1, 4, 1),  # tp=4: half a node
    (2, 4, 2, 1),  # dp=2 with tp=4: both on one node
    (4, 8, 1, 4),  # dp=4 with tp=8: one rank per node
    (8, 4, 2, 4),  # dp=8 with tp=4: two ranks on each of 4 nodes
    (16, 2, 4, 4),  # dp=16 with tp=2: four ranks on each of 4 nodes
])
def test_group_layout_strides(size: int, stride: int, local: int, nodes: int) -> None:
    layout = _cluster().group_layout(size, stride)
    assert (layout.size, layout.ranks_per_node, layout.num_nodes) == (size, local, nodes)


def test_axis_layout_orders_tp_fastest_then_cp_dp_pp() -> None:
    cluster = _cluster()  # 32 GPUs on 4 nodes
    par = ParallelSpec(tp=4, cp=1, dp=4, pp=2)
    assert axis_layout("tp", par, cluster) == GroupLayout(size=4, ranks_per_node=4, num_nodes=1)
    assert axis_layout("dp", par, cluster) == GroupLayout(size=4, ranks_per_node=2, num_nodes=2)
    # pp neighbours are tp*cp*dp = 16 ranks apart: on different nodes.
    assert axis_layout("pp", par, cluster) == GroupLayout(size=2, ranks_per_node=1, num_nodes=2)
