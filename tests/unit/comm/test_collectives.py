"""Collective times as NCCL runs them, against hand-computed closed forms (comm/collectives.py module doc).

For n ranks, l per NVLink domain on D domains, a buffer of S bytes, NVLink bandwidth B, per-GPU NIC bandwidth N
(NIC bw x NICs per server / GPUs per server), and for protocol p NCCL's start-up c_p, NVLink step latency a_p and
network step latency b_p + the link's latency (NCCL 2.29.7 src/graph/tuning.cc, comm/nccl_tuning.py):
    ring all-reduce                 c_p + (2(n-1) - 2(D-1)) a_p + 2(D-1) b_p + 2(n-1)/n * S / B_p
    ring all-gather / reduce-scatter c_p + ((n-1) - (D-1)) a_p + (D-1) b_p + (n-1)/n * S / B_p
    B_Simple = B inside one domain, min(B, l N) across domains; B_LL128 = 0.92 B_Simple, B_LL = B_Simple / 2
    tree all-reduce (D > 1)         c_p + 2((l-1) a_p + log2(D) b_p) + 2 S / (0.92 B_Simple x protocol factor)
    NVLS all-reduce (one domain)    25 us + S / (B e_nvls)
    send-recv                       8.4 us + S/B + the link's latency inside a domain, 8.4 us + S/N + b_Simple across
The calibration is set to efficiency 1, no extra start-up and no extra latency, so B and N are the links' own
numbers and the latencies NCCL's; the fitted start-up (base_latency_s) and step latency add to NCCL's.
"""

import math

import pytest

from trainsim.catalog import load_cluster, load_device
from trainsim.catalog.calibration import Calibration, CommParams
from trainsim.comm import nccl_tuning as nccl
from trainsim.comm.collectives import NcclComm, choose_algorithm, collective_time_s
from trainsim.comm.nccl_tuning import LL, SIMPLE
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


BASE_S, STEP_S = nccl.RING_BASE_LATENCY_S[SIMPLE], nccl.NVLINK_RING_STEP_S[SIMPLE]  # 8.4 us, 3.4 us
NET_STEP_S = nccl.NET_RING_STEP_S[SIMPLE] + INTER_LAT  # 14 us + the link's 4 us


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_single_node(n: int) -> None:
    expected = BASE_S + 2 * (n - 1) / n * S / INTRA_BW + 2 * (n - 1) * STEP_S
    assert _time("all-reduce", n, 1) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", ["all-gather", "reduce-scatter"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_gather_reduce_scatter_single_node(collective: str, n: int) -> None:
    expected = BASE_S + (n - 1) / n * S / INTRA_BW + (n - 1) * STEP_S
    assert _time(collective, n, 1) == pytest.approx(expected, rel=1e-12)


def test_a_small_all_reduce_in_one_server_runs_ll_at_nccls_ll_latency() -> None:
    # 8 ranks, 1 kB: LL's 6.6 us start-up + 14 steps x 0.6 us + 2 x 7/8 x 1 kB at half the NVLink (50 GB/s)
    # = 15 us + 35 ns; LL128 would take 14 + 14 x 1.9 = 40.6 us, Simple 8.4 + 14 x 3.4 = 56 us.
    small = 1e3
    ll = 6.6e-6 + 14 * 0.6e-6 + 2 * 7 / 8 * small / (0.5 * INTRA_BW)
    cluster = _cluster(num_nodes=1)
    assert choose_algorithm("all-reduce", small, cluster.group_layout(8, 1), cluster, EXACT) == (
        "ring/LL", pytest.approx(ll, rel=1e-12))
    assert ll == pytest.approx(15.035e-6, rel=1e-12)


def test_a_large_all_reduce_in_one_server_runs_simple() -> None:
    # 8 ranks, 1 GB: Simple's 8.4 us + 14 x 3.4 us + 17.5 ms at the full NVLink beats LL128's 40.6 us + 17.5 ms
    # / 0.92 and LL's 15 us + 35 ms.
    cluster = _cluster(num_nodes=1)
    simple = 8.4e-6 + 14 * 3.4e-6 + 2 * 7 / 8 * S / INTRA_BW
    assert choose_algorithm("all-reduce", S, cluster.group_layout(8, 1), cluster, EXACT) == (
        "ring/Simple", pytest.approx(simple, rel=1e-12))


def test_ll_runs_at_most_nccls_ll_bandwidth() -> None:
    # A Blackwell NVL72 rack: half its 900 GB/s NVLink exceeds NCCL's LL cap for Blackwell inside one domain
    # (llMaxBws: 282 GB/s), so LL's bandwidth is the cap.
    job = load_cluster("gb200-nvl72").with_num_gpus(72)
    cal = EXACT.model_copy(update={"device_generation": {job.device.name: "blackwell"}})
    layout = job.group_layout(8, 1)
    assert 0.5 * job.intra_node.bw_bytes_per_s > 282e9
    assert choose_algorithm("all-gather", 1e4, layout, job, cal) == (
        "ring/LL", pytest.approx(6.6e-6 + 7 * 0.6e-6 + 7 / 8 * 1e4 / 282e9, rel=1e-12))


def test_calibration_scales_bandwidth_and_adds_start_up_and_latency_per_step() -> None:
    n, eff, extra, base = 8, 0.5, 3e-6, 7e-6
    cal = Calibration(comm={"all-reduce": CommParams(latency_s=extra, bw_efficiency=eff, base_latency_s=base)})
    expected = BASE_S + base + 2 * (n - 1) / n * S / (eff * INTRA_BW) + 2 * (n - 1) * (STEP_S + extra)
    assert _time("all-reduce", n, 1, cal=cal) == pytest.approx(expected, rel=1e-12)


def test_two_node_ring_by_hand() -> None:
    # 16 ranks on 2 servers of 8: 30 ring steps, 2 of them cross the network. Bus bandwidth: the 8 NICs'
    # shares of the group's ranks in a server, 8 x 12.5 = 100 GB/s, no more than NVLink (100 GB/s).
    # 8.4 us + 28 x 3.4 us + 2 x (14 + 4) us + 2 x 15/16 x 1 GB / 100 GB/s = 139.6 us + 18.75 ms
    assert choose_algorithm("all-reduce", S, _cluster().group_layout(16, 1), _cluster(), EXACT)[0] == "ring/Simple"
    assert _time("all-reduce", 16, 1) == pytest.approx(139.6e-6 + 18.75e-3, rel=1e-12)


def test_cross_node_ring_is_bounded_by_the_nics_of_the_groups_ranks() -> None:
    # dp=8 with tp=4: 2 ranks per server on 4 servers; the ring gets 2 NIC shares = 25 GB/s, not NVLink.
    n, local, nodes = 8, 2, 4
    ring = BASE_S + 2 * (n - 1) / n * S / (local * NIC_BW_PER_GPU) + (2 * (n - 1) - 2 * (nodes - 1)) * STEP_S \
        + 2 * (nodes - 1) * NET_STEP_S
    assert _time("all-reduce", n, 4) == pytest.approx(ring, rel=1e-12)


def test_tree_wins_small_all_reduces_over_many_servers() -> None:
    cluster = _cluster(num_nodes=32)
    layout = cluster.group_layout(32, 8)  # one rank on each of 32 servers
    small = 1e3
    # LL: 6.8 us + 2 log2(32) (5 + 4) us; the tree's 0.92 B / 3.8 (under the 20.4 GB/s LL cap beyond 2 servers)
    tree = 6.8e-6 + 2 * math.log2(32) * (5e-6 + INTER_LAT) + 2 * small / (0.92 * NIC_BW_PER_GPU / 3.8)
    # at one rank a server the ring's network steps are the tree's: 6.6 us + 62 x (5 + 4) us
    ring = 6.6e-6 + 2 * 31 * (5e-6 + INTER_LAT) + 2 * 31 / 32 * small / (0.5 * NIC_BW_PER_GPU)
    assert choose_algorithm("all-reduce", small, layout, cluster, EXACT) == (
        "tree/LL", pytest.approx(tree, rel=1e-12))
    assert tree < ring
    # Large buffers: the ring's 2(n-1)/n beats the tree's 2/0.92.
    assert choose_algorithm("all-reduce", S, layout, cluster, EXACT)[0] == "ring/Simple"


def test_nccls_tree_correction_by_size() -> None:
    # ncclTopoGetAlgoTime: Simple tree bandwidth x 0.5 for 128-256 kB (log2(bytes / 64) = 11), x 1 off the table.
    assert nccl.tree_correction(SIMPLE, 200e3) == 0.5
    assert nccl.tree_correction(LL, 63) == 1.0 and nccl.tree_correction(LL, 64) == 1.0
    assert nccl.tree_correction(SIMPLE, 2.0**30) == 1.0


def test_nvls_on_a_multicast_nvswitch_for_large_all_reduces() -> None:
    cluster = _cluster(num_nodes=1, multicast=True)
    layout = cluster.group_layout(8, 1)
    assert choose_algorithm("all-reduce", S, layout, cluster, EXACT) == (
        "nvls/Simple", pytest.approx(nccl.NVLS_LATENCY_S + S / (INTRA_BW * NVLS_EFF), rel=1e-12))
    assert choose_algorithm("all-reduce", 1e4, layout, cluster, EXACT)[0] == "ring/LL"  # 25 us start-up
    plain = _cluster(num_nodes=1)
    assert choose_algorithm("all-reduce", S, plain.group_layout(8, 1), plain, EXACT)[0] == "ring/Simple"


def test_in_network_reduction_where_the_cluster_declares_it() -> None:
    cluster = _cluster(in_network_reduction=True)
    layout = cluster.group_layout(32, 1)  # 8 ranks on each of 4 servers
    # reduce-scatter / all-gather over NVLink (2 x 7/8 S / B = 17.5 ms) against S/l through each NIC to the
    # switch (1 GB / 8 / 12.5 GB/s = 10 ms): NVLink bound; CollNetDirect's latency 2 (3.7 + 7 x 0.4) us
    # + (31 + 4) us.
    expected = 2 * (3.7e-6 + 7 * 0.4e-6) + 31e-6 + INTER_LAT + 2 * 7 / 8 * S / INTRA_BW
    assert choose_algorithm("all-reduce", S, layout, cluster, EXACT) == ("collnet/Simple", pytest.approx(expected))
    assert not choose_algorithm("all-reduce", S, layout, _cluster(), EXACT)[0].startswith("collnet")


@pytest.mark.parametrize("collective", ["all-gather", "reduce-scatter"])
def test_pat_at_one_rank_per_server(collective: str) -> None:
    cluster = _cluster(num_nodes=16)
    layout = cluster.group_layout(16, 8)
    expected = 8.0e-6 + math.log2(16) * NET_STEP_S + 15 / 16 * 1e6 / NIC_BW_PER_GPU
    assert choose_algorithm(collective, 1e6, layout, cluster, EXACT) == (
        "pat/Simple", pytest.approx(expected, rel=1e-12))


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
    inside = 2 * (BASE_S + (local - 1) / local * S / INTRA_BW + (local - 1) * STEP_S)
    across = BASE_S + 2 * (nodes - 1) / nodes * (S / local) / NIC_BW_PER_GPU + 2 * (nodes - 1) * NET_STEP_S
    assert _time("all-reduce", size, stride, hierarchical=True) == pytest.approx(inside + across, rel=1e-12)


def test_send_recv_inside_and_across_nodes() -> None:
    cluster = _cluster()
    inside = cluster.group_layout(2, 4)
    across = cluster.group_layout(2, 8)
    assert inside.num_domains == 1 and across.num_domains == 2
    assert collective_time_s("send-recv", S, inside, cluster, EXACT) == pytest.approx(
        BASE_S + S / INTRA_BW + INTRA_LAT)
    assert collective_time_s("send-recv", S, across, cluster, EXACT) == pytest.approx(
        BASE_S + S / NIC_BW_PER_GPU + NET_STEP_S)


def test_all_to_all_inside_a_domain() -> None:
    # 8.4 us + (n-1)/n S / B + log2(n) a (the link's latency)
    assert _time("all-to-all", 8, 1) == pytest.approx(BASE_S + 7 / 8 * S / INTRA_BW + 3 * INTRA_LAT, rel=1e-12)


def test_nvl72_ring_stays_on_nvlink_inside_the_rack_and_crosses_racks_on_nics() -> None:
    job = load_cluster("gb200-nvl72").with_num_gpus(256)
    rack = job.group_layout(64, 1)
    racks = job.group_layout(256, 1)
    assert rack.num_domains == 1 and racks.num_domains == 4
    one_rack = collective_time_s("all-gather", S, rack, job, EXACT)
    four_racks = collective_time_s("all-gather", S, racks, job, EXACT)
    nvlink = job.intra_node.bw_bytes_per_s
    assert one_rack == pytest.approx(BASE_S + 63 * STEP_S + 63 / 64 * S / nvlink, rel=1e-12)
    # 64 NICs of 50 GB/s per rack exceed the 900 GB/s of NVLink: the ring stays NVLink bound. At 256 ranks the
    # 252 NVLink steps make LL128 (14 us + 1.9 us a step, 0.92 of the bandwidth) cheaper than Simple.
    assert choose_algorithm("all-gather", S, racks, job, EXACT)[0] == "ring/LL128"
    assert four_racks == pytest.approx(14e-6 + 252 * 1.9e-6 + 3 * (4e-6 + job.inter_node.latency_s)
                                       + 255 / 256 * S / (0.92 * nvlink), rel=1e-12)


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
        BASE_S + 28 * STEP_S + 2 * (NET_STEP_S + other_extra) + bandwidth_s, rel=1e-12)
    assert _time("all-reduce", 16, 1, cal=cal, cluster=efa) == pytest.approx(
        BASE_S + 28 * STEP_S + 2 * (NET_STEP_S + efa_extra) + bandwidth_s, rel=1e-12)
