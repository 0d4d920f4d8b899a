"""Physical links a communication group crosses, and how many groups share each (Proteus Sec. VI-C, Fig. 7).

Proteus detects bandwidth sharing top-down over the link hierarchy: each group is split into per-node
sub-groups; a group of more than one sub-group crosses the NIC of every node it touches, and the groups crossing
one NIC share its bandwidth fairly; inside a node, groups share the node's fabric where it is a shared bus
(PCIe: every GPU of the node behind one switch) and not where each GPU has its own ports (NVLink, NVSwitch).

physical_links names those links as the event simulator's resources ("node3.nic.tx"; one per direction: links
are full duplex), so concurrent transfers of different groups on one link slow each other in the engine
(SimOptions.bandwidth_sharing); shared_groups is the static count of the same detection, for a set of groups
that run at once. Ranks are numbered node-major (hardware.cluster).
"""

from collections.abc import Sequence

from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec

_SHARED_FABRICS = ("pcie",)  # intra-node link kinds whose bandwidth the node's GPUs share


def nodes_of(ranks: Sequence[int], cluster: ClusterSpec) -> tuple[int, ...]:
    """The nodes a group's ranks sit on, in order."""
    if not ranks:
        raise ConfigError("group", list(ranks), "needs at least one rank")
    bad = [r for r in ranks if not 0 <= r < cluster.num_gpus]
    if bad:
        raise ConfigError("group", bad[0], f"ranks are 0-{cluster.num_gpus - 1} on {cluster.name}")
    return tuple(dict.fromkeys(r // cluster.gpus_per_node for r in ranks))


def physical_links(ranks: Sequence[int], cluster: ClusterSpec) -> tuple[str, ...]:
    """The shared links a collective of these ranks crosses: the NIC of each node when it spans nodes, the node's
    fabric when that is a shared bus and the group has more than one rank there."""
    nodes = nodes_of(ranks, cluster)
    if len(set(ranks)) <= 1:
        return ()
    names: list[str] = []
    if len(nodes) > 1:
        names += [f"node{n}.nic.{d}" for n in nodes for d in ("tx", "rx")]
    if cluster.intra_node.kind in _SHARED_FABRICS:
        per_node = {n: sum(1 for r in set(ranks) if r // cluster.gpus_per_node == n) for n in nodes}
        names += [f"node{n}.fabric" for n in nodes if per_node[n] > 1]
    return tuple(names)


def link_capacity(name: str, cluster: ClusterSpec) -> float:
    """Relative capacity of a link resource: a node's NICs together (nics_per_node), one shared fabric."""
    return float(cluster.nics_per_node) if ".nic." in name else 1.0


def shared_groups(groups: Sequence[Sequence[int]], cluster: ClusterSpec) -> list[float]:
    """Per group running at once with the others, the most groups per unit of capacity on any link it crosses
    (1.0: it has its links to itself; 2.0: it gets half the bandwidth of its busiest link)."""
    users: dict[str, int] = {}
    links = [physical_links(g, cluster) for g in groups]
    for names in links:
        for name in {n.rsplit(".", 1)[0] if ".nic." in n else n for n in names}:
            users[name] = users.get(name, 0) + 1
    out: list[float] = []
    for names in links:
        shares = [users[n.rsplit(".", 1)[0] if ".nic." in n else n] / link_capacity(n, cluster) for n in names]
        out.append(max([1.0, *shares]))
    return out
