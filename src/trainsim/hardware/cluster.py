"""Clusters as built: servers (nodes) of GPUs, NVLink domains of whole servers, and a rail-optimized network of
leaves (scalable units) joined above by spines.

A DGX/HGX server is its own NVLink domain (8 GPUs on NVSwitch). A GB200/GB300 NVL72 rack is one NVLink domain
of 72 GPUs on 18 compute trays of 4 (the "node": the GPUs one host drives); its NVLink switch trays join every
GPU of the rack. Across domains every GPU has its own NIC share on a rail-optimized fat tree: the GPUs of one
local rank sit on one rail, and the rail's leaf switch joins the same rail of `nodes_per_leaf` servers (a
scalable unit: 32 DGX servers in the NVIDIA DGX SuperPOD reference architectures). Above the leaves the
network may be oversubscribed (`leaf_oversubscription` = leaf down-links / up-links; 1 = non-blocking).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainsim.errors import ConfigError
from trainsim.hardware.device import DeviceSpec
from trainsim.specbase import Spec
from trainsim.units import parse_bandwidth, parse_duration

# The most GPUs a cluster holds: 2**24 (16.7 million) is 16 times the largest job trainsim is checked on (10^6
# GPUs); a count beyond it is a typo, and every per-GPU figure stays a plain float far from overflow.
MAX_GPUS = 2**24
MAX_SLOWDOWN = 1e3  # a rank a thousand times slower than its peers is a dead one, not a straggler

LinkKind = Literal["nvlink", "nvswitch", "pcie", "infiniband", "roce", "ethernet", "nvlink-bridge", "efa",
                   "infinity-fabric", "slingshot"]


class LinkSpec(Spec):
    """A link family. bw_bytes_per_s is per direction per endpoint (per GPU inside a node, per NIC across).
    multicast: the switch reduces and multicasts (NVLink SHARP, "NVLS": third-generation NVSwitch and later,
    i.e. Hopper and Blackwell NVSwitch systems; NCCL 2.17+ runs all-reduce on it)."""

    name: str
    kind: LinkKind
    description: str = ""
    bw_bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    latency_s: float = Field(ge=0, allow_inf_nan=False)
    multicast: bool = False

    @field_validator("bw_bytes_per_s", mode="before")
    @classmethod
    def _parse_bw(cls, value: object) -> object:
        return parse_bandwidth(value, "bw_bytes_per_s") if isinstance(value, str) else value

    @field_validator("latency_s", mode="before")
    @classmethod
    def _parse_latency(cls, value: object) -> object:
        return parse_duration(value, "latency_s") if isinstance(value, str) else value


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """Where the ranks of one communication group sit: ranks_per_node on each of num_nodes servers,
    ranks_per_domain on each of num_domains NVLink domains (equal to the node figures where a server is its own
    domain), and num_leaves: the leaf switches (scalable units) the group spans (1: it stays under one leaf).
    A plain dataclass, not a Spec: only ClusterSpec.group_layout makes them, on the engines' per-plan path."""

    size: int
    ranks_per_node: int
    num_nodes: int
    ranks_per_domain: int = 0  # 0: the same as ranks_per_node
    num_domains: int = 0  # 0: the same as num_nodes
    num_leaves: int = 1

    def __post_init__(self) -> None:
        if self.ranks_per_domain == 0:
            object.__setattr__(self, "ranks_per_domain", self.ranks_per_node)
        if self.num_domains == 0:
            object.__setattr__(self, "num_domains", self.num_nodes)


def _spread(layout: GroupLayout) -> tuple[int, ...]:
    """How spread a group's ranks are: domains, leaves, servers; then the fewer ranks per domain and server."""
    return (layout.num_domains, layout.num_leaves, layout.num_nodes, -layout.ranks_per_domain, -layout.ranks_per_node)


def _per_block(block: int, size: int, stride: int) -> int:
    """Ranks of a group (size ranks, stride apart, numbered block-major) inside one block of `block` ranks."""
    per_block = max(1, block // stride) if stride < block else 1
    return min(per_block, size)


class ClusterSpec(Spec):
    name: str
    description: str = ""
    device: DeviceSpec
    gpus_per_node: int = Field(gt=0)
    num_nodes: int = Field(default=1, gt=0)
    intra_node: LinkSpec  # the NVLink (or PCIe) fabric of one NVLink domain, per GPU
    inter_node: LinkSpec  # one scale-out NIC
    nics_per_node: int = Field(default=1, gt=0)
    # GPUs one NVLink domain can hold (72 on an NVL72 rack); None: each server is its own domain.
    nvlink_domain_gpus: int | None = Field(default=None, gt=0)
    # Servers whose same-rail NICs share one leaf switch (a scalable unit); None: one leaf joins them all.
    nodes_per_leaf: int | None = Field(default=None, gt=0)
    leaf_oversubscription: float = Field(default=1.0, ge=1.0, allow_inf_nan=False)
    # The scale-out switches reduce in the network (InfiniBand SHARP; NCCL's CollNet algorithms).
    in_network_reduction: bool = False
    # Ranks unlike the others (Proteus Sec. VI: devices that are not symmetric are simulated each on its own
    # timeline, compile/device_classes.py): rank -> the device it is (a heterogeneous pool: an older GPU in a
    # newer cluster) and rank -> its compute slow-down (a straggler: 1.25 = its compute takes 25% longer).
    # Ranks are numbered as the strategy places them (tp fastest, then cp, dp and pp); ranks past a job's GPUs
    # do not take part in it.
    rank_devices: dict[int, DeviceSpec] = Field(default_factory=dict)
    compute_slowdown: dict[int, float] = Field(default_factory=dict)
    # The block of the cluster's ranks a job runs on where it is one pipeline stage on a submesh of its own (Alpa,
    # Zheng et al. 2022, Sec. 5: a stage's devices are a contiguous block; compile/stage_meshes.py): (first rank,
    # ranks). Its groups are then laid out from their actual ranks (group_layout). None: the job's ranks are the
    # cluster's from rank 0.
    submesh: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        domain = self.nvlink_domain_gpus
        if domain is not None and domain % self.gpus_per_node:
            raise ValueError(f"nvlink_domain_gpus={domain} must be a multiple of gpus_per_node="
                             f"{self.gpus_per_node} (a domain holds whole servers)")
        for field, ranks in (("rank_devices", self.rank_devices), ("compute_slowdown", self.compute_slowdown)):
            for rank in ranks:
                if not 0 <= rank < MAX_GPUS:
                    raise ValueError(f"{field} rank {rank} must be 0 to {MAX_GPUS - 1}")
        for rank, factor in self.compute_slowdown.items():
            if not (math.isfinite(factor) and 0.0 < factor <= MAX_SLOWDOWN):
                raise ValueError(f"compute_slowdown[{rank}]={factor} must be finite, > 0 and at most {MAX_SLOWDOWN:g}")
        if self.submesh is not None:
            first, count = self.submesh
            if first < 0 or count <= 0 or first + count > self.num_gpus:
                raise ValueError(f"submesh {self.submesh} must be (first rank >= 0, ranks > 0) inside the cluster's "
                                 f"{self.num_gpus} GPUs")
        if self.num_gpus > MAX_GPUS:
            raise ValueError(f"gpus_per_node x num_nodes = {self.gpus_per_node} x {self.num_nodes} must be at most "
                             f"{MAX_GPUS}")
        return self

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def domain_capacity_gpus(self) -> int:
        """GPUs one NVLink domain holds (at least a server's)."""
        return max(self.nvlink_domain_gpus or self.gpus_per_node, self.gpus_per_node)

    @property
    def gpus_per_domain(self) -> int:
        """GPUs of this job in each NVLink domain it uses. The job takes the fewest domains that hold it and
        spreads its servers evenly over them when they divide (256 GPUs on NVL72 racks: 4 racks of 64, 16 of
        the 18 trays each); otherwise it fills domains in order and the last is partial (76 GPUs: 72 + 4)."""
        capacity = self.domain_capacity_gpus
        domains = math.ceil(self.num_gpus / capacity)
        even = self.num_gpus // domains
        if self.num_gpus % domains == 0 and even % self.gpus_per_node == 0:
            return even
        return capacity

    @property
    def num_domains(self) -> int:
        return math.ceil(self.num_gpus / self.gpus_per_domain)

    def with_num_gpus(self, num_gpus: int) -> "ClusterSpec":
        """Scale to num_gpus: whole servers of gpus_per_node (trays of an NVL72 rack), or one partial server
        when fewer GPUs are asked. The NVLink domains follow (gpus_per_domain)."""
        if num_gpus <= 0 or num_gpus > MAX_GPUS:
            raise ConfigError("num_gpus", num_gpus, f"must be a positive integer of at most {MAX_GPUS}")
        if num_gpus <= self.gpus_per_node:
            update: dict[str, object] = {"gpus_per_node": num_gpus, "num_nodes": 1}
            if self.nvlink_domain_gpus is not None and self.nvlink_domain_gpus % num_gpus:
                update["nvlink_domain_gpus"] = num_gpus  # one partial server: a domain of its own
            return self.model_copy(update=update)
        if num_gpus % self.gpus_per_node:
            raise ConfigError(
                "num_gpus", num_gpus,
                f"must be at most or a multiple of gpus_per_node={self.gpus_per_node} of cluster {self.name}",
            )
        return self.model_copy(update={"num_nodes": num_gpus // self.gpus_per_node})

    def on_one_node(self) -> "ClusterSpec":
        """All of the cluster's devices on one node (processes of one host, as `trainsim measure` runs them
        locally): the intra-node link joins every pair."""
        return self.model_copy(update={"gpus_per_node": self.num_gpus, "num_nodes": 1, "nvlink_domain_gpus": None})

    def group_layout(self, size: int, stride: int) -> GroupLayout:
        """Layout of a group of `size` ranks spaced `stride` apart (ranks are numbered server-major, servers
        domain-major: consecutive trays of a rack). On a submesh: the most spread of the block's groups of that
        shape (submesh_layout)."""
        if size <= 1:
            return GroupLayout(max(size, 1), 1, 1, 1, 1, 1)
        if self.submesh is not None:
            return self.submesh_layout(size, stride)
        gpus_per_node = self.gpus_per_node
        per_node = _per_block(gpus_per_node, size, stride)
        per_domain = per_node if self.nvlink_domain_gpus is None else _per_block(self.gpus_per_domain, size, stride)
        num_nodes = math.ceil(size / per_node)
        num_domains = math.ceil(size / per_domain)
        leaves = 1
        if num_domains > 1 and self.nodes_per_leaf is not None:
            span_nodes = math.ceil(((size - 1) * stride + 1) / gpus_per_node)
            leaves = math.ceil(span_nodes / self.nodes_per_leaf)
        return GroupLayout(size, per_node, num_nodes, per_domain, num_domains, leaves)

    def submesh_layout(self, size: int, stride: int) -> GroupLayout:
        """The groups of `size` ranks `stride` apart that tile the submesh's block (first rank f, n ranks: the
        groups starting at f + j + m x size x stride, j < stride), each laid out from its ranks (ranks_layout); the
        most spread of them (most domains, then leaves, then nodes; then the fewest ranks per domain and node): the
        stage's collective over that axis ends when its slowest group's does. A group longer than the block runs
        on past it (ranks past the cluster's count as further servers)."""
        assert self.submesh is not None
        first, count = self.submesh
        period = size * stride
        worst: GroupLayout | None = None
        for base in range(first, first + max(count, period), period):
            for lane in range(min(stride, count)):
                layout = self.ranks_layout(range(base + lane, base + lane + period, stride))
                if worst is None or _spread(layout) > _spread(worst):
                    worst = layout
        assert worst is not None
        return worst

    def ranks_layout(self, ranks: Sequence[int]) -> GroupLayout:
        """The layout of a group of these ranks: the servers, NVLink domains and leaves they span, and the fewest
        of its ranks on any server (domain) it spans. NB: a group spread unevenly (3 ranks over two servers, 2 and
        1) is taken at its narrowest server's share of the NICs, which bounds a ring through it."""
        size = len(ranks)
        if size <= 1:
            return GroupLayout(max(size, 1), 1, 1, 1, 1, 1)
        per_node: dict[int, int] = {}
        per_domain: dict[int, int] = {}
        node_gpus, domain_gpus = self.gpus_per_node, self.gpus_per_domain
        for rank in ranks:
            per_node[rank // node_gpus] = per_node.get(rank // node_gpus, 0) + 1
            per_domain[rank // domain_gpus] = per_domain.get(rank // domain_gpus, 0) + 1
        leaves = 1
        if len(per_domain) > 1 and self.nodes_per_leaf is not None:
            leaves = len({node // self.nodes_per_leaf for node in per_node})
        return GroupLayout(size, min(per_node.values()), len(per_node), min(per_domain.values()), len(per_domain),
                           leaves)

    @property
    def nic_bw_per_gpu_bytes_per_s(self) -> float:
        """Scale-out bandwidth a GPU gets when all GPUs of its server send at once (rail-optimized: each GPU
        drives its own NIC, or its share of one)."""
        return self.inter_node.bw_bytes_per_s * self.nics_per_node / self.gpus_per_node

    @property
    def fabric_key(self) -> tuple[object, ...]:
        """Everything of the topology a price reads beyond the device, links and shape (for cache keys)."""
        return (self.nvlink_domain_gpus, self.nodes_per_leaf, self.leaf_oversubscription, self.in_network_reduction,
                self.submesh)
