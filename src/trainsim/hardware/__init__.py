"""Devices, links and clusters: where a job runs."""

from trainsim.hardware.cluster import ClusterSpec, LinkSpec
from trainsim.hardware.device import DeviceSpec

__all__ = ["ClusterSpec", "DeviceSpec", "LinkSpec"]
