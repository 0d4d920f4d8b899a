"""Pipeline stages mapped to their own meshes (Proteus Sec. IV-B: `map` places a subtree on a device mesh of its
own; the plan's LoweredPlan.stage_meshes).

A stage with its own mesh keeps the job's devices per stage (tp x dp x cp) but splits them another way: its own
tensor-parallel degree, and the data-parallel degree that leaves. Every stage runs the same micro-batches of the
global batch, so a replica of that stage takes micro_batch x dp / dp_stage samples per micro-batch. The stage's
ops are one of its devices' under its own tp (the catalog graph builder shapes them, as for a job of that mesh),
and its collectives (tp, the data-parallel gradient buckets over its dp, ZeRO) are priced over its own groups.

Compiling: the job is compiled once per distinct mesh (the job with that stage's tp, dp and micro-batch; the
plan's layers rebuilt for it), and each stage's tasks are taken from the compilation of its own mesh. A mesh's
compilation carries the plan's computation configs of its own stages' layers: over tp those the tree read
against the stage's tp (Megatron's, or an op over fewer ranks or whole: compile.shape_layers shapes them for the
mesh), over dp those carved from the stage's dp ranks (compile.splits; the placements enter and leave the stage
in the plain batch split); the other stages' layers take Megatron's configs over its tp and no dp configs (their
tasks come from their own compilations). The stages still meet where they did: the pipeline transfers (a send's
receiver, a batched exchange's partner) and the optimizer barrier, matched by name between the compilations.

The pipeline transfer across a boundary between two meshes is a point-to-point reshard: a receiving rank needs
its replica's whole micro-batch (its sequence share under sp) and a sending rank sends its own, so the transfer
is priced at the larger per-device volume of the two sides (each compilation prices it at its own side's
volume: the longer of the two). NB: Megatron-LM has no such transfer (one mesh per job); this is Proteus'
strategy transformation between two device groups of equal size, without an optimisation that sends each
sample once across the tp ranks of the side that holds copies.

A captured graph's stages (the torch front-end's) take their layers from the model captured again at each stage
mesh's micro-batch (with_captures) and the tree's configs over their own tp (compile.front_end_meshes) instead of
the catalog builder's layers and Megatron's configs.

Under interleaved 1F1B a stage's mesh holds every model chunk of its pipeline rank (Megatron-LM's virtual pipeline:
chunk c of rank r is virtual stage c x pp + r), so a boundary vs{b} joins ranks b mod pp and (b + 1) mod pp, and a
chunk entered from another mesh starts its chain of dp placements in the plain batch split (LoweredPlan.chain_starts).
"""

import dataclasses
import itertools
import re
from collections.abc import Callable

from trainsim.compile.device_classes import device_classes
from trainsim.compile.front_end_meshes import check_captured, front_end_mesh_parts, front_end_stage_repeated_flops
from trainsim.compile.shape_layers import added_flops, repeated_flops, shape_layers
from trainsim.cost.rank_classes import uniform
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.exec_graph import ExecGraph, Task
from trainsim.ir.graph import Layer, OpGraph
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan, StageMesh, expand_layers, megatron_splits

CompileStages = Callable[[Job, LoweredPlan], ExecGraph]
_BOUNDARY = re.compile(r"\bvs(\d+)\b")


def compile_stage_meshes(job: Job, plan: LoweredPlan, compile_stages: CompileStages) -> ExecGraph:
    """The plan's stages compiled each on its own mesh (one device per stage); `compile_stages(job, plan)`
    compiles every stage of a job. Without stage meshes: the job's graph as compile_stages gives it."""
    if not plan.stage_meshes:
        return compile_stages(job, plan)
    if not uniform(device_classes(job)):
        raise ConfigError("map.tp", plan.stage_meshes[0].tp, "a stage with its own mesh needs ranks that are "
                          "alike (rank_devices and compute_slowdown are not combined with stage meshes)")
    compilations, source_of = stage_compilations(job, plan)
    compiled = [compile_stages(mesh_job, shape_layers(mesh_job, mesh_plan)) for mesh_job, mesh_plan in compilations]
    return _splice([compiled[source_of[stage]] for stage in range(plan.num_stages)])


def stage_repeated_flops(job: Job, plan: LoweredPlan) -> float:
    """compile.shape_layers.repeated_flops of any plan, in the job's units (per device of the job's tp and per
    micro-batch of its replicas): a stage on its own mesh repeats its shaped modules on each of its tp_s ranks
    for each of its micro-batches of micro_batch_s samples, so its FLOPs count tp_s / tp x micro_batch /
    micro_batch_s times."""
    if not plan.stage_meshes:
        return repeated_flops(job, plan)
    compilations, source_of = stage_compilations(job, plan)
    if plan.frontend != "catalog":
        return front_end_stage_repeated_flops(job, plan, compilations, source_of)
    par = job.parallel
    total = 0.0
    for index, (mesh_job, mesh_plan) in enumerate(compilations):
        stages = {stage for stage, source in enumerate(source_of) if source == index}
        mesh = mesh_job.parallel
        added = added_flops(mesh_plan, shape_layers(mesh_job, mesh_plan), stages)
        total += added * mesh.tp * par.micro_batch / (par.tp * mesh.micro_batch)
    return total


def stage_compilations(job: Job, plan: LoweredPlan) -> tuple[list[tuple[Job, LoweredPlan]], list[int]]:
    """The distinct compilations a plan with stage meshes takes (the job on a mesh, with the plan for it:
    mesh_plan), and per stage the index of its own. Stages of one mesh share one; where the stages differ in
    size (plan.stage_ranks), one per mesh and block of ranks (the job on that block: ClusterSpec.submesh)."""
    meshes = {mesh.stage: mesh for mesh in plan.stage_meshes}
    par = job.parallel
    keys: dict[tuple[int, int, tuple[int, int] | None], list[int]] = {}  # (tp, dp, block) -> its stages
    for stage in range(plan.num_stages):
        mesh = meshes.get(stage, StageMesh(stage, par.tp, par.dp, par.micro_batch))
        keys.setdefault((mesh.tp, mesh.dp, plan.stage_block(stage) if plan.stage_ranks else None), []).append(stage)
    compilations: list[tuple[Job, LoweredPlan]] = []
    source_of = [0] * plan.num_stages
    for (tp, dp, block), stages in keys.items():
        mesh = meshes.get(stages[0], StageMesh(stages[0], tp, dp, par.micro_batch))
        own = (tp, dp) == (par.tp, par.dp)  # the job's mesh: its layers as they are
        mesh_job = job if own and block is None else job_of_mesh(job, mesh, block)
        for stage in stages:
            source_of[stage] = len(compilations)
        compilations.append((mesh_job, mesh_plan(plan, mesh_job, frozenset(stages), rebuild=not own)))
    return compilations, source_of


def job_of_mesh(job: Job, mesh: StageMesh, block: tuple[int, int] | None = None) -> Job:
    """The job as a stage of this mesh runs it: its tp and dp, its replicas' micro-batch, the same global batch
    (make_job checks the mesh against the model: heads divisible by tp, ...). block: the stage's (first rank,
    ranks) where stages differ in size: the job then fills pp stages of that mesh, on the cluster seen from that
    block (ClusterSpec.submesh)."""
    par = mesh.parallel_of(job.parallel)
    if block is None:
        return make_job(job.model, job.cluster, par, job.stack)
    cluster = job.cluster.model_copy(update={"submesh": block})
    return make_job(job.model, cluster, par, job.stack, num_gpus=par.num_gpus)


def mesh_plan(plan: LoweredPlan, mesh_job: Job, stages: frozenset[int], *, rebuild: bool = True) -> LoweredPlan:
    """The plan as the compilation of `mesh_job` for `stages` takes it: its layers' ops shaped for the mesh's
    devices (rebuild: by the catalog builder over the mesh's slice; else the plan's, on the job's own mesh), the
    plan's computation configs on the layers of `stages` (over tp: the tree's for their mesh; over dp: over its
    dp ranks) and Megatron's over the mesh's tp on every other layer (their tasks are another compilation's)."""
    mine = {a.index for a in plan.layers if a.stage in stages}
    if plan.frontend != "catalog":  # a captured graph: re-captured at the mesh's micro-batch, the tree's configs
        assignments, mesh_splits, op_splits = front_end_mesh_parts(plan, mesh_job, stages, rebuild=rebuild)
        return dataclasses.replace(plan, layers=assignments, op_splits=op_splits, mesh_splits=mesh_splits,
                                   stage_meshes=(), chain_starts=_entered(plan, mine), captured=())
    layers = _mesh_layers(plan, mesh_job) if rebuild else [a.layer for a in plan.layers]
    mesh_splits = sorted([s for s in plan.mesh_splits if s.layer in mine]
                         + [s for s in megatron_splits(layers, mesh_job.parallel) if s.layer not in mine],
                         key=lambda s: s.layer)
    assignments = tuple(dataclasses.replace(a, layer=layer) for a, layer in zip(plan.layers, layers, strict=True)) \
        if rebuild else plan.layers
    return dataclasses.replace(plan, layers=assignments, op_splits=tuple(s for s in plan.op_splits if s.layer in mine),
                               mesh_splits=tuple(mesh_splits), stage_meshes=(), chain_starts=_entered(plan, mine))


def with_captures(job: Job, plan: LoweredPlan, capture: Callable[[Job], OpGraph]) -> LoweredPlan:
    """The plan of a capturing front-end's graph with its layers captured at each stage mesh's micro-batch
    (LoweredPlan.captured; capture(mesh_job): the front-end's graph of the job as a stage of that mesh runs it, once
    per micro-batch; the job's own: the plan's layers). The plan itself on the catalog front-end, or without stage
    meshes."""
    if plan.frontend == "catalog" or not plan.stage_meshes:
        return plan
    captured = {job.parallel.micro_batch: tuple(a.layer for a in plan.layers), **dict(plan.captured)}
    for mesh in plan.stage_meshes:
        if mesh.micro_batch not in captured:
            mesh_job = job_of_mesh(job, mesh, plan.stage_block(mesh.stage) if plan.stage_ranks else None)
            captured[mesh.micro_batch] = check_captured(plan, expand_layers(capture(mesh_job)), mesh.micro_batch)
    return dataclasses.replace(plan, captured=tuple(sorted(captured.items())))


def _entered(plan: LoweredPlan, mine: set[int]) -> frozenset[int]:
    """Of the layers `mine`, those that follow in model order a layer compiled on another mesh (the first layer of
    a model chunk after another stage's chunk, under interleaved 1F1B): the pipeline transfer into it is the
    cross-mesh reshard, which hands each replica its whole micro-batch, so its chain of dp placements starts there
    in the plain batch split. (With one chunk per stage, the stages before a stage hold no configs in its
    compilation, so its chain enters in that split anyway.)"""
    indices = [a.index for a in plan.layers]
    return frozenset(index for before, index in itertools.pairwise(indices)
                     if index in mine and before not in mine)


def _mesh_layers(plan: LoweredPlan, mesh_job: Job) -> list[Layer]:
    """The plan's layer instances as the catalog builder shapes them over the mesh's slice (the ops one device's
    under Megatron's splits over its tp)."""
    layers = expand_layers(build_graph(mesh_job.model, DeviceSlice.of(mesh_job.parallel, mesh_job.stack)))
    if [layer.name for layer in layers] != [a.layer.name for a in plan.layers]:
        raise ConfigError("map.tp", mesh_job.parallel.tp, f"the catalog graph of {mesh_job.model.name} at tp="
                          f"{mesh_job.parallel.tp} has other layers than the plan's; stage meshes need the catalog "
                          "front-end's graph")
    return layers


def _splice(sources: list[ExecGraph]) -> ExecGraph:
    """Stage s's device and tasks from sources[s] (each source holds every stage), renumbered; a dependency on
    another stage's task follows it by name into that stage's own source; a pipeline transfer across a boundary
    between two sources lasts the longer of its two prices."""
    new_tid: dict[tuple[int, int], int] = {}
    order: list[tuple[ExecGraph, Task]] = []
    for stage, source in enumerate(sources):
        for task in source.tasks:
            if task.device == stage:
                new_tid[(id(source), task.tid)] = len(order)
                order.append((source, task))
    by_name: dict[int, dict[tuple[int, str], int]] = {}

    def named(source: ExecGraph) -> dict[tuple[int, str], int]:
        index = by_name.get(id(source))
        if index is None:
            index = by_name[id(source)] = {(t.device, t.name): t.tid for t in source.tasks}
        return index

    def follow(source: ExecGraph, dep: int) -> int:
        target = source.tasks[dep]
        own = sources[target.device]
        if own is source:
            return new_tid[(id(source), dep)]
        return new_tid[(id(own), named(own)[(target.device, target.name)])]

    tasks: list[Task] = []
    for tid, (source, task) in enumerate(order):
        seconds = task.duration_s
        other = _neighbour_source(task, sources) if task.category == "pp_comm" else None
        if other is not None and other is not source:
            twin = named(other).get((task.device, task.name))
            if twin is not None:
                seconds = max(seconds, other.tasks[twin].duration_s)
        tasks.append(Task(tid, task.name, task.device, task.stream, task.kind, seconds,
                          tuple(follow(source, d) for d in task.deps), task.sync_key, task.resources,
                          task.alloc_bytes, task.free_bytes, task.phase, task.layer, task.micro_batch, task.stage,
                          task.category, task.priority, task.link_shares))
    devices = [dataclasses.replace(source.devices[stage]) for stage, source in enumerate(sources)]
    capacity: dict[str, float] = {}
    for source in sources:
        capacity.update(source.resource_capacity)
    return ExecGraph(devices=devices, tasks=tasks, resource_capacity=capacity)


def _neighbour_source(task: Task, sources: list[ExecGraph]) -> ExecGraph | None:
    """The source of the stage a pipeline transfer joins task's stage to: boundary vs{b} lies between virtual
    stages b and b + 1, held by pipeline ranks b mod p and (b + 1) mod p (Megatron-LM's interleaved placement:
    model chunk c of rank r is virtual stage c x p + r; with one chunk per stage, stages b and b + 1); None for a
    task that names no boundary (the pipeline overhead)."""
    match = _BOUNDARY.search(task.name)
    if match is None:
        return None
    boundary = int(match[1])
    lower, upper = boundary % len(sources), (boundary + 1) % len(sources)
    return sources[upper if task.device == lower else lower]
