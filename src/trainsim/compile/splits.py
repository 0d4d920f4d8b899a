"""Pass: apply a strategy tree's computation configs (split item "compute") and insert the resharding they need.

Proteus (Sec. II-A, IV-B, V-A, VII): an op's computation config partitions its batch (b), sequence (s), output
(o) and reduction (h) dimensions; the tensors it reads and writes take the placement that config implies, and
where a producer's placement differs from what its consumer needs, the compiler inserts the collectives of the
strategy transformation (strategy.reshard). An op without a config infers it from its input's placement
(propagation along data dependencies, Sec. VII): it keeps the input's batch, sequence and feature splits, a
matmul or convolution reading a feature-split input splits its reduction dimension, and a partial sum is added
up (all-reduce) before any op that is not a matmul reads it; layer norms and the loss read whole features
(BatchNorm normalises each channel, so a channel split passes through it).

The configs partition the stage's data-parallel ranks (the group: dp devices that the plain strategy splits
by batch, which is every tensor's placement where no config applies). Each op's per-device work is the
graph's per-device op scaled by dp / (b s o h): what one of the group's devices computes; op times come from
the pricer (task_level "op") or scale the layer's price by the ratio of op times (task_level "layer"), so
unsplit layers keep their calibrated prices. NB: ops are taken as a chain in forward order (the tensor an op
reads is the one its predecessor wrote), which holds for the transformer, VGG and ResNet main paths and is an
approximation for Inception's parallel branches.

Backward: the gradient of an op's input is placed as the op read the input, partial over the devices that
split its output dimension; the gradient its producer reads is placed as the producer's output, whole. Their
reshard follows the op's input-gradient op (Megatron-LM's conjugate pairs fall out: an all-gather before a
column split pairs with a reduce-scatter after its backward, an all-reduce of partial sums with none). Each
reshard also copies on the host (the parts laid out for the collective and back, strategy.reshard_copies), in
the forward after the op before and in the backward after the input-gradient op: SplitCopy, priced as a copy op.

A split op's weight is held and synced in 1/(o h) parts (a lookup's table in 1/o): grad_params, which
the model states (apply_zero.stage_model_state) and the data-parallel gradient sync count. Each part's gradient
is summed only over the ranks that hold that part, G / (o h) of the group's G (grad_params_by_ranks; Proteus
Sec. V-A: a parameter's gradient is synchronised among its replicas): none where every rank holds its own part
(o h = G, as torch DDP leaves out a parameter that no other rank holds). NB: the weight's
memory config is its computation config unless a weight split (item "weight", dims out / reduce) stores it
finer: then it is gathered for compute and its gradient reduce-scattered back (_weight_memory), the Proteus
memory config; ZeRO's flat split stays apply_zero's.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainsim.errors import ConfigError
from trainsim.hardware.device import BYTES_PER_DTYPE, DType
from trainsim.ir.graph import COPY_OP, Comm, Layer, Op, Phase
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LayerAssignment, LoweredPlan, OpSplit
from trainsim.strategy.megatron import UNSPLIT, Axis, layer_comms, token_split_params
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import (
    CONTRACTING,
    OpConfig,
    Placement,
    input_grad_placement,
    input_placement,
    output_grad_placement,
    output_placement,
)
from trainsim.strategy.reshard import ReshardStep, reshard
from trainsim.strategy.reshard_copies import reduce_gradients_copy_bytes, reshard_copies
from trainsim.strategy.stack import StackSpec

WHOLE_FEATURE = ("norm", "loss")  # ops that read whole features


@dataclass(frozen=True, slots=True)
class SplitComm:
    """A reshard collective, run after the op named `after` (a forward or backward op of the layer)."""

    after: str
    phase: str  # fwd | bwd
    step: ReshardStep
    tensor: str  # what moves, for the task name


@dataclass(frozen=True, slots=True)
class SplitCopy:
    """Host memory copies of a reshard (strategy.reshard_copies: the parts laid out for the collective and back),
    run on the compute stream after the op named `after`, before the reshard's collective."""

    after: str
    phase: Phase
    copy_bytes: float  # bytes one device copies (each read once and written once)
    dtype: DType

    def op(self) -> Op:
        """The copy as a memory-bound op for the op-cost model (its profiled "copy" kernel, else the roofline):
        each byte read and written once."""
        elements = max(1, round(self.copy_bytes / BYTES_PER_DTYPE[self.dtype]))
        return Op(COPY_OP, "elementwise", "reshard", self.phase, self.dtype, 0.0, 2.0 * self.copy_bytes, (elements,))


@dataclass(slots=True)
class LayerSplit:
    """What the configs make of one layer instance."""

    configs: dict[str, OpConfig] = field(default_factory=dict)  # forward op name -> its config
    modules: dict[str, OpConfig] = field(default_factory=dict)  # module path -> its first forward op's config
    comms: list[SplitComm] = field(default_factory=list)
    copies: list[SplitCopy] = field(default_factory=list)
    grad_params: float = 0.0  # parameters whose gradient one device syncs (the layer's, less split weights)
    held_params: float = 0.0  # parameters one device stores
    # of grad_params, those whose gradient is summed over n ranks (n -> parameters; n = 1: no collective)
    grad_params_by_ranks: dict[int, float] = field(default_factory=dict)

    def key(self) -> tuple[object, ...]:
        return (tuple(self.configs.items()), tuple(self.comms), tuple(self.copies), self.grad_params,
                tuple(sorted(self.grad_params_by_ranks.items())))

    def move_grad(self, params: float, group: int, parts: int) -> None:
        """`params` of the whole-group sync (over `group` ranks) become one of `parts` parts: synced over the
        group / parts ranks that hold the same part."""
        by_ranks = self.grad_params_by_ranks
        by_ranks[group] = by_ranks.get(group, 0.0) - params
        by_ranks[group // parts] = by_ranks.get(group // parts, 0.0) + params / parts


def plan_splits(plan: LoweredPlan, group: int) -> dict[int, LayerSplit]:
    """Per expanded layer index, the configs, collectives and gradient volume of the plan's op splits over a
    group of `group` data-parallel ranks ({} when the plan has none: the compiler's plain path)."""
    if not plan.op_splits:
        return {}
    given = _given(plan.op_splits)
    out: dict[int, LayerSplit] = {}
    placement = Placement(group, batch=group)
    in_bytes = 0.0
    previous: tuple[LayerSplit, str] | None = None  # the instance and op before the next op
    for a in plan.layers:
        if a.index in plan.chain_starts:  # entered across a cross-mesh transfer: each replica's whole samples
            placement = Placement(group, batch=group)
        split = out[a.index] = LayerSplit(grad_params=a.layer.param_count, held_params=a.layer.param_count,
                                          grad_params_by_ranks={group: a.layer.param_count})
        for op in a.layer.fwd:
            op_split = given.get((a.index, op.module_path))
            compute = op_split if op_split is not None and op_split.has_compute else None
            config, need, produced = _op_config(op, placement, compute, group, a)
            full_in = (in_bytes or op_input_bytes(op)) * group
            for step in reshard(placement, need, full_in):
                if previous is not None:
                    previous[0].comms.append(SplitComm(previous[1], "fwd", step, f"into {op.name}"))
            grad_in = input_grad_placement(need, config, op.kind in CONTRACTING)
            for step in reshard(grad_in, output_grad_placement(placement), full_in):
                split.comms.append(SplitComm(_last_bwd(a.layer, op), "bwd", step, f"grad of {op.name} input"))
            _add_copies(op, config, placement, need, full_in, split, previous, _last_bwd(a.layer, op))
            split.configs[op.name] = config
            if op.kind in CONTRACTING and config.out * config.reduce > 1:
                shed = weight_params(op) * (1.0 - 1.0 / (config.out * config.reduce))
                split.grad_params -= shed
                split.held_params -= shed
                split.move_grad(weight_params(op), group, config.out * config.reduce)
            if op_split is not None and (op_split.weight_out or op_split.weight_reduce):
                _weight_memory(op, config, op_split, group, a, split, previous)
            split.modules.setdefault(op.module_path, config)
            placement, in_bytes = produced, op_output_bytes(op)
            previous = (split, op.name)
        split.grad_params -= _table_share(a.layer, split)
        split.held_params -= _table_share(a.layer, split)
        _move_table_grads(a.layer, split, group)
        in_bytes = a.layer.output_bytes or in_bytes  # what the layer hands on (all of DLRM's lookups, say)
    return out


def plan_mesh_comms(plan: LoweredPlan, model: ModelSpec, par: ParallelSpec, stack: StackSpec | None = None
                    ) -> dict[int, tuple[Comm, ...]]:
    """Per expanded layer index, the feature collectives that resharding between its ops' computation configs
    over tp, cp and ep inserts (strategy.megatron.layer_comms; {} when the plan carries none), an MoE block's
    token dispatch as the stack's dispatcher runs it (StackSpec.moe_dispatcher). Layer instances with equal
    configs share one tuple (BuildContext.timing caches by it)."""
    if not plan.mesh_splits:
        return {}
    if not isinstance(model, TransformerSpec):
        raise ConfigError("split.axis", "tp | cp | ep", f"model-parallel splits apply to transformers, not "
                          f"{model.name}")
    configs: dict[int, dict[tuple[str, Axis], OpConfig]] = {}
    for s in plan.mesh_splits:
        configs.setdefault(s.layer, {})[(s.module_path, s.axis)] = s.config
    dev = DeviceSlice.of(par, stack)
    derived: dict[tuple[object, ...], tuple[Comm, ...]] = {}
    out: dict[int, tuple[Comm, ...]] = {}
    for a in plan.layers:
        given = configs.get(a.index, {})
        key = (id(a.layer), tuple(given.items()))
        comms = derived.get(key)
        if comms is None:
            comms = derived[key] = layer_comms(model, dev, a.layer.kind, a.layer.fwd, given)
        out[a.index] = comms
    return out


def plan_tp_token_params(plan: LoweredPlan, model: ModelSpec, par: ParallelSpec) -> dict[int, dict[int, float]]:
    """Per expanded layer index, {k: parameters} of its matmuls whose config over tp splits their tokens k ways
    (strategy.megatron.token_split_params: their gradient is summed over those k tp ranks too); {} where none.
    A captured graph's shaped plan carries its own (compile.shape_front_end)."""
    if plan.front_end_token_params:
        captured: dict[int, dict[int, float]] = {}
        for index, parts, params in plan.front_end_token_params:
            captured.setdefault(index, {})[parts] = params
        return captured
    if par.tp == 1 or not plan.mesh_splits or not isinstance(model, TransformerSpec):
        return {}
    configs, dev = plan.tp_configs(), DeviceSlice.of(par)
    out: dict[int, dict[int, float]] = {}
    for a in plan.layers:
        given = configs.get(a.index, {})
        shared = token_split_params(model, a.layer.fwd, lambda op, g=given: g.get(op.module_path, UNSPLIT), dev)
        if shared:
            out[a.index] = shared
    return out


def _given(op_splits: tuple[OpSplit, ...]) -> Mapping[tuple[int, str], OpSplit]:
    return {(s.layer, s.module_path): s for s in op_splits}


def _op_config(op: Op, placement: Placement, given: OpSplit | None, group: int,
               a: LayerAssignment) -> tuple[OpConfig, Placement, Placement]:
    """(the op's config, the input placement it needs, the output placement it makes)."""
    contracting = op.kind in CONTRACTING
    if given is None:
        return inferred_config(op, placement, group)
    where = f"split.compute at layer {a.index} ({a.layer.name}) {op.module_path}"
    if given.reduce > 1 and not contracting:
        raise ConfigError(f"{where}.reduce", given.reduce, f"a {op.kind} op has no reduction dimension; "
                          f"split reduce on a matmul or conv")
    seq, out, red = given.seq or 1, given.out or 1, given.reduce or 1
    rest = seq * out * red
    if group % rest != 0:
        raise ConfigError(where, f"seq={seq} out={out} reduce={red}",
                          f"the parts must divide the data-parallel group of {group} ranks")
    batch = given.batch or group // rest
    config = OpConfig(batch, seq, out, red)
    if group % config.parts != 0:
        raise ConfigError(where, f"batch={batch} seq={seq} out={out} reduce={red}",
                          f"the parts must divide the data-parallel group of {group} ranks")
    return config, input_placement(config, group, contracting), output_placement(config, group, contracting)


def inferred_config(op: Op, placement: Placement, group: int) -> tuple[OpConfig, Placement, Placement]:
    """(config, input placement it needs, output placement it makes) of an op without a config, from its input's
    placement (Proteus Sec. VII; module doc): batch, sequence and feature splits kept, a matmul or conv reading
    split features splits its reduction, partial sums added up first, norms (not BatchNorm) and the loss read
    whole features."""
    feature = 1 if op.kind in WHOLE_FEATURE and not _per_channel(op) else placement.feature
    need = Placement(group, placement.batch, placement.seq, feature)
    if op.kind in CONTRACTING:
        config = OpConfig(need.batch, need.seq, 1, need.feature)
        return config, need, Placement(group, need.batch, need.seq, 1, need.feature)
    return OpConfig(need.batch, need.seq, need.feature, 1), need, need


def _add_copies(op: Op, config: OpConfig, placement: Placement, need: Placement, full_in: float, split: LayerSplit,
                previous: tuple[LayerSplit, str] | None, grad_site: str) -> None:
    """The host copies of op's input reshard (strategy.reshard_copies): the forward's after the op before (where
    its collectives run), the backward's where the input's gradient is complete. An output-split op reading its
    input as placed clones the input's gradient for its all-reduce instead."""
    if previous is None:  # the job's input: each rank reads its part of the batch, nothing is resharded
        return
    copies = reshard_copies(placement, need, full_in)
    if copies.fwd_bytes > 0.0:
        previous[0].copies.append(SplitCopy(previous[1], "fwd", copies.fwd_bytes, op.dtype))
    bwd_bytes = copies.bwd_bytes
    if placement == need and op.kind in CONTRACTING and config.out > 1:
        bwd_bytes += reduce_gradients_copy_bytes(need, full_in)
    if bwd_bytes > 0.0:
        split.copies.append(SplitCopy(grad_site, "bwd", bwd_bytes, op.dtype))


def _weight_memory(op: Op, config: OpConfig, given: OpSplit, group: int, a: LayerAssignment, split: LayerSplit,
                   previous: tuple[LayerSplit, str] | None) -> None:
    """A weight stored finer than its computation config (Proteus Sec. II-A, memory config; ZeRO-3): gathered
    to the computation placement before the forward and again before the input gradient, its gradient reduced
    to the stored placement after the weight gradient (per micro-batch, as FSDP without no_sync), so it leaves
    the data-parallel sync. Weight dims: reduce as seq, out as feature of a Placement."""
    where = f"split.weight at layer {a.index} ({a.layer.name}) {op.module_path}"
    if op.kind not in CONTRACTING:
        raise ConfigError(where, op.kind, "a weight memory config needs a matmul or conv (an op with a weight)")
    mem_out, mem_red = given.weight_out or config.out, given.weight_reduce or config.reduce
    if mem_out % config.out or mem_red % config.reduce or group % (mem_out * mem_red):
        raise ConfigError(where, f"out={mem_out} reduce={mem_red}", f"must refine the computation config (out="
                          f"{config.out} reduce={config.reduce}) and divide the group of {group} ranks")
    compute = Placement(group, seq=config.reduce, feature=config.out)
    memory = Placement(group, seq=mem_red, feature=mem_out)
    full = weight_params(op) * _elem(op)
    before_fwd = previous if previous is not None else (split, op.name)
    for step in reshard(memory, compute, full):
        before_fwd[0].comms.append(SplitComm(before_fwd[1], "fwd", step, f"weight of {op.name}"))
        split.comms.append(SplitComm(_before_bwd(a.layer, op), "bwd", step, f"weight of {op.name}"))
    grad = Placement(group, seq=config.reduce, feature=config.out, partial=compute.replicas)
    wgrad = f"{op.name}.wgrad" if any(b.name == f"{op.name}.wgrad" for b in a.layer.bwd) else _last_bwd(a.layer, op)
    for step in reshard(grad, memory, full):
        split.comms.append(SplitComm(wgrad, "bwd", step, f"weight grad of {op.name}"))
    per_device = weight_params(op) / (config.out * config.reduce)
    split.grad_params -= per_device
    sync = group // (config.out * config.reduce)
    split.grad_params_by_ranks[sync] = split.grad_params_by_ranks.get(sync, 0.0) - per_device
    split.held_params -= per_device - weight_params(op) / (mem_out * mem_red)


def _before_bwd(layer: Layer, op: Op) -> str:
    """The backward op after which op's input-gradient op runs (the gather of its weight goes there)."""
    names = [b.name for b in layer.bwd]
    target = f"{op.name}.dgrad" if f"{op.name}.dgrad" in names else _last_bwd(layer, op)
    index = names.index(target) if target in names else 0
    return names[index - 1] if index > 0 else target


def _table_share(layer: Layer, split: LayerSplit) -> float:
    """Embedding-table parameters a device no longer holds: the layer's tables taken as equal shares of its
    parameters, each lookup's split by its out parts. NB: exact when every table of the layer is split alike
    (the op graph does not keep per-table sizes)."""
    lookups = [op for op in layer.fwd if op.kind == "embedding"]
    if not lookups:
        return 0.0
    share = layer.param_count / len(lookups)
    return sum(share * (1.0 - 1.0 / split.configs[op.name].out) for op in lookups if op.name in split.configs)


def _move_table_grads(layer: Layer, split: LayerSplit, group: int) -> None:
    """Each split lookup's table share (as _table_share) is synced over the group / out ranks holding its
    columns."""
    lookups = [op for op in layer.fwd if op.kind == "embedding"]
    for op in lookups:
        config = split.configs.get(op.name)
        if config is not None and config.out > 1:
            split.move_grad(layer.param_count / len(lookups), group, config.out)


def _per_channel(op: Op) -> bool:
    """BatchNorm (torchvision's bn* modules; a captured graph's batch-norm kernels: is_batch_norm) normalises each
    channel alone, so a channel split passes through; layer and RMS norms read whole features."""
    return op.module_path.rsplit(".", 1)[-1].startswith("bn") or is_batch_norm(op)


def is_batch_norm(op: Op) -> bool:
    """A batch norm kernel (alone or heading a fused group): statistics per channel, none across a channel split."""
    return op.kind == "norm" and "batch_norm" in op.name


def _scale(config: OpConfig, group: int) -> float:
    """One device's share of the op under the config, over its share in the plain data-parallel graph."""
    return group / config.parts


def _last_bwd(layer: Layer, op: Op) -> str:
    """The backward op after which the gradient of op's input is complete: op's input-gradient op, else the
    last backward op of op's module, else the layer's last backward op."""
    names = [b.name for b in layer.bwd]
    if f"{op.name}.dgrad" in names:
        return f"{op.name}.dgrad"
    same = [b.name for b in layer.bwd if b.module_path == op.module_path]
    return same[-1] if same else (names[-1] if names else "")


def _elem(op: Op) -> int:
    return BYTES_PER_DTYPE[op.dtype]


def op_output_bytes(op: Op) -> float:
    """Bytes of the tensor an op writes on one device of the plain graph."""
    s = op.shape
    if op.kind == "matmul" and len(s) == 4:
        return float(s[0] * s[1] * s[2]) * _elem(op)
    if op.kind == "attention" and len(s) == 4:
        return float(s[0] * s[1] * s[3]) * _elem(op)
    total = 1.0
    for d in s:
        total *= d
    return total * _elem(op)


def op_input_bytes(op: Op) -> float:
    """Bytes of the activation an op reads on one device of the plain graph: a matmul's m x k, any other op's
    output's."""
    s = op.shape
    if op.kind == "matmul" and len(s) == 4:
        return float(s[0] * s[1] * s[3]) * _elem(op)
    return op_output_bytes(op)


def weight_params(op: Op) -> float:
    """A matmul's n x k weight; a convolution's Cout x Cin x kh x kw: FLOPs / (2 x output elements) is the
    Cin x kh x kw multiply-adds of one output element, times the Cout of its output shape (batch, Cout, h, w)."""
    s = op.shape
    if op.kind == "matmul" and len(s) == 4:
        return float(s[2] * s[3])
    outputs = op_output_bytes(op) / _elem(op)
    per_output = op.flops / (2.0 * outputs) if outputs > 0 else 0.0
    return per_output * s[1] if op.kind == "conv" and len(s) == 4 else per_output


def scaled_op(op: Op, config: OpConfig, group: int) -> Op:
    """The op one device runs under config (forward or backward: dgrad/wgrad shapes permute the forward's). A
    dimension that its parts do not divide is split unevenly (ceil and floor parts, as torch.chunk / DTensor's
    Shard placement cut it): the device shown is the busiest one, whose part is the ceiling (the collective after
    the op waits for it), and its FLOPs and bytes grow by that part over the even share."""
    factor = _scale(config, group)
    batch_scale = group / config.batch
    shape = list(op.shape)
    uneven = 1.0
    if op.kind == "matmul" and len(shape) == 4:
        dims = {"m": config.seq, "n": config.out, "k": config.reduce}
        order = ("m", "k", "n") if op.name.endswith(".dgrad") else ("k", "n", "m") if op.name.endswith(".wgrad") \
            else ("m", "n", "k")
        parts = [ceil_part(shape[i + 1], dims[d]) for i, d in enumerate(order)]
        shape = [max(1, round(shape[0] * batch_scale))] + [part for part, _ in parts]
        for _, excess in parts:
            uneven *= excess
    elif op.kind == "attention" and len(shape) == 4:  # (batch x heads, q, kv, head dim): heads split by out
        shape[0], uneven = ceil_part(max(1, round(shape[0] * batch_scale)), config.out)
    elif op.kind == "conv" and len(shape) == 4:  # (batch, out channels, h, w); in channels follow the FLOPs
        shape[0] = max(1, round(shape[0] * batch_scale))
        shape[1], uneven = ceil_part(shape[1], config.out)
    elif len(shape) == 1:  # a pointwise op's elements: its share of the batch and of the features
        shape[0] = max(1, round(shape[0] * factor))
    elif shape:  # (batch, ..., features), a lookup's
        shape[0] = max(1, round(shape[0] * batch_scale))
        shape[-1], uneven = ceil_part(shape[-1], config.out)
    if factor == 1.0 and config.parts == group and uneven == 1.0:
        return op  # NB: the graph's op as it was (its shape too) where every part is an even share
    factor *= uneven
    return dataclasses.replace(op, flops=op.flops * factor, bytes_moved=op.bytes_moved * factor, shape=tuple(shape))


def ceil_part(size: int, parts: int) -> tuple[int, float]:
    """The largest of `parts` near-equal parts of `size` (the ceiling), and its ratio to the even share size /
    parts (1.0 exactly where parts divide size)."""
    if parts <= 1 or size <= 0:
        return max(1, size), 1.0
    part = -(-size // parts)
    return part, part * parts / size


def config_of(split: LayerSplit, op: Op) -> OpConfig | None:
    """The config of a forward op, or of the backward op of a forward op (name.dgrad, name.wgrad, or the
    module's)."""
    config = split.configs.get(op.name)
    if config is None and "." in op.name:
        config = split.configs.get(op.name.rsplit(".", 1)[0])
    return config if config is not None else split.modules.get(op.module_path)
