"""Pipeline stages on their own meshes over a capturing front-end's graph (Proteus Sec. IV-B: a subtree mapped to
a device mesh of its own, any op of it split over that mesh; Sec. V-B: the strategy transformation where two
device groups meet).

A captured graph (the torch front-end's) is one device's whole model at the job's micro-batch; a strategy tree's
configs over tp shape it per op (compile.shape_front_end). A stage on its own mesh (tp_s, dp_s) runs replicas of
micro_batch x dp / dp_s samples, so its layers are the model captured again at that micro-batch
(LoweredPlan.captured, filled by compile.stage_meshes.with_captures from the front-end): the catalog path
rebuilds its layers with the catalog builder at the mesh's slice instead. Each mesh's compilation
(compile.stage_meshes) takes those layers, the tree's configs over tp of its own stages' layers only, read
against the stage's tp when the tree was lowered (strategy.front_end_splits), and none on the other stages'
layers (their tasks come from their own compilations; shaped whole, they are not priced). Its stages' ops are
shaped at the configs over the mesh's tp, its feature collectives derived on the mesh's tp group; its
data-parallel gradient sync, ZeRO and memory are the mesh's, and the pipeline transfer across the boundary
between two meshes is priced as the catalog path prices it (the longer of the two sides' hops of each side's
replica's whole hidden state: compile.stage_meshes._splice).

A re-captured layer instance may name its ops under other module paths (the trace repeats the first traced block
where the blocks do not differ: every block instance of a 1-sample capture is `transformer.h.0`'s ops), so the
plan's configs, addressed by the module paths of the job's capture, are carried over op by op: the i-th forward
op of an instance in the job's capture to the i-th of the same instance re-captured (both captures must hold the
same layers and forward ops, by kind).

Refused in one line (ConfigError): a stage mesh at tp > 1 whose stages' layers take no config over tp from the tree
(the captured graph is one device's whole model), two captures whose layers or forward ops differ, and a plan
whose stage meshes' micro-batches were not captured.
"""

import dataclasses
from collections.abc import Sequence

from trainsim.compile.shape_layers import shape_layers
from trainsim.errors import ConfigError
from trainsim.ir.graph import Layer
from trainsim.job import Job
from trainsim.strategy.lowered import LayerAssignment, LoweredPlan, MeshSplit, OpSplit


def check_captured(plan: LoweredPlan, layers: Sequence[Layer], micro_batch: int) -> tuple[Layer, ...]:
    """The layer instances of the model captured at `micro_batch` (expanded, in model order), checked to be the
    plan's op for op: the same instances, kinds and forward ops by kind."""
    where = f"the graph captured at micro-batch {micro_batch}"
    if len(layers) != len(plan.layers):
        raise ConfigError("micro_batch", micro_batch, f"{where} has {len(layers)} layer instances, the plan "
                          f"{len(plan.layers)}; a stage mesh of a captured graph needs the same layers at its "
                          "micro-batch")
    for a, layer in zip(plan.layers, layers, strict=True):
        ours, theirs = [op.kind for op in a.layer.fwd], [op.kind for op in layer.fwd]
        if layer.kind != a.layer.kind or ours != theirs:
            raise ConfigError("micro_batch", micro_batch, f"{where} holds layer {a.index} as a {layer.kind} of "
                              f"{len(theirs)} forward ops, the plan as a {a.layer.kind} of {len(ours)} ({a.layer.name})"
                              "; a stage mesh of a captured graph needs the same ops at its micro-batch")
    return tuple(layers)


def front_end_mesh_parts(plan: LoweredPlan, mesh_job: Job, stages: frozenset[int], *, rebuild: bool
                         ) -> tuple[tuple[LayerAssignment, ...], tuple[MeshSplit, ...], tuple[OpSplit, ...]]:
    """The layer instances, configs over tp and configs over dp the compilation of `mesh_job` for `stages` takes
    (module doc): the plan's layers at the mesh's micro-batch (rebuild: captured again; else the plan's own, on
    the job's mesh), the configs of the layers of `stages` only, under the module paths of those layers."""
    mesh = mesh_job.parallel
    mine = {a.index for a in plan.layers if a.stage in stages}
    mesh_splits = tuple(s for s in plan.mesh_splits if s.layer in mine)
    if mesh.tp > 1 and not any(s.axis == "tp" for s in mesh_splits):
        raise ConfigError("map.tp", mesh.tp, f"stage {min(stages)} runs tp={mesh.tp} on the {plan.frontend} "
                          "front-end's graph, one device's whole model: split its ops over tp in the tree (split "
                          "item compute, axis tp), or map the stage to tp=1")
    op_splits = tuple(s for s in plan.op_splits if s.layer in mine)
    if not rebuild:
        return plan.layers, mesh_splits, op_splits
    captured = dict(plan.captured).get(mesh.micro_batch)
    if captured is None:
        raise ConfigError("map.dp", mesh.dp, f"stage {min(stages)}'s replicas take micro-batches of "
                          f"{mesh.micro_batch}, at which the {plan.frontend} front-end's graph was not captured "
                          "(compile.stage_meshes.with_captures captures it: trainsim predict does)")
    paths = [_paths(a.layer, layer) for a, layer in zip(plan.layers, captured, strict=True)]
    layers = tuple(dataclasses.replace(a, layer=layer) for a, layer in zip(plan.layers, captured, strict=True))
    return (layers, tuple(dataclasses.replace(s, module_path=paths[s.layer][s.module_path]) for s in mesh_splits),
            tuple(dataclasses.replace(s, module_path=paths[s.layer][s.module_path]) for s in op_splits))


def _paths(ours: Layer, captured: Layer) -> dict[str, str]:
    """The module path of each forward op of a layer instance in the job's capture -> that of the same op (by
    position) re-captured; a path naming ops under two paths there is refused."""
    out: dict[str, str] = {}
    for mine, theirs in zip(ours.fwd, captured.fwd, strict=True):
        if out.setdefault(mine.module_path, theirs.module_path) != theirs.module_path:
            raise ConfigError("micro_batch", captured.name, f"the re-captured {captured.name} names the ops of "
                              f"{mine.module_path or '<root>'} under two module paths, {out[mine.module_path]} and "
                              f"{theirs.module_path}; its configs cannot be carried over")
    return out


def front_end_stage_repeated_flops(job: Job, plan: LoweredPlan, compilations: Sequence[tuple[Job, LoweredPlan]],
                                   source_of: Sequence[int]) -> float:
    """compile.shape_front_end.front_end_repeated_flops of a plan whose stages run their own meshes, in the job's
    units (per device of the job's tp and per micro-batch of its replicas): each of a stage's tp_s devices runs
    its shaped instances for each of its micro-batches of micro_batch_s samples, so over the iteration it runs
    tp_s / tp x micro_batch / micro_batch_s of them per device of the job's tp and micro-batch; less 1/tp of the
    job's whole capture of the same instances (which the model FLOPs count)."""
    par = job.parallel
    total = 0.0
    for index, (mesh_job, mesh_plan) in enumerate(compilations):
        mesh = mesh_job.parallel
        scale = mesh.tp * par.micro_batch / mesh.micro_batch
        shaped = shape_layers(mesh_job, mesh_plan)
        total += sum((scale * new.run_flops() - old.run_flops()) / par.tp
                     for old, new in zip(plan.layers, shaped.layers, strict=True)
                     if source_of[old.stage] == index)
    return total
