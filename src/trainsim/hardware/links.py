"""Shared physical links: which links a transfer crosses, how many GPUs' worth of bandwidth each holds, and how
much of it a transfer takes (Proteus Sec. VI-C, Fig. 7).

Proteus detects bandwidth sharing top-down over the link hierarchy: each group is split into per-node sub-groups;
a group of more than one sub-group crosses the NIC of every node it touches, and the groups crossing one NIC
share its bandwidth; inside a node, groups share the node's fabric where it is a shared bus (PCIe: every GPU of
the node behind one switch) and not where each GPU has its own ports (NVLink, NVSwitch, whose ports are the
GPU's own: no other device's transfer crosses them). Above the nodes, a group that spans leaf switches (scalable
units, ClusterSpec.nodes_per_leaf) crosses its leaf's up-links, shared where they are oversubscribed.

On a rail-optimized node each NIC serves the GPUs next to it (nic_rails: one GPU per NIC on a DGX A100 / H100,
two on a DGX-1), so a GPU's traffic leaves through its own rail's NIC ("node3.nic1.tx") and transfers on other
rails of the node do not slow it; where the NICs do not divide the node's GPUs they are one pool ("node3.nic.tx").

A shared link's capacity is counted in GPUs: the GPUs behind it (one rail's NIC: the GPUs it serves; a pool of
NICs and a PCIe switch: gpus_per_node; a leaf's up-links: the GPUs under the leaf), each GPU's share of its
bandwidth being what a collective price over the cluster gives one GPU (comm/collectives.py: NICs x bandwidth /
GPUs per node, divided by the leaf oversubscription above the leaves). A transfer takes, on each link, the shares
its price assumes:

- one per GPU whose transfer crosses it, for a transfer priced per GPU (the compiler's collectives and sends:
  link_runs);
- the whole of one NIC (gpus_per_node / nics_per_node shares, spread over the rails of its ranks on the node) or
  of the bus, for a group priced at the link's full bandwidth (Proteus' own group model: group_links).

The event simulator stretches every flow on a link whose flows together take more than its capacity by their
total over its capacity (sim/engine.py, SimOptions.bandwidth_sharing). So identical devices that fill a node
keep exactly the speed their prices give, and a link shared by several devices (two pipeline stages on one node,
two device classes behind one NIC) slows every transfer crossing it once their transfers together ask more than
it carries. Ranks are numbered node-major (hardware.cluster).
"""

import re
from collections.abc import Sequence
from itertools import pairwise

from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec

SHARED_FABRICS = ("pcie",)  # intra-node link kinds whose bandwidth the node's GPUs share
NIC, UPLINK, FABRIC = "nic", "uplink", "fabric"  # the shared levels, as transfers name what they cross
_RAIL = re.compile(rf"\.{NIC}\d+\.")  # one rail's NIC ("node3.nic1.tx")


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


def nic_rails(cluster: ClusterSpec) -> int:
    """The rails a node's scale-out traffic splits into: on a rail-optimized node each NIC serves the GPUs next to
    it (its PCIe switch: one GPU each on a DGX A100 / H100 of 8 NICs, two on a DGX-1 of 4), so a GPU's transfers
    cross its own NIC only (NCCL picks the GPU's nearest NIC: its topology search, src/graph/search.cc, NCCL
    2.18). Rails: nics_per_node where they divide the node's GPUs, one per GPU where there are at least as many
    NICs as GPUs, else 1 (the node's NICs as one pool)."""
    nics, gpus = cluster.nics_per_node, cluster.gpus_per_node
    if nics >= gpus:
        return gpus
    return nics if gpus % nics == 0 else 1


def nic_name(node: int, rail: int, direction: str, rails: int) -> str:
    """A node's NIC on one rail ("node3.nic1.tx"), or the node's pool of NICs ("node3.nic.tx") with one rail."""
    return f"node{node}.{NIC}.{direction}" if rails == 1 else f"node{node}.{NIC}{rail}.{direction}"


def link_kind(name: str) -> str:
    """What a link is, whichever node, leaf or rail it sits on ("nic.tx", "uplink.rx", "fabric")."""
    return _RAIL.sub(f".{NIC}.", name).split(".", 1)[1]


def link_capacity(name: str, cluster: ClusterSpec) -> float:
    """The GPUs behind a shared link (its bandwidth in per-GPU shares): a node's pool of NICs and a node's bus,
    gpus_per_node; one rail's NIC, the GPUs it serves; a leaf's up-links, the GPUs of its nodes."""
    if f".{UPLINK}" in name and cluster.nodes_per_leaf is not None:
        leaf = int(name.split(".", 1)[0].removeprefix("leaf"))
        nodes = min(cluster.nodes_per_leaf, cluster.num_nodes - leaf * cluster.nodes_per_leaf)
        return float(max(nodes, 1) * cluster.gpus_per_node)
    if _RAIL.search(name) is not None:
        return float(cluster.gpus_per_node // nic_rails(cluster))
    return float(cluster.gpus_per_node)


def link_unit(level: str, cluster: ClusterSpec) -> int:
    """The ranks behind one link of a shared level (numbered node-major): one rail's GPUs (or the node's, on a pool
    of NICs), a node's for its bus, a leaf's for its up-links."""
    if level == NIC:
        return cluster.gpus_per_node // nic_rails(cluster)
    if level == UPLINK and cluster.nodes_per_leaf is not None:
        return cluster.nodes_per_leaf * cluster.gpus_per_node
    return cluster.gpus_per_node


def link_name(level: str, index: int, direction: str, cluster: ClusterSpec) -> str:
    """The name of a shared level's link number `index` (rank // link_unit)."""
    if level == NIC:
        rails = nic_rails(cluster)
        return nic_name(*divmod(index, rails), direction, rails)
    if level == FABRIC:
        return f"node{index}.{FABRIC}"
    return f"leaf{index}.{UPLINK}.{direction}"


def link_runs(blocks: Sequence[tuple[int, int]], level: str, direction: str,
              cluster: ClusterSpec) -> list[tuple[int, int, int]]:
    """Per shared link of `level` a transfer priced per GPU crosses, the shares it takes: one per rank of the
    transfer behind the link. blocks: the transfer's ranks, as (first rank, count) runs; level: what it crosses
    (NIC: it leaves its NVLink domain; UPLINK: its leaf; FABRIC: it moves between GPUs of one node); direction
    "tx" or "rx" (links are full duplex; a PCIe bus is one resource). Without a name per link: (first link, end
    link, shares each) runs of link numbers (link_name), in the order the ranks first cross them. Ranks in
    ascending runs are counted per run (a run's whole links between its partial ends are alike), others link by
    link."""
    if not {NIC: True, UPLINK: uplinks_shared(cluster), FABRIC: fabric_shared(cluster)}.get(level, False):
        return []
    unit = link_unit(level, cluster)
    ascending = all(a[0] + a[1] <= b[0] for a, b in pairwise(blocks))
    if not ascending:
        per_link: dict[int, int] = {}
        for first, count in blocks:
            for rank in range(first, first + count):
                per_link[rank // unit] = per_link.get(rank // unit, 0) + 1
        return [(link, link + 1, count) for link, count in per_link.items()]
    runs: list[tuple[int, int, int]] = []
    for first, count in blocks:
        end = first + count
        low, high = -(-first // unit), end // unit  # the links the run fills
        pieces = [(first // unit, first // unit + 1, count)] if low > high else [
            *([(first // unit, low, low * unit - first)] if first % unit else []),
            *([(low, high, unit)] if high > low else []),
            *([(high, high + 1, end - high * unit)] if end % unit else [])]
        for piece in pieces:
            last = runs[-1] if runs else None
            if last is not None and last[1] - 1 == piece[0]:  # (one link) the link the previous run ended in
                runs[-1:] = [*([(last[0], last[1] - 1, last[2])] if last[1] - last[0] > 1 else []),
                             (piece[0], piece[1], last[2] + piece[2])]
            elif last is not None and last[1] == piece[0] and last[2] == piece[2]:
                runs[-1] = (last[0], piece[1], last[2])
            else:
                runs.append(piece)
    return runs


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
        rails = nic_rails(cluster)
        per_rail = cluster.gpus_per_node // rails
        for node in nodes:  # one NIC's worth per node, spread over the rails of the group's ranks there
            on_node = sorted(r for r in members if r // cluster.gpus_per_node == node)
            for rank in on_node:
                rail = rank % cluster.gpus_per_node // per_rail
                for d in ("tx", "rx"):
                    name = nic_name(node, rail, d, rails)
                    uses[name] = uses.get(name, 0.0) + one_nic / len(on_node)
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
