"""Shared physical links: which links a transfer crosses, how many GPUs' worth of bandwidth each holds, and how
much of it a transfer takes (Proteus Sec. VI-C, Fig. 7).

Proteus detects bandwidth sharing top-down over the link hierarchy: each group is split into per-node sub-groups;
a group of more than one sub-group crosses the NIC of every node it touches, and the groups crossing one NIC
share its bandwidth; inside a node, groups share the node's fabric where it is a shared bus (PCIe: every GPU of
the node behind one switch) and not where each GPU has its own ports (NVLink, NVSwitch, whose ports are the
GPU's own: no other device's transfer crosses them). Above the nodes, a group that spans leaf switches (scalable
units, ClusterSpec.nodes_per_leaf) crosses its leaf's up-links, shared where they are oversubscribed.

A shared link's capacity is counted in GPUs: the GPUs behind it (a node's NICs together: gpus_per_node; a PCIe
switch: gpus_per_node; a leaf's up-links: the GPUs under the leaf), each GPU's share of its bandwidth being what a
collective price over the cluster gives one GPU (comm/collectives.py: NICs x bandwidth / GPUs per node, divided
by the leaf oversubscription above the leaves). A transfer takes, on each link, the shares its price assumes:

- one per GPU whose transfer crosses it, for a transfer priced per GPU (the compiler's collectives and sends:
  link_uses);
- the whole of one NIC (gpus_per_node / nics_per_node shares) or of the bus, for a group priced at the link's
  full bandwidth (Proteus' own group model: group_links).

The event simulator stretches every flow on a link whose flows together take more than its capacity by their
total over its capacity (sim/engine.py, SimOptions.bandwidth_sharing). So identical devices that fill a node
keep exactly the speed their prices give, and a link shared by several devices (two pipeline stages on one node,
two device classes behind one NIC) slows every transfer crossing it once their transfers together ask more than
it carries. Ranks are numbered node-major (hardware.cluster).
"""

from collections.abc import Iterable, Sequence

from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec

SHARED_FABRICS = ("pcie",)  # intra-node link kinds whose bandwidth the node's GPUs share
NIC, UPLINK, FABRIC = "nic", "uplink", "fabric"  # the shared levels, as transfers name what they cross


def nodes_of(ranks: Sequence[int], cluster: ClusterSpec) -> tuple[int, ...]:
    """The nodes a group's ranks sit on, in order."""
    if not ranks:
        raise ConfigError("group", list(ranks), "needs at least one rank")
    bad = [r for r in ranks if not 0 <= r < cluster.num_gpus]
    if bad:
        raise ConfigError("group", bad[0], f"ranks are 0-{cluster.num_gpus - 1} on {cluster.name}")
    return tuple(dict.fromkeys(r // cluster.gpus_per_node for r in ranks))


def uplinks_shared(cluster: ClusterSpec) -> bool:
    """Whether the leaves' up-links are a shared bottleneck of their own (oversubscribed scalable units)."""
    return cluster.nodes_per_leaf is not None and cluster.leaf_oversubscription > 1.0


def fabric_shared(cluster: ClusterSpec) -> bool:
    return cluster.intra_node.kind in SHARED_FABRICS


def _leaf_of(node: int, cluster: ClusterSpec) -> int:
    return node // cluster.nodes_per_leaf if cluster.nodes_per_leaf is not None else 0


def link_capacity(name: str, cluster: ClusterSpec) -> float:
    """The GPUs behind a shared link (its bandwidth in per-GPU shares): a node's NICs and a node's bus,
    gpus_per_node; a leaf's up-links, the GPUs of its nodes."""
    if f".{UPLINK}" in name and cluster.nodes_per_leaf is not None:
        leaf = int(name.split(".", 1)[0].removeprefix("leaf"))
        nodes = min(cluster.nodes_per_leaf, cluster.num_nodes - leaf * cluster.nodes_per_leaf)
        return float(max(nodes, 1) * cluster.gpus_per_node)
    return float(cluster.gpus_per_node)


def link_uses(blocks: Iterable[tuple[int, int]], levels: Iterable[str], direction: str,
              cluster: ClusterSpec) -> dict[str, int]:
    """Per shared link a transfer priced per GPU crosses, the shares it takes: one per rank of the transfer behind
    the link. blocks: the transfer's ranks, as (first rank, count) runs; levels: what it crosses (NIC: it leaves
    its NVLink domain; UPLINK: its leaf; FABRIC: it moves between GPUs of one node); direction "tx" or "rx"
    (links are full duplex; a PCIe bus is one resource)."""
    wanted = set(levels)
    nic = NIC in wanted
    uplink = UPLINK in wanted and uplinks_shared(cluster)
    fabric = FABRIC in wanted and fabric_shared(cluster)
    if not (nic or uplink or fabric):
        return {}
    gpus_per_node = cluster.gpus_per_node
    per_node: dict[int, int] = {}
    for first, count in blocks:  # NB: a run of ranks, split at node boundaries (loops over nodes, not ranks)
        rank, end = first, first + count
        while rank < end:
            node = rank // gpus_per_node
            stop = min(end, (node + 1) * gpus_per_node)
            per_node[node] = per_node.get(node, 0) + stop - rank
            rank = stop
    uses: dict[str, int] = {}
    for node, count in per_node.items():
        if nic:
            uses[f"node{node}.{NIC}.{direction}"] = count
        if fabric:
            uses[f"node{node}.{FABRIC}"] = count
        if uplink:
            name = f"leaf{_leaf_of(node, cluster)}.{UPLINK}.{direction}"
            uses[name] = uses.get(name, 0) + count
    return uses


def group_links(ranks: Sequence[int], cluster: ClusterSpec) -> dict[str, float]:
    """The shared links a collective of these ranks crosses, each with the shares a group priced at the link's
    full bandwidth takes: the NIC of each node when it spans nodes (one NIC's worth), the leaf's up-links when it
    spans leaves (the NICs of the group's ranks under the leaf), the node's bus when that is shared and the group
    has more than one rank there (all of it)."""
    nodes = nodes_of(ranks, cluster)
    members = set(ranks)
    if len(members) <= 1:
        return {}
    one_nic = cluster.gpus_per_node / cluster.nics_per_node
    uses: dict[str, float] = {}
    if len(nodes) > 1:
        for node in nodes:
            uses |= {f"node{node}.{NIC}.{d}": one_nic for d in ("tx", "rx")}
        leaves = {_leaf_of(n, cluster) for n in nodes}
        if len(leaves) > 1 and uplinks_shared(cluster):
            for leaf in sorted(leaves):
                count = sum(1 for n in nodes if _leaf_of(n, cluster) == leaf)
                uses |= {f"leaf{leaf}.{UPLINK}.{d}": count * one_nic for d in ("tx", "rx")}
    if fabric_shared(cluster):
        per_node = {n: sum(1 for r in members if r // cluster.gpus_per_node == n) for n in nodes}
        uses |= {f"node{n}.{FABRIC}": float(cluster.gpus_per_node) for n in nodes if per_node[n] > 1}
    return uses


def physical_links(ranks: Sequence[int], cluster: ClusterSpec) -> tuple[str, ...]:
    """The shared links a collective of these ranks crosses (group_links' names)."""
    return tuple(group_links(ranks, cluster))


def shared_groups(groups: Sequence[Sequence[int]], cluster: ClusterSpec) -> list[float]:
    """Per group running at once with the others (each priced at its links' full bandwidth), its slow-down on
    its busiest link: the shares all groups take there over the link's capacity (1.0: it has its links to
    itself; 2.0: it gets half the bandwidth of its busiest link)."""
    uses = [group_links(g, cluster) for g in groups]
    load: dict[str, float] = {}
    for links in uses:
        for name, shares in links.items():
            load[name] = load.get(name, 0.0) + shares
    return [max([1.0, *(load[name] / link_capacity(name, cluster) for name in links)]) for links in uses]
