"""Pass: shape each layer instance's ops from its computation configs over tp (Proteus Sec. IV-B: a split on any
op takes effect; Sec. V-A: an op's cost follows its partition).

The OpGraph's ops are one device's under Megatron's tensor split. A strategy tree may split any op of a block's
attention or MLP, the embedding's lookup, the head's vocabulary projection or its cross-entropy Megatron's way
over fewer ranks d dividing tp, or leave it unsplit (d = 1; strategy.megatron.op_degrees): each rank then runs 1/d
of that op, so the layer instance is rebuilt by the catalog builders with that op at degree d
(frontends.catalog.transformer block_layer, embedding_layer, head_layer): it does 1/d of the op's FLOPs, holds
1/d of its weight (and with it of the gradient, optimizer states and data-parallel gradient volume), keeps the
activations of its backward at that share, and the layer's collectives are those the resharding between the
configs inserts (compile.splits.plan_mesh_comms; over a sub-group of d ranks where the layout change spans it).
Instances with the same degrees share one rebuilt layer; a plan whose configs are Megatron's everywhere is
returned as it is.
"""

import dataclasses
from collections.abc import Container

from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import block_layer, embedding_layer, head_layer
from trainsim.ir.graph import Layer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LayerAssignment, LoweredPlan
from trainsim.strategy.megatron import UNSPLIT, Degrees, op_degrees
from trainsim.strategy.placement import OpConfig


def shape_layers(job: Job, plan: LoweredPlan) -> LoweredPlan:
    """The plan with every layer instance some of whose attention, MLP, lookup or vocabulary ops take their own
    tp degree rebuilt for that (module doc); the plan itself where there is none, and where stages run their own
    meshes (each stage's layers are shaped for its mesh: compile.stage_meshes)."""
    if job.parallel.tp == 1 or not plan.mesh_splits or not isinstance(job.model, TransformerSpec) \
            or plan.stage_meshes:
        return plan
    configs: dict[int, dict[str, OpConfig]] = {}  # layer index -> op module path -> its config over tp
    for s in plan.mesh_splits:
        if s.axis == "tp":
            configs.setdefault(s.layer, {})[s.module_path] = s.config
    dev = DeviceSlice.of(job.parallel)
    built: dict[tuple[int, Degrees], Layer] = {}
    assignments = list(plan.layers)
    for position, a in enumerate(plan.layers):
        given = configs.get(a.index, {})
        degrees = op_degrees(a.layer.fwd, dev, lambda op, g=given: g.get(op.module_path, UNSPLIT))
        if not degrees:
            continue
        key = (id(a.layer), degrees)
        layer = built.get(key)
        if layer is None:
            layer = built[key] = _rebuilt(job.model, dev, a.layer, degrees)
        assignments[position] = dataclasses.replace(a, layer=layer)
    _check_tied(job.model, dev, built)
    return dataclasses.replace(plan, layers=tuple(assignments)) if built else plan


def _check_tied(spec: TransformerSpec, dev: DeviceSlice, built: dict[tuple[int, Degrees], Layer]) -> None:
    """A model whose head projects with the embedding's table (tied embeddings) holds that table one way: the
    lookup and the vocabulary projection over one tp degree (Megatron's vocab-parallel table: tp; 1: whole)."""
    if not spec.tied_embeddings:
        return
    given = {layer.kind: dict(degrees) for (_, degrees), layer in built.items()}
    lookup, logits = given.get("embedding", {}).get("lookup", dev.tp), given.get("head", {}).get("logits", dev.tp)
    if lookup != logits:
        raise ConfigError("split.compute@tp", "nothing", f"{spec.name} ties its embedding table to the head's "
                          "projection: split embedding.tokens (reduce) and head.proj (out) over tp alike, or "
                          "neither")


def _rebuilt(spec: TransformerSpec, dev: DeviceSlice, layer: Layer, degrees: Degrees) -> Layer:
    """The layer with the ops in `degrees` at their own tp degrees, checked to hold the same ops as the plan's."""
    if layer.kind == "embedding":
        rebuilt = embedding_layer(spec, dev, degrees)
    elif layer.kind == "head":
        rebuilt = head_layer(spec, dev, degrees)
    else:
        rebuilt = block_layer(spec, dev, layer.count, layer.kind == "moe_block", degrees)
    if [op.name for op in rebuilt.fwd] != [op.name for op in layer.fwd]:
        raise ConfigError("split.compute@tp", "nothing", f"the catalog {layer.kind} of {spec.name} has other ops "
                          f"than the plan's {layer.name}; running its {', '.join(sorted(n for n, _ in degrees))} at "
                          "their own tp degrees needs the catalog front-end's graph")
    return rebuilt


def repeated_flops(job: Job, plan: LoweredPlan) -> float:
    """The FLOPs one device runs per micro-batch beyond its share of the model's: the modules a plan runs whole
    on every tp rank, forward, backward and what recompute repeats of them (hardware FLOPs, HFU, count them; model
    FLOPs, MFU, do not). 0 for a plan with Megatron's splits everywhere. (A plan with stage meshes:
    compile.stage_meshes.stage_repeated_flops.)"""
    return added_flops(plan, shape_layers(job, plan))


def added_flops(plan: LoweredPlan, shaped: LoweredPlan, stages: Container[int] | None = None) -> float:
    """What the shaped plan's layer instances (on `stages`; None: all) run per micro-batch beyond the plan's."""
    if shaped is plan:
        return 0.0
    return sum(_run_flops(new) - _run_flops(old) for old, new in zip(plan.layers, shaped.layers, strict=True)
               if new.layer is not old.layer and (stages is None or old.stage in stages))


def _run_flops(a: LayerAssignment) -> float:
    """One micro-batch through a layer instance: forward, backward and its recompute."""
    return a.layer.flops("fwd") + a.layer.flops("bwd") + a.layer.recomputed_flops(a.recompute)
