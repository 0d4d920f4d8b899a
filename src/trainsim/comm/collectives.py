"""Alpha-beta collective times over a cluster's topology (ring algorithms, hierarchical across nodes).

Per Thakur et al. 2005 / NCCL's bus-bandwidth convention, for n ranks and a buffer of S bytes:
all-reduce moves 2(n-1)/n * S per rank, all-gather and reduce-scatter (n-1)/n * S (S = the full buffer),
all-to-all (n-1)/n * S, send-recv S. Across nodes the all-reduce is hierarchical: reduce-scatter inside the
node, all-reduce of the 1/l shard across nodes over the NICs, all-gather inside the node.
"""

from typing import Protocol

from trainsim.catalog.calibration import Calibration
from trainsim.hardware.cluster import ClusterSpec, GroupLayout

_TRAFFIC_FACTOR = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0}


def _ring_s(collective: str, buffer_bytes: float, ranks: int, bw_bytes_per_s: float, latency_s: float) -> float:
    if ranks <= 1 or buffer_bytes <= 0:
        return 0.0
    factor = _TRAFFIC_FACTOR[collective]
    steps = factor * (ranks - 1)
    return steps * latency_s + factor * (ranks - 1) / ranks * buffer_bytes / bw_bytes_per_s


def collective_time_s(collective: str, buffer_bytes: float, layout: GroupLayout, cluster: ClusterSpec,
                      cal: Calibration) -> float:
    """Time of one collective on a group laid out as `layout` (all groups of that axis run at once)."""
    if layout.size <= 1 or buffer_bytes <= 0:
        return 0.0
    params = cal.comm_params(collective, cluster.device.name)
    intra_bw = cluster.intra_node.bw_bytes_per_s * params.bw_efficiency
    inter_bw = cluster.nic_bw_per_gpu_bytes_per_s * params.bw_efficiency
    intra_lat = cluster.intra_node.latency_s + params.latency_s
    inter_lat = cluster.inter_node.latency_s + params.latency_s
    local, nodes = layout.ranks_per_node, layout.num_nodes
    if collective == "send-recv":
        bw, lat = (intra_bw, intra_lat) if nodes == 1 else (inter_bw, inter_lat)
        return lat + buffer_bytes / bw
    if nodes == 1:
        return _ring_s(collective, buffer_bytes, local, intra_bw, intra_lat)
    if collective == "all-reduce":
        inside = 2.0 * _ring_s("reduce-scatter", buffer_bytes, local, intra_bw, intra_lat)
        return inside + _ring_s("all-reduce", buffer_bytes / local, nodes, inter_bw, inter_lat)
    if collective == "all-to-all":
        # NB: (n - l)/n of the data crosses nodes; the node-local part overlaps with it.
        cross = (layout.size - local) / layout.size * buffer_bytes / inter_bw
        return max(cross, _ring_s(collective, buffer_bytes * local / layout.size, local, intra_bw, intra_lat)) \
            + (layout.size - 1) * inter_lat
    # Hierarchical all-gather (reduce-scatter mirrors it): GPUs of the same local rank gather across nodes the
    # S/l slice their node will hold, then each node gathers the full buffer over its fabric.
    cross = _ring_s(collective, buffer_bytes / local, nodes, inter_bw, inter_lat)
    return cross + _ring_s(collective, buffer_bytes, local, intra_bw, intra_lat)


class CommCostModel(Protocol):
    """Seconds of one collective on a group laid out as `layout`. The alpha-beta model below is the default; a
    profile database of measured collectives stands in where it has them (cost/profiled.py)."""

    name: str

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout,
                          cluster: ClusterSpec) -> float: ...


class AlphaBetaComm:
    """collective_time_s with the calibration's fitted latency and bandwidth efficiency, as a CommCostModel."""

    name = "alpha-beta"

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout,
                          cluster: ClusterSpec) -> float:
        return collective_time_s(collective, buffer_bytes, layout, cluster, self.cal)
