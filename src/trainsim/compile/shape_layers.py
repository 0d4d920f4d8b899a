"""Pass: shape each layer instance's ops from its computation configs over tp (Proteus Sec. IV-B: a split on any
op takes effect; Sec. V-A: an op's cost follows its partition).

The OpGraph's ops are one device's under Megatron's tensor split. A strategy tree may give any op of a block's attention
or MLP, the head's vocabulary projection or its cross-entropy a config of its own over tp ((batch, seq, out, reduce)
parts dividing tp), a block's norms and residual adds, the head's norm, the learned positions and BERT's token types and
embedding norm a batch, sequence or hidden-feature split, and the embedding's lookup Megatron's split over fewer ranks d
dividing tp, by tokens, or none (strategy.megatron.own_configs): the layer instance is rebuilt by the catalog builders
with each such op at its config (frontends.catalog.transformer block_layer, embedding_layer, head_layer): it runs the op
on its share of the tokens and features (its FLOPs and bytes), holds 1/(out x reduce) of its weight (and with it of the
gradient, optimizer states and data-parallel gradient volume), keeps the activations of its backward at that share, and
the layer's collectives are those the resharding between the configs inserts (compile.splits.plan_mesh_comms; over a
sub-group of ranks where the layout change spans fewer than tp). Instances with the same configs share one rebuilt
layer; a plan whose configs are Megatron's everywhere is returned as it is.

An MoE's experts (strategy.megatron: Megatron-Core's expert tensor parallelism) at degree d run the routed
copies of their d ranks' tokens under sp (all the micro-batch's without sp) and hold 1/d of each of their ep
share of experts. Every MoE layer's experts (at d = tp too) sum their gradient over Megatron-Core's expert
data-parallel ranks where those are not the data-parallel group (ep > 1, or d < tp under sp, where the tp / d
groups of a tp group ran other tokens through the same experts: expert_grad_groups, strategy.expert_groups).
"""

import dataclasses
from collections.abc import Container

from trainsim.compile.shape_front_end import front_end_repeated_flops, shape_front_end_layers
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import block_layer, embedding_layer, head_layer
from trainsim.ir.graph import Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.expert_groups import expert_data_ranks, experts_own_group
from trainsim.strategy.lowered import LoweredPlan, default_plan
from trainsim.strategy.megatron import UNSPLIT, TpConfigs, own_configs
from trainsim.strategy.placement import OpConfig


def shape_layers(job: Job, plan: LoweredPlan) -> LoweredPlan:
    """The plan with every layer instance some of whose attention, MLP, expert, lookup or vocabulary ops take
    their own config over tp rebuilt for that (module doc); the plan itself where there is none, and where stages
    run their own meshes (each stage's layers are shaped for its mesh: compile.stage_meshes)."""
    if plan.frontend != "catalog":  # a captured graph: one device's whole model, shaped generically
        return shape_front_end_layers(job, plan)
    if job.parallel.tp == 1 or not plan.mesh_splits or not isinstance(job.model, TransformerSpec) \
            or plan.stage_meshes:
        return plan
    dev = DeviceSlice.of(job.parallel, job.stack)
    built: dict[tuple[int, TpConfigs], Layer] = {}
    assignments = list(plan.layers)
    for position, (a, own) in enumerate(zip(plan.layers, _layer_configs(plan, dev), strict=True)):
        if not own:
            continue
        key = (id(a.layer), own)
        layer = built.get(key)
        if layer is None:
            layer = built[key] = _rebuilt(job.model, dev, a.layer, own)
        assignments[position] = dataclasses.replace(a, layer=layer)
    _check_tied(job.model, dev, built)
    return dataclasses.replace(plan, layers=tuple(assignments)) if built else plan


def shaped_graph(job: Job, graph: OpGraph, plan: LoweredPlan) -> OpGraph:
    """shaped_graph_and_repeated_flops's graph."""
    return shaped_graph_and_repeated_flops(job, graph, plan)[0]


def shaped_graph_and_repeated_flops(job: Job, graph: OpGraph, plan: LoweredPlan) -> tuple[OpGraph, float]:
    """The graph with its layers as the plan's configs over tp shape them (shape_layers), for the closed-form
    engine, which places layers evenly and prices each layer once for all its instances: the plan must be the
    strategy's default plan but for its ops' configs over tp, and give every instance of a layer the same.
    NB: the closed form sums an MoE's experts' gradient over their expert data-parallel group, as the simulator
    (Layer.experts: Pricer.gradient_queues), but the weights of matmuls split by tokens over tp over the
    data-parallel group (the simulator sums those over dp x their token parts:
    compile.splits.plan_tp_token_params). With it, the plan's repeated_flops (the layers shaped once for both)."""
    default = default_plan(graph, job.parallel)
    if dataclasses.replace(plan, mesh_splits=default.mesh_splits) != default:
        raise ConfigError("engine", "analytical", "places layers, schedules, recomputes and splits over dp as the "
                          "strategy does; a tree that sets any of those needs --engine sim (the analytical engine "
                          "takes a tree's ops' configs over tp)")
    shaped = shape_layers(job, plan)
    if shaped is plan:
        return graph, 0.0
    by_layer: dict[int, Layer] = {}  # id of a graph layer -> its instances' shaped layer
    for old, new in zip(plan.layers, shaped.layers, strict=True):
        if by_layer.setdefault(id(old.layer), new.layer) is not new.layer:
            raise ConfigError("engine", "analytical", f"prices each layer once for all its instances; the tree "
                              f"splits the instances of {old.layer.name} over tp differently: use --engine sim")
    return (dataclasses.replace(graph, layers=tuple(by_layer.get(id(layer), layer) for layer in graph.layers)),
            _repeated(job, plan, shaped))


def _layer_configs(plan: LoweredPlan, dev: DeviceSlice) -> list[TpConfigs]:
    """Per layer instance of the plan (in its order), the ops its configs over tp give a config of their own
    (strategy.megatron.own_configs)."""
    configs = plan.tp_configs()
    out: list[TpConfigs] = []
    for a in plan.layers:
        given = configs.get(a.index, {})
        out.append(own_configs(a.layer.fwd, dev, lambda op, g=given: g.get(op.module_path, UNSPLIT)))
    return out


def expert_grad_groups(job: Job, plan: LoweredPlan) -> dict[int, tuple[float, tuple[int, ...]]]:
    """Per layer index of an MoE block whose experts' expert data-parallel group is not the data-parallel group
    (strategy.expert_groups: ep > 1, or experts a tree splits over d < tp ranks under sp): the expert parameters
    one rank holds (Layer.experts: the router's share left out, its gradient summed over the data-parallel group)
    and rank 0's expert data-parallel group, the ranks that sum their gradient (world / (etp x ep x pp) of them:
    initialize_model_parallel, megatron/core/parallel_state.py, megatron-core 0.16.1)."""
    par = job.parallel
    out: dict[int, tuple[float, tuple[int, ...]]] = {}
    for a in plan.layers:
        experts = a.layer.experts
        if experts is None or not experts_own_group(par, experts.tp_degree):
            continue
        if any(s.layer == a.index for s in plan.op_splits):
            raise ConfigError("split.compute@tp", experts.tp_degree, f"layer {a.index} ({a.layer.name}): an MoE's "
                              "experts in their own expert data-parallel group and computation configs over dp in "
                              "one layer are not combined")
        out[a.index] = (experts.params, expert_data_ranks(par, experts.tp_degree))
    return out


def _check_tied(spec: TransformerSpec, dev: DeviceSlice, built: dict[tuple[int, TpConfigs], Layer]) -> None:
    """A model whose head projects with the embedding's table (tied embeddings) holds that table one way: the
    lookup's rows and the projection's output (the vocabulary) split over one tp degree, the projection's
    reduction (the hidden features) and tokens not (Megatron's vocab-parallel table: tp; 1: whole, as a lookup by
    tokens holds it)."""
    if not spec.tied_embeddings:
        return
    given = {layer.kind: dict(own) for (_, own), layer in built.items()}
    lookup = given.get("embedding", {}).get("lookup", OpConfig(1, 1, 1, dev.tp))
    logits = given.get("head", {}).get("logits", OpConfig(1, 1, dev.tp, 1))
    if logits != OpConfig(1, 1, lookup.reduce, 1):
        raise ConfigError("split.compute@tp", "nothing", f"{spec.name} ties its embedding table to the head's "
                          "projection: split embedding.tokens (reduce) and head.proj (out) over tp alike, or "
                          "neither (a lookup by tokens holds the whole table: head.proj whole)")


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
    return _repeated(job, plan, shape_layers(job, plan))


def _repeated(job: Job, plan: LoweredPlan, shaped: LoweredPlan) -> float:
    if plan.frontend != "catalog":
        return front_end_repeated_flops(plan, shaped, job.parallel.tp * job.parallel.cp)
    return added_flops(plan, shaped)


def added_flops(plan: LoweredPlan, shaped: LoweredPlan, stages: Container[int] | None = None) -> float:
    """What the shaped plan's layer instances (on `stages`; None: all) run per micro-batch beyond the plan's."""
    if shaped is plan:
        return 0.0
    return sum(new.run_flops() - old.run_flops() for old, new in zip(plan.layers, shaped.layers, strict=True)
               if new.layer is not old.layer and (stages is None or old.stage in stages))
