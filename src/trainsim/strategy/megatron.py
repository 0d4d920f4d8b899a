"""Megatron-LM's tensor (TP), sequence (SP), context (CP) and expert (EP) parallelism as splits of a transformer
layer's ops, and the collectives their resharding inserts (Proteus Sec. II-A, IV-B, V-B).

Each model-parallel axis of a device slice (tp, cp, ep of size > 1) gives every forward op of a layer a
computation config over that axis' group (strategy.placement.OpConfig: batch, seq, out, reduce parts): the
split-tree form of Megatron's patterns (Shoeybi et al. 2019, Sec. 3; Korthikanti et al. 2022, Sec. 4.2):

- tp: column-parallel matmuls (qkv, fc1, gate_up, the vocabulary projection) split their output dimension,
  row-parallel ones (the attention projection, fc2, down) their reduction dimension, the ops between them
  (rope, attention, softmax, the activation, the cross-entropy) the features the column split leaves (heads,
  ffn, vocabulary); the vocab-parallel lookup splits its reduction (the table's rows: partial sums); every other
  op (norms, residual adds, positions, the router) splits the sequence tp ways under SP, else holds it whole;
- cp: every op splits the sequence; the attention reads the keys and values of the whole sequence;
- ep (MoE layers): the expert ops (the MoE's matmuls and activation, not its router) split the expert dimension
  (a device holds the tokens routed to its experts; a Placement carries it in its feature slot, and an expert's
  output is whole, not a partial sum), every other op the batch.

A strategy tree may split any op of a block's attention or its (dense) MLP, the embedding's lookup, the head's
vocabulary projection or its cross-entropy Megatron's way over fewer ranks d dividing tp, or leave it unsplit
(d = 1; op_degrees): each group of d consecutive tp ranks then runs that op split d ways, each rank 1/d of it
(op_config's `degrees`; a collective over such a split spans the d ranks, ir.graph.Comm.ranks), the catalog
builders shape it at degree d (frontends.catalog.transformer block_layer,
embedding_layer, head_layer; compile.shape_layers), and the resharding below inserts what the layout changes
need: a whole attention beside a split MLP pays only the MLP's all-reduce pair; qkv split by heads before a whole
attention core all-gathers q, k and v; fc1 split before a whole fc2 all-gathers the ffn features; a whole head
pays no vocab-parallel statistics.

An MoE's experts (their matmuls and activation, all at one degree) may take Megatron's split over d dividing tp
too: Megatron-Core's expert tensor parallelism (expert_tensor_parallel_size, megatron/core/
model_parallel_config.py and parallel_state.py, megatron-core 0.16.1: the experts' own tp groups of d ranks, ep
groups and expert data-parallel groups of world / (d x ep x pp) ranks). Under sp an expert op at degree d keeps
the sequence split of its d ranks' tokens (config seq = tp / d; d = 1: seq = tp, each rank's experts whole on
its own sequence share); without sp every d-group runs all the micro-batch's tokens. Where d < tp the token
dispatch follows Megatron-Core's MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py,
0.16.1): the all-to-all over ep moves the routed copies of the tokens a rank holds, then the routed tokens are
all-gathered over the d ranks and reduce-scattered after the experts (none at d = 1); trainsim's Megatron
split (d = tp) keeps its own order, the hidden state gathered over tp before dispatching all local tokens
(_read_bytes, _tensor_bytes). The router has no other config: Megatron-Core's TopKRouter holds its weight
whole on every tp rank and runs it on the rank's tokens (its sequence share under sp, its gradient then summed
over tp as the norms' are: the weight's `sequence_parallel` attribute, megatron/core/transformer/moe/router.py
and megatron/core/distributed/finalize_model_grads.py, 0.16.1), as the norms' config here says.

layer_comms walks a layer's ops in order per axis, as compile.splits walks a tree's computation configs: where
what an op reads differs from how its producer left it, strategy.reshard's pattern matching gives the collective
(partial sums -> all-reduce, or reduce-scatter where the reader splits the sequence; a sequence split read whole
-> all-gather; a batch split read as an expert split -> all-to-all), and the backward pass the gradient's
conjugate. A layer hands on the hidden state as the next layer reads it (split by sequence over tp under SP and
over cp, by batch over ep); the embedding's lookup reads token ids, which every rank holds. Under Megatron's
splits every TP collective moves a hidden state (local tokens x hidden): the inputs of qkv and fc1, the outputs
of the projections, the input of the logits; a reshard inside a module moves the tensor its reader reads
(_read_bytes: q, k and v, the ffn features). The vocab-parallel cross-entropy reads the class dimension split:
its three per-token statistics (max logit, target logit, sum of exponentials) are partial over tp, one fp32
all-reduce each (megatron/core/tensor_parallel/cross_entropy.py, megatron-core 0.9).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.graph import Comm, LayerKind, Op
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
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

Axis = Literal["ep", "tp", "cp"]
AXES: tuple[Axis, ...] = ("ep", "tp", "cp")  # the order a layer lists its collectives in
COLUMN = ("qkv", "fc1", "gate_up", "logits")  # split the output dimension over tp
ROW = ("out_proj", "fc2", "down")  # split the reduction dimension over tp
FEATURE = ("rope", "attention", "softmax", "gelu", "swiglu", "cross_entropy")  # split the features over tp
_SHORT = {"all-reduce": "ar", "all-gather": "ag", "reduce-scatter": "rs", "all-to-all": "a2a", "send-recv": "p2p"}
_STATISTICS = ("max", "target", "sum_exp")  # the vocab-parallel cross-entropy's all-reduces, in its order
_Found = tuple[str, ReshardStep]  # (collective's name, step)
Configs = Mapping[tuple[str, Axis], OpConfig]  # (op module path, axis) -> the op's config (a tree's)
UNSPLIT = OpConfig(1, 1, 1, 1)
Degrees = frozenset[tuple[str, int]]  # (op name, its tp degree) where it is not the job's tp (op_degrees)


def axis_sizes(kind: LayerKind, dev: DeviceSlice) -> dict[Axis, int]:
    """The model-parallel axes that split a layer of `kind`: size > 1, ep in MoE blocks only."""
    sizes: dict[Axis, int] = {"ep": dev.ep if kind == "moe_block" else 1, "tp": dev.tp, "cp": dev.cp}
    return {axis: sizes[axis] for axis in AXES if sizes[axis] > 1}


def op_config(axis: Axis, op: Op, dev: DeviceSlice, degrees: Degrees = frozenset()) -> OpConfig:
    """The computation config of forward op `op` over `axis` (module doc). degrees: (op name, tp degree) of the
    replicable ops (replicable_module) split over fewer ranks than tp, Megatron's way (1: whole on each tp rank,
    no split); an expert op at degree d keeps, under sp, the tokens of its d ranks (the sequence split tp / d
    ways: Megatron-Core's expert tensor parallelism, _expert_tp)."""
    if axis == "tp":
        t = dict(degrees).get(op.name, dev.tp) if degrees and replicable_module(op) else dev.tp
        seq = dev.tp if dev.sp else 1
        token_parts = seq // t if dev.sp and _expert(op) else 1
        if op.name in COLUMN or op.name in FEATURE:
            return OpConfig(1, token_parts, t, 1)
        if op.name in ROW or op.kind == "embedding":
            return OpConfig(1, token_parts, 1, t)
        return OpConfig(1, seq, 1, 1)
    if axis == "cp":
        return OpConfig(1, dev.cp, 1, 1)
    return OpConfig(1, 1, dev.ep, 1) if _expert(op) else OpConfig(dev.ep, 1, 1, 1)


def replicable_module(op: Op) -> str:
    """The part of the model whose op may hold its tensors whole over tp instead of Megatron's split: "attn" (qkv,
    rope, the attention core, softmax, the projection), "mlp" (a dense block's MLP), "experts" (an MoE's expert
    matmuls and activation: Megatron-Core's expert tensor parallelism), "embed" (the token lookup) or "head"
    (the vocabulary projection and the cross-entropy); "" for any other op (norms, residual adds, positions and
    an MoE's router: Megatron's configs always)."""
    parts = op.module_path.split(".")
    if "attn" in parts:
        return "attn"
    if _expert(op):
        return "experts"
    if "mlp" in parts and "moe" not in parts:
        return "mlp"
    if op.kind == "embedding":
        return "embed"
    return "head" if op.name in ("logits", "cross_entropy") else ""


def op_degrees(fwd: Sequence[Op], dev: DeviceSlice, config_of: Callable[[Op], OpConfig]) -> Degrees:
    """(op name, tp degree) of a layer's replicable ops (replicable_module) whose config over tp under config_of
    is Megatron's split over fewer ranks d dividing tp (d = 1: unsplit, the op whole on each tp rank); an op with
    any other config is left out (it must take Megatron's)."""
    out: list[tuple[str, int]] = []
    for op in fwd:
        config = config_of(op)
        d = max(config.out, config.reduce)  # Megatron's split of a replicable op is one of the two (an expert's
    # sequence split under sp follows from d: op_config)
        if d < dev.tp and dev.tp % d == 0 and replicable_module(op) and config == op_config(
                "tp", op, dev, frozenset({(op.name, d)})):
            out.append((op.name, d))
    return frozenset(out)


def handed_on(axis: Axis, dev: DeviceSlice) -> Placement:
    """How a layer hands the hidden state to the next one over `axis`."""
    if axis == "tp":
        return Placement(dev.tp, seq=dev.tp if dev.sp else 1)
    if axis == "cp":
        return Placement(dev.cp, seq=dev.cp)
    return Placement(dev.ep, batch=dev.ep)


def layer_comms(spec: TransformerSpec, dev: DeviceSlice, kind: LayerKind, fwd: Sequence[Op],
                configs: Configs | None = None) -> tuple[Comm, ...]:
    """The feature collectives of one layer (per micro-batch) that resharding between its ops' configs inserts,
    per axis in AXES order: the forward's in op order, then the backward's (by site in op order, within a site
    as the backward pass meets them); the cross-entropy's statistics last. configs: the ops' configs (a
    strategy tree's, by module path and axis; an op it leaves out is not split); default: Megatron's."""
    comms: list[Comm] = []
    for axis, size in axis_sizes(kind, dev).items():
        def config_of(op: Op, axis: Axis = axis) -> OpConfig:
            if configs is None:
                return op_config(axis, op, dev)
            return configs.get((op.module_path, axis), UNSPLIT)

        forward, backward = _walk(axis, size, spec, dev, kind, fwd, config_of,
                                  (_heads_parts(fwd, dev, configs), _expert_tp(fwd, dev, configs)))
        sites = {_site(op): i for i, op in reversed(list(enumerate(fwd)))}
        backward.sort(key=lambda found: sites.get(found[0].split(".")[0], len(sites)))
        comms += [Comm(name, step.collective, axis, "fwd", step.buffer_bytes, _sub(step, size))
                  for name, step in forward]
        comms += [Comm(name, step.collective, axis, "bwd", step.buffer_bytes, _sub(step, size))
                  for name, step in backward]
        if axis == "tp":
            comms += _loss_statistics(fwd, dev, config_of)
    return tuple(comms)


def _walk(axis: Axis, size: int, spec: TransformerSpec, dev: DeviceSlice, kind: LayerKind, fwd: Sequence[Op],
          config_of: Callable[[Op], OpConfig], parts: tuple[int, int]) -> tuple[list[_Found], list[_Found]]:
    """(forward, backward) reshards of the layer's op chain over one axis; the backward's in the order the
    backward pass meets them. parts: the parts the attention's heads are split into over tp, and the tp degree
    of the experts (_expert_tp; below tp: Megatron-Core's dispatch order, _read_bytes)."""
    heads_parts, expert_tp = parts
    dispatch_first = expert_tp < dev.tp
    full = _tensor_bytes(axis, spec, dev, dispatch_first)
    handed = handed_on(axis, dev)
    forward: list[_Found] = []
    backward: list[_Found] = []
    placement: Placement | None = None if kind == "embedding" else handed  # the lookup reads token ids
    producer: Op | None = None
    for op in fwd:
        config = config_of(op)
        contracting = _contracting(axis, op)
        need = input_placement(config, size, contracting)
        if placement is not None:
            routed = dispatch_first and (_expert(op) or (producer is not None and _expert(producer)))
            site, read = _namer(axis, kind, producer, op), _read_bytes(axis, spec, dev, op, full, routed)
            forward += _named(site, axis, reshard(placement, need, read))
            grad = input_grad_placement(need, config, contracting)
            backward += _named(site, axis, reshard(grad, output_grad_placement(placement), read))
        if axis == "cp" and op.kind == "attention":  # keys and values of the whole sequence
            kv = _kv_bytes(spec, dev, heads_parts)
            forward += _named("kv", axis, reshard(Placement(size, seq=size), Placement(size), kv))
            backward += _named("kv", axis, reshard(Placement(size, partial=size), Placement(size, seq=size), kv))
        placement, producer = output_placement(config, size, contracting), op
    if placement is not None and kind != "head":  # the head hands on the loss
        site = _namer(axis, kind, producer, None)
        forward += _named(site, axis, reshard(placement, handed, full))
        backward += _named(site, axis, reshard(handed, output_grad_placement(placement), full))
    return forward, backward[::-1]


def _loss_statistics(fwd: Sequence[Op], dev: DeviceSlice, config_of: Callable[[Op], OpConfig]) -> list[Comm]:
    """The cross-entropy reading a class dimension split tp ways: each statistic's partial sums all-reduced."""
    loss = next((op for op in fwd if op.name == "cross_entropy"), None)
    if loss is None or config_of(loss).out == 1:
        return []
    parts = config_of(loss).out
    steps = reshard(Placement(dev.tp, partial=parts), Placement(dev.tp), dev.local_tokens * 4.0)  # fp32
    return [Comm(f"loss.{name}", step.collective, "tp", "fwd", step.buffer_bytes, _sub(step, dev.tp))
            for name in _STATISTICS for step in steps]


def _sub(step: ReshardStep, size: int) -> int:
    """The sub-group a collective spans (ir.graph.Comm.ranks): its ranks where fewer than the axis' `size`."""
    return step.ranks if step.collective != "send-recv" and step.ranks < size else 0


def _namer(axis: Axis, kind: LayerKind, producer: Op | None, consumer: Op | None) -> str:
    """The site of a reshard between two ops: the reader's, else the producer's, else the layer's (the compiler
    places a collective after its site's last op); over ep the token dispatch or combine."""
    if axis == "ep":
        return "dispatch" if consumer is not None and _expert(consumer) else "combine"
    ops = [op for op in (consumer, producer) if op is not None]
    return next((s for s in (_site(op) for op in ops) if s), _layer_site(kind))


def _named(site: str, axis: Axis, steps: tuple[ReshardStep, ...]) -> list[_Found]:
    """Collectives named site.kind (attn.ag, mlp.rs, kv.ag); over ep the site alone."""
    return [(site if axis == "ep" else f"{site}.{_SHORT[step.collective]}", step) for step in steps]


def _site(op: Op) -> str:
    parts = op.module_path.split(".")
    if "attn" in parts:
        return "attn"
    if "mlp" in parts or "moe" in parts:
        return "mlp"
    return ""


def _layer_site(kind: LayerKind) -> str:
    return {"embedding": "embed", "head": "logits"}.get(kind, "")


def _expert(op: Op) -> bool:
    return "moe" in op.module_path.split(".") and op.name != "router"


def _contracting(axis: Axis, op: Op) -> bool:
    """Whether the op's config splits a reduction dimension over the axis (a partial-sum maker): a matmul or the
    vocab-parallel lookup over tp; no op contracts over cp or ep."""
    return axis == "tp" and (op.kind in CONTRACTING or op.kind == "embedding")


def _tensor_bytes(axis: Axis, spec: TransformerSpec, dev: DeviceSlice, own_tokens: bool = False) -> float:
    """The whole tensor a reshard over `axis` moves: the hidden state of the micro-batch's local tokens over
    tp (over cp the attention's keys and values, _kv_bytes); over ep the tokens routed to top_k experts on
    every rank of the group: of all the micro-batch's local tokens (the hidden state gathered over tp before
    the dispatch), or with own_tokens of those the rank holds (its sequence share under sp: Megatron-Core's
    order where the experts' tp degree is below tp, _read_bytes)."""
    hidden = float(dev.local_tokens * spec.hidden * BYTES_PER_DTYPE[dev.precision.activation_dtype])
    if axis == "ep" and own_tokens and dev.sp:
        own = float(dev.local_tokens // dev.tp * spec.hidden * BYTES_PER_DTYPE[dev.precision.activation_dtype])
        return own * spec.top_k * dev.ep
    return hidden * spec.top_k * dev.ep if axis == "ep" else hidden


def _read_bytes(axis: Axis, spec: TransformerSpec, dev: DeviceSlice, consumer: Op, hidden: float,
                routed: bool = False) -> float:
    """The whole tensor (over tp) that `consumer` reads from the op before it, the buffer a reshard over tp
    moves: q, k and v for the rope and the attention core, the scores for an unfused softmax, the attention's
    output for the projection, the ffn features (the routed tokens' in an MoE) for the activation and the second
    matmul, the logits for the cross-entropy; the hidden state for every other op (hidden: its bytes), or with
    `routed` the routed tokens' hidden states (top_k per token). Over cp and ep: `hidden` (_tensor_bytes).

    routed: a reshard into an expert's first matmul or out of its last where the experts' tp degree d is below
    tp. Megatron-Core's all-to-all dispatcher then runs the all-to-all over ep first, then the all-gather of
    the routed tokens over the d ranks of the expert tp group (and the reduce-scatter before the combine's
    all-to-all): MoEAlltoAllTokenDispatcher dispatch_postprocess / combine_preprocess,
    megatron/core/transformer/moe/token_dispatcher.py, megatron-core 0.16.1. NB: under Megatron's split (d =
    tp) trainsim keeps its order, the hidden state gathered over tp before the dispatch (hidden bytes here, all
    local tokens over ep: _tensor_bytes)."""
    if axis != "tp":
        return hidden
    act, d, f = BYTES_PER_DTYPE[dev.precision.activation_dtype], spec.head_dim, spec.ffn_hidden
    tokens = dev.local_tokens * (spec.top_k if "moe" in consumer.module_path.split(".") else 1)
    if routed and consumer.name not in ("gelu", "fc2", "down", "swiglu"):
        return float(dev.local_tokens * spec.top_k * spec.hidden * act)
    elements = {
        "rope": tokens * (spec.num_heads + 2 * spec.kv_heads) * d,
        "attention": tokens * (spec.num_heads + 2 * spec.kv_heads) * d,
        "softmax": tokens * spec.num_heads * dev.seq_len,
        "out_proj": tokens * spec.num_heads * d,
        "gelu": tokens * f, "fc2": tokens * f, "down": tokens * f, "swiglu": tokens * 2 * f,
        "cross_entropy": tokens * spec.vocab,
    }.get(consumer.name)
    return hidden if elements is None else float(elements * act)


def _expert_tp(fwd: Sequence[Op], dev: DeviceSlice, configs: Configs | None) -> int:
    """The tp degree d of the layer's experts: Megatron's tp, or the degree their configs split the experts'
    features over (d < tp: Megatron-Core's expert_tensor_parallel_size, megatron/core/model_parallel_config.py,
    megatron-core 0.16.1); tp for a layer without experts."""
    expert = next((op for op in fwd if _expert(op)), None)
    if configs is None or expert is None or dev.tp == 1:
        return dev.tp
    config = configs.get((expert.module_path, "tp"), UNSPLIT)
    return max(config.out, config.reduce)


def _kv_bytes(spec: TransformerSpec, dev: DeviceSlice, heads_parts: int) -> float:
    """Keys and values of the whole sequence of a micro-batch, of this tp rank's heads (split heads_parts ways)."""
    act = BYTES_PER_DTYPE[dev.precision.activation_dtype]
    return float(2 * dev.micro_batch * dev.seq_len * spec.kv_heads * spec.head_dim // heads_parts * act)


def _heads_parts(fwd: Sequence[Op], dev: DeviceSlice, configs: Configs | None) -> int:
    """The parts the layer's attention heads are split into over tp: Megatron's tp, or the attention op's
    config's (1 where a tree runs the attention whole on each tp rank)."""
    core = next((op for op in fwd if op.kind == "attention"), None)
    if configs is None or core is None or dev.tp == 1:
        return dev.tp
    return configs.get((core.module_path, "tp"), UNSPLIT).out
