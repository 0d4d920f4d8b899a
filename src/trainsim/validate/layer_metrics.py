"""Per-layer metrics of a runs file (layer_fwd_ms, layer_bwd_ms; README of the calibration data, section 1:
"forward / backward time of one transformer layer"): one transformer block's forward or backward for one
micro-batch on one GPU, as the engines' pricer prices it inside the job: its ops and the exposed part of its
feature collectives (tensor and context parallel). A block under full recomputation repeats its forward in its
backward pass (and selective recomputation the part it recomputes), so a backward row counts that too."""

from trainsim.cost.pricing import Pricer
from trainsim.errors import TrainsimError
from trainsim.ir.graph import OpGraph
from trainsim.job import Job

LAYER_METRICS = ("layer_fwd_ms", "layer_bwd_ms")
_BLOCKS = ("block", "moe_block")


def layer_time_ms(metric: str, job: Job, graph: OpGraph, pricer: Pricer) -> float:
    """Milliseconds of one transformer block's forward (layer_fwd_ms) or backward (layer_bwd_ms)."""
    block = next((layer for layer in graph.layers if layer.kind in _BLOCKS), None)
    if block is None:
        raise TrainsimError(f"metric {metric}: the model has no transformer block")
    cost = pricer.layer_cost(block, job)
    forward_s = cost.fwd_s + cost.comm_fwd_s
    if metric == "layer_fwd_ms":
        return forward_s * 1e3
    backward_s = cost.bwd_s + sum(cost.comm_s.values()) - cost.comm_fwd_s
    recompute = job.parallel.recompute
    if recompute == "full":
        backward_s += forward_s
    elif recompute == "selective":
        backward_s += cost.selective_s
    return backward_s * 1e3
