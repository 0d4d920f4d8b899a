"""compile_job: Job + LoweredPlan -> ExecGraph, the input of the event simulator (Proteus sec. V).

One simulated device per pipeline stage stands for its dp x tp x cp ranks; collectives are priced over the
real group layouts (analytical.axis_layout), so the graph's size does not grow with dp or tp. Per stage, in
the schedule's order (schedules.py), each step (F, B or W of one micro-batch on one model chunk) becomes its
layers' layer-phases: compute on the compute stream and the feature collectives that block it on the feature
stream, in one dependency chain per stage (the critical path the analytical engine adds up). The passes:

- shape_layers: a block whose attention, MLP or experts the plan splits over fewer tp ranks than tp (or leaves
  unsplit) rebuilt with those ops at their degree; an MoE's experts sum their gradient (and shard their ZeRO
  states) over their expert data-parallel ranks where those are not the data-parallel group
  (expert_grad_groups);
- schedule_pipeline: step order per stage, send/recv between virtual stages (pp_comm);
- lower_layers: layer-phases (one task per layer, or per op at task_level="op") with their memory;
- apply_recompute: recompute before the backward (full or selective);
- insert_collectives: TP/CP/EP feature collectives per layer-phase (derived from the plan's computation configs
  over tp, cp and ep: splits.plan_mesh_comms, strategy.megatron); DP gradient buckets (dp_comm);
- apply_zero: resident model states per stage; ZeRO-3 gathers and reduce-scatters with prefetch windows;
- links (after device classes): the cluster's shared links (NICs, leaf up-links, a PCIe bus) in place of each
  device's, so every transfer crossing one shares it;
- here: per micro-batch host and pipeline overheads, the distributed optimizer's parameter gathers and the
  step's end: a barrier over all stages (the gradient-norm all-reduce), the optimizer step (analytical
  optimizer_step_s of the stage's parameters), the parameter gathers that do not overlap the forward pass
  (insert_gathers_after_step) and the iteration overhead.

What overlaps is the job's stack (strategy/stack.py), as the analytical engine reads it: gradient buckets start
when their last gradient is ready (grad_reduce_overlap) or after the backward pass; ZeRO-3 gathers run
fsdp_prefetch_depth layer-phases ahead (apply_zero); the distributed optimizer's parameter gathers run at the
start of the iteration, each before the first forward of its bucket's layers (param_gather_overlap: the next
iteration's forward in Megatron-Core, one iteration later here), or after the optimizer step. The simulator
applies the overlap slow-down itself (sim/engine.py).
"""

from dataclasses import dataclass

from trainsim.compile.apply_zero import FsdpChain, FsdpNeed, fsdp_enabled, stage_model_state
from trainsim.compile.context import (
    TASK_LEVELS,
    BuildContext,
    ExpertReplicas,
    SpecBlock,
    StageWriter,
    TaskLevel,
    TaskSpec,
)
from trainsim.compile.device_classes import split_device_classes
from trainsim.compile.insert_collectives import (
    Grads,
    insert_gathers_after_step,
    insert_gradient_sync,
    insert_param_gathers,
)
from trainsim.compile.lower_layers import Cut, Unit, UnitMemory, emit_unit, step_units, unit_specs
from trainsim.compile.place_links import place_links
from trainsim.compile.schedule_pipeline import StepTids, chunk_layers, insert_transfers, stage_programs
from trainsim.compile.schedules import Step, splits_backward
from trainsim.compile.shape_layers import expert_grad_groups, shape_layers
from trainsim.compile.splits import plan_mesh_comms, plan_splits, plan_tp_token_params
from trainsim.compile.stage_meshes import compile_stage_meshes
from trainsim.cost.memory import optimizer_step_bytes
from trainsim.cost.pricing import Pricer
from trainsim.cost.rank_classes import job_on_device
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, SimDevice, TaskColumns
from trainsim.job import Job
from trainsim.strategy.lowered import LayerAssignment, LoweredPlan

_NEVER = float("inf")  # a cut after the whole layer-phase
_NO_EXTRA = UnitMemory()  # NB: shared, never changed: emit_unit only reads it


@dataclass(slots=True)
class _StageTail:
    last_tid: int
    grad_tids: list[int]
    grads: Grads  # the gradients in the order they become final, by sync group (insert_gradient_sync's)


def compile_job(job: Job, plan: LoweredPlan, pricer: Pricer,
                task_level: TaskLevel = "layer") -> ExecGraph:
    """The iteration of `job` placed by `plan` as per-device tasks, priced by `pricer`: one device per stage (on
    its own mesh where the plan gives it one: stage_meshes), and one per stage and device class where the
    cluster's ranks differ (device_classes)."""
    plan = shape_layers(job, plan)
    graph = compile_stage_meshes(job, plan, lambda mesh_job, mesh_plan: _compile_stages(
        mesh_job, mesh_plan, pricer, task_level))
    graph = split_device_classes(job, graph, lambda device: _compile_stages(
        job_on_device(job, device), plan, pricer, task_level))
    return place_links(job, graph)


def _compile_stages(job: Job, plan: LoweredPlan, pricer: Pricer, task_level: TaskLevel) -> ExecGraph:
    """One simulated device per pipeline stage."""
    if task_level not in TASK_LEVELS:
        raise ConfigError("task_level", task_level, f"choose one of: {', '.join(TASK_LEVELS)}")
    if plan.num_stages != job.parallel.pp:
        raise ConfigError("plan.num_stages", plan.num_stages, f"must equal pp={job.parallel.pp} of the job")
    graph = ExecGraph(devices=[], columns=TaskColumns())
    ctx = BuildContext(job, plan, pricer, task_level, graph)
    ctx.splits = plan_splits(plan, job.parallel.dp)
    ctx.mesh_comms = plan_mesh_comms(plan, job.model, job.parallel, job.stack)
    ctx.expert_grads = {index: (params, ExpertReplicas(ranks))
                        for index, (params, ranks) in expert_grad_groups(job, plan).items()}
    ctx.tp_token_params = plan_tp_token_params(plan, job.model, job.parallel)
    ranks = job.parallel.dp * job.parallel.tp * job.parallel.cp
    for stage in range(plan.num_stages):
        states = stage_model_state(ctx, stage)
        graph.devices.append(SimDevice(index=stage, stage=stage, ranks=ranks,
                                       capacity_bytes=job.cluster.device.hbm_bytes,
                                       static_bytes=sum(states.values()), static_breakdown=states))
    programs = stage_programs(plan)
    layers = chunk_layers(plan)
    steps = [StepTids([], []) for _ in range(plan.num_stages)]
    tails = [_emit_stage(ctx, stage, programs[stage], layers, steps[stage]) for stage in range(plan.num_stages)]
    insert_transfers(ctx, programs, steps)
    _emit_step_end(ctx, tails)
    return graph


def _emit_stage(ctx: BuildContext, stage: int, program: list[Step],
                layers: dict[tuple[int, int], list[LayerAssignment]],
                tids: StepTids) -> _StageTail:
    w = StageWriter(ctx, stage)
    split = splits_backward(str(ctx.plan.schedule))
    steps = [(step, layers[(stage, step.chunk)]) for step in program]
    fsdp = None
    if fsdp_enabled(ctx):
        fsdp = FsdpChain(ctx, w, [_fsdp_need(u, split) for step, chunk in steps for u in step_units(step, chunk)])
        fsdp.start()
    param_gathers = insert_param_gathers(ctx, stage, [a for step, chunk in steps if step.phase == "F" for a in chunk])
    overheads = _per_micro_batch_overheads(ctx, stage)
    grads: dict[int, tuple[int, Unit]] = {}  # layer index -> (tid that finishes its gradient, its layer-phase)
    templates: dict[tuple[int, str], _StepTemplate] = {}
    k = 0
    first_tids, last_tids = tids  # per step of the program, in its order
    # consecutive template steps, written together (StageWriter.emit_blocks) before any other task is written
    blocks: list[SpecBlock] = []
    micro_batches: list[int] = []
    first = len(w.columns)  # the tid of the next template step's first task while blocks are held
    for step, chunk in steps:
        phase, micro_batch, chunk_index = step
        if fsdp is None and chunk and not (phase == "F" and param_gathers
                                           and any(a.index in param_gathers for a in chunk)):
            # a step no pass cuts into: its tasks as one template per (chunk, F | B | W), replayed per micro-batch
            template = templates.get((chunk_index, phase))
            if template is None:
                _flush(w, blocks, micro_batches)
                template = templates[(chunk_index, phase)] = _step_template(
                    w, step_units(step, chunk), overheads, split)
            size = template.size
            if size:
                if not blocks:
                    first = len(w.columns)
                blocks.append(template.block)
                micro_batches.append(micro_batch)
                for offset, index, unit in template.gradients:
                    grads.pop(index, None)  # re-insert: the dict keeps the order in which gradients become final
                    grads[index] = (first + offset if offset >= 0 else -1, unit)
                first_tids.append(first)
                first += size
                last_tids.append(first - 1)
            else:
                _flush(w, blocks, micro_batches)
                first_tids.append(-1)  # (no task of this step)
                last_tids.append(w.prev)
            k += len(chunk)
            continue
        w.step_first = -1
        _flush(w, blocks, micro_batches)
        units = step_units(step, chunk)
        if step.phase == "F":
            for spec in overheads:
                w.emit(spec, step.micro_batch)
        if not units:  # a model chunk without layers passes its input through
            w.chain(name=f"{step} pass-through", stream="compute", kind="compute", duration_s=0.0,
                    phase="fwd" if step.phase == "F" else "bwd", category="compute", micro_batch=step.micro_batch)
        for unit in units:
            gather = param_gathers.pop(unit.assignment.index, None) if unit.phase == "F" else None
            if gather is not None:
                w.wait_for(gather)
            extra = _NO_EXTRA
            if fsdp is not None:
                fsdp.before(k)
                extra = UnitMemory(fsdp.gathered_bytes(k) if unit.phase != "W" else 0.0, fsdp.grad_bytes(k),
                                   [_fsdp_cut(w, unit, split, fsdp, k)])
            last = emit_unit(w, unit, split, extra)
            if fsdp is not None:
                fsdp.main_end[k] = last
            if unit.makes_gradient(split):
                index = unit.assignment.index
                grads.pop(index, None)  # re-insert: the dict keeps the order in which gradients become final
                grads[index] = (last, unit)
            k += 1
        first_tids.append(w.step_first)
        last_tids.append(w.prev)
    _flush(w, blocks, micro_batches)
    final = [(tid, ctx.grad_params_by_ranks(u.assignment.index, u.assignment.layer.param_count), u.label)
             for tid, u in grads.values()]
    grad_tids = insert_gradient_sync(ctx, stage, final, w.prev)
    if fsdp is not None:
        grad_tids += fsdp.finish()
    return _StageTail(w.prev, grad_tids, final)


def _flush(w: StageWriter, blocks: list[SpecBlock], micro_batches: list[int]) -> None:
    """Write the held template steps' tasks and forget them."""
    if blocks:
        w.emit_blocks(blocks, micro_batches)
        blocks.clear()
        micro_batches.clear()


@dataclass(frozen=True, slots=True)
class _StepTemplate:
    """A step's chain tasks whatever its micro-batch (the forward's per-micro-batch overheads, then each
    layer-phase's specs), and per layer-phase that finishes a weight gradient the offset of its last compute task
    among them (-1: none) and its layer's index."""

    block: SpecBlock
    gradients: tuple[tuple[int, int, Unit], ...]  # (offset, layer index, layer-phase)
    size: int  # its tasks


def _step_template(w: StageWriter, units: list[Unit], overheads: tuple[TaskSpec, ...], split: bool) -> _StepTemplate:
    specs: list[TaskSpec] = list(overheads) if units[0].phase == "F" else []
    gradients: list[tuple[int, int, Unit]] = []
    for unit in units:
        unit_tasks = unit_specs(w, unit, split)
        last = max((len(specs) + i for i, spec in enumerate(unit_tasks) if spec.stream == "compute"), default=-1)
        specs += unit_tasks
        if unit.makes_gradient(split):
            gradients.append((last, unit.assignment.index, unit))
    return _StepTemplate(SpecBlock.of(tuple(specs)), tuple(gradients), len(specs))


def _per_micro_batch_overheads(ctx: BuildContext, stage: int) -> tuple[TaskSpec, ...]:
    """The tasks each forward step starts with. NB: after the receive (the step's first task waits for it): a
    blocking p2p receive keeps the host from launching ahead, so the per-micro-batch host cost is paid on every
    stage; spread over the model chunks, as the analytical engine spreads it over the stage time."""
    items = [(ctx.micro_batch_overhead_s(stage), "overhead", "micro-batch overhead")]
    if ctx.plan.num_stages > 1:
        items.append((ctx.cal.runtime.pipeline_overhead_per_micro_batch_s, "pp_comm", "pipeline overhead"))
    return tuple(TaskSpec(f"{what} mb", "", "compute", "compute", seconds / ctx.plan.num_chunks, "fwd", category)
                 for seconds, category, what in items if seconds > 0.0)


def _fsdp_need(unit: Unit, split: bool) -> FsdpNeed:
    params = unit.assignment.layer.param_count
    gather = params if unit.phase in ("F", "B") else 0.0
    scatter = params if unit.makes_gradient(split) else 0.0
    return FsdpNeed(unit.label, unit.micro_batch, gather, scatter)


def _fsdp_cut(w: StageWriter, unit: Unit, split: bool, fsdp: FsdpChain, k: int) -> Cut:
    """With prefetch, layer-phase k's window opens when its compute starts (the next gathers run beside it);
    without, when it ends (the next gather waits for it and is exposed)."""
    head = 0.0 if w.ctx.job.stack.fsdp_prefetch_depth > 0 and fsdp.overlaps else _NEVER
    return head, lambda: fsdp.issue(k)


def _emit_step_end(ctx: BuildContext, tails: list[_StageTail]) -> None:
    """Barrier over the stages (gradient-norm all-reduce), then each stage's optimizer step and the iteration's
    fixed overhead."""
    job = ctx.job
    multi = len(tails) > 1
    for stage, tail in enumerate(tails):
        deps = (tail.last_tid, *tail.grad_tids) if tail.last_tid >= 0 else tuple(tail.grad_tids)
        barrier = ctx.add(name="optimizer barrier", device=stage, stream="gradient", kind="comm", duration_s=0.0,
                          deps=deps, sync_key="optimizer-barrier" if multi else "", phase="comm")
        parts = ctx.stage_parts(stage)
        seconds = ctx.pricer.optimizer_step_s([parts], job) if parts else 0.0  # the shared formula
        zeros = sum(ctx.pricer.zero_state_params_of(a.layer, ctx.held_params(a.index, a.layer.param_count), job,
                                                    a.index)
                    for a in ctx.plan.layers if a.stage == stage)  # zero optimizer states (optimizer_zeros, census)
        if (ctx.splits or zeros > 0.0) and parts:  # a device steps the weights it holds: split and sharded ones
            held = sum(ctx.held_params(a.index, a.layer.param_count) for a in ctx.plan.layers if a.stage == stage)
            seconds = ctx.pricer.optimizer_step_of_params_s(held, job, zeros, ctx.stage_expert_params(stage))
        temporary = optimizer_step_bytes(parts, job.parallel)
        synced = sum(ctx.grad_params(a.index, a.layer.param_count) for a in ctx.plan.layers if a.stage == stage)
        copies = ctx.pricer.grad_copies_s(synced, job)
        if copies > 0.0:  # the gradient sync's bucket copies on the host (StackSpec.grad_bucket_copies)
            barrier = ctx.add(name="gradient bucket copies", device=stage, stream="compute", kind="compute",
                              duration_s=copies, deps=(barrier,), phase="optimizer", category="overhead")
        optimizer = ctx.add(name="optimizer step", device=stage, stream="compute", kind="compute", duration_s=seconds,
                            deps=(barrier,), phase="optimizer", category="optimizer", alloc_bytes=temporary,
                            free_bytes=temporary)
        gathers = insert_gathers_after_step(ctx, stage, tail.grads, optimizer)
        overhead = ctx.pricer.iteration_overhead_s(job)
        if overhead > 0.0:
            ctx.add(name="iteration overhead", device=stage, stream="compute", kind="compute", duration_s=overhead,
                    deps=(optimizer, *gathers[-1:]), phase="optimizer", category="overhead")
