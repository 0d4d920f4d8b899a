"""NCCL's tuner constants per algorithm and protocol (LL, LL128, Simple), as facts about NCCL 2.29.7.

Every figure is from src/graph/tuning.cc of NCCL 2.29.7 (ncclTunerConstantsDefaults, ncclTopoTuneModel and
ncclTopoGetAlgoTime); tuples are indexed by protocol in PROTOCOLS' order. NCCL keeps latencies in microseconds
and bandwidths in GB/s; here seconds and bytes per second.

The three protocols trade latency for bandwidth (NCCL's docs, "NCCL_PROTO"): LL sends 8-byte flag+data words
(half the bandwidth, the least latency), LL128 128-byte lines with 8 bytes of flags (120/128 of the bandwidth,
needs NVLink), Simple large chunks behind memory fences (full bandwidth, the most latency per step).
"""

LL, LL128, SIMPLE = 0, 1, 2
PROTOCOLS = ("LL", "LL128", "Simple")
_US = 1e-6

# ncclTunerConstantsDefaults.baseLatencies[algorithm][protocol]: the start-up of one call.
RING_BASE_LATENCY_S = (6.6 * _US, 14.0 * _US, 8.4 * _US)
TREE_BASE_LATENCY_S = (6.8 * _US, 14.0 * _US, 8.4 * _US)
PAT_BASE_LATENCY_S = 8.0 * _US  # PAT runs Simple only (ncclTopoTuneModel skips its other protocols)

# ncclTunerConstantsDefaults.hwLatencies[hardware][algorithm][protocol]: the latency of one step, by the hardware
# the step crosses (NVLink, PCI inside a server; NET across servers).
NVLINK_RING_STEP_S = (0.6 * _US, 1.9 * _US, 3.4 * _US)
NVLINK_TREE_STEP_S = (0.6 * _US, 1.25 * _US, 4.0 * _US)
PCI_RING_STEP_S = (1.0 * _US, 2.5 * _US, 5.7 * _US)
PCI_TREE_STEP_S = (1.0 * _US, 1.9 * _US, 4.0 * _US)
NET_RING_STEP_S = (2.7 * _US, 4.0 * _US, 14.0 * _US)
NET_TREE_STEP_S = (5.0 * _US, 8.5 * _US, 14.0 * _US)
NVLINK_COLLNET_DIRECT_STEP_S = 3.7 * _US  # Simple only
NET_COLLNET_DIRECT_STEP_S = 31.0 * _US  # Simple only
NVLS_LATENCY_S = 25.0 * _US  # hwLatencies[NVLINK][NVLS][Simple]; NVLS has no base latency (it is overwritten)

# ncclTopoTuneModel's protocol bandwidths from the algorithm's bus bandwidth B:
#   ring LL: min(llMaxBw, B / 2); ring LL128: 0.92 B (NCCL's comment: 120/128); ring Simple: B
#   tree all-reduce: 0.92 B, then LL: / 3.8 (at most llMaxBw), LL128: x 120/128 across servers (7/9 inside one)
RING_LL_BW_FACTOR = 0.5
RING_LL128_BW_FACTOR = 0.92
TREE_BW_FACTOR = 0.92
TREE_LL_DIVISOR = 3.8
TREE_LL128_MULTI_NODE_FACTOR = 120.0 / 128.0
# NB: NCCL also caps LL128 and tree at nChannels x a per-channel figure (perChMaxRingLL128Bws, perChMaxTreeBws);
# channels are not modelled here, so those caps are left out (inside a server they exceed the NVLink's share).

# ncclTunerConstantsDefaults.llMaxBws, GB/s: the LL bus bandwidth cap. Inside one server by GPU generation
# (compCapIndex: Volta, Ampere, Hopper, Blackwell); across servers by CPU (row 0: Intel and any non-AMD CPU),
# 2 servers or more than 2 (index2).
LL_MAX_BW_ONE_NODE_BYTES_PER_S = {"volta": 39.0e9, "ampere": 87.7e9, "hopper": 141.0e9, "blackwell": 282.0e9}
LL_MAX_BW_TWO_NODES_BYTES_PER_S = 39.0e9
LL_MAX_BW_MORE_NODES_BYTES_PER_S = 20.4e9

# ncclTopoGetAlgoTime's treeCorrectionFactor[protocol][log2(bytes / 64)]: tree all-reduce bandwidth by size
# (buffers of 64 B up to 256 MiB; none outside: NCCL's 24th entry is never read).
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
COLLNET_PER_RANK_LATENCY_S = 0.4 * _US  # CollNetDirect's arity serialization, per local rank


def tree_correction(protocol: int, size_bytes: float) -> float:
    """ncclTopoGetAlgoTime's tree all-reduce bandwidth factor for a buffer of size_bytes (1 outside its table)."""
    log_size = (int(size_bytes) >> 6).bit_length() - 1
    return TREE_CORRECTION[protocol][log_size] if 0 <= log_size < len(TREE_CORRECTION[protocol]) else 1.0


def ll_max_bw_bytes_per_s(generation: str, num_domains: int) -> float:
    """The LL cap (llMaxBws) for a group over num_domains NVLink domains (NCCL's nNodes); inside one domain of a
    GPU generation NCCL has no row for, no cap."""
    if num_domains == 1:
        return LL_MAX_BW_ONE_NODE_BYTES_PER_S.get(generation, float("inf"))
    return LL_MAX_BW_TWO_NODES_BYTES_PER_S if num_domains == 2 else LL_MAX_BW_MORE_NODES_BYTES_PER_S
