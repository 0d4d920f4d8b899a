"""Pass: activation recomputation before a layer's backward.

full: the layer's forward runs again, with its forward feature collectives (the analytical engine's
recompute = fwd_s + comm_fwd_s); embedding and head layers keep their activations and are not recomputed.
selective: the ops marked recompute_selective (the attention core) run again (Korthikanti et al. 2022).
Memory: the forward kept saved_bytes[mode]; the recompute allocates what it rebuilds (cost.memory.rebuilt_bytes:
the layer's full activations under full recompute, what the policy dropped under selective) when it starts,
and the backward releases both.
"""

from trainsim.compile.context import BuildContext, LayerTiming, TaskSpec, Work
from trainsim.compile.insert_collectives import feature_comm_spec
from trainsim.cost.memory import rebuilt_bytes
from trainsim.strategy.lowered import LayerAssignment


def recompute_work(assignment: LayerAssignment, timing: LayerTiming) -> tuple[Work, ...]:
    if assignment.recompute == "full":
        return () if assignment.layer.kind in ("embedding", "head") else timing.fwd
    if assignment.recompute == "selective":
        return timing.selective
    return ()


def recompute_specs(ctx: BuildContext, stage: int, assignment: LayerAssignment, timing: LayerTiming, *,
                    layer: str) -> list[TaskSpec]:
    """The recompute tasks of one layer (for any micro-batch); the first allocates what they rebuild."""
    works = recompute_work(assignment, timing)
    if not works:
        return []
    alloc = rebuilt_bytes(assignment.layer, assignment.recompute, ctx.job.stack)
    specs = [TaskSpec("R", f" {layer} {work.name}", "compute", "compute", work.seconds, "recompute", "recompute",
                      layer, alloc_bytes=alloc if i == 0 else 0.0) for i, work in enumerate(works)]
    if assignment.recompute == "full":
        specs += [feature_comm_spec(ctx, stage, comm, layer=layer, category="recompute")
                  for comm in timing.comms["fwd"]]
    return specs
