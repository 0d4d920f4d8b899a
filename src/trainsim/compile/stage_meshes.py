"""Pipeline stages mapped to their own meshes (Proteus Sec. IV-B: `map` places a subtree on a device mesh of its
own; the plan's LoweredPlan.stage_meshes).

A stage with its own mesh keeps the job's devices per stage (tp x dp x cp) but splits them another way: its own
tensor-parallel degree, and the data-parallel degree that leaves. Every stage runs the same micro-batches of the
global batch, so a replica of that stage takes micro_batch x dp / dp_stage samples per micro-batch. The stage's
ops are one of its devices' under its own tp (the catalog graph builder shapes them, as for a job of that mesh),
and its collectives (tp, the data-parallel gradient buckets over its dp, ZeRO) are priced over its own groups.

Compiling: the job is compiled once per distinct mesh (the job with that stage's tp, dp and micro-batch; the
plan's layers rebuilt for it, with Megatron's computation configs for its tp), and each stage's tasks are taken
from the compilation of its own mesh. The stages still meet where they did: the pipeline transfers (a send's
receiver, a batched exchange's partner) and the optimizer barrier, matched by name between the compilations.

The pipeline transfer across a boundary between two meshes is a point-to-point reshard: a receiving rank needs
its replica's whole micro-batch (its sequence share under sp) and a sending rank sends its own, so the transfer
is priced at the larger per-device volume of the two sides (each compilation prices it at its own side's
volume: the longer of the two). NB: Megatron-LM has no such transfer (one mesh per job); this is Proteus'
strategy transformation between two device groups of equal size, without an optimisation that sends each
sample once across the tp ranks of the side that holds copies.
"""

import dataclasses
import re
from collections.abc import Callable

from trainsim.compile.device_classes import device_classes
from trainsim.cost.rank_classes import uniform
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.exec_graph import ExecGraph, Task
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
    if plan.stage_ranks:
        return _splice(_stage_sources(job, plan, compile_stages))
    base = compile_stages(job, plan)
    compiled: dict[tuple[int, int], ExecGraph] = {(job.parallel.tp, job.parallel.dp): base}
    sources = [base] * plan.num_stages
    for mesh in plan.stage_meshes:
        key = (mesh.tp, mesh.dp)
        if key not in compiled:
            mesh_job = job_of_mesh(job, mesh)
            compiled[key] = compile_stages(mesh_job, plan_of_mesh(plan, mesh_job))
        sources[mesh.stage] = compiled[key]
    return _splice(sources)


def _stage_sources(job: Job, plan: LoweredPlan, compile_stages: CompileStages) -> list[ExecGraph]:
    """Stages of their own device counts (plan.stage_ranks): each stage's compilation, the job on that stage's
    mesh and block of ranks (its groups laid out from their ranks: ClusterSpec.submesh). Stages of one mesh
    and block share one."""
    meshes = {mesh.stage: mesh for mesh in plan.stage_meshes}
    par = job.parallel
    compiled: dict[tuple[int, int, tuple[int, int]], ExecGraph] = {}
    sources: list[ExecGraph] = []
    for stage in range(plan.num_stages):
        mesh = meshes.get(stage, StageMesh(stage, par.tp, par.dp, par.micro_batch))
        block = plan.stage_block(stage)
        key = (mesh.tp, mesh.dp, block)
        if key not in compiled:
            mesh_job = job_of_mesh(job, mesh, block)
            own = (mesh.tp, mesh.dp) == (par.tp, par.dp)  # the job's mesh: its layers as they are
            mesh_plan = dataclasses.replace(plan, stage_meshes=()) if own else plan_of_mesh(plan, mesh_job)
            compiled[key] = compile_stages(mesh_job, mesh_plan)
        sources.append(compiled[key])
    return sources


def job_of_mesh(job: Job, mesh: StageMesh, block: tuple[int, int] | None = None) -> Job:
    """The job as a stage of this mesh runs it: its tp and dp, its replicas' micro-batch, the same global batch
    (make_job checks the mesh against the model: heads divisible by tp, ...). block: the stage's (first rank,
    ranks) where stages differ in size: the job then fills pp stages of that mesh, on the cluster seen from that
    block (ClusterSpec.submesh)."""
    par = job.parallel.replaced(tp=mesh.tp, dp=mesh.dp, micro_batch=mesh.micro_batch,
                                sp=job.parallel.sp and mesh.tp > 1)
    if block is None:
        return make_job(job.model, job.cluster, par, job.stack)
    cluster = job.cluster.model_copy(update={"submesh": block})
    return make_job(job.model, cluster, par, job.stack, num_gpus=par.num_gpus)


def plan_of_mesh(plan: LoweredPlan, mesh_job: Job) -> LoweredPlan:
    """The plan with its layers' ops shaped for the mesh's devices (the catalog builder over the mesh's slice)
    and Megatron's computation configs over its tp."""
    layers = expand_layers(build_graph(mesh_job.model, DeviceSlice.of(mesh_job.parallel)))
    if [layer.name for layer in layers] != [a.layer.name for a in plan.layers]:
        raise ConfigError("map.tp", mesh_job.parallel.tp, f"the catalog graph of {mesh_job.model.name} at tp="
                          f"{mesh_job.parallel.tp} has other layers than the plan's; stage meshes need the catalog "
                          "front-end's graph")
    assignments = tuple(dataclasses.replace(a, layer=layer) for a, layer in zip(plan.layers, layers, strict=True))
    return dataclasses.replace(plan, layers=assignments, mesh_splits=megatron_splits(layers, mesh_job.parallel),
                               stage_meshes=())


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
    """The source of the stage a pipeline transfer joins task's stage to: boundary vs{b} lies between stages b
    and b + 1 (one model chunk per stage); None for a task that names no boundary (the pipeline overhead)."""
    match = _BOUNDARY.search(task.name)
    if match is None:
        return None
    boundary = int(match[1])
    other = boundary + 1 if task.device == boundary else boundary
    return sources[other] if 0 <= other < len(sources) else None
