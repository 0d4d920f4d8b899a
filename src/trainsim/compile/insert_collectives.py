"""Pass: the collectives a layer-phase needs, and the data-parallel gradient reduction.

Feature collectives (TP, SP, CP, EP) run on the feature stream inside the stage's chain: the next compute task
waits for them, as the analytical engine puts them on the critical path. At op level each sits after the last
op of its site (the attention or MLP block: Megatron's row-parallel all-reduce / reduce-scatter points), at
layer level after the layer's compute, one task per axis.

Gradient reduction (ZeRO 0-2) runs on the gradient stream in buckets of the stack's grad_bucket_params, filled
in the order the last micro-batch's backward finishes the layers (Megatron's and DDP's buckets): each bucket's
all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1-2) is issued when its last gradient is ready (the stack's
grad_reduce_overlap) or when the stage's work has ended. The distributed optimizer's parameter all-gather
follows its reduce-scatter on the gradient stream, or, with param_gather_overlap, runs at the start of the
iteration, bucket by bucket in forward order, each bucket's layers' first forward waiting for it
(insert_param_gathers; Megatron-Core's overlap_param_gather gathers for the next iteration's forward).
"""

from trainsim.compile.context import BuildContext, CommWork, StageWriter, TaskSpec
from trainsim.strategy.lowered import LayerAssignment

_CATEGORY = {"split": "comm"}  # reshard collectives of computation configs (compile.splits): general comm
MIN_PARAMS = 0.5  # under one parameter left of a sync group's share (float sums of split parts): none


def feature_comm_spec(ctx: BuildContext, stage: int, comm: CommWork, *, layer: str, category: str = "") -> TaskSpec:
    """A feature collective of one layer-phase, in the stage's chain on the feature stream."""
    return TaskSpec(f"{comm.name} mb", f" {layer}", "feature", "comm", comm.seconds, "comm",
                    category or _CATEGORY.get(comm.axis, f"{comm.axis}_comm"), layer,
                    resources=ctx.link_resources(ctx.layout(comm.axis), (stage,)))


def emit_feature_comm(w: StageWriter, comm: CommWork, *, layer: str, micro_batch: int, category: str = "") -> None:
    w.emit(feature_comm_spec(w.ctx, w.stage, comm, layer=layer, category=category), micro_batch)


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


def _gathers_overlap(ctx: BuildContext) -> bool:
    par = ctx.par
    return par.zero in (1, 2) and ctx.pricer.overlaps("param_gather_overlap", ctx.job)


def insert_gradient_sync(ctx: BuildContext, stage: int, grads: list[tuple[int, dict[int, float], str]],
                         end_tid: int = -1) -> list[int]:
    """grads: (tid of the task that finishes the layer's gradient, its parameters by the number of ranks that sum
    them, layer label) in the order the gradients become final; end_tid: the stage's last task (no bucket starts
    before it unless the stack overlaps the reduction). Returns the tids of the gradient tasks.

    Each sync group fills its own buckets (torch DDP's and the split executor's buckets hold parameters of one
    process group); a part that one rank alone holds (1 rank) is not communicated."""
    par = ctx.par
    if par.dp * par.cp == 1 or par.zero >= 3 or not grads:
        return []
    bucket_size = ctx.job.stack.grad_bucket_params
    # the whole group's buckets take every layer and close at the last (a part's: the last layer it has)
    last_position = {ranks: position for position, (_, by_ranks, _) in enumerate(grads)
                     for ranks, params in by_ranks.items() if params >= MIN_PARAMS}
    last_position[par.dp] = len(grads) - 1
    open_buckets: dict[int, tuple[float, str]] = {}  # ranks -> (parameters so far, first layer's label)
    out: list[int] = []
    buckets = 0
    for position, (tid, by_ranks, label) in enumerate(grads):
        for ranks, params in by_ranks.items():
            if params < MIN_PARAMS and ranks != par.dp:
                continue
            so_far, first_label = open_buckets.get(ranks, (0.0, ""))
            so_far, first_label = so_far + max(params, 0.0), first_label or label
            if so_far < bucket_size and position < last_position[ranks]:
                open_buckets[ranks] = (so_far, first_label)
                continue
            open_buckets.pop(ranks, None)
            if ranks > 1 or (ranks == par.dp and par.cp > 1):
                out += _sync_bucket(ctx, stage, f"bucket{buckets} {first_label}..{label}", so_far, ranks,
                                    (tid,) if _overlaps(ctx) or end_tid < 0 or end_tid == tid else (tid, end_tid))
                buckets += 1
    return out


def _overlaps(ctx: BuildContext) -> bool:
    return ctx.pricer.overlaps("grad_reduce_overlap", ctx.job)


def _sync_bucket(ctx: BuildContext, stage: int, name: str, params: float, ranks: int,
                 deps: tuple[int, ...]) -> list[int]:
    """One bucket's all-reduce (ZeRO 0), or reduce-scatter and all-gather (ZeRO 1-2), over `ranks` ranks."""
    policy = ctx.policy
    grad_bytes = params * policy.grad_bytes
    if ctx.par.zero == 0:
        steps = [("all-reduce", grad_bytes)]
    else:
        steps = [("reduce-scatter", grad_bytes)]
        if not _gathers_overlap(ctx):
            steps.append(("all-gather", params * policy.weight_bytes))
    layout = ctx.sync_layout(ranks)
    resources = ctx.link_resources(layout, (stage,))
    out: list[int] = []
    for collective, size in steps:
        added = ctx.add(name=f"dp {collective} {name}", device=stage, stream="gradient", kind="comm",
                        duration_s=ctx.pricer.collective_s(collective, size, layout, ctx.job), deps=deps,
                        phase="comm", category="dp_comm", resources=resources)
        deps = (added,)
        out.append(added)
    return out


def insert_param_gathers(ctx: BuildContext, stage: int, forward: list[LayerAssignment]) -> dict[int, int]:
    """The distributed optimizer's parameter all-gathers overlapped with the forward pass (ZeRO 1-2 with
    param_gather_overlap): buckets of grad_bucket_params in the order `forward` (the stage's forward layer
    instances, in schedule order) first uses the layers. Returns layer index -> its bucket's gather tid."""
    par = ctx.par
    if par.dp * par.cp == 1 or not _gathers_overlap(ctx):
        return {}
    seen: dict[int, LayerAssignment] = {}
    for assignment in forward:
        seen.setdefault(assignment.index, assignment)
    order = list(seen.values())
    resources = ctx.link_resources(ctx.layout("grad"), (stage,))
    bucket_size = ctx.job.stack.grad_bucket_params
    out: dict[int, int] = {}
    members: list[LayerAssignment] = []
    params = 0.0
    for position, assignment in enumerate(order):
        members.append(assignment)
        params += assignment.layer.param_count
        if params < bucket_size and position < len(order) - 1:
            continue
        seconds = ctx.collective_s("all-gather", params * ctx.policy.weight_bytes, "grad")
        tid = ctx.add(name=f"dp all-gather params {members[0].layer.name}..{assignment.layer.name}",
                       device=stage, stream="gradient", kind="comm", duration_s=seconds, phase="comm",
                       category="dp_comm", resources=resources)
        out.update({member.index: tid for member in members})
        members, params = [], 0.0
    return out
