"""Collective times as NCCL runs them: per collective, buffer and group, the algorithm and protocol NCCL's tuner
would pick and its bandwidth and latency over the cluster's topology.

The shape follows NCCL's own cost model (src/graph/tuning.cc, ncclTopoTuneModel, NCCL 2.19-2.29): each
(algorithm, protocol)'s time is latency + bytes / bandwidth, and NCCL runs the fastest enabled one
(ncclTopoGetAlgoTime). Each algorithm runs under up to three protocols (comm/nccl_tuning.py, NCCL 2.29.7's
constants): LL (the least start-up and step latency, half the bandwidth, at most NCCL's llMaxBw), LL128
(0.92 of the bandwidth; NVLink systems only) and Simple (the full bandwidth, the most latency); NVLS, CollNet
and PAT run Simple only. Small buffers go LL, large ones Simple. The step and start-up latencies below are the
protocol's; for n ranks in a group with l ranks on each of D NVLink domains and a buffer of S bytes (the full
buffer):

- ring (every collective): 2(n-1) steps for all-reduce, n-1 for all-gather / reduce-scatter, each step a
  per-hop latency; the steps that cross domains pay the network's latency (NCCL: nInterSteps x interLat). The
  ring moves 2(n-1)/n S (all-reduce) or (n-1)/n S per rank at the ring's bus bandwidth: the NVLink fabric inside
  one domain; across domains the l NICs of the group's ranks in each domain (rail-optimized: every GPU drives
  its own NIC; each NCCL channel crosses a domain through one NIC), never more than the NVLink.
- tree (all-reduce across domains): NCCL's double binary tree, a chain inside each domain: latency
  2((l-1) intra + log2(D) inter); bandwidth 0.92 of the ring's bus bandwidth for 2 S per rank (tuning.cc:
  busBw * .92 for Tree, algorithm bandwidth busBw / 2), times NCCL's correction by size and protocol.
- nvls (all-reduce inside one domain on a multicast NVSwitch, Hopper and later): the switch reduces and
  multicasts, so each GPU sends and receives S once: S / (link bw x fitted NVLS efficiency), after NCCL's
  NVLS hardware latency (tuning.cc hwLat[NVLINK][NVLS][Simple] = 25 us) and the fitted extra start-up.
- collnet (all-reduce across domains where the switches reduce: InfiniBand SHARP): reduce-scatter and
  all-gather inside the domain, S / l per GPU to and from the switch (tuning.cc CollNetDirect latency:
  2 (min(1, l-1) intra + 0.4 us (l-1)) + inter, its own step latencies: 3.7 us NVLink, 31 us network).
- pat (all-gather / reduce-scatter at one rank per domain, NCCL >= 2.23's Parallel Aggregated Trees):
  log2(n) network steps at the ring's bandwidth.
- all-to-all (NCCL's grouped send/recv): (n-1)/n S per rank; across domains the (n-l)/n S bound for other
  domains over the rank's own NIC, the rest over NVLink at the same time. The sends to all peers are issued
  in one group and overlap, so the latency grows as log2(n) steps, not n-1 (the form the XLA collective
  tables of collectives.csv show: about 23 us at 4 ranks and 63 us at 72 on GB200 NVL72).
- send-recv: S over NVLink inside a domain, over the sender's NIC across.

Above the leaf switches (a group spanning several scalable units) the NIC bandwidth is divided by the
cluster's leaf oversubscription. Hierarchical all-reduce / all-gather / reduce-scatter (inside the domain, then
across domains among the ranks of one local index, then inside again) is what hybrid-sharded stacks run
(PyTorch FSDP HYBRID_SHARD, DeepSpeed hpZ / MiCS); NCCL itself does not: `hierarchical=True` asks for it.

Every algorithm but NVLS starts with NCCL's start-up latency (baseLat per algorithm and protocol); the fitted
corrections extend NCCL's constants rather than replace them: a per-collective extra start-up (on every
algorithm: what NCCL's model leaves out, the host side and the kernel launch) and extra step latency, and the
bandwidth efficiency that scales the bus bandwidth before the protocol's factor; the NVLS efficiency; and per
fabric the network's efficiency and extra step latency (over NCCL's hwLatencies[NET] and the link's latency).
They are fitted on collectives.csv (calibrate/microbenchmarks.py); a fabric without multi-node measurements
(InfiniBand, RoCE, ...) takes NCCL's own step latency (no fitted extra:
calibrate.microbenchmarks.NCCL_NET_EXTRA_STEP_LATENCY_S). Grouped sends and receives (all-to-all, send-recv)
are priced as before, Simple only, with the link's latency per step (NB: NCCL runs p2p under LL below 16 KiB).
"""

import math
from typing import Protocol

from trainsim.catalog.calibration import Calibration, CommParams
from trainsim.comm import nccl_tuning as nccl
from trainsim.comm.nccl_tuning import LL, LL128, SIMPLE
from trainsim.hardware.cluster import ClusterSpec, GroupLayout

_TRAFFIC_FACTOR = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0}
_NVLINK_KINDS = ("nvlink", "nvswitch", "nvlink-bridge")


def _shifted(nccl_s: tuple[float, float, float], extra_s: float) -> tuple[float, float, float]:
    return (nccl_s[LL] + extra_s, nccl_s[LL128] + extra_s, nccl_s[SIMPLE] + extra_s)


class _Links:
    """The bandwidths and per-protocol latencies one collective sees on one cluster (calibration applied): NCCL's
    constants (comm/nccl_tuning.py) plus the fitted start-up and step latency, the links' bandwidths times the
    fitted efficiencies."""

    __slots__ = ("base_extra", "collnet_intra", "collnet_net", "intra_bw", "ll128", "ll_cap_one_domain",
                 "multicast", "nic_bw", "nvls_bw", "p2p_intra_lat", "pat_base", "ring_base", "ring_intra",
                 "ring_net", "ring_terms", "sharp", "tree_base", "tree_intra", "tree_net")

    def __init__(self, collective: str, layout: GroupLayout, cluster: ClusterSpec, cal: Calibration) -> None:
        params: CommParams = cal.comm_params(collective, cluster.device.name)
        network = cal.network_params(cluster.inter_node.kind)
        nvlink = cluster.intra_node.kind in _NVLINK_KINDS
        step = params.latency_s
        self.base_extra = params.base_latency_s
        self.ring_base = _shifted(nccl.RING_BASE_LATENCY_S, self.base_extra)
        self.tree_base = _shifted(nccl.TREE_BASE_LATENCY_S, self.base_extra)
        self.pat_base = nccl.PAT_BASE_LATENCY_S + self.base_extra
        self.ring_intra = _shifted(nccl.NVLINK_RING_STEP_S if nvlink else nccl.PCI_RING_STEP_S, step)
        self.tree_intra = _shifted(nccl.NVLINK_TREE_STEP_S if nvlink else nccl.PCI_TREE_STEP_S, step)
        # NB: the fabric's own latency on every network step (NCCL: interLat += the net transport's latency)
        fabric = cluster.inter_node.latency_s + network.latency_s
        self.ring_net = _shifted(nccl.NET_RING_STEP_S, fabric)
        self.tree_net = _shifted(nccl.NET_TREE_STEP_S, fabric)
        self.collnet_intra = nccl.NVLINK_COLLNET_DIRECT_STEP_S + step
        self.collnet_net = nccl.NET_COLLNET_DIRECT_STEP_S + fabric
        self.p2p_intra_lat = cluster.intra_node.latency_s + step
        # LL128 only where the GPUs talk over NVLink (ncclTopoTuneModel: typeIntra <= PATH_NVB); the NIC is taken
        # as behind a PCIe switch, where NCCL allows it across servers too (typeInter <= PATH_PXB).
        self.ll128 = nvlink
        generation = cal.device_generation.get(cluster.device.name, "")
        self.ll_cap_one_domain = nccl.ll_max_bw_bytes_per_s(generation, 1)
        self.intra_bw = cluster.intra_node.bw_bytes_per_s * params.bw_efficiency
        oversubscription = cluster.leaf_oversubscription if layout.num_leaves > 1 else 1.0
        self.nic_bw = cluster.nic_bw_per_gpu_bytes_per_s * network.bw_efficiency / oversubscription
        self.nvls_bw = cluster.intra_node.bw_bytes_per_s * params.nvls_bw_efficiency
        self.multicast = cluster.intra_node.multicast
        self.sharp = cluster.in_network_reduction
        # (size, domains, ranks per domain) -> _ring_terms; NB: a _Links is made per collective and leaf span
        self.ring_terms: dict[tuple[int, int, int], tuple[float, ...]] = {}

    def ring_bw(self, layout: GroupLayout) -> float:
        """Bus bandwidth of a ring: NVLink inside a domain; across domains the NICs of the group's ranks in a
        domain, at most the NVLink."""
        if layout.num_domains == 1:
            return self.intra_bw
        return min(self.intra_bw, layout.ranks_per_domain * self.nic_bw)

    def ll_cap(self, num_domains: int) -> float:
        """NCCL's LL bus bandwidth cap (llMaxBws) for a group over num_domains NVLink domains."""
        if num_domains == 1:
            return self.ll_cap_one_domain
        return nccl.LL_MAX_BW_TWO_NODES_BYTES_PER_S if num_domains == 2 else nccl.LL_MAX_BW_MORE_NODES_BYTES_PER_S


def _ring_terms(collective: str, layout: GroupLayout, links: _Links) -> tuple[float, ...]:
    """A ring's per-protocol latencies and bus bandwidths on this group (LL, LL128, Simple; LL128 at an infinite
    latency where it is off) and the bytes each rank moves per byte of buffer, made once per group shape."""
    key = (layout.size, layout.num_domains, layout.ranks_per_domain)
    known = links.ring_terms.get(key)
    if known is not None:
        return known
    n, domains = layout.size, layout.num_domains
    factor = _TRAFFIC_FACTOR[collective]
    net_steps = factor * (domains - 1)
    intra_steps = factor * (n - 1) - net_steps
    # NB: at one rank per domain NCCL charges the tree's network step (ncclTopoTuneModel: ppn == 1)
    net = links.tree_net if layout.ranks_per_domain == 1 else links.ring_net
    latency = [links.ring_base[p] + intra_steps * links.ring_intra[p] + net_steps * net[p] for p in (LL, LL128, SIMPLE)]
    if not links.ll128:
        latency[LL128] = math.inf
    bus_bw = links.ring_bw(layout)
    terms = (*latency, min(links.ll_cap(domains), nccl.RING_LL_BW_FACTOR * bus_bw),
             nccl.RING_LL128_BW_FACTOR * bus_bw, bus_bw, factor * (n - 1) / n)
    links.ring_terms[key] = terms
    return terms


def _ring_s(collective: str, size_bytes: float, layout: GroupLayout, links: _Links,
            times: dict[str, float] | None = None) -> float:
    """The fastest protocol's seconds of a ring; each enabled protocol's into `times` when given."""
    ll_lat, ll128_lat, simple_lat, ll_bw, ll128_bw, simple_bw, share = _ring_terms(collective, layout, links)
    traffic_bytes = share * size_bytes
    ll, simple = ll_lat + traffic_bytes / ll_bw, simple_lat + traffic_bytes / simple_bw
    ll128 = ll128_lat + traffic_bytes / ll128_bw
    if times is not None:
        times["ring/LL"], times["ring/Simple"] = ll, simple
        if links.ll128:
            times["ring/LL128"] = ll128
    return min(ll, ll128, simple)


def _tree_s(size_bytes: float, layout: GroupLayout, links: _Links, times: dict[str, float] | None = None) -> float:
    """The fastest protocol's seconds of NCCL's tree all-reduce; each enabled protocol's into `times` when
    given."""
    intra_steps = 2.0 * (layout.ranks_per_domain - 1)
    net_steps = 2.0 * math.ceil(math.log2(layout.num_domains))
    base, intra, net = links.tree_base, links.tree_intra, links.tree_net
    bus_bw = nccl.TREE_BW_FACTOR * links.ring_bw(layout)
    ll_bw = min(bus_bw / nccl.TREE_LL_DIVISOR, links.ll_cap(layout.num_domains))
    ll = (base[LL] + intra_steps * intra[LL] + net_steps * net[LL]
          + 2.0 * size_bytes / (ll_bw * nccl.tree_correction(LL, size_bytes)))
    simple = (base[SIMPLE] + intra_steps * intra[SIMPLE] + net_steps * net[SIMPLE]
              + 2.0 * size_bytes / (bus_bw * nccl.tree_correction(SIMPLE, size_bytes)))
    best = min(ll, simple)
    if links.ll128:  # NB: tree runs across domains only here, so LL128 takes NCCL's multi-node factor
        ll128_bw = bus_bw * nccl.TREE_LL128_MULTI_NODE_FACTOR
        ll128 = (base[LL128] + intra_steps * intra[LL128] + net_steps * net[LL128]
                 + 2.0 * size_bytes / (ll128_bw * nccl.tree_correction(LL128, size_bytes)))
        best = min(best, ll128)
        if times is not None:
            times["tree/LL128"] = ll128
    if times is not None:
        times["tree/LL"], times["tree/Simple"] = ll, simple
    return best


def _nvls_s(size_bytes: float, links: _Links) -> float:
    return links.base_extra + nccl.NVLS_LATENCY_S + size_bytes / links.nvls_bw


def _collnet_s(size_bytes: float, layout: GroupLayout, links: _Links) -> float:
    local = layout.ranks_per_domain
    latency = links.base_extra + 2.0 * (min(1, local - 1) * links.collnet_intra
                                        + (local - 1) * nccl.COLLNET_PER_RANK_LATENCY_S) + links.collnet_net
    inside = 2.0 * (local - 1) / local * size_bytes / links.intra_bw
    return latency + max(inside, size_bytes / (local * links.nic_bw))


def _pat_s(size_bytes: float, layout: GroupLayout, links: _Links) -> float:
    n = layout.size
    return (links.pat_base + math.ceil(math.log2(n)) * links.tree_net[SIMPLE]
            + (n - 1) / n * size_bytes / links.ring_bw(layout))


def _all_to_all_s(size_bytes: float, layout: GroupLayout, links: _Links) -> float:
    n, local = layout.size, layout.ranks_per_domain
    steps = math.ceil(math.log2(n))  # NB: the peers' sends of one grouped call overlap (see the module doc)
    if layout.num_domains == 1:
        return links.ring_base[SIMPLE] + steps * links.p2p_intra_lat + (n - 1) / n * size_bytes / links.intra_bw
    cross = (n - local) / n * size_bytes / links.nic_bw
    inside = (local - 1) / n * size_bytes / links.intra_bw
    return links.ring_base[SIMPLE] + steps * links.ring_net[SIMPLE] + max(cross, inside)


def _send_recv_s(size_bytes: float, layout: GroupLayout, links: _Links) -> float:
    if layout.num_domains == 1:
        return links.ring_base[SIMPLE] + links.p2p_intra_lat + size_bytes / links.intra_bw
    return links.ring_base[SIMPLE] + links.ring_net[SIMPLE] + size_bytes / links.nic_bw


def algorithm_times_s(collective: str, size_bytes: float, layout: GroupLayout, cluster: ClusterSpec,
                      cal: Calibration) -> dict[str, float]:
    """Seconds of every (algorithm, protocol) NCCL could run for this collective on this group (the enabled ones
    only), keyed "algorithm/protocol"; "p2p" for NCCL's grouped sends and receives."""
    links = _Links(collective, layout, cluster, cal)
    if collective == "send-recv":
        return {"p2p": _send_recv_s(size_bytes, layout, links)}
    if collective == "all-to-all":
        return {"p2p": _all_to_all_s(size_bytes, layout, links)}
    times: dict[str, float] = {}
    _ring_s(collective, size_bytes, layout, links, times)
    crosses = layout.num_domains > 1
    if collective == "all-reduce":
        if crosses:
            _tree_s(size_bytes, layout, links, times)
            if links.sharp:
                times["collnet/Simple"] = _collnet_s(size_bytes, layout, links)
        elif links.multicast and layout.size > 2:
            times["nvls/Simple"] = _nvls_s(size_bytes, links)
    elif crosses and layout.ranks_per_domain == 1:
        times["pat/Simple"] = _pat_s(size_bytes, layout, links)
    return times


def _fastest_s(collective: str, size_bytes: float, layout: GroupLayout, links: _Links) -> float:
    """The seconds of choose_algorithm's pick: the least of algorithm_times_s's times, the same branches
    without the dict of names (one call per collective the engines price)."""
    if collective == "send-recv":
        return _send_recv_s(size_bytes, layout, links)
    if collective == "all-to-all":
        return _all_to_all_s(size_bytes, layout, links)
    seconds = _ring_s(collective, size_bytes, layout, links)
    crosses = layout.num_domains > 1
    if collective == "all-reduce":
        if crosses:
            seconds = min(seconds, _tree_s(size_bytes, layout, links))
            if links.sharp:
                seconds = min(seconds, _collnet_s(size_bytes, layout, links))
        elif links.multicast and layout.size > 2:
            seconds = min(seconds, _nvls_s(size_bytes, links))
    elif crosses and layout.ranks_per_domain == 1:
        seconds = min(seconds, _pat_s(size_bytes, layout, links))
    return seconds


def choose_algorithm(collective: str, size_bytes: float, layout: GroupLayout, cluster: ClusterSpec,
                     cal: Calibration) -> tuple[str, float]:
    """The algorithm and protocol NCCL's tuner would pick (the fastest by its model, "algorithm/protocol") and
    its seconds."""
    times = algorithm_times_s(collective, size_bytes, layout, cluster, cal)
    name = min(times, key=times.__getitem__)
    return name, times[name]


def _hierarchical_s(collective: str, size_bytes: float, layout: GroupLayout, cluster: ClusterSpec,
                    cal: Calibration) -> float:
    """Inside the domain, across domains among the ranks of one local index (one rank per domain, on its own
    NIC), inside again: all-reduce = reduce-scatter + all-reduce of S/l + all-gather."""
    local, domains = layout.ranks_per_domain, layout.num_domains
    inside = GroupLayout(size=local, ranks_per_node=min(local, layout.ranks_per_node), num_nodes=1,
                         ranks_per_domain=local, num_domains=1)
    across = GroupLayout(size=domains, ranks_per_node=1, num_nodes=domains, ranks_per_domain=1,
                         num_domains=domains, num_leaves=layout.num_leaves)

    def part(name: str, size: float, group: GroupLayout) -> float:
        return choose_algorithm(name, size, group, cluster, cal)[1] if group.size > 1 else 0.0

    if collective == "all-reduce":
        return (part("reduce-scatter", size_bytes, inside) + part("all-reduce", size_bytes / local, across)
                + part("all-gather", size_bytes, inside))
    return part(collective, size_bytes / local, across) + part(collective, size_bytes, inside)


def collective_time_s(collective: str, buffer_bytes: float, layout: GroupLayout, cluster: ClusterSpec,
                      cal: Calibration, *, hierarchical: bool = False) -> float:
    """Time of one collective on a group laid out as `layout` (all groups of that axis run at once), with the
    algorithm NCCL would pick; hierarchical: the two-level decomposition hybrid-sharded stacks run."""
    if layout.size <= 1 or buffer_bytes <= 0:
        return 0.0
    if _two_levels(collective, layout, hierarchical):
        return _hierarchical_s(collective, buffer_bytes, layout, cluster, cal)
    return choose_algorithm(collective, buffer_bytes, layout, cluster, cal)[1]


def _two_levels(collective: str, layout: GroupLayout, hierarchical: bool) -> bool:
    """Whether collective_time_s prices the collective as _hierarchical_s's two levels."""
    return (hierarchical and collective in ("all-reduce", "all-gather", "reduce-scatter")
            and layout.num_domains > 1 and layout.ranks_per_domain > 1)


class CommCostModel(Protocol):
    """Seconds of one collective on a group laid out as `layout`. The NCCL model below is the default; a
    profile database of measured collectives stands in where it has them (cost/profiled.py)."""

    name: str

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout,
                          cluster: ClusterSpec) -> float: ...


class NcclComm:
    """collective_time_s with the calibration's fitted efficiencies and latencies, as a CommCostModel.
    hierarchical: price all-reduce / all-gather / reduce-scatter across domains as hybrid-sharded stacks run
    them (two levels) rather than as NCCL's flat algorithms; the default of every call, which a call may
    override (a stack that shards hierarchically over its data-parallel group only)."""

    name = "nccl"

    def __init__(self, cal: Calibration, *, hierarchical: bool = False) -> None:
        self.cal = cal
        self.hierarchical = hierarchical
        # NB: keyed by the cluster's id; the entry holds the cluster, checked by identity
        self._links: dict[tuple[str, bool, int], tuple[ClusterSpec, _Links]] = {}

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout, cluster: ClusterSpec,
                          *, hierarchical: bool | None = None) -> float:
        """collective_time_s (the module's) with this model's calibration; a flat collective's links made once
        per (collective, whether the group spans leaves, cluster): the same figures."""
        flag = self.hierarchical if hierarchical is None else hierarchical
        if layout.size <= 1 or buffer_bytes <= 0 or _two_levels(collective, layout, flag):
            return collective_time_s(collective, buffer_bytes, layout, cluster, self.cal, hierarchical=flag)
        key = (collective, layout.num_leaves > 1, id(cluster))
        known = self._links.get(key)
        if known is None or known[0] is not cluster:
            known = self._links[key] = (cluster, _Links(collective, layout, cluster, self.cal))
        return _fastest_s(collective, buffer_bytes, layout, known[1])
