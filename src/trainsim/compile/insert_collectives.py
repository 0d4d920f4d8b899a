"""Pass: the collectives a layer-phase needs, and the data-parallel gradient reduction.

Feature collectives (TP, SP, CP, EP) run on the feature stream inside the stage's chain: the next compute task
waits for them, as the analytical engine puts them on the critical path. At op level each sits after the last
op of its site (the attention or MLP block: Megatron's row-parallel all-reduce / reduce-scatter points), at
layer level after the layer's compute, one task per axis.

Gradient reduction (ZeRO 0-2) runs on the gradient stream in buckets of the stack's grad_bucket_params, filled
in the order the last micro-batch's backward finishes the layers (Megatron's and DDP's buckets): each bucket's
all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1-2) is issued when its last gradient is ready (the stack's
grad_reduce_overlap) or when the stage's work has ended. The distributed optimizer's parameter all-gathers
follow the optimizer step, bucket by bucket (insert_gathers_after_step), or, with param_gather_overlap, run at
the start of the iteration, bucket by bucket in forward order, each bucket's layers' first forward waiting for
it (insert_param_gathers; Megatron-Core's overlap_param_gather gathers for the next iteration's forward).
"""

from trainsim.compile.context import BuildContext, CommWork, StageWriter, SyncGroup, TaskSpec, sync_size
from trainsim.strategy.lowered import LayerAssignment

_CATEGORY = {"split": "comm"}  # reshard collectives of computation configs (compile.splits): general comm
MIN_PARAMS = 0.5  # under one parameter left of a sync group's share (float sums of split parts): none


def feature_comm_spec(ctx: BuildContext, stage: int, comm: CommWork, *, layer: str, category: str = "") -> TaskSpec:
    """A feature collective of one layer-phase, in the stage's chain on the feature stream, on the links of the
    ranks it spans (its sub-group's where it spans one: a rank pair's inside a node crosses no NIC)."""
    return TaskSpec(f"{comm.name} mb", f" {layer}", "feature", "comm", comm.seconds, "comm",
                    category or _CATEGORY.get(comm.axis, f"{comm.axis}_comm"), layer,
                    resources=ctx.link_resources(ctx.comm_layout(comm.axis, comm.ranks), (stage,)))


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


Grads = list[tuple[int, dict[SyncGroup, float], str]]  # (tid finishing a layer's gradient, params by the ranks
# that sum them, label)
Bucket = tuple[int, float, SyncGroup, str]  # (tid of its last gradient, its parameters, its ranks, its name)


def _group_buckets(grads: Grads, bucket_params: float, par_dp: int) -> list[Bucket]:
    """The gradient buckets as the stack sends them: each sync group (the number of ranks that sum a part) fills
    its own buckets of bucket_params, whole layers, in the order the gradients become final; a bucket is sent
    once it holds that many or at its group's last layer (the whole group's: the stage's last layer). Per
    bucket: the tid of its last gradient, its parameters, its ranks and its name."""
    last_position = {ranks: position for position, (_, by_ranks, _) in enumerate(grads)
                     for ranks, params in by_ranks.items() if params >= MIN_PARAMS}
    last_position[par_dp] = len(grads) - 1
    open_buckets: dict[SyncGroup, tuple[float, str]] = {}  # ranks -> (parameters so far, first layer's label)
    out: list[Bucket] = []
    for position, (tid, by_ranks, label) in enumerate(grads):
        for ranks, params in by_ranks.items():
            if params < MIN_PARAMS and ranks != par_dp:
                continue
            so_far, first_label = open_buckets.get(ranks, (0.0, ""))
            so_far, first_label = so_far + max(params, 0.0), first_label or label
            if so_far < bucket_params and position < last_position[ranks]:
                open_buckets[ranks] = (so_far, first_label)
                continue
            open_buckets.pop(ranks, None)
            out.append((tid, so_far, ranks, f"{first_label}..{label}"))
    return out


def _synced_buckets(ctx: BuildContext, grads: Grads) -> list[Bucket]:
    """_group_buckets that ranks communicate: a part that one rank alone holds is not sent (unless context
    parallelism sums it), numbered in sending order."""
    par = ctx.par
    kept = [(tid, params, ranks, label) for tid, params, ranks, label
            in _group_buckets(grads, ctx.job.stack.grad_bucket_params, par.dp)
            if sync_size(ranks) > 1 or (ranks == par.dp and par.cp > 1)]
    return [(tid, params, ranks, f"bucket{number} {label}") for number, (tid, params, ranks, label)
            in enumerate(kept)]


def insert_gradient_sync(ctx: BuildContext, stage: int, grads: Grads, end_tid: int = -1) -> list[int]:
    """grads: (tid of the task that finishes the layer's gradient, its parameters by the number of ranks that sum
    them, layer label) in the order the gradients become final; end_tid: the stage's last task (no bucket starts
    before it unless the stack overlaps the reduction). Returns the tids of the gradient tasks.

    Each sync group fills its own buckets (torch DDP's and the split executor's buckets hold parameters of one
    process group); a part that one rank alone holds (1 rank) is not communicated."""
    par = ctx.par
    if (par.dp * par.cp == 1 and not ctx.tp_token_params) or par.zero >= 3 or not grads:
        return []
    out: list[int] = []
    for tid, params, ranks, name in _synced_buckets(ctx, grads):
        deps = (tid,) if _overlaps(ctx) or end_tid < 0 or end_tid == tid else (tid, end_tid)
        collective = "all-reduce" if par.zero == 0 else "reduce-scatter"
        out.append(_sync_collective(ctx, stage, collective, name, params * ctx.policy.grad_bytes, ranks, deps))
    return out


def insert_gathers_after_step(ctx: BuildContext, stage: int, grads: Grads, step_tid: int) -> list[int]:
    """The distributed optimizer's parameter all-gathers where they do not overlap the forward pass (ZeRO 1-2
    without param_gather_overlap): after the optimizer step (step_tid) has updated the shards, one per gradient
    bucket (the reduce-scatters' buckets, over the same ranks), on the gradient stream. Megatron-Core's
    DistributedOptimizer gathers the updated parameters after the step (megatron/core/optimizer/
    distrib_optimizer.py, megatron-core 0.9.0: step_with_ready_grads calls start_param_sync unless
    overlap_param_gather) and DeepSpeed ZeRO 1-2 too (deepspeed/runtime/zero/stage_1_and_2.py, 0.12.6: step()
    ends with all_gather_dp_groups). Returns their tids."""
    par = ctx.par
    if (par.dp * par.cp == 1 and not ctx.tp_token_params) or par.zero not in (1, 2) or _gathers_overlap(ctx) \
            or not grads:
        return []
    out: list[int] = []
    deps = (step_tid,)
    for _, params, ranks, name in _synced_buckets(ctx, grads):
        deps = (_sync_collective(ctx, stage, "all-gather", name, params * ctx.policy.weight_bytes, ranks, deps),)
        out.append(deps[0])
    return out


def _overlaps(ctx: BuildContext) -> bool:
    return ctx.pricer.overlaps("grad_reduce_overlap", ctx.job)


def _sync_collective(ctx: BuildContext, stage: int, collective: str, name: str, size_bytes: float,
                     ranks: SyncGroup, deps: tuple[int, ...]) -> int:
    """One bucket's collective over the `ranks` ranks that hold its parameters (BuildContext.sync_layout)."""
    layout = ctx.sync_layout(ranks)
    return ctx.add(name=f"dp {collective} {name}", device=stage, stream="gradient", kind="comm",
                   duration_s=ctx.pricer.collective_s(collective, size_bytes, layout, ctx.job), deps=deps,
                   phase="comm", category="dp_comm", resources=ctx.link_resources(layout, (stage,)))


def insert_param_gathers(ctx: BuildContext, stage: int, forward: list[LayerAssignment]) -> dict[int, int]:
    """The distributed optimizer's parameter all-gathers overlapped with the forward pass (ZeRO 1-2 with
    param_gather_overlap): buckets of grad_bucket_params in the order `forward` (the stage's forward layer
    instances, in schedule order) first uses the layers, each sync group its own (an MoE's experts over their
    expert data-parallel ranks: BuildContext.expert_grads; Megatron-Core's expert parameter buffers). Returns
    layer index -> the gather tid its first forward waits for (its last bucket's: one stream runs them in order)."""
    par = ctx.par
    if par.dp * par.cp == 1 or not _gathers_overlap(ctx):
        return {}
    seen: dict[int, LayerAssignment] = {}
    for assignment in forward:
        seen.setdefault(assignment.index, assignment)
    order = list(seen.values())
    parts = [_gather_parts(ctx, a) for a in order]
    last = {group: position for position, by_group in enumerate(parts) for group in by_group}
    bucket_size = ctx.job.stack.grad_bucket_params
    out: dict[int, int] = {}
    open_buckets: dict[SyncGroup, tuple[list[LayerAssignment], float]] = {}
    for position, (assignment, by_group) in enumerate(zip(order, parts, strict=True)):
        for group, count in by_group.items():
            members, params = open_buckets.pop(group, ([], 0.0))
            members, params = [*members, assignment], params + count
            if params < bucket_size and position < last[group]:
                open_buckets[group] = (members, params)
                continue
            layout = ctx.sync_layout(group)
            seconds = ctx.pricer.collective_s("all-gather", params * ctx.policy.weight_bytes, layout, ctx.job)
            tid = ctx.add(name=f"dp all-gather params {members[0].layer.name}..{assignment.layer.name}",
                          device=stage, stream="gradient", kind="comm", duration_s=seconds, phase="comm",
                          category="dp_comm", resources=ctx.link_resources(layout, (stage,)))
            out.update({member.index: max(tid, out.get(member.index, tid)) for member in members})
    return out


def _gather_parts(ctx: BuildContext, assignment: LayerAssignment) -> dict[SyncGroup, float]:
    """A layer's parameters by the group that gathers them: the data-parallel group's (dp) and its MoE experts'
    over their expert data-parallel ranks (BuildContext.expert_grads) where more than one rank holds them."""
    params = assignment.layer.param_count
    experts = ctx.expert_grads.get(assignment.index)
    if experts is None:
        return {ctx.par.dp: params}
    own = {experts[1]: experts[0]} if experts[1].size > 1 else {}  # one rank alone holds them: no gather
    return {ctx.par.dp: params - experts[0], **own}
