"""Link sharing between communication groups (hardware.links + the engine's bandwidth sharing): exact cases."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import a100_cluster, link_shares_by_rank
from trainsim.catalog import load_cluster
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.hardware.links import (
    FABRIC,
    NIC,
    UPLINK,
    group_links,
    link_capacity,
    link_name,
    link_runs,
    nic_rails,
    physical_links,
    shared_groups,
)
from trainsim.ir.exec_graph import ExecGraph, SimDevice
from trainsim.sim.engine import simulate
from trainsim.sim.outcome import SimOptions


def _one_nic_nodes(num_gpus: int) -> ClusterSpec:
    """DGX A100 nodes with a single NIC each."""
    return a100_cluster(num_gpus).model_copy(update={"nics_per_node": 1})


def _graph(groups: list[list[int]], cluster: ClusterSpec, seconds: float = 1.0) -> ExecGraph:
    """One simulated device per group, running one collective of `seconds` alone."""
    graph = ExecGraph(devices=[SimDevice(index=i, stage=i, ranks=len(g), capacity_bytes=1e12, static_bytes=0.0,
                                         static_breakdown={}) for i, g in enumerate(groups)], tasks=[])
    for i, group in enumerate(groups):
        uses = group_links(group, cluster)
        names = tuple(uses)
        graph.add(name=f"all-reduce {group}", device=i, stream="gradient", kind="comm", duration_s=seconds,
                  resources=names, phase="comm", stage=i, category="dp_comm", link_shares=tuple(uses.values()))
        for name in names:
            graph.resource_capacity[name] = link_capacity(name, cluster)
    return graph


def test_two_groups_crossing_one_nic_each_take_twice_as_long() -> None:
    """{0, 8} and {1, 9} both cross node 0's and node 1's single NIC: with sharing each gets half of it."""
    cluster = _one_nic_nodes(16)
    graph = _graph([[0, 8], [1, 9]], cluster)
    shared = simulate(graph, SimOptions(bandwidth_sharing=True))
    alone = simulate(graph, SimOptions())
    assert shared.end_s == pytest.approx([2.0, 2.0])
    assert alone.end_s == pytest.approx([1.0, 1.0])
    assert shared_groups([[0, 8], [1, 9]], cluster) == [2.0, 2.0]


def test_a_group_inside_a_node_does_not_touch_the_nic() -> None:
    cluster = _one_nic_nodes(16)
    graph = _graph([[0, 8], [2, 3]], cluster)
    out = simulate(graph, SimOptions(bandwidth_sharing=True))
    assert out.end_s == pytest.approx([1.0, 1.0])
    assert physical_links([2, 3], cluster) == ()  # NVSwitch: every GPU has its own ports
    assert shared_groups([[0, 8], [2, 3]], cluster) == [1.0, 1.0]


def test_two_nics_per_node_carry_two_groups_on_their_two_rails_at_full_speed() -> None:
    """8 GPUs and 2 NICs per node: NIC 0 serves GPUs 0-3, NIC 1 GPUs 4-7 (rails). A group priced at one NIC's
    bandwidth takes that NIC's 4 shares: {0, 8} and {4, 12} use different rails and run at full speed; {1, 9} shares
    rail 0 with {0, 8}, and the two take twice as long while {4, 12} keeps its rail."""
    cluster = a100_cluster(16).model_copy(update={"nics_per_node": 2})
    assert shared_groups([[0, 8], [4, 12]], cluster) == [1.0, 1.0]
    assert shared_groups([[0, 8], [1, 9], [4, 12]], cluster) == [2.0, 2.0, 1.0]
    out = simulate(_graph([[0, 8], [1, 9], [4, 12]], cluster), SimOptions(bandwidth_sharing=True))
    assert out.end_s == pytest.approx([2.0, 2.0, 1.0])
    assert group_links([0, 8], cluster) == {f"node{n}.nic0.{d}": 4.0 for n in (0, 1) for d in ("tx", "rx")}
    assert link_capacity("node1.nic0.tx", cluster) == 4.0


def test_groups_on_different_rails_do_not_contend_and_on_one_rail_do() -> None:
    """DGX A100 nodes, a NIC per GPU (8 rails): {0, 8} and {9, 17} cross node 1 on rails 0 and 1, each alone on
    its NIC; {0, 8} and {8, 16} both use node 1's rail 0 and take twice as long. With the node's 8 NICs as one
    pool (before) neither pair contended: 2 of 8 NICs' worth."""
    cluster = a100_cluster(24)
    assert shared_groups([[0, 8], [9, 17]], cluster) == [1.0, 1.0]
    assert shared_groups([[0, 8], [8, 16]], cluster) == [2.0, 2.0]
    out = simulate(_graph([[0, 8], [8, 16], [9, 17]], cluster), SimOptions(bandwidth_sharing=True))
    assert out.end_s == pytest.approx([2.0, 2.0, 1.0])
    # a group with two ranks on one node spreads its NIC's worth over their two rails
    assert group_links([0, 1, 8, 9], cluster)["node0.nic1.tx"] == 0.5


def test_a_pcie_node_shares_its_switch_among_groups_inside_it() -> None:
    """Titan Xp behind PCIe (Proteus HC1): the 4 gradient groups {0,4} .. {3,7} of one node share its bus."""
    cluster = load_cluster("local-cpu").model_copy(update={
        "gpus_per_node": 8, "intra_node": load_cluster("dgx1-v100").intra_node.model_copy(update={"kind": "pcie"})})
    groups = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [physical_links(g, cluster) for g in groups] == [("node0.fabric",)] * 4
    assert shared_groups(groups, cluster) == [4.0] * 4


def test_ranks_outside_the_cluster_are_refused() -> None:
    with pytest.raises(ConfigError) as exc:
        physical_links([0, 16], _one_nic_nodes(16))
    assert exc.value.field == "group"


def _uses(blocks: list[tuple[int, int]], levels: tuple[str, ...], direction: str,
          cluster: ClusterSpec) -> dict[str, int]:
    """link_runs at each level, link by link (link_name): per link the shares the transfer takes."""
    return {link_name(level, link, direction, cluster): shares for level in levels
            for first, end, shares in link_runs(blocks, level, direction, cluster) for link in range(first, end)}


def test_a_transfer_takes_one_share_per_rank_behind_each_link_it_crosses() -> None:
    """Ranks 4-11 on nodes of 8 GPUs behind one NIC: 4 behind node 0's NIC and 4 behind node 1's; with one node per
    leaf and oversubscribed up-links, the same shares of each leaf's up-links (capacity: the leaf's 8 GPUs)."""
    cluster = _one_nic_nodes(16).model_copy(update={"nodes_per_leaf": 1, "leaf_oversubscription": 2.0})
    assert _uses([(4, 8)], (NIC, UPLINK), "tx", cluster) == {
        "node0.nic.tx": 4, "leaf0.uplink.tx": 4, "node1.nic.tx": 4, "leaf1.uplink.tx": 4}
    assert link_capacity("leaf1.uplink.tx", cluster) == link_capacity("node1.nic.tx", cluster) == 8.0
    assert _uses([(4, 8)], (FABRIC,), "rx", cluster) == {}  # NVSwitch ports are each GPU's own
    non_blocking = cluster.model_copy(update={"leaf_oversubscription": 1.0})
    assert _uses([(4, 8)], (UPLINK,), "tx", non_blocking) == {}


def test_a_transfer_takes_one_share_of_each_rank_s_own_rail() -> None:
    """The same ranks on DGX A100 nodes (a NIC per GPU): one share of each of node 0's NICs 4-7 and node 1's 0-3,
    each a rail of one GPU; on DGX-1 nodes (4 NICs, one per pair of GPUs) two shares of node 0's NICs 2 and 3 and
    of node 1's 0 and 1, each a rail of two."""
    cluster = a100_cluster(16)
    assert _uses([(4, 8)], (NIC,), "tx", cluster) == {
        **{f"node0.nic{rail}.tx": 1 for rail in range(4, 8)}, **{f"node1.nic{rail}.tx": 1 for rail in range(4)}}
    assert link_capacity("node1.nic0.tx", cluster) == 1.0
    dgx1 = load_cluster("dgx1-v100").with_num_gpus(16)
    assert nic_rails(dgx1) == 4
    assert _uses([(4, 8)], (NIC,), "rx", dgx1) == {"node0.nic2.rx": 2, "node0.nic3.rx": 2, "node1.nic0.rx": 2,
                                                         "node1.nic1.rx": 2}
    assert link_capacity("node0.nic2.rx", dgx1) == 2.0
    # NICs that do not divide the node's GPUs stay one pool; more NICs than GPUs: a rail per GPU
    assert nic_rails(cluster.model_copy(update={"nics_per_node": 3})) == 1
    assert nic_rails(cluster.model_copy(update={"nics_per_node": 16})) == 8


def test_a_leaf_of_several_nodes_holds_their_gpus_and_the_last_leaf_what_is_left() -> None:
    cluster = a100_cluster(40).model_copy(update={"nodes_per_leaf": 2, "leaf_oversubscription": 3.0})
    assert [link_capacity(f"leaf{leaf}.uplink.rx", cluster) for leaf in range(3)] == [16.0, 16.0, 8.0]
    assert _uses([(0, 2), (30, 10)], (UPLINK,), "rx", cluster) == {"leaf0.uplink.rx": 2, "leaf1.uplink.rx": 2,
                                                                         "leaf2.uplink.rx": 8}


def _link_clusters() -> list[ClusterSpec]:
    """A rail per GPU with oversubscribed leaves of 3 nodes; DGX-1 (a rail per 2 GPUs); a pool of 3 NICs; a PCIe
    bus (shared) under leaves of 7 nodes."""
    a100 = a100_cluster(128)
    return [a100.model_copy(update={"nodes_per_leaf": 3, "leaf_oversubscription": 2.0}),
            load_cluster("dgx1-v100").with_num_gpus(128),
            a100.model_copy(update={"nics_per_node": 3}),
            load_cluster("titanxp-pcie-8").model_copy(update={"num_nodes": 16, "nodes_per_leaf": 7,
                                                               "leaf_oversubscription": 3.0})]


def test_link_runs_count_a_run_s_whole_links_at_once() -> None:
    """DGX A100 nodes: ranks 4-11 take one share of rails 4-11 (node 0's 4-7, node 1's 0-3); DGX-1 (2 GPUs a
    rail): ranks 3-8 take 1 share of rail 1, 2 of rails 2 and 3, 1 of rail 4."""
    assert link_runs([(4, 8)], NIC, "tx", a100_cluster(16)) == [(4, 12, 1)]
    assert link_runs([(3, 6)], NIC, "tx", load_cluster("dgx1-v100").with_num_gpus(16)) == [(1, 2, 1), (2, 4, 2),
                                                                                          (4, 5, 1)]
    assert link_runs([(4, 8)], UPLINK, "tx", a100_cluster(16)) == []  # non-blocking: no shared up-links


@settings(max_examples=300, deadline=None)
@given(cluster=st.sampled_from(_link_clusters()), level=st.sampled_from([NIC, UPLINK, FABRIC]),
       starts=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=5),
       shuffle=st.booleans())
def test_link_runs_name_what_the_ranks_cross_in_their_order(cluster: ClusterSpec, level: str,
                                                           starts: list[tuple[int, int]], shuffle: bool) -> None:
    """Differential: link_runs expanded link by link is the rank-by-rank reference, names, shares and order, for
    runs of ranks in order (with gaps, or touching inside one link) and out of order."""
    blocks, rank = [], 0
    for gap, count in starts:
        blocks.append((rank + gap, count))
        rank += gap + count
    blocks = blocks[::-1] if shuffle else blocks
    expanded = [(link_name(level, link, "tx", cluster), shares)
                for first, end, shares in link_runs(blocks, level, "tx", cluster) for link in range(first, end)]
    assert expanded == list(link_shares_by_rank(blocks, level, "tx", cluster).items())
