"""Clusters as a two-level topology: GPUs in a node on one fabric, nodes joined by NICs."""

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainsim.errors import ConfigError
from trainsim.hardware.device import DeviceSpec
from trainsim.specbase import Spec
from trainsim.units import parse_bandwidth, parse_duration

# The most GPUs a cluster holds: 2**24 (16.7 million) is 16 times the largest job trainsim is checked on (10^6
# GPUs); a count beyond it is a typo, and every per-GPU figure stays a plain float far from overflow.
MAX_GPUS = 2**24

LinkKind = Literal["nvlink", "nvswitch", "pcie", "infiniband", "roce", "ethernet", "nvlink-bridge"]


class LinkSpec(Spec):
    """A link family. bw_bytes_per_s is per direction per endpoint (per GPU inside a node, per NIC across)."""

    name: str
    kind: LinkKind
    description: str = ""
    bw_bytes_per_s: float = Field(gt=0)
    latency_s: float = Field(ge=0)

    @field_validator("bw_bytes_per_s", mode="before")
    @classmethod
    def _parse_bw(cls, value: object) -> object:
        return parse_bandwidth(value, "bw_bytes_per_s") if isinstance(value, str) else value

    @field_validator("latency_s", mode="before")
    @classmethod
    def _parse_latency(cls, value: object) -> object:
        return parse_duration(value, "latency_s") if isinstance(value, str) else value


class GroupLayout(Spec):
    """Where the ranks of one communication group sit: ranks_per_node on each of num_nodes nodes."""

    size: int
    ranks_per_node: int
    num_nodes: int


class ClusterSpec(Spec):
    name: str
    description: str = ""
    device: DeviceSpec
    gpus_per_node: int = Field(gt=0)
    num_nodes: int = Field(default=1, gt=0)
    intra_node: LinkSpec
    inter_node: LinkSpec
    nics_per_node: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        if self.num_gpus > MAX_GPUS:
            raise ValueError(f"gpus_per_node x num_nodes = {self.gpus_per_node} x {self.num_nodes} must be at most "
                             f"{MAX_GPUS}")
        if self.num_nodes > 1 and self.nics_per_node < 1:
            raise ValueError("a multi-node cluster needs nics_per_node >= 1")
        return self

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def with_num_gpus(self, num_gpus: int) -> "ClusterSpec":
        """Scale to num_gpus: whole nodes of gpus_per_node, or one partial node when fewer GPUs are asked."""
        if num_gpus <= 0 or num_gpus > MAX_GPUS:
            raise ConfigError("num_gpus", num_gpus, f"must be a positive integer of at most {MAX_GPUS}")
        if num_gpus <= self.gpus_per_node:
            return self.model_copy(update={"gpus_per_node": num_gpus, "num_nodes": 1})
        if num_gpus % self.gpus_per_node:
            raise ConfigError(
                "num_gpus", num_gpus,
                f"must be at most or a multiple of gpus_per_node={self.gpus_per_node} of cluster {self.name}",
            )
        return self.model_copy(update={"num_nodes": num_gpus // self.gpus_per_node})

    def on_one_node(self) -> "ClusterSpec":
        """All of the cluster's devices on one node (processes of one host, as `trainsim measure` runs them
        locally): the intra-node link joins every pair."""
        return self.model_copy(update={"gpus_per_node": self.num_gpus, "num_nodes": 1})

    def group_layout(self, size: int, stride: int) -> GroupLayout:
        """Layout of a group of `size` ranks spaced `stride` apart (ranks are numbered node-major)."""
        if size <= 1:
            return GroupLayout(size=max(size, 1), ranks_per_node=1, num_nodes=1)
        per_node = max(1, self.gpus_per_node // stride) if stride < self.gpus_per_node else 1
        per_node = min(per_node, size)
        return GroupLayout(size=size, ranks_per_node=per_node, num_nodes=math.ceil(size / per_node))

    @property
    def nic_bw_per_gpu_bytes_per_s(self) -> float:
        """Inter-node bandwidth a GPU gets when all GPUs of its node send at once."""
        return self.inter_node.bw_bytes_per_s * self.nics_per_node / self.gpus_per_node
