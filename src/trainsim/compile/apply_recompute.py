"""Pass: activation recomputation before a layer's backward.

full: the layer's forward runs again, with its forward feature collectives (the analytical engine's
recompute = fwd_s + comm_fwd_s); embedding and head layers keep their activations and are not recomputed.
selective: the ops marked recompute_selective (the attention core) run again (Korthikanti et al. 2022).
Memory: the forward kept saved_bytes[mode]; the recompute allocates what it rebuilds (cost.memory.rebuilt_bytes:
the layer's full activations under full recompute, what the policy dropped under selective) when it starts,
and the backward releases both.
"""

from trainsim.compile.context import LayerTiming, StageWriter, Work
from trainsim.compile.insert_collectives import emit_feature_comm
from trainsim.cost.memory import rebuilt_bytes
from trainsim.strategy.lowered import LayerAssignment


def recompute_work(assignment: LayerAssignment, timing: LayerTiming) -> tuple[Work, ...]:
    if assignment.recompute == "full":
        return () if assignment.layer.kind in ("embedding", "head") else timing.fwd
    if assignment.recompute == "selective":
        return timing.selective
    return ()


def emit_recompute(w: StageWriter, assignment: LayerAssignment, timing: LayerTiming, *, layer: str,
                   micro_batch: int) -> float:
    """Emit the recompute tasks of one layer for one micro-batch; return the bytes they allocate."""
    works = recompute_work(assignment, timing)
    if not works:
        return 0.0
    alloc = rebuilt_bytes(assignment.layer, assignment.recompute, w.ctx.job.stack)
    for i, work in enumerate(works):
        w.chain(name=f"R{micro_batch} {layer} {work.name}", stream="compute", kind="compute",
                duration_s=work.seconds, phase="recompute", category="recompute", layer=layer,
                micro_batch=micro_batch, alloc_bytes=alloc if i == 0 else 0.0)
    if assignment.recompute == "full":
        for comm in timing.comms["fwd"]:
            emit_feature_comm(w, comm, layer=layer, micro_batch=micro_batch, category="recompute")
    return alloc
