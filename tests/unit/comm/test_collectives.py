"""Collective times as NCCL runs them, against hand-computed closed forms (comm/collectives.py module doc).

For n ranks, l per NVLink domain on D domains, a buffer of S bytes, NVLink bandwidth B and per-step latency a,
per-GPU NIC bandwidth N (NIC bw x NICs per server / GPUs per server) and network step latency b:
    ring all-reduce                 (2(n-1) - 2(D-1)) a + 2(D-1) b + 2(n-1)/n * S / B_ring
    ring all-gather / reduce-scatter ((n-1) - (D-1)) a + (D-1) b + (n-1)/n * S / B_ring
    B_ring = B inside one domain, min(B, l N) across domains
    tree all-reduce (D > 1)         2((l-1) a + log2(D) b) + 2 S / (0.92 B_ring)
    NVLS all-reduce (one domain)    25 us + S / (B e_nvls)
    send-recv                       S/B + a inside a domain, S/N + b across
The calibration is set to efficiency 1, no start-up and no extra latency, so B, N, a and b are the links' own
numbers; every algorithm but NVLS adds the fitted start-up (base_latency_s) on top.
"""

import math

import pytest

from trainsim.catalog import load_cluster, load_device
from trainsim.catalog.calibration import Calibration, CommParams
from trainsim.comm.collectives import (
    NVLS_LATENCY_S,
    TREE_BW_FACTOR,
    NcclComm,
    choose_algorithm,
    collective_time_s,
)
from trainsim.cost.pricing import axis_layout
from trainsim.hardware.cluster import ClusterSpec, GroupLayout, LinkSpec
from trainsim.strategy.parallel import ParallelSpec

INTRA_BW, INTRA_LAT = 100e9, 1e-6  # bytes/s per GPU, s
NIC_BW, INTER_LAT = 25e9, 4e-6  # bytes/s per NIC, s
GPUS_PER_NODE, NICS_PER_NODE = 8, 4
NIC_BW_PER_GPU = NIC_BW * NICS_PER_NODE / GPUS_PER_NODE  # 12.5 GB/s
S = 1.0e9
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
NVLS_EFF = 1.0
EXACT = Calibration(comm={name: CommParams(latency_s=0.0, bw_efficiency=1.0, nvls_bw_efficiency=NVLS_EFF,
                                          base_latency_s=0.0) for name in COLLECTIVES},
                    comm_network=CommParams(latency_s=0.0, bw_efficiency=1.0))


def _cluster(num_nodes: int = 4, **extra: object) -> ClusterSpec:
    multicast = bool(extra.pop("multicast", False))
    inter = extra.pop("inter_node", LinkSpec(name="inter", kind="infiniband", bw_bytes_per_s=NIC_BW,
                                             latency_s=INTER_LAT))
    return ClusterSpec(
        name="test", device=load_device("a100-sxm4-80gb"), gpus_per_node=GPUS_PER_NODE, num_nodes=num_nodes,
        intra_node=LinkSpec(name="intra", kind="nvswitch", bw_bytes_per_s=INTRA_BW, latency_s=INTRA_LAT,
                            multicast=multicast),
        inter_node=inter, nics_per_node=NICS_PER_NODE, **extra,  # type: ignore[arg-type]
    )


def _time(collective: str, size: int, stride: int, buffer_bytes: float = S, cal: Calibration = EXACT,
          cluster: ClusterSpec | None = None, hierarchical: bool = False) -> float:
    cluster = cluster or _cluster()
    return collective_time_s(collective, buffer_bytes, cluster.group_layout(size, stride), cluster, cal,
                             hierarchical=hierarchical)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_single_node(n: int) -> None:
    expected = 2 * (n - 1) / n * S / INTRA_BW + 2 * (n - 1) * INTRA_LAT
    assert _time("all-reduce", n, 1) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", ["all-gather", "reduce-scatter"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_gather_reduce_scatter_single_node(collective: str, n: int) -> None:
    expected = (n - 1) / n * S / INTRA_BW + (n - 1) * INTRA_LAT
    assert _time(collective, n, 1) == pytest.approx(expected, rel=1e-12)


def test_calibration_scales_bandwidth_and_adds_start_up_and_latency_per_step() -> None:
    n, eff, extra, base = 8, 0.5, 3e-6, 7e-6
    cal = Calibration(comm={"all-reduce": CommParams(latency_s=extra, bw_efficiency=eff, base_latency_s=base)})
    expected = base + 2 * (n - 1) / n * S / (eff * INTRA_BW) + 2 * (n - 1) * (INTRA_LAT + extra)
    assert _time("all-reduce", n, 1, cal=cal) == pytest.approx(expected, rel=1e-12)


def test_two_node_ring_by_hand() -> None:
    # 16 ranks on 2 servers of 8: 30 ring steps, 2 of them cross the network. Bus bandwidth: the 8 NICs'
    # shares of the group's ranks in a server, 8 x 12.5 = 100 GB/s, no more than NVLink (100 GB/s).
    # 28 x 1 us + 2 x 4 us + 2 x 15/16 x 1 GB / 100 GB/s = 36 us + 18.75 ms
    assert choose_algorithm("all-reduce", S, _cluster().group_layout(16, 1), _cluster(), EXACT)[0] == "ring"
    assert _time("all-reduce", 16, 1) == pytest.approx(36e-6 + 18.75e-3, rel=1e-12)


def test_cross_node_ring_is_bounded_by_the_nics_of_the_groups_ranks() -> None:
    # dp=8 with tp=4: 2 ranks per server on 4 servers; the ring gets 2 NIC shares = 25 GB/s, not NVLink.
    n, local, nodes = 8, 2, 4
    ring = 2 * (n - 1) / n * S / (local * NIC_BW_PER_GPU) + (2 * (n - 1) - 2 * (nodes - 1)) * INTRA_LAT \
        + 2 * (nodes - 1) * INTER_LAT
    assert _time("all-reduce", n, 4) == pytest.approx(ring, rel=1e-12)


def test_tree_wins_small_all_reduces_over_many_servers() -> None:
    cluster = _cluster(num_nodes=32)
    layout = cluster.group_layout(32, 8)  # one rank on each of 32 servers
    small = 1e3
    tree = 2 * math.log2(32) * INTER_LAT + 2 * small / (TREE_BW_FACTOR * NIC_BW_PER_GPU)
    ring = 2 * 31 * INTER_LAT + 2 * 31 / 32 * small / NIC_BW_PER_GPU
    assert choose_algorithm("all-reduce", small, layout, cluster, EXACT) == ("tree", pytest.approx(tree, rel=1e-12))
    assert tree < ring
    # Large buffers: the ring's 2(n-1)/n beats the tree's 2/0.92.
    assert choose_algorithm("all-reduce", S, layout, cluster, EXACT)[0] == "ring"


def test_nvls_on_a_multicast_nvswitch_for_large_all_reduces() -> None:
    cluster = _cluster(num_nodes=1, multicast=True)
    layout = cluster.group_layout(8, 1)
    assert choose_algorithm("all-reduce", S, layout, cluster, EXACT) == (
        "nvls", pytest.approx(NVLS_LATENCY_S + S / (INTRA_BW * NVLS_EFF), rel=1e-12))
    assert choose_algorithm("all-reduce", 1e4, layout, cluster, EXACT)[0] == "ring"  # 25 us start-up
    plain = _cluster(num_nodes=1)
    assert choose_algorithm("all-reduce", S, plain.group_layout(8, 1), plain, EXACT)[0] == "ring"


def test_in_network_reduction_where_the_cluster_declares_it() -> None:
    cluster = _cluster(in_network_reduction=True)
    layout = cluster.group_layout(32, 1)  # 8 ranks on each of 4 servers
    # reduce-scatter / all-gather over NVLink (2 x 7/8 S / B = 17.5 ms) against S/l through each NIC to the
    # switch (1 GB / 8 / 12.5 GB/s = 10 ms): NVLink bound; latency 2 (a + 7 x 0.4 us) + b.
    expected = 2 * (INTRA_LAT + 7 * 0.4e-6) + INTER_LAT + 2 * 7 / 8 * S / INTRA_BW
    assert choose_algorithm("all-reduce", S, layout, cluster, EXACT) == ("collnet", pytest.approx(expected))
    assert choose_algorithm("all-reduce", S, layout, _cluster(), EXACT)[0] != "collnet"


@pytest.mark.parametrize("collective", ["all-gather", "reduce-scatter"])
def test_pat_at_one_rank_per_server(collective: str) -> None:
    cluster = _cluster(num_nodes=16)
    layout = cluster.group_layout(16, 8)
    expected = math.log2(16) * INTER_LAT + 15 / 16 * 1e6 / NIC_BW_PER_GPU
    assert choose_algorithm(collective, 1e6, layout, cluster, EXACT) == ("pat", pytest.approx(expected, rel=1e-12))


def test_oversubscribed_leaves_slow_groups_that_cross_them() -> None:
    flat = _cluster(num_nodes=4, nodes_per_leaf=2)
    tapered = _cluster(num_nodes=4, nodes_per_leaf=2, leaf_oversubscription=2.0)
    across, under = (4, 8), (2, 8)  # one rank per server on 4 servers (2 leaves) / on 2 (1 leaf)
    assert _time("all-reduce", *across, cluster=tapered) > 1.9 * _time("all-reduce", *across, cluster=flat)
    assert _time("all-reduce", *under, cluster=tapered) == _time("all-reduce", *under, cluster=flat)


@pytest.mark.parametrize(("size", "stride", "local", "nodes"), [(16, 1, 8, 2), (32, 1, 8, 4), (8, 4, 2, 4)])
def test_hierarchical_all_reduce_when_the_stack_asks_for_it(size: int, stride: int, local: int, nodes: int) -> None:
    layout = _cluster().group_layout(size, stride)
    assert (layout.ranks_per_node, layout.num_nodes) == (local, nodes)
    # reduce-scatter + all-gather inside the server, each (l-1)/l S/B + (l-1) a, then the best all-reduce of
    # S/l over the N servers' ranks of one local index (a ring here: S/l is large).
    inside = 2 * ((local - 1) / local * S / INTRA_BW + (local - 1) * INTRA_LAT)
    across = 2 * (nodes - 1) / nodes * (S / local) / NIC_BW_PER_GPU + 2 * (nodes - 1) * INTER_LAT
    assert _time("all-reduce", size, stride, hierarchical=True) == pytest.approx(inside + across, rel=1e-12)


def test_send_recv_inside_and_across_nodes() -> None:
    cluster = _cluster()
    inside = cluster.group_layout(2, 4)
    across = cluster.group_layout(2, 8)
    assert inside.num_domains == 1 and across.num_domains == 2
    assert collective_time_s("send-recv", S, inside, cluster, EXACT) == pytest.approx(S / INTRA_BW + INTRA_LAT)
    assert collective_time_s("send-recv", S, across, cluster, EXACT) == pytest.approx(S / NIC_BW_PER_GPU + INTER_LAT)


def test_all_to_all_inside_a_domain() -> None:
    # (n-1)/n S / B + log2(n) a
    assert _time("all-to-all", 8, 1) == pytest.approx(7 / 8 * S / INTRA_BW + 3 * INTRA_LAT, rel=1e-12)


def test_nvl72_ring_stays_on_nvlink_inside_the_rack_and_crosses_racks_on_nics() -> None:
    job = load_cluster("gb200-nvl72").with_num_gpus(256)
    rack = job.group_layout(64, 1)
    racks = job.group_layout(256, 1)
    assert rack.num_domains == 1 and racks.num_domains == 4
    one_rack = collective_time_s("all-gather", S, rack, job, EXACT)
    four_racks = collective_time_s("all-gather", S, racks, job, EXACT)
    nvlink = job.intra_node.bw_bytes_per_s
    assert one_rack == pytest.approx(63 * job.intra_node.latency_s + 63 / 64 * S / nvlink, rel=1e-12)
    # 64 NICs of 50 GB/s per rack exceed the 900 GB/s of NVLink: the ring stays NVLink bound.
    assert four_racks == pytest.approx(252 * job.intra_node.latency_s + 3 * job.inter_node.latency_s
                                       + 255 / 256 * S / nvlink, rel=1e-12)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_size_one_group_and_empty_buffer_cost_nothing(collective: str) -> None:
    cluster = _cluster()
    single = GroupLayout(size=1, ranks_per_node=1, num_nodes=1)
    assert collective_time_s(collective, S, single, cluster, EXACT) == 0.0
    assert collective_time_s(collective, S, cluster.group_layout(1, 8), cluster, EXACT) == 0.0
    assert collective_time_s(collective, 0.0, cluster.group_layout(8, 1), cluster, EXACT) == 0.0


@pytest.mark.parametrize(("size", "stride", "local", "nodes"), [
    (8, 1, 8, 1), (4, 1, 4, 1), (2, 4, 2, 1), (4, 8, 1, 4), (8, 4, 2, 4), (16, 2, 4, 4),
])
def test_group_layout_strides(size: int, stride: int, local: int, nodes: int) -> None:
    layout = _cluster().group_layout(size, stride)
    assert (layout.size, layout.ranks_per_node, layout.num_nodes) == (size, local, nodes)
    assert (layout.ranks_per_domain, layout.num_domains) == (local, nodes)


def test_axis_layout_orders_tp_fastest_then_cp_dp_pp() -> None:
    cluster = _cluster()
    par = ParallelSpec(tp=4, cp=1, dp=4, pp=2)
    assert axis_layout("tp", par, cluster) == GroupLayout(size=4, ranks_per_node=4, num_nodes=1)
    assert axis_layout("dp", par, cluster) == GroupLayout(size=4, ranks_per_node=2, num_nodes=2)
    assert axis_layout("pp", par, cluster) == GroupLayout(size=2, ranks_per_node=1, num_nodes=2)


def test_the_comm_model_equals_the_module_function_and_its_chosen_algorithm() -> None:
    """NcclComm.collective_time_s (links made once per collective, leaf span and cluster; no dict of names)
    == collective_time_s == choose_algorithm's seconds, bit for bit, over every collective, group shape,
    buffer, both flags and clusters with multicast, in-network reduction and tapered leaves; the same model
    asked about a second cluster (one the first cached nothing for) as well."""
    fitted = Calibration(comm={name: CommParams(latency_s=3e-6, bw_efficiency=0.8, nvls_bw_efficiency=0.6,
                                                base_latency_s=7e-6) for name in COLLECTIVES},
                         comm_network=CommParams(latency_s=2e-6, bw_efficiency=0.9))
    clusters = [_cluster(num_nodes=16), _cluster(num_nodes=16, multicast=True),
                _cluster(num_nodes=16, in_network_reduction=True),
                _cluster(num_nodes=16, nodes_per_leaf=4, leaf_oversubscription=2.0),
                load_cluster("dgx-h100-80gb").with_num_gpus(1024)]
    shapes = [(1, 1), (2, 1), (8, 1), (4, 2), (16, 1), (16, 8), (32, 4), (64, 2), (128, 1), (4, 32), (16, 64)]
    for cal in (EXACT, fitted):
        for hierarchical in (False, True):
            model = NcclComm(cal, hierarchical=hierarchical)
            for cluster in clusters:
                for size, stride in shapes:
                    if size * stride > cluster.num_gpus:
                        continue
                    layout = cluster.group_layout(size, stride)
                    for collective in COLLECTIVES:
                        for buffer_bytes in (0.0, 1.0, 3e3, 1e6, 7.5e7, S, 4e10):
                            seconds = model.collective_time_s(collective, buffer_bytes, layout, cluster)
                            assert seconds == collective_time_s(collective, buffer_bytes, layout, cluster, cal,
                                                                hierarchical=hierarchical)
                            flat = model.collective_time_s(collective, buffer_bytes, layout, cluster,
                                                           hierarchical=False)
                            if size > 1 and buffer_bytes > 0:
                                assert flat == choose_algorithm(collective, buffer_bytes, layout, cluster, cal)[1]


def test_the_network_step_latency_is_the_fabrics() -> None:
    """A fabric with its own network fit (EFA, the measured one) uses it; any other fabric the shared
    `comm_network`. The same 16-rank ring all-reduce over 2 servers, 2 network steps: only those move."""
    efa_extra, other_extra = 70e-6, 14e-6
    cal = EXACT.model_copy(update={"comm_network": CommParams(latency_s=other_extra, bw_efficiency=1.0),
                                   "comm_network_by_fabric": {"efa": CommParams(latency_s=efa_extra,
                                                                                bw_efficiency=1.0)}})
    efa = _cluster(inter_node=LinkSpec(name="inter", kind="efa", bw_bytes_per_s=NIC_BW, latency_s=INTER_LAT))
    assert cal.network_params("efa").latency_s == efa_extra
    assert cal.network_params("infiniband").latency_s == other_extra
    bandwidth_s = 2 * 15 / 16 * S / 100e9
    assert _time("all-reduce", 16, 1, cal=cal) == pytest.approx(
        28 * INTRA_LAT + 2 * (INTER_LAT + other_extra) + bandwidth_s, rel=1e-12)
    assert _time("all-reduce", 16, 1, cal=cal, cluster=efa) == pytest.approx(
        28 * INTRA_LAT + 2 * (INTER_LAT + efa_extra) + bandwidth_s, rel=1e-12)
