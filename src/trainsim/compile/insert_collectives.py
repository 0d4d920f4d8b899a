"""Pass: the collectives a layer-phase needs, and the data-parallel gradient reduction.

Feature collectives (TP, SP, CP, EP) run on the feature stream inside the stage's chain: the next compute task
waits for them, as the analytical engine puts them on the critical path. At op level each sits after the last
op of its site (the attention or MLP block: Megatron's row-parallel all-reduce / reduce-scatter points), at
layer level after the layer's compute, one task per axis.

Gradient reduction (ZeRO 0-2) runs on the gradient stream in buckets of analytical.BUCKET_BYTES, filled in the
order the last micro-batch's backward finishes the layers (Megatron-LM's DDP buckets): each bucket's
all-reduce (ZeRO 0), or reduce-scatter then parameter all-gather (ZeRO 1-2, the distributed optimizer), is
issued when the backward pass has produced its last gradient and the overlap window is open (build.py).
NB: the distributed optimizer gathers the updated parameters after its step, overlapped with the next
iteration's forward (Megatron-LM's overlap_param_gather); here each bucket's gather follows its
reduce-scatter on the gradient stream, which costs the same stream time, as the analytical engine counts it.
"""

from trainsim.compile.context import BuildContext, CommWork, StageWriter
from trainsim.cost.pricing import BUCKET_BYTES

_CATEGORY = {"split": "comm"}  # reshard collectives of computation configs (compile.splits): general comm


def emit_feature_comm(w: StageWriter, comm: CommWork, *, layer: str, micro_batch: int, category: str = "") -> None:
    ctx = w.ctx
    w.chain(name=f"{comm.name} mb{micro_batch} {layer}", stream="feature", kind="comm", duration_s=comm.seconds,
            phase="comm", category=category or _CATEGORY.get(comm.axis, f"{comm.axis}_comm"), layer=layer,
            micro_batch=micro_batch,
            resources=ctx.link_resources(ctx.layout(comm.axis), (w.stage,)))


def placements(sites: list[str], comms: tuple[CommWork, ...]) -> list[list[CommWork]]:
    """comms to run after each work item: a collective follows the last work of its site, or the last work."""
    after: list[list[CommWork]] = [[] for _ in sites]
    if not sites:
        return after
    for comm in comms:
        index = len(sites) - 1
        if comm.site:
            for i in range(len(sites) - 1, -1, -1):
                if sites[i] == comm.site:
                    index = i
                    break
        after[index].append(comm)
    return after


def insert_gradient_sync(ctx: BuildContext, stage: int, grads: list[tuple[int, float, str]],
                         window_tid: int = -1) -> list[int]:
    """grads: (tid of the task that finishes the layer's gradient, parameters, layer label) in the order the
    gradients become final; window_tid: no bucket starts before this task ends (the overlap window opens).
    Returns the tids of the gradient tasks."""
    par = ctx.par
    if par.dp * par.cp == 1 or par.zero >= 3 or not grads:
        return []
    policy = ctx.policy
    resources = ctx.link_resources(ctx.layout("grad"), (stage,))
    out: list[int] = []
    bucket_params = 0.0
    first_label = ""
    for position, (tid, params, label) in enumerate(grads):
        first_label = first_label or label
        bucket_params += params
        if bucket_params * policy.grad_bytes < BUCKET_BYTES and position < len(grads) - 1:
            continue
        name = f"bucket{len(out) if par.zero == 0 else len(out) // 2} {first_label}..{label}"
        grad_bytes = bucket_params * policy.grad_bytes
        if par.zero == 0:
            steps = [("all-reduce", grad_bytes)]
        else:
            steps = [("reduce-scatter", grad_bytes), ("all-gather", bucket_params * policy.weight_bytes)]
        deps = (tid, window_tid) if window_tid >= 0 and window_tid != tid else (tid,)
        for collective, size in steps:
            task = ctx.add(name=f"dp {collective} {name}", device=stage, stream="gradient", kind="comm",
                           duration_s=ctx.collective_s(collective, size, "grad"), deps=deps, phase="comm",
                           category="dp_comm", resources=resources)
            deps = (task.tid,)
            out.append(task.tid)
        bucket_params, first_label = 0.0, ""
    return out
