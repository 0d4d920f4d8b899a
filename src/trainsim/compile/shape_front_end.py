"""Pass: shape a capturing front-end's layers (the torch front-end's traced graph, the JAX front-end's jaxpr) from
a strategy tree's computation configs over tp (Proteus Sec. IV-B: a split on any op takes effect; Sec. V-B: the
collective each layout change needs; Sec. VII: unspecified partitions inferred along data dependencies).

A captured graph is one device's whole model, its ops the framework's kernels under their module paths
(ir.graph.OpGraph.frontend), each forward op with its data dependencies (ir.graph.Op.inputs: the ops whose output
it reads, or the layer's input). A tree addresses them by path (strategy.front_end_splits); each layer instance is
walked along its forward ops in order: an op the tree configures takes its config, any other infers it from the
first of its inputs that is split (else its first; an op reading no activation, a mask or a lookup, runs whole)
with compile.splits.inferred_config's rules: batch, sequence and feature splits kept, a matmul reading split
features splits its reduction, partial sums added up before any op that is not a matmul, norms and the loss read
whole features. Each op is shaped generically from its kind and dims (front_end_op): a matmul's (batch x seq, out,
reduce) parts divide its m, n and k (its backward matmuls' too, the same dims permuted), an attention core's batch
and out parts its batch x heads and its seq parts the query rows, a 4-dim element-wise op's (HF's attention layout:
batch, heads, seq, head dim or keys; the rope) its first three dims, any other op's batch, seq and out parts its
leading, second and last dims; FLOPs and bytes divide by the parts (the busiest part where they do not divide).
Convolutions, pools, batch norms (their tensors (batch, channels, h, w)) and token lookups (by columns or rows):
compile.shape_front_end_cnn.

Every reader's layout is compared with its own producer's: where they differ, strategy.reshard's pattern matching
gives the collective (strategy.megatron.reshard_tp names it as the catalog's: attn.ar, mlp.ag, block.ag), and the
backward the gradient's conjugate. A tensor read by several ops (a block's input: its first norm and the residual
add's skip connection) is resharded once per layout its readers need, and their input gradients, summed where
they lie alike, once per layout onto the producer's (the catalog's _skip_reshards); a tensor that carries no
gradient (a mask, a rotary table: written by ops that read neither the layer's input nor a weight) is not resharded
backward. An attention split by query rows gathers its keys and values, a norm split by features all-reduces its
statistics (strategy.megatron.op_tp_collectives) and a loss split by its classes its three statistics
(strategy.megatron.loss_statistics). A layer reads and hands on the whole hidden state, under sp its sequence
share over tp (compile.front_end_sequence; Layer.hands_on names the op writing it); the embedding's first op reads
token ids. Under cp every op runs its rank's share of the sequence and each attention core exchanges its keys and
values over cp (compile.front_end_context).

A split matmul holds 1/(out x reduce) of its weight (n x k of its shape) and 1/out of its bias (its bytes beyond
its three operands); a norm split by features 1/out of its gain and bias (the model's norm size); split by tokens,
either holds its part whole and sums its gradient over those tp ranks too (LoweredPlan.front_end_token_params). A
matmul whose weight the layer does not hold (GPT-2's head, tied to the embedding's table) holds nothing: the table
stays where the lookup holds it (whole, or at its split where the head's projection splits alike:
compile.shape_front_end_cnn.hold_tied_tables). Each op keeps the activations it saves for its backward
(Op.saved_bytes) as it reads them: divided by its input's parts.

A batched matmul (attention written as einsums: the scores and the weighted sum over batch x heads) keeps a
feature split of its inputs as a split of its heads, in its batch dim (batched_matmul).

Refused in one line: a seq split of an image op (a convolution, a pool, a batch norm) or of a batched matmul, an
attention or norm split needing the model's shape where the graph has none, and tp > 1 without any config from a
tree (the graph is one device's whole model). A plan whose stages run their own meshes is shaped per mesh
(compile.front_end_meshes).
NB: the saved activations are divided per op, not per tensor (a whole mask the attention core keeps is divided
with its q, k and v); a tensor written in place is attributed to the op that allocated it.
"""

import dataclasses
from collections.abc import Mapping

from trainsim.compile.front_end_context import check_context_parallel, context_parallel_comms
from trainsim.compile.front_end_sequence import check_sequence_parallel, kept_parts, sequence_parallel_config
from trainsim.compile.shape_front_end_cnn import (
    TABLE_KINDS,
    backward_pairs,
    check_image_config,
    hold_tied_tables,
    image_op,
    input_elements,
    is_image_op,
    lookup_op,
    own_params,
)
from trainsim.compile.splits import ceil_part, inferred_config, is_batch_norm, op_output_bytes
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
    handed_on,
    layer_site,
    loss_statistics,
    module_site,
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


def shape_front_end_layers(job: Job, plan: LoweredPlan) -> LoweredPlan:
    """The plan with each layer instance of a captured graph shaped at its ops' configs over tp (module doc),
    its feature collectives in Layer.comms, the parameters its token-split ops sum over tp ranks in
    front_end_token_params and no mesh_splits left for the catalog's passes."""
    tp = job.parallel.tp
    # stage meshes: each stage's layers shaped on its own mesh (compile.front_end_meshes)
    if (tp == 1 and job.parallel.cp == 1) or plan.stage_meshes:
        return plan
    configs = plan.tp_configs()
    if not configs:
        refuse_whole_model_tp(plan.frontend, tp)
    dev = DeviceSlice.of(job.parallel, job.stack)
    check_sequence_parallel(dev)
    check_context_parallel(job.model, dev, plan.frontend)
    built: dict[tuple[int, frozenset[tuple[str, OpConfig]]], tuple[Layer, dict[int, float]]] = {}
    assignments = list(plan.layers)
    shared: list[tuple[int, int, float]] = []
    for position, a in enumerate(plan.layers):
        given = configs.get(a.index, {})
        key = (id(a.layer), frozenset(given.items()))
        found = built.get(key)
        if found is None:
            found = built[key] = _shaped(job, dev, a.layer, given)
        layer, token_params = found
        assignments[position] = dataclasses.replace(a, layer=layer)
        shared += [(a.index, parts, params) for parts, params in token_params.items()]
    assignments = hold_tied_tables(plan.layers, assignments, configs)
    return dataclasses.replace(plan, layers=tuple(assignments), mesh_splits=(), front_end_token_params=tuple(shared))


def front_end_repeated_flops(plan: LoweredPlan, shaped: LoweredPlan, tp: int) -> float:
    """What one device runs per micro-batch beyond its 1/tp share of the captured (whole) layers: forward,
    backward and recompute of the shaped instances less 1/tp of the whole ones' (0 where every op splits tp
    ways; ops a plan runs whole or over fewer ranks count)."""
    return sum(new.run_flops() - old.run_flops() / tp for old, new in zip(plan.layers, shaped.layers, strict=True))


def _shaped(job: Job, dev: DeviceSlice, layer: Layer, given: Mapping[str, OpConfig]
            ) -> tuple[Layer, dict[int, float]]:
    """One layer of a captured graph at its ops' configs over tp (given: by module path; the rest inferred), and
    {k: parameters} of its ops whose config splits their tokens k ways
    (each of those ranks holds its part of the weight whole and makes its gradient from its own tokens: summed
    over them with the data-parallel reduction, as strategy.megatron.token_split_params for the catalog's)."""
    whole, layer = layer, _context_share(layer, dev.cp)
    walk = _Walk(job, dev, layer)
    for position, op in enumerate(layer.fwd):
        walk.step(position, op, given.get(op.module_path))
    walk.hand_on()
    configs = {id(op): config for position, (op, config) in enumerate(zip(layer.fwd, walk.configs, strict=True))
               if walk.gradient[position]}  # what backward ops take their config from
    fwd = tuple(front_end_op(op, config) for op, config in zip(layer.fwd, walk.configs, strict=True))
    pairs = backward_pairs(layer, configs)
    bwd = tuple(front_end_op(op, configs[id(pairs[id(op)])] if id(op) in pairs else _backward_config(
                    op, layer.fwd, configs, dev.micro_batch),
                             _forward_of(op, layer.fwd)) for op in layer.bwd)
    comms = tuple(tp_comms(walk.forward, "fwd", dev.tp) + tp_comms(walk.backward[::-1], "bwd", dev.tp)
                  + walk.statistics)
    handed = handed_on("tp", dev).shards  # under sp the hidden state between layers (a pipeline send) is split
    saved = _saved_bytes(layer, walk.kept_parts, handed)
    shaped = dataclasses.replace(layer, fwd=fwd, bwd=bwd, param_count=layer.param_count - walk.shed,
                                 saved_bytes=saved, output_bytes=layer.output_bytes / handed)
    shaped = dataclasses.replace(shaped, comms=comms + context_parallel_comms(job.model, dev, whole, shaped))
    return shaped, walk.token_params


def _context_share(layer: Layer, cp: int) -> Layer:
    """One cp rank's share of a captured layer (compile.front_end_context): every op at seq = cp, what it keeps
    for its backward and hands on divided alike; a matmul still reads its whole weight (its bytes less only the
    activations').
    NB: a weight-gradient op shaped as its weight (the lookup's) is divided too, as the ops a config splits."""
    if cp == 1:
        return layer
    config = OpConfig(1, cp, 1, 1)

    def share(op: Op, forward: Op | None = None) -> Op:
        ran = front_end_op(op, config, forward)
        if op.kind == "matmul" and len(op.shape) == 4:
            ran = dataclasses.replace(ran, bytes_moved=op.bytes_moved - _operand_bytes(op) + _operand_bytes(ran))
        return dataclasses.replace(ran, saved_bytes=op.saved_bytes / cp, saved_aux_bytes=op.saved_aux_bytes / cp)

    return dataclasses.replace(layer, fwd=tuple(share(op) for op in layer.fwd),
                               bwd=tuple(share(op, _forward_of(op, layer.fwd)) for op in layer.bwd),
                               saved_bytes={mode: kept / cp for mode, kept in layer.saved_bytes.items()},
                               output_bytes=layer.output_bytes / cp)


def _saved_bytes(layer: Layer, parts_kept: list[int], input_parts: int) -> dict[str, float]:
    """The layer's activations kept for its backward pass, each op's (Op.saved_bytes) as it holds what it reads:
    divided by its input's parts (parts_kept: per forward op, compile.front_end_sequence.kept_parts); a block's
    under selective recompute less its side outputs (Op.saved_aux_bytes), under full recompute its input as it
    reads it (the whole hidden state, or its input_parts sequence share under sp). NB: per op, not per tensor (a
    whole mask an attention core split by heads keeps is divided with its q, k and v)."""
    shed = aux = 0.0
    for op, parts in zip(layer.fwd, parts_kept, strict=True):
        shed += op.saved_bytes * (1.0 - 1.0 / parts)
        aux += op.saved_aux_bytes * (1.0 - 1.0 / parts)
    if layer.kind != "block":  # every mode keeps what the layer saves (frontends.torch.layers)
        return {mode: kept - shed for mode, kept in layer.saved_bytes.items()}
    out = dict(layer.saved_bytes)
    out["none"] -= shed
    if "selective" in out:  # the JAX front-end knows only "none" (the jaxpr fixes what autodiff saves)
        out["selective"] -= shed - aux  # the aux tensors are not kept
    if "full" in out:
        out["full"] /= input_parts
    return out


_WEIGHTED = ("embedding", "matmul", "norm", "conv")  # kinds whose output carries a gradient (their weight's)


class _Walk:
    """A layer's forward ops over tp along their data dependencies (Op.inputs): each op's config, the reshards
    between each producer and each of its readers, the parameters a rank no longer holds or sums over tp ranks."""

    def __init__(self, job: Job, dev: DeviceSlice, layer: Layer) -> None:
        self.job, self.dev, self.layer = job, dev, layer
        read = handed_on("tp", dev)  # the hidden state between layers: split by sequence under sp
        self.placements: dict[int, Placement] = {} if layer.kind == "embedding" else {-1: read}  # -1: the input
        self.gradient: dict[int, bool] = {-1: True}  # whether an op's output carries a gradient back
        self.read_as: dict[int, list[Placement]] = {}  # per producer, the layouts its readers had it resharded to
        self.grad_as: dict[int, list[Placement]] = {}  # per producer, its readers' input gradients' layouts
        self.statistics: list[Comm] = []  # a loss split by classes: its statistics' all-reduces (listed last)
        self.unclaimed_params = layer.full_param_count  # parameters of this layer no op has claimed yet
        self.configs: list[OpConfig] = []  # per forward op, its config over tp
        self.kept_parts: list[int] = []  # per forward op, the parts of its input it keeps for its backward
        self.forward: list[tuple[str, ReshardStep, str]] = []  # (name, step, column-parallel matmul: Comm)
        self.backward: list[tuple[str, ReshardStep, str]] = []
        self.shed = 0.0
        self.token_params: dict[int, float] = {}

    def step(self, position: int, op: Op, config: OpConfig | None) -> None:
        where = f"split.compute@tp on {self.layer.name} {op.module_path or '<root>'} ({op.name})"
        inputs = [p for p in self._inputs(position, op) if p in self.placements]
        # a lookup's rows: partial sums; a batched matmul splits its heads, as an attention core
        contracting = (op.kind in CONTRACTING or op.kind in TABLE_KINDS) and not batched_matmul(op)
        if config is None or (config.reduce > 1 and not contracting):  # a reduce split reaches the matmuls only
            config = self._inferred(op, inputs)
        need = input_placement(config, self.dev.tp, contracting)
        check_image_config(op, config, where, config_text(config))
        if batched_matmul(op) and config.seq > 1:
            raise ConfigError(where, config_text(config), "a batched matmul (attention written as einsums) splits its "
                              "batch or heads (out), not its rows: its keys would need gathering")
        column = op.module_path if contracting and config == OpConfig(1, 1, self.dev.tp, 1) else ""
        grad = input_grad_placement(need, config, contracting)
        for producer in inputs:
            self._reshard(producer, op, need, grad, column)
        if (op.kind == "attention" and config.seq > 1) or (op.kind == "norm" and config.out > 1
                                                            and not is_batch_norm(op)):
            forward, backward = op_tp_collectives(self._spec(op, config, where), self.dev, op, config)
            self.forward += forward
            self.backward += backward
        if op.kind == "loss" and config.out > 1:
            self.statistics += loss_statistics(config, self.dev)
        self.configs.append(config)
        self.kept_parts.append(kept_parts(op, config, self.placements[inputs[0]] if inputs else None, self.dev,
                                          op.kind in CONTRACTING and not batched_matmul(op)))
        self._hold(op, config)
        self.placements[position] = output_placement(config, self.dev.tp, contracting)
        self.gradient[position] = op.kind in _WEIGHTED or any(self.gradient[p] for p in inputs)

    def hand_on(self) -> None:
        """The layer hands on the hidden state, whole or under sp split by sequence (the head: the loss, nothing)."""
        if self.layer.kind == "head" or not self.layer.fwd:
            return
        last = self.layer.hands_on if self.layer.hands_on is not None else len(self.layer.fwd) - 1
        held, handed = self.placements[last], handed_on("tp", self.dev)
        site, tensor = self._site(None, last), self._tensor_bytes(last, None)
        self.forward += reshard_tp(site, reshard(held, handed, tensor))
        self.backward += reshard_tp(site, reshard(handed, output_grad_placement(held), tensor))

    def _inputs(self, position: int, op: Op) -> tuple[int, ...]:
        """The producers an op reads (Op.inputs; without them, the op before it: a chain)."""
        if op.inputs is not None:
            return op.inputs
        return (position - 1,) if position > 0 else (-1,)

    def _reshard(self, producer: int, reader: Op, need: Placement, grad: Placement, column: str) -> None:
        """The reshards between a producer's output and a reader: forward onto the layout the reader needs, unless
        an earlier reader had it resharded to that layout already (the catalog's skip connection: its add reads
        the tensor as its norm did); backward the reader's input gradient onto the producer's gradient layout,
        unless an earlier reader's lies alike (they are summed first, then resharded once)."""
        held, site, tensor = self.placements[producer], self._site(reader, producer), self._tensor_bytes(
            producer, reader)
        if need not in self.read_as.setdefault(producer, []):
            self.read_as[producer].append(need)
            self.forward += reshard_tp(site, reshard(held, need, tensor), column)
        if self.gradient[producer] and grad not in self.grad_as.setdefault(producer, []):
            self.grad_as[producer].append(grad)
            self.backward += reshard_tp(site, reshard(grad, output_grad_placement(held), tensor), column)

    def _tensor_bytes(self, producer: int, reader: Op | None) -> float:
        """A producer's output, whole, as it moves to `reader`: at the narrower of their dtypes (a fused group is
        labelled by its first op: an RMSNorm group casting to fp32 and back hands on the activation dtype; the
        fp32 copy of the logits reaches the loss in fp32); handed on, at the narrower of the writer's and the
        activation dtype. The layer's input (producer -1): the hidden state its reader reads."""
        activation: DType = self.dev.precision.activation_dtype
        writer = self.layer.fwd[producer] if producer >= 0 else None
        ends: list[DType] = [writer.dtype if writer is not None else activation,
                             reader.dtype if reader is not None else activation]
        if writer is not None:
            elements = op_output_bytes(writer) / BYTES_PER_DTYPE[writer.dtype]
        else:
            assert reader is not None  # the layer's input is handed on only through an op
            elements = input_elements(reader, self.layer)
        return elements * min(BYTES_PER_DTYPE[dtype] for dtype in ends)

    def _site(self, reader: Op | None, producer: int) -> str:
        """Where a reshard into `reader` runs: the reader's module's attention or MLP, else the producer's, else
        the layer's (the compiler places a collective after its site's last op)."""
        writer = self.layer.fwd[producer] if producer >= 0 else None
        sites = (module_site(op.module_path) for op in (reader, writer) if op is not None)
        return next((site for site in sites if site), layer_site(self.layer.kind))

    def _inferred(self, op: Op, inputs: list[int]) -> OpConfig:
        """An op the tree does not configure: its config from the first input that is split (or partial), else
        from its first input, else (an op reading no activation: a mask, a lookup) whole."""
        if not inputs:
            return UNSPLIT
        placements = [self.placements[p] for p in inputs]
        held = next((p for p in placements if p.shards > 1), placements[0])
        if batched_matmul(op):  # split features are its heads, a batch dim: kept, as an element-wise op keeps them
            return OpConfig(held.batch, held.seq, held.feature, 1)
        return sequence_parallel_config(op, inferred_config(op, held, self.dev.tp)[0], held, self.dev)

    def _spec(self, op: Op, config: OpConfig, where: str) -> TransformerSpec:
        if not isinstance(self.job.model, TransformerSpec):
            raise ConfigError(where, config_text(config), f"a {op.kind} op split over tp needs the model's shape (a "
                              "Hugging Face config), which this graph has not")
        return self.job.model

    def _hold(self, op: Op, config: OpConfig) -> None:
        """The op's own parameters at its config: a matmul's weight 1/(out x reduce), its bias 1/out; a norm's
        gain and bias 1/out (the model's norm size); the rest shed, and what a rank holds summed over the ranks
        that split its tokens. A matmul whose weight the layer does not hold (it exceeds what no other op has
        claimed: GPT-2's head, tied to the embedding's table) holds nothing here."""
        weight = bias = 0.0
        if op.kind == "matmul" and len(op.shape) == 4 and not batched_matmul(op):  # batched: two activations
            weight, bias = _matmul_params(op)
            if weight + bias > self.unclaimed_params:
                return
            self.unclaimed_params -= weight + bias
        elif op.kind in TABLE_KINDS or is_batch_norm(op):
            weight = min(own_params(op, self.layer), self.unclaimed_params)
            self.unclaimed_params -= weight
        elif op.kind == "norm" and config != UNSPLIT and isinstance(self.job.model, TransformerSpec):
            weight = float(norm_params(self.job.model))
        held = weight / (config.out * config.reduce) + bias / config.out
        self.shed += weight + bias - held
        tokens = config.batch * config.seq
        if tokens > 1 and held > 0.0:
            self.token_params[tokens] = self.token_params.get(tokens, 0.0) + held


def front_end_op(op: Op, config: OpConfig, forward: Op | None = None) -> Op:
    """The op one tp rank runs at `config` (module doc). forward: a backward matmul's forward op, whose dims
    (m, n, k) it permutes."""
    if config == UNSPLIT:
        return op
    if is_image_op(op):
        return image_op(op, config, forward)
    if op.kind == "embedding":
        return lookup_op(op, config)
    shape, ratio = list(op.shape), 1.0
    tokens = config.batch * config.seq
    if batched_matmul(op):  # (batch x heads, m, n, k): its batch and heads parts divide the batch dim
        shape[0], ratio = ceil_part(shape[0], config.batch * config.out)
    elif op.kind == "matmul" and len(shape) == 4:
        for i, parts in zip((1, 2, 3), _matmul_parts(op, forward, config), strict=True):
            shape[i], excess = ceil_part(shape[i], parts)
            ratio *= excess
    elif op.kind == "attention" and len(shape) == 4:  # (batch x heads, q, kv, head dim)
        shape[0], excess = ceil_part(shape[0], config.batch * config.out)
        shape[1], more = ceil_part(shape[1], config.seq)
        ratio = excess * more
    elif len(shape) == 4 and op.kind in ("elementwise", "softmax"):  # (batch, heads, seq, head dim or keys)
        for i, parts in ((0, config.batch), (1, config.out), (2, config.seq)):
            shape[i], excess = ceil_part(shape[i], parts)
            ratio *= excess
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


def batched_matmul(op: Op) -> bool:
    """A matmul over a batch dim (batch, m, n, k with batch > 1): an einsum over heads, as attention written in
    jax.numpy runs (the scores q k^T and the weighted sum); a Dense's or a Linear's matmul has batch 1 (its tokens
    are m). Its heads come from the features its producer split, so it keeps a feature split in its batch dim, as
    an attention core does, and has no weight."""
    return op.kind == "matmul" and len(op.shape) == 4 and op.shape[0] > 1


def _backward_config(op: Op, fwd: tuple[Op, ...], configs: Mapping[int, OpConfig], micro_batch: int) -> OpConfig:
    """A backward op's config: that of the forward op of its module whose output carries a gradient (configs
    holds those; of its kind first), else of the last such forward op of an enclosing or enclosed module whose
    output's last dim is the op's; whole where none is."""
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
    """A backward matmul's or convolution's forward op (same module path and kind)."""
    if op.kind not in ("matmul", "conv"):
        return None
    return next((f for f in fwd if f.kind == op.kind and f.module_path == op.module_path), None)


def _matmul_params(op: Op) -> tuple[float, float]:
    """(weight, bias) parameters of a captured matmul (batch, m, n, k): n x k, and n where its bytes hold a bias
    beyond its three operands."""
    n, k = op.shape[2:]
    return float(n * k), float(n) if op.bytes_moved >= _operand_bytes(op) + n * BYTES_PER_DTYPE[op.dtype] else 0.0


def _operand_bytes(op: Op) -> float:
    """A captured matmul's (batch, m, n, k) three operands: its input, weight and output."""
    b, m, n, k = op.shape
    return float(b * m * k + n * k + b * m * n) * BYTES_PER_DTYPE[op.dtype]
