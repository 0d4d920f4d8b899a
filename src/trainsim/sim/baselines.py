"""The runtime-behaviour switches of the simulator for the Proteus experiments (Sec. VIII-C, VIII-D).

- "proteus": the overlap slow-down (gamma, measured per device and model family) and bandwidth sharing on;
- "plain": both off (Fig. 9's "Plain": Proteus without its runtime behaviour detector);
- "flexflow": FlexFlow-Sim as Proteus re-implemented it (Sec. VIII-C): the same task graph with the resharding
  collectives inserted and the same profiled op costs, no runtime behaviours, and collectives priced from the
  link's bandwidth alone (FlexFlow, Jia et al. 2019, Sec. 5.1: a transfer takes its size over the connection's
  bandwidth; no measured collective curves, no latency, no topology below the link).

The switch picks the SimEstimator's overlap and sharing flags and, for "flexflow", the Pricer's collective model
(flexflow_pricer) and no in-flight limit; everything else is the one simulator. The engines "sim-plain" and
"flexflow-sim" of the registry (estimate/baselines.py) are these switches.
"""

from dataclasses import dataclass
from typing import Literal

from trainsim.cost.pricing import Pricer
from trainsim.hardware.cluster import ClusterSpec, GroupLayout

Behaviours = Literal["proteus", "plain", "flexflow"]
BEHAVIOURS: tuple[Behaviours, ...] = ("proteus", "plain", "flexflow")
# (overlap slow-down, bandwidth sharing) of each switch
RUNTIME_FLAGS: dict[Behaviours, tuple[bool, bool]] = {"proteus": (True, True), "plain": (False, False),
                                                       "flexflow": (False, False)}


@dataclass(slots=True)  # NB: not frozen: CommCostModel's name is a plain attribute
class BandwidthOnlyComm:
    """A CommCostModel pricing a collective as the bytes each rank sends over the group's link bandwidth: the
    ring's 2 (n - 1) / n of the buffer for all-reduce, (n - 1) / n for all-gather, reduce-scatter and all-to-all,
    the message for send-recv; the inter-node link when the group spans nodes, else the intra-node link."""

    name: str = "bandwidth-only"

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout,
                          cluster: ClusterSpec) -> float:
        n = layout.size
        if n <= 1 or buffer_bytes <= 0.0:
            return 0.0
        link = cluster.inter_node if layout.num_nodes > 1 and cluster.inter_node is not None else cluster.intra_node
        factor = {"all-reduce": 2.0 * (n - 1) / n, "send-recv": 1.0}.get(collective, (n - 1) / n)
        return factor * buffer_bytes / link.bw_bytes_per_s


def flexflow_pricer(pricer: Pricer) -> Pricer:
    """`pricer`'s op and step costs with FlexFlow's collectives (BandwidthOnlyComm)."""
    return Pricer(pricer.cal, op_costs=pricer.op_costs, step_costs=pricer.step_costs, comm_costs=BandwidthOnlyComm())
