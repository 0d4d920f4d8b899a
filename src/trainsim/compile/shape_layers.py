"""Pass: shape each layer instance's ops from its computation configs over tp (Proteus Sec. IV-B: a split on any
op takes effect; Sec. V-A: an op's cost follows its partition).

The OpGraph's ops are one device's under Megatron's tensor split. A strategy tree may give any op of a block's
attention or MLP, the head's vocabulary projection or its cross-entropy a config of its own over tp ((batch, seq,
out, reduce) parts dividing tp), and the embedding's lookup Megatron's split over fewer ranks d dividing tp, or
none (strategy.megatron.own_configs): the layer instance is rebuilt by the catalog builders with each such op at
its config (frontends.catalog.transformer block_layer, embedding_layer, head_layer): it runs the op on its share
of the tokens and features (its FLOPs and bytes), holds 1/(out x reduce) of its weight (and with it of the
gradient, optimizer states and data-parallel gradient volume), keeps the activations of its backward at that
share, and the layer's collectives are those the resharding between the configs inserts
(compile.splits.plan_mesh_comms; over a sub-group of ranks where the layout change spans fewer than tp).
Instances with the same configs share one rebuilt layer; a plan whose configs are Megatron's everywhere is
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
from trainsim.strategy.megatron import UNSPLIT, TpConfigs, own_configs
from trainsim.strategy.placement import OpConfig


def shape_layers(job: Job, plan: LoweredPlan) -> LoweredPlan:
    """The plan with every layer instance some of whose attention, MLP, lookup or vocabulary ops take their own
    config over tp rebuilt for that (module doc); the plan itself where there is none, and where stages run their
    own meshes (each stage's layers are shaped for its mesh: compile.stage_meshes)."""
    if job.parallel.tp == 1 or not plan.mesh_splits or not isinstance(job.model, TransformerSpec) \
            or plan.stage_meshes:
        return plan
    configs: dict[int, dict[str, OpConfig]] = {}  # layer index -> op module path -> its config over tp
    for s in plan.mesh_splits:
        if s.axis == "tp":
            configs.setdefault(s.layer, {})[s.module_path] = s.config
    dev = DeviceSlice.of(job.parallel)
    built: dict[tuple[int, TpConfigs], Layer] = {}
    assignments = list(plan.layers)
    for position, a in enumerate(plan.layers):
        given = configs.get(a.index, {})
        own = own_configs(a.layer.fwd, dev, lambda op, g=given: g.get(op.module_path, UNSPLIT))
        if not own:
            continue
        key = (id(a.layer), own)
        layer = built.get(key)
        if layer is None:
            layer = built[key] = _rebuilt(job.model, dev, a.layer, own)
        assignments[position] = dataclasses.replace(a, layer=layer)
    _check_tied(job.model, dev, built)
    return dataclasses.replace(plan, layers=tuple(assignments)) if built else plan


def _check_tied(spec: TransformerSpec, dev: DeviceSlice, built: dict[tuple[int, TpConfigs], Layer]) -> None:
    """A model whose head projects with the embedding's table (tied embeddings) holds that table one way: the
    lookup's rows and the projection's output (the vocabulary) split over one tp degree, the projection's
    reduction (the hidden features) and tokens not (Megatron's vocab-parallel table: tp; 1: whole)."""
    if not spec.tied_embeddings:
        return
    given = {layer.kind: dict(own) for (_, own), layer in built.items()}
    lookup = given.get("embedding", {}).get("lookup", OpConfig(1, 1, 1, dev.tp))
    logits = given.get("head", {}).get("logits", OpConfig(1, 1, dev.tp, 1))
    if logits != OpConfig(1, 1, lookup.reduce, 1):
        raise ConfigError("split.compute@tp", "nothing", f"{spec.name} ties its embedding table to the head's "
                          "projection: split embedding.tokens (reduce) and head.proj (out) over tp alike, or "
                          "neither")


def _rebuilt(spec: TransformerSpec, dev: DeviceSlice, layer: Layer, own: TpConfigs) -> Layer:
    """The layer with the ops in `own` at their own configs over tp, checked to hold the same ops as the plan's."""
    if layer.kind == "embedding":
        rebuilt = embedding_layer(spec, dev, own)
    elif layer.kind == "head":
        rebuilt = head_layer(spec, dev, own)
    else:
        rebuilt = block_layer(spec, dev, layer.count, layer.kind == "moe_block", own)
    if [op.name for op in rebuilt.fwd] != [op.name for op in layer.fwd]:
        raise ConfigError("split.compute@tp", "nothing", f"the catalog {layer.kind} of {spec.name} has other ops "
                          f"than the plan's {layer.name}; running its {', '.join(sorted(n for n, _ in own))} at "
                          "their own configs over tp needs the catalog front-end's graph")
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
