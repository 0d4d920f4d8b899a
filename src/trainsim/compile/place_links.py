"""The cluster's shared links as the simulator's resources (Proteus Sec. VI-C: a link shared by several devices is
shared among every transfer crossing it).

While compiling, a transfer names what its simulated device's ranks cross: "stage{d}.{level}.{tx|rx}", level nic
(it leaves the NVLink domain), uplink (it leaves its leaf) or fabric (it moves between GPUs of one node)
(context.link_resources). This pass, run on the finished graph (after device classes: compile/device_classes.py),
puts the physical links in their place (hardware/links.py):

- a node's NICs (each rail's own on a rail-optimized node: hardware.links.nic_rails), a leaf's oversubscribed
  up-links and a node's PCIe bus are shared links: each such level of a
  device's transfer becomes the links its ranks sit behind, and the transfer takes one share per rank behind each
  (Task.link_shares), of a capacity of the GPUs behind it. Every device whose ranks sit behind a link names the
  same resource, so two pipeline stages on one node, two device classes behind one NIC, or the tensor- and
  data-parallel groups of a hybrid plan, all slow each other once their transfers together ask more than the
  link carries;
- NVLink and NVSwitch ports are each GPU's own: no other device's transfer crosses them, so they stay the
  device's own resource ("stage{d}.fabric.tx"), as before.

Identical links are one resource: links with the same capacity that the same devices' transfers cross with the
same shares see the same flows, so they are merged ("node8.nic0.tx (+63 alike)": the 8 rails of a stage's 8 nodes),
and the number of resources does not grow with dp. A device alone behind its links takes all of their capacity per
transfer, so a cluster of such devices simulates exactly as with a resource per device.
"""

import re
from bisect import bisect_left
from itertools import compress

from trainsim.compile.device_classes import device_rank_blocks
from trainsim.hardware.links import (
    FABRIC,
    NIC,
    UPLINK,
    fabric_shared,
    link_capacity,
    link_kind,
    link_name,
    link_runs,
    link_unit,
)
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.template_runs import holding_resources, ordered_runs, parts
from trainsim.job import Job

_TOKEN = re.compile(r"^stage(\d+)\.(\w+)\.(tx|rx)$")


def place_links(job: Job, graph: ExecGraph) -> ExecGraph:
    """Replace the devices' shared-level link names by the cluster's physical links, merged where alike, with each
    transfer's shares of them; `graph` is changed in place (as columns) and returned."""
    cluster = job.cluster
    shared_levels = {NIC, UPLINK} | ({FABRIC} if fabric_shared(cluster) else set())
    # NB: the compiler shares resource tuples, so the distinct ones are few; the loops over tasks run in C where
    # they can (half of a 175B job's 150,000 tasks name links)
    columns = graph.writable_columns()  # NB: compile_job's graphs hold columns (a graph of Task objects: taken over)
    links_of = columns.resources
    # the tasks in parts: the compiler's template runs whose resources are their blocks' (read per block), and the
    # tasks between them (read per task)
    pieces = parts(len(links_of), holding_resources(ordered_runs(columns, len(links_of)), links_of))
    tuples: dict[int, tuple[str, ...]] = {}
    for piece in pieces:
        named = list(compress(links_of[piece.first:piece.end], links_of[piece.first:piece.end])) \
            if piece.run is None else [names for block in piece.distinct.values() for names in block.resources if names]
        tuples.update(zip(map(id, named), named, strict=True))
    tokens = {name for names in tuples.values() for name in names
              if (m := _TOKEN.match(name)) is not None and m[2] in shared_levels}
    if not tokens:
        return graph
    blocks = device_rank_blocks(job, len({d.stage for d in graph.devices}), [d.ranks for d in graph.devices])
    physical: dict[str, list[tuple[int, int, int]]] = {}  # token -> runs of its level's link numbers, shares each
    for token in sorted(tokens):
        m = _TOKEN.match(token)
        assert m is not None
        physical[token] = link_runs(blocks[int(m[1])], m[2], m[3], cluster)
    merged, capacity = _merge_alike(physical, job)
    graph.resource_capacity.update(capacity)
    crossing = {key for key, names in tuples.items() if not tokens.isdisjoint(names)}
    placed: dict[tuple[int, int], tuple[tuple[str, ...], tuple[float, ...]]] = {}
    device_of, sync_keys, link_shares = columns.device, columns.sync_key, columns.link_shares
    for piece in pieces:
        first, end = piece.first, piece.end
        if piece.run is not None and crossing.isdisjoint(
                id(names) for block in piece.distinct.values() for names in block.resources):
            continue  # (a run of steps whose transfers stay on the devices' own ports)
        for tid in compress(range(first, end), map(crossing.__contains__, map(id, links_of[first:end]))):
            # a collective's member takes its own device's shares (the engine adds its members' up)
            names = links_of[tid]
            key = (id(names), device_of[tid] if sync_keys[tid] else -1)
            done = placed.get(key)
            if done is None:
                done = placed[key] = _place(names, key[1], merged)
            links_of[tid], link_shares[tid] = done
    return graph


def _place(names: tuple[str, ...], device: int, merged: dict[str, dict[str, float]]) -> tuple[tuple[str, ...],
                                                                                            tuple[float, ...]]:
    """A transfer's resources and shares: its shared levels' links, its own ports; only `device`'s if >= 0."""
    shares: dict[str, float] = {}
    for name in names:
        m = _TOKEN.match(name)
        if device >= 0 and m is not None and int(m[1]) != device:
            continue
        for link, share in merged.get(name, {name: 1.0}).items():
            shares[link] = max(shares.get(link, 0.0), share)  # a bus named for sending and receiving: once
    return tuple(shares), tuple(shares.values())


def _merge_alike(physical: dict[str, list[tuple[int, int, int]]], job: Job) -> tuple[dict[str, dict[str, float]],
                                                                                   dict[str, float]]:
    """Merge the links that the same tokens cross with the same shares (and of one capacity): per token its merged
    links and shares, and each merged link's capacity. A merged link is named for its first link in the order the
    tokens (sorted) name their links, and resources come in that order too.

    NB: worked out on runs of link numbers, not per link (2**20 GPUs cross 2**20 rails): a level's links are cut
    where any token's runs start or end (and at the last leaf, whose up-links may serve fewer nodes); between two
    cuts every link has the same users, kind and capacity."""
    cluster = job.cluster
    order = {token: i for i, token in enumerate(physical)}
    cuts: dict[tuple[str, str], set[int]] = {}  # (level, direction: "" for a node's bus) -> where links change
    for token, runs in physical.items():
        level, direction = _level_of(token)
        cut = cuts.setdefault((level, direction), set())
        if level == UPLINK and cluster.nodes_per_leaf is not None:
            cut.add(cluster.num_gpus // link_unit(UPLINK, cluster))  # the last leaf, maybe short of nodes
        for first, end, _ in runs:
            cut.update((first, end))
    bounds = {key: sorted(cut) for key, cut in cuts.items()}
    # per piece of links between two cuts (level, direction, first link): its end and its users (token, shares,
    # and where the token first names it: the token's place in sorted order, the run's place in its list)
    pieces: dict[tuple[str, str, int], tuple[int, list[tuple[str, int]], tuple[int, int, int]]] = {}
    for token, runs in physical.items():
        level, direction = _level_of(token)
        at = bounds[(level, direction)]
        for k, (first, end, shares) in enumerate(runs):
            for i in range(bisect_left(at, first), bisect_left(at, end)):
                start, stop = at[i], at[i + 1]
                piece = pieces.setdefault((level, direction, start), (stop, [], (order[token], k, start)))
                piece[1].append((token, shares))
    alike: dict[tuple[str, float, tuple[tuple[str, int], ...]], tuple[tuple[int, int, int], str, int]] = {}
    for (level, direction, start), (stop, used, first_named) in pieces.items():
        link = link_name(level, start, direction, cluster)
        key = (link_kind(link), link_capacity(link, cluster), tuple(sorted(used)))
        known = alike.get(key)
        count = stop - start + (0 if known is None else known[2])
        alike[key] = (first_named, link, count) if known is None or first_named < known[0] else \
            (known[0], known[1], count)
    merged: dict[str, dict[str, float]] = {token: {} for token in physical}
    capacity: dict[str, float] = {}
    for (_, cap, used), (_, link, count) in sorted(alike.items(), key=lambda item: item[1][0]):
        name = link if count == 1 else f"{link} (+{count - 1} alike)"
        capacity[name] = cap
        for token, share in used:
            merged[token][name] = float(share)
    return merged, capacity


def _level_of(token: str) -> tuple[str, str]:
    """A shared-level token's level and direction ("" for a node's bus: one resource for sending and receiving)."""
    m = _TOKEN.match(token)
    assert m is not None
    return m[2], "" if m[2] == FABRIC else m[3]
