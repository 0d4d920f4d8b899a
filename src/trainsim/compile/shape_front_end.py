"""Pass: shape a capturing front-end's layers (the torch front-end's traced graph) from a strategy tree's computation
configs over tp (Proteus Sec. IV-B: a split on any op takes effect; Sec. V-B: the collective each layout change
needs; Sec. VII: unspecified partitions inferred along data dependencies).

A captured graph is one device's whole model, its ops the framework's kernels under their module paths
(ir.graph.OpGraph.frontend). A tree addresses them by path (strategy.front_end_splits); each layer instance is
walked along its forward ops as a chain (as compile.splits walks the configs over dp): an op the tree configures
takes its config, any other infers it from the tensor it reads (compile.splits.inferred_config: batch, sequence and
feature splits kept, a matmul reading split features splits its reduction, partial sums added up before any op that
is not a matmul, norms and the loss read whole features). Each op is shaped generically from its kind and dims
(front_end_op): a matmul's (batch x seq, out, reduce) parts divide its m, n and k (its backward matmuls' too, the
same dims permuted), an attention core's batch and out parts its batch x heads and its seq parts the query rows,
any other op's batch, seq and out parts its leading, second and last dims; FLOPs and bytes divide by the parts
(the busiest part where they do not divide). Where a producer's placement differs from its reader's,
strategy.reshard's pattern matching gives the collective (strategy.megatron.reshard_tp names it as the catalog's:
attn.ar, mlp.ag, block.ag), and the backward the gradient's conjugate; an attention split by query rows gathers its
keys and values, a norm split by features all-reduces its statistics (strategy.megatron.op_tp_collectives) and a
loss split by its classes its three statistics (strategy.megatron.loss_statistics). A layer reads and hands on the
whole hidden state (no sequence parallelism); the embedding's first op reads token ids.

A split matmul holds 1/(out x reduce) of its weight (n x k of its shape) and 1/out of its bias (its bytes beyond
its three operands); split by tokens, it holds the weight whole and sums its gradient over those tp ranks too
(front_end_token_params). A norm split by features holds 1/out of its gain and bias (the model's norm size). A
matmul whose weight the layer does not hold (GPT-2's head, tied to the embedding's table) sheds nothing: the table
stays whole where the lookup holds it.

Refused in one line: a config on an op whose dims the pass cannot shape (a lookup, a convolution, a pool), an
attention or norm split needing the model's shape where the graph has none, stage meshes, and tp > 1 without any
config from a tree (the graph is one device's whole model).
NB: ops are a chain in forward order: an element-wise op whose last dim is not the chain tensor's features (a mask
built beside the attention) is taken as off the chain and runs whole; a residual add's skip input is not resharded
(the catalog's _skip_reshards); saved activations keep the whole model's bytes (memory is an over-estimate for a
split layer).
"""

import dataclasses
from collections.abc import Mapping

from trainsim.compile.splits import ceil_part, inferred_config, op_output_bytes
from trainsim.errors import ConfigError
from trainsim.hardware.device import BYTES_PER_DTYPE, DType
from trainsim.ir.graph import Comm, Layer, Op
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.front_end_splits import config_text, refuse_whole_model_tp
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.megatron import (
    UNSPLIT,
    layer_site,
    loss_statistics,
    norm_params,
    op_tp_collectives,
    reshard_tp,
    tp_comms,
)
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

_SHAPED_KINDS = ("matmul", "attention", "elementwise", "softmax", "norm", "loss")  # kinds with dims to split


def shape_front_end_layers(job: Job, plan: LoweredPlan) -> LoweredPlan:
    """The plan with each layer instance of a captured graph shaped at its ops' configs over tp (module doc),
    its feature collectives in Layer.comms and no mesh_splits left for the catalog's passes."""
    tp = job.parallel.tp
    if tp == 1:
        return plan
    where = f"the {plan.frontend} front-end's graph"
    if plan.stage_meshes:
        raise ConfigError("map.tp", plan.stage_meshes[0].tp, f"{where} runs one mesh; stage meshes need the catalog "
                          "front-end")
    configs = plan.tp_configs()
    if not configs:
        refuse_whole_model_tp(plan.frontend, tp)
    dev = DeviceSlice.of(job.parallel)
    built: dict[tuple[int, frozenset[tuple[str, OpConfig]]], Layer] = {}
    assignments = list(plan.layers)
    for position, a in enumerate(plan.layers):
        given = configs.get(a.index, {})
        key = (id(a.layer), frozenset(given.items()))
        layer = built.get(key)
        if layer is None:
            layer = built[key] = shape_front_end_layer(job, dev, a.layer, given)
        assignments[position] = dataclasses.replace(a, layer=layer)
    shared = tuple((index, parts, params) for index, by_parts in front_end_token_params(job, plan).items()
                   for parts, params in by_parts.items())
    return dataclasses.replace(plan, layers=tuple(assignments), mesh_splits=(), front_end_token_params=shared)


def front_end_repeated_flops(plan: LoweredPlan, shaped: LoweredPlan, tp: int) -> float:
    """What one device runs per micro-batch beyond its 1/tp share of the captured (whole) layers: forward,
    backward and recompute of the shaped instances less 1/tp of the whole ones' (0 where every op splits tp
    ways; ops a plan runs whole or over fewer ranks count)."""
    return sum(_run_flops(new.layer, new.recompute) - _run_flops(old.layer, old.recompute) / tp
               for old, new in zip(plan.layers, shaped.layers, strict=True))


def _run_flops(layer: Layer, recompute: str) -> float:
    return layer.flops("fwd") + layer.flops("bwd") + layer.recomputed_flops(recompute)


def shape_front_end_layer(job: Job, dev: DeviceSlice, layer: Layer, given: Mapping[str, OpConfig]) -> Layer:
    """One layer of a captured graph at its ops' configs over tp (given: by module path; the rest inferred)."""
    walk = _Walk(job, dev, layer)
    for op in layer.fwd:
        walk.step(op, given.get(op.module_path))
    walk.hand_on()
    fwd = tuple(front_end_op(op, walk.configs.get(id(op), UNSPLIT)) for op in layer.fwd)
    bwd = tuple(front_end_op(op, _backward_config(op, layer.fwd, walk.configs, dev.micro_batch),
                             _forward_of(op, layer.fwd)) for op in layer.bwd)
    comms = tuple(tp_comms(walk.forward, "fwd", dev.tp) + tp_comms(walk.backward[::-1], "bwd", dev.tp)
                  + walk.statistics)
    return dataclasses.replace(layer, fwd=fwd, bwd=bwd, comms=comms,
                               param_count=layer.param_count - walk.shed_params)


class _Walk:
    """The chain of a layer's forward ops over tp: each op's config, the reshards between them, the parameters a
    rank no longer holds."""

    def __init__(self, job: Job, dev: DeviceSlice, layer: Layer) -> None:
        self.job, self.dev, self.layer = job, dev, layer
        self.placement: Placement | None = None if layer.kind == "embedding" else Placement(dev.tp)
        self.producer: Op | None = None
        self.features = 0  # the last dim of the chain tensor (0: not known yet)
        self.elements = 0.0  # the chain tensor's whole elements
        self.statistics: list[Comm] = []  # a loss split by classes: its statistics' all-reduces (listed last)
        self.unclaimed_params = layer.full_param_count  # parameters of this layer no split op has claimed yet
        self.configs: dict[int, OpConfig] = {}  # id(op) -> its config over tp
        self.forward: list[tuple[str, ReshardStep, str]] = []  # (name, step, column-parallel matmul: Comm)
        self.backward: list[tuple[str, ReshardStep, str]] = []
        self.shed_params = 0.0

    def step(self, op: Op, config: OpConfig | None) -> None:
        where = f"split.compute@tp on {self.layer.name} {op.module_path or '<root>'} ({op.name})"
        if config is None and not self._on_chain(op):
            return  # off the chain (a mask, a lookup of positions): runs whole, the chain tensor unchanged
        contracting = op.kind in CONTRACTING
        if config is None:
            config, need = self._inferred(op)
        else:
            need = input_placement(config, self.dev.tp, contracting)
        if config != UNSPLIT and op.kind not in _SHAPED_KINDS:  # given, or inferred from a split input
            raise ConfigError(where, config_text(config), f"a {op.kind} op is not shaped on a captured graph; give "
                              "configs to matmuls, attention, norms and element-wise ops (the lookup runs whole)")
        if self.placement is not None:
            column = op.module_path if contracting and config == OpConfig(1, 1, self.dev.tp, 1) else ""
            grad = input_grad_placement(need, config, contracting)
            site, tensor = self._site(op), self._tensor_bytes(op)
            self.forward += reshard_tp(site, reshard(self.placement, need, tensor), column)
            self.backward += reshard_tp(site, reshard(grad, output_grad_placement(self.placement), tensor), column)
        if (op.kind == "attention" and config.seq > 1) or (op.kind == "norm" and config.out > 1):
            forward, backward = op_tp_collectives(self._spec(op, config, where), self.dev, op, config)
            self.forward += forward
            self.backward += backward
        if op.kind == "loss" and config.out > 1:
            self.statistics += loss_statistics(config, self.dev)
        self.configs[id(op)] = config
        self.shed_params += self._shed(op, config)
        self.placement, self.producer = output_placement(config, self.dev.tp, contracting), op
        self.elements = op_output_bytes(op) / BYTES_PER_DTYPE[op.dtype]
        self.features = _out_dim(op, self.dev.micro_batch)

    def hand_on(self) -> None:
        """The layer hands on the whole hidden state (the head: the loss, nothing)."""
        if self.placement is None or self.layer.kind == "head":
            return
        whole, site, tensor = Placement(self.dev.tp), self._site(None), self._tensor_bytes(None)
        self.forward += reshard_tp(site, reshard(self.placement, whole, tensor))
        self.backward += reshard_tp(site, reshard(whole, output_grad_placement(self.placement), tensor))

    def _tensor_bytes(self, reader: Op | None) -> float:
        """The chain tensor's whole bytes as it moves between its writer and `reader`: at the narrower of their
        dtypes (a fused group is labelled by its first op: an RMSNorm group casting to fp32 and back hands on
        the activation dtype; the fp32 copy of the logits reaches the loss in fp32); handed on, at the narrower
        of the writer's and the activation dtype."""
        activation: DType = self.dev.precision.activation_dtype
        ends: list[DType] = [self.producer.dtype if self.producer is not None else activation,
                             reader.dtype if reader is not None else activation]
        return self.elements * min(BYTES_PER_DTYPE[dtype] for dtype in ends)

    def _site(self, reader: Op | None) -> str:
        """Where a reshard into `reader` runs: the reader's module's attention or MLP, else the producer's, else
        the layer's (the compiler places a collective after its site's last op)."""
        for op in (reader, self.producer):
            for part in op.module_path.split(".") if op is not None else ():
                if "attn" in part or "attention" in part:
                    return "attn"
                if "mlp" in part or "ffn" in part or "feed_forward" in part:
                    return "mlp"
        return layer_site(self.layer.kind)

    def _on_chain(self, op: Op) -> bool:
        """Whether op reads the chain tensor: a lookup reads token ids (whole); a matmul, attention, conv or pool
        does; any other op where its last dim is the chain tensor's features (or none is known yet)."""
        if op.kind == "embedding":
            return False
        if op.kind in ("matmul", "attention", "conv", "pool") or self.features == 0:
            return True
        return bool(op.shape) and op.shape[-1] == self.features

    def _inferred(self, op: Op) -> tuple[OpConfig, Placement]:
        held = self.placement or Placement(self.dev.tp)
        config, need, _ = inferred_config(op, held, self.dev.tp)
        return config, need

    def _spec(self, op: Op, config: OpConfig, where: str) -> TransformerSpec:
        if not isinstance(self.job.model, TransformerSpec):
            raise ConfigError(where, config_text(config), f"a {op.kind} op split over tp needs the model's shape (a "
                              "Hugging Face config), which this graph has not")
        return self.job.model

    def _shed(self, op: Op, config: OpConfig) -> float:
        """Parameters one rank no longer holds: a split matmul's (weight and bias) parts, a norm's by features."""
        if op.kind == "matmul" and len(op.shape) == 4:
            weight, bias = _matmul_params(op)
            if weight + bias > self.unclaimed_params:  # a weight tied to another layer's (GPT-2's head): held there
                return 0.0
            self.unclaimed_params -= weight + bias
            return weight * (1.0 - 1.0 / (config.out * config.reduce)) + bias * (1.0 - 1.0 / config.out)
        if op.kind == "norm" and config.out > 1 and isinstance(self.job.model, TransformerSpec):
            return norm_params(self.job.model) * (1.0 - 1.0 / config.out)
        return 0.0


def front_end_token_params(job: Job, plan: LoweredPlan) -> dict[int, dict[int, float]]:
    """Per layer index, {k: parameters} of a captured layer's matmuls (weight and bias) and norms whose config
    over tp splits their tokens k ways: each of those ranks holds its part of the weight and makes its gradient
    from its own tokens, summed over them with the data-parallel reduction (as
    strategy.megatron.token_split_params for the catalog's). plan: before shape_front_end_layers."""
    out: dict[int, dict[int, float]] = {}
    spec = job.model if isinstance(job.model, TransformerSpec) else None
    layers = {a.index: a.layer for a in plan.layers}
    for index, given in plan.tp_configs().items():
        layer = layers[index]
        for op in layer.fwd:
            config = given.get(op.module_path)
            if config is None or config.batch * config.seq == 1:
                continue
            parts = config.batch * config.seq
            if op.kind == "matmul" and len(op.shape) == 4:
                weight, bias = _matmul_params(op)
                if weight + bias > layer.full_param_count:  # tied to another layer's weight (held there)
                    continue
                held = weight / (config.out * config.reduce) + bias / config.out
            elif op.kind == "norm" and spec is not None:
                held = norm_params(spec) / config.out
            else:
                continue
            out.setdefault(index, {})[parts] = out.get(index, {}).get(parts, 0.0) + held
    return out


def front_end_op(op: Op, config: OpConfig, forward: Op | None = None) -> Op:
    """The op one tp rank runs at `config` (module doc). forward: a backward matmul's forward op, whose dims
    (m, n, k) it permutes."""
    if config == UNSPLIT:
        return op
    shape, ratio = list(op.shape), 1.0
    tokens = config.batch * config.seq
    if op.kind == "matmul" and len(shape) == 4:
        for i, parts in zip((1, 2, 3), _matmul_parts(op, forward, config), strict=True):
            shape[i], excess = ceil_part(shape[i], parts)
            ratio *= excess
    elif op.kind == "attention" and len(shape) == 4:  # (batch x heads, q, kv, head dim)
        shape[0], excess = ceil_part(shape[0], config.batch * config.out)
        shape[1], more = ceil_part(shape[1], config.seq)
        ratio = excess * more
    elif len(shape) >= 2:  # (batch, [seq, ...,] features)
        dims = [(0, config.batch), (1, config.seq)] if len(shape) >= 3 else [(0, tokens)]
        for i, parts in [*dims, (len(shape) - 1, config.out)]:
            shape[i], excess = ceil_part(shape[i], parts)
            ratio *= excess
    elif shape:
        shape[0], ratio = ceil_part(shape[0], config.parts)
    divide = config.parts if op.kind in CONTRACTING else config.batch * config.seq * config.out
    factor = ratio / divide
    return dataclasses.replace(op, flops=op.flops * factor, bytes_moved=op.bytes_moved * factor, shape=tuple(shape))


def _backward_config(op: Op, fwd: tuple[Op, ...], configs: Mapping[int, OpConfig], micro_batch: int) -> OpConfig:
    """A backward op's config: that of the forward op of its module on the chain (of its kind first), else of
    the last forward op on the chain of an enclosing or enclosed module whose output's last dim is the op's;
    whole where none is."""
    same = [f for f in fwd if f.module_path == op.module_path and id(f) in configs]
    match = next((f for f in reversed(same) if f.kind == op.kind), same[-1] if same else None)
    if match is None and op.shape:
        related = [f for f in fwd if id(f) in configs and _out_dim(f, micro_batch) == op.shape[-1] and (
            f.module_path.startswith(op.module_path + ".") or op.module_path.startswith(f.module_path + "."))]
        match = related[-1] if related else None
    return configs[id(match)] if match is not None else UNSPLIT


def _out_dim(op: Op, micro_batch: int) -> int:
    """The last dim of the tensor an op writes: a matmul's n, an attention core's heads x head dim."""
    if op.kind == "attention" and len(op.shape) == 4:  # (batch x heads, q, kv, head dim)
        return op.shape[0] // max(1, micro_batch) * op.shape[3]
    if op.kind == "matmul" and len(op.shape) == 4:
        return op.shape[2]
    return op.shape[-1] if op.shape else 0


# (m, n, k) of the forward matmul as a matmul's own dims: itself, its input gradient (dY W: m, k, n), its weight
# gradient (X^T dY: k, n, m, or dY^T X: n, k, m); the rest as a fallback
_PERMUTATIONS = ((0, 1, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (1, 0, 2), (2, 0, 1))


def _matmul_parts(op: Op, forward: Op | None, config: OpConfig) -> tuple[int, int, int]:
    """The parts of a matmul's three dims (shape[1:]): the forward's m by tokens, n by out, k by reduce, placed
    by the first permutation of the forward's dims that matches the op's. NB: dims of equal size cannot tell
    an input gradient from a weight gradient; either takes the same FLOPs."""
    dims = (forward or op).shape[1:]
    parts = (config.batch * config.seq, config.out, config.reduce)
    order = next((p for p in _PERMUTATIONS if tuple(dims[i] for i in p) == tuple(op.shape[1:])), (0, 1, 2))
    return parts[order[0]], parts[order[1]], parts[order[2]]


def _forward_of(op: Op, fwd: tuple[Op, ...]) -> Op | None:
    """A backward matmul's forward matmul (same module path)."""
    if op.kind != "matmul":
        return None
    return next((f for f in fwd if f.kind == "matmul" and f.module_path == op.module_path), None)


def _matmul_params(op: Op) -> tuple[float, float]:
    """(weight, bias) parameters of a captured matmul (batch, m, n, k): n x k, and n where its bytes hold a bias
    beyond its three operands."""
    b, m, n, k = op.shape
    operands = float(b * m * k + n * k + b * m * n) * BYTES_PER_DTYPE[op.dtype]
    return float(n * k), float(n) if op.bytes_moved >= operands + n * BYTES_PER_DTYPE[op.dtype] else 0.0
