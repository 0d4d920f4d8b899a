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

A strategy tree may give any op of a block's attention or its (dense) MLP, the head's vocabulary projection or its
cross-entropy a config of its own over tp (own_configs; Proteus Sec. IV-B: a split on any op takes effect): any of
(batch, seq, out, reduce) parts, their product dividing tp, reduce on a matmul only: Megatron's split over fewer
ranks d (each group of d consecutive tp ranks runs the op split d ways), none (the op whole on each tp rank), a
matmul split by its reduction dimension (input features sliced, partial sums out) or by its output dimension where
Megatron splits the reduction, an op split by sequence (query rows for the attention core, tokens for a matmul,
whose weight each rank then holds whole, its gradient summed over those ranks with the data-parallel reduction:
token_split_params). A block's norms and residual adds (dense or MoE), the head's final norm, the embedding's
learned positions and BERT's token types and embedding norm may take any batch or sequence split whose parts
divide tp (replicable_module "tokens"): split
by sequence without sp (per-op sequence parallelism; a block then hands on the whole hidden state, its last add's
halves all-gathered: block.ag), or whole under sp; a norm's gain (and bias), like the position table, is held
whole and, where its tokens are split other than Megatron's way, its gradient summed over those ranks as a
token-split matmul's is (Megatron-LM sums the sequence-parallel norms' gradients over tp: finalize_model_grads,
megatron-core 0.9); the positions' add looks up each rank's own positions in the whole table. A norm (a block's or
the head's) may split its hidden features too (out, with or without batch and sequence parts): each rank
normalises its h / out slice of each of its tokens and holds that slice of the gain and bias (no gradient sum for
it over tp); the per-token statistics over the features are partial over the out ranks, one fp32 all-reduce
each: a LayerNorm's sums of x and x^2 forward, of dy' and dy' xhat backward, an RMSNorm's sum of x^2 and of
dy' xhat (_norm_statistics: Colossal-AI's 2D LayerNorm; RMSNorm's derived); the layout changes around it (its
input sliced or exchanged by all-to-all from a sequence split, its output gathered for a reader of whole
features, the gradients' conjugates) come out of the walk below like any op's. A residual add, the positions and
BERT's token types may split the hidden features too (out, with or without token parts): each rank adds its h / out
slice of each of its tokens (no statistics); a table (the positions', the token types') is held 1/out on each rank,
no gradient summed for it over tp unless its tokens are split too (that slice's, over those ranks). A residual
add's second input, the skip connection, is the tensor its block's norm reads (the block's input for residual1,
residual1's sum for residual2): where the add, split by tokens or by features or whole, reads it otherwise than
the norm does, it is resharded from the tensor's layout (block.a2a, block.ag, a slice), and where the add's input
gradient lies otherwise than the norm's, that gradient is resharded back before the two are summed (block.ag:
_skip_reshards); alike, they are summed first and resharded once (the walk's). The embedding's lookup takes
Megatron's split over d dividing tp, none, or a batch or sequence split whose parts divide tp (each rank looks up
its own tokens in the whole table, whose gradient is then summed over those ranks; a tied table then needs the
head's projection whole), an MoE's experts Megatron's split over d or none and its router a batch or sequence
split whose parts divide tp, or none (below); no op takes a split of a reduction dimension it has not
(tp_config_problem says what an op can take). The catalog builders
shape each op at its config (frontends.catalog.transformer block_layer, embedding_layer, head_layer;
compile.shape_layers); a collective over a split of fewer ranks than tp spans them (ir.graph.Comm.ranks), and the
resharding below inserts what the layout changes need: a whole attention beside a split MLP pays only the MLP's
all-reduce pair; qkv split by heads before a whole attention core all-gathers q, k and v; qkv split by its reduction
dimension before a whole core all-reduces them (before a core split by heads: a reduce-scatter); a core split by
sequence after qkv split by heads exchanges q, k and v by all-to-all and all-gathers the keys and values of the
whole sequence (as cp does; their gradient reduce-scattered); a whole head pays no vocab-parallel statistics.

An MoE's experts (their matmuls and activation, all at one degree) may take Megatron's split over d dividing tp
too: Megatron-Core's expert tensor parallelism (expert_tensor_parallel_size, megatron/core/
model_parallel_config.py and parallel_state.py, megatron-core 0.16.1: the experts' own tp groups of d ranks, ep
groups and expert data-parallel groups of world / (d x ep x pp) ranks). Under sp an expert op at degree d keeps
the sequence split of its d ranks' tokens (config seq = tp / d; d = 1: seq = tp, each rank's experts whole on
its own sequence share); without sp every d-group runs all the micro-batch's tokens. Where d < tp, and at
Megatron's split (d = tp) under sp at any ep, the token dispatch follows Megatron-Core's
MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py, token_permutation in 0.9.0,
dispatch_postprocess in 0.16.1: the same order; the dispatcher NeMo's MoE recipes and Megatron-LM's Mixtral
example set): each rank dispatches its own tokens, the all-to-all over ep moves their routed copies (T k h / tp
per rank under sp; none at ep 1, where it is the identity), then the routed tokens are all-gathered over the d
ranks (gather_from_sequence_parallel_region over the expert tp group: T k h, k times the hidden state at ep 1
too) and reduce-scattered after the experts (none at d = 1). The dispatch (not the combine) carries each routed
copy's routing probability beside it, in the router's dtype (0.16.1: _with_probs). Without sp (which
Megatron-Core refuses for MoE training at tp > 1: moe_layer.py) trainsim keeps its order, every rank
dispatching all its local tokens (_read_bytes, _tensor_bytes). Megatron-Core's default dispatcher type is
the all-gather one (MoEAllGatherTokenDispatcher: the hidden state gathered over tp x ep, T ep h a rank), priced
where the stack asks it (StackSpec.moe_dispatcher, DeviceSlice.moe_dispatcher: _allgather_dispatcher). Not
priced: the small per-layer collectives (the all-to-all dispatcher's tokens-per-expert counts gathered over
tp x ep, the load-balancing loss's all-reduce of E counts over tp x cp when moe_aux_loss_coeff > 0). Routing is
dropless (moe_expert_capacity_factor None, both releases' default): the experts run all T k routed copies.
Megatron-Core's TopKRouter holds its weight whole on every tp rank and runs it on the rank's tokens (its
sequence share under sp, as the router op is shaped; its gradient then summed over tp as the norms' are: the
weight's `sequence_parallel` attribute, megatron/core/transformer/moe/router.py and
megatron/core/distributed/finalize_model_grads.py, 0.16.1): Megatron's config here is the norms'. A tree may
give the router a batch or sequence split whose parts divide tp, or none (replicable_module "router"; not its
experts, which its top-k spans): its weight whole on each rank, its gradient summed over the ranks that split its
tokens where the split is not Megatron's (token_split_params). The dispatch then starts from the tokens each rank
routed (dispatch_layout; as wherever the experts take d < tp): the all-to-all over ep moves those tokens' routed
copies (sliced first to the experts' tokens where the router ran more), the routed tokens are all-gathered over
the ranks whose experts read them (and reduce-scattered back before the combine); where the experts' tokens are
split as the dispatched ones, the experts' partial sums travel through the combine and are reduced as the hidden
state onto the next op's layout (trainsim's order). A router split by batch beside experts split by sequence, or
token parts that do not divide each other, are refused (dispatch_problem). NB: the op chain carries the router's
output as the hidden state the experts read (a norm2 whole before a sequence-split router is gathered again
before the experts; the routing decisions' own bytes are not priced, as under Megatron's configs).

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
all-reduce each (megatron/core/tensor_parallel/cross_entropy.py, megatron-core 0.9); a norm reading its
features split all-reduces its statistics likewise (_norm_statistics), in the forward list as the walk meets it
and in the backward as the backward pass does (named after the norm: norm1.sum, final_norm.sum_dy_xhat; the
compiler places them, as every collective outside the attention and MLP, after the layer-phase's last op).
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from trainsim.errors import ConfigError
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
# split the output dimension over tp (q_proj, q_up, kv_up: a multi-head latent attention's up-projections)
COLUMN = ("qkv", "fc1", "gate_up", "logits", "q_proj", "q_up", "kv_up")
ROW = ("out_proj", "fc2", "down")  # split the reduction dimension over tp
FEATURE = ("rope", "attention", "softmax", "gelu", "swiglu", "cross_entropy")  # split the features over tp
_SHORT = {"all-reduce": "ar", "all-gather": "ag", "reduce-scatter": "rs", "all-to-all": "a2a", "send-recv": "p2p"}
_STATISTICS = ("max", "target", "sum_exp")  # the vocab-parallel cross-entropy's all-reduces, in its order
_Found = tuple[str, ReshardStep, str]  # (collective's name, step, the column-parallel matmul it feeds: Comm)
Configs = Mapping[tuple[str, Axis], OpConfig]  # (op module path, axis) -> the op's config (a tree's)
UNSPLIT = OpConfig(1, 1, 1, 1)
COMPUTE_PARTS = ("batch", "seq", "out", "reduce")  # an OpConfig's parts, in its order
TpConfigs = frozenset[tuple[str, OpConfig]]  # (op name, its config over tp) where not Megatron's (own_configs)
# replicable "tokens" outside a block (replicable_module): the head's norm, the positions, BERT's token types and
# embedding norm
TOKEN_PATHS = ("head.norm", "embed.positions", "embed.token_types", "embed.norm")
# an op reading not its producer's output but a tensor laid out as its producer's input (a multi-head latent
# attention's key-value up-projection beside the query's: both read a latent made by the replicated
# down-projections)
_BESIDE = ("kv_up",)
_SKIPS = {"residual1": "norm1", "residual2": "norm2"}  # a block's residual add -> the norm reading its skip input
_BOOL_BYTES = 1  # a torch.bool element (the all-gather dispatcher's routing map)
# a latent attention's down-projections: whole on every tp rank, on its own tokens under sp (Megatron-Core's
# TELinear in "duplicated" mode, its weight's gradient summed over tp as the norms' are: not priced, as theirs)
_DUPLICATED = ("q_down", "kv_down")
_NORM_STATISTICS = {  # a norm split by its features: per-token partial sums, (forward, backward) (_norm_statistics)
    "layernorm": (("sum", "sum_sq"), ("sum_dy", "sum_dy_xhat")),
    "rmsnorm": (("sum_sq",), ("sum_dy_xhat",)),
}


def axis_sizes(kind: LayerKind, dev: DeviceSlice) -> dict[Axis, int]:
    """The model-parallel axes that split a layer of `kind`: size > 1, ep in MoE blocks only."""
    sizes: dict[Axis, int] = {"ep": dev.ep if kind == "moe_block" else 1, "tp": dev.tp, "cp": dev.cp}
    return {axis: sizes[axis] for axis in AXES if sizes[axis] > 1}


def op_config(axis: Axis, op: Op, dev: DeviceSlice, own: TpConfigs = frozenset()) -> OpConfig:
    """The computation config of forward op `op` over `axis` (module doc). own: (op name, config over tp) of the
    replicable ops (replicable_module) a tree configures other than Megatron's (own_configs)."""
    if axis == "tp":
        given = dict(own).get(op.name) if own and replicable_module(op) else None
        return given or megatron_tp(op, dev, dev.tp)
    if axis == "cp":
        return OpConfig(1, dev.cp, 1, 1)
    return OpConfig(1, 1, dev.ep, 1) if _expert(op) else OpConfig(dev.ep, 1, 1, 1)


def megatron_tp(op: Op, dev: DeviceSlice, degree: int) -> OpConfig:
    """Megatron's config of `op` over tp, its split made over `degree` ranks (module doc); an expert op at degree
    d keeps, under sp, the tokens of its d ranks (the sequence split tp / d ways: Megatron-Core's expert tensor
    parallelism, dispatch_layout)."""
    token_parts = dev.tp // degree if dev.sp and _expert(op) else 1
    if op.name in COLUMN or op.name in FEATURE:
        return OpConfig(1, token_parts, degree, 1)
    if op.name in ROW or op.kind == "embedding":
        return OpConfig(1, token_parts, 1, degree)
    return OpConfig(1, dev.tp if dev.sp else 1, 1, 1)


def replicable_module(op: Op) -> str:
    """The part of the model whose op may take a config of its own over tp instead of Megatron's: "attn" (qkv,
    rope, the attention core, softmax, the projection), "mlp" (a dense block's MLP), "experts" (an MoE's expert
    matmuls and activation: Megatron-Core's expert tensor parallelism), "embed" (the token lookup) or "head"
    (the vocabulary projection and the cross-entropy), "tokens" (a block's norms and residual adds, dense or MoE,
    the head's norm, the embedding's positions and BERT's token types and embedding norm: a batch, sequence or
    hidden-feature split), "router" (an MoE's gating matmul: a batch or sequence split, its weight whole); "" for
    any other op (BERT's head transform: Megatron's configs always)."""
    parts = op.module_path.split(".")
    if "attn" in parts:
        return "attn"
    if _expert(op):
        return "experts"
    if "moe" in parts:
        return "router"
    if "mlp" in parts:
        return "mlp"
    if op.kind == "embedding":
        return "embed"
    if op.kind in ("norm", "elementwise") and len(parts) == 3 and parts[:2] in (
            ["blocks", "block"], ["blocks", "moe_block"]):
        return "tokens"
    if op.module_path in TOKEN_PATHS:
        return "tokens"
    return "head" if op.name in ("logits", "cross_entropy") else ""


def tp_config_problem(op: Op, config: OpConfig, dev: DeviceSlice) -> str:
    """Why a replicable op (replicable_module) cannot take `config` over tp ("" where it can): the parts must
    divide tp, the micro-batch and the sequence; reduce splits a matmul's reduction dimension only; out an
    attention or MLP op's, the head's projection or loss, or the hidden features of a norm, a residual add, the
    positions or BERT's token types (not the router's); the lookup takes Megatron's split (reduce) over d
    dividing tp, or none; an MoE's expert op Megatron's split over d dividing tp (under sp with seq = tp / d), or
    none (expert tensor parallelism 1)."""
    if op.kind == "embedding":
        by_tokens = config.out == config.reduce == 1 and config.parts > 1
        if not by_tokens and (config != megatron_tp(op, dev, config.reduce) or dev.tp % config.reduce):
            return f"that split over fewer ranks dividing {dev.tp}, a batch or seq split whose parts divide " \
                f"{dev.tp} (each rank its own tokens from the whole table), or none (the {op.name} whole on each " \
                "tp rank)"
        if by_tokens:
            return _token_problem(config, dev)
        return ""
    if replicable_module(op) == "experts":
        d = max(config.out, config.reduce)
        if dev.tp % d or config != megatron_tp(op, dev, d):
            whole = " ".join(f"{dim}={getattr(megatron_tp(op, dev, 1), dim)}" for dim in COMPUTE_PARTS
                             if getattr(megatron_tp(op, dev, 1), dim) > 1) or "nothing"
            fewer = f"that split over fewer ranks d dividing {dev.tp}{' (and seq=tp/d)' if dev.sp else ''}, or " \
                if dev.tp > 2 else ""
            return f"{fewer}{whole} (the experts whole on each tp rank: expert tensor parallelism 1)"
        return ""
    # the router's top-k spans its experts: its tokens only; a norm, a residual add, the positions and BERT's
    # token types their tokens and hidden features (a norm's statistics all-reduced: _norm_statistics)
    tokens_only = replicable_module(op) == "router"
    dims = COMPUTE_PARTS[:2] if tokens_only else COMPUTE_PARTS if op.kind in CONTRACTING else COMPUTE_PARTS[:3]
    allowed = f"any split of its {', '.join(dims)} whose parts divide {dev.tp}, or none (the {op.name} whole on " \
        "each tp rank)"
    if dev.tp % config.parts or (config.reduce > 1 and op.kind not in CONTRACTING) or (
            tokens_only and config.out * config.reduce > 1):
        return allowed
    return _token_problem(config, dev)


def _token_problem(config: OpConfig, dev: DeviceSlice) -> str:
    """Why a config's parts do not fit tp and the micro-batch ("" where they do)."""
    if dev.tp % config.parts:
        return f"parts whose product divides {dev.tp}"
    sequence = dev.local_tokens // dev.micro_batch
    if dev.micro_batch % config.batch or sequence % config.seq:
        return f"batch and seq parts dividing the micro-batch ({dev.micro_batch} x {sequence} tokens)"
    return ""


def own_configs(fwd: Sequence[Op], dev: DeviceSlice, config_of: Callable[[Op], OpConfig]) -> TpConfigs:
    """(op name, config over tp) of a layer's replicable ops (replicable_module) whose config under config_of is
    not Megatron's and one they can take (tp_config_problem); an op with any other config is left out (it must
    take Megatron's)."""
    out: list[tuple[str, OpConfig]] = []
    for op in fwd:
        config = config_of(op)
        if replicable_module(op) and config != megatron_tp(op, dev, dev.tp) and not tp_config_problem(
                op, config, dev):
            out.append((op.name, config))
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
    strategy tree's, by module path and axis; an op it leaves out is not split); default: Megatron's. Under a
    tree's configs, the collectives beyond those of Megatron's configs of the same ops (per axis, phase and
    collective, in excess of Megatron's count) are marked Comm.reshard: the reshards the tree adds."""
    comms = _axis_comms(spec, dev, kind, fwd, configs)
    return comms if configs is None else mark_reshards(comms, _axis_comms(spec, dev, kind, fwd, None))


def mark_reshards(comms: Sequence[Comm], megatron: Sequence[Comm]) -> tuple[Comm, ...]:
    """`comms` with those in excess of `megatron`'s marked Comm.reshard. Each of Megatron's collectives is
    matched by at most one of `comms` of its axis and phase: the same collective of the same name first, then one
    at the same site (attn, mlp, logits: a tree's collective in place of Megatron's, a reduce-scatter for an
    all-reduce, is the same module running another collective, not one more), then the same collective, then
    any; what is left unmatched is marked."""
    keys: tuple[Callable[[Comm], tuple[str, ...]], ...] = (
        lambda c: (c.axis, c.phase, c.collective, c.name), lambda c: (c.axis, c.phase, _comm_site(c)),
        lambda c: (c.axis, c.phase, c.collective), lambda c: (c.axis, c.phase))
    matched = [False] * len(comms)
    left = [True] * len(megatron)
    for key in keys:
        for i, c in enumerate(comms):
            if matched[i]:
                continue
            j = next((j for j, m in enumerate(megatron) if left[j] and key(m) == key(c)), None)
            if j is not None:
                matched[i], left[j] = True, False
    return tuple(c if m else dataclasses.replace(c, reshard=True) for c, m in zip(comms, matched, strict=True))


def _comm_site(c: Comm) -> str:
    """The module a collective's name places it at (attn.ar: attn)."""
    return c.name.split(".")[0]


def _axis_comms(spec: TransformerSpec, dev: DeviceSlice, kind: LayerKind, fwd: Sequence[Op],
                configs: Configs | None) -> tuple[Comm, ...]:
    """layer_comms' collectives, none marked."""
    comms: list[Comm] = []
    for axis, size in axis_sizes(kind, dev).items():
        def config_of(op: Op, axis: Axis = axis) -> OpConfig:
            if configs is None:
                return op_config(axis, op, dev)
            return configs.get((op.module_path, axis), UNSPLIT)

        if kind == "moe_block" and dev.moe_dispatcher == "allgather":
            _check_allgather_dispatcher(fwd, dev, configs)
        forward, backward = _walk(axis, size, spec, dev, kind, fwd, config_of,
                                  (_heads_parts(fwd, dev, configs), dispatch_layout(fwd, dev, configs)))
        sites = {_site(op): i for i, op in reversed(list(enumerate(fwd)))}
        backward.sort(key=lambda found: sites.get(found[0].split(".")[0], len(sites)))
        comms += [Comm(name, step.collective, axis, "fwd", step.buffer_bytes, _sub(step, size), column)
                  for name, step, column in forward]
        comms += [Comm(name, step.collective, axis, "bwd", step.buffer_bytes, _sub(step, size), column)
                  for name, step, column in backward]
        if axis == "tp":
            comms += _loss_statistics(fwd, dev, config_of)
    return tuple(comms)


def _walk(axis: Axis, size: int, spec: TransformerSpec, dev: DeviceSlice, kind: LayerKind, fwd: Sequence[Op],
          config_of: Callable[[Op], OpConfig], parts: tuple[int, Placement | None]
          ) -> tuple[list[_Found], list[_Found]]:
    """(forward, backward) reshards of the layer's op chain over one axis; the backward's in the order the
    backward pass meets them. parts: the parts the attention's heads are split into over tp, and the layout over
    tp of the tokens each rank dispatches (dispatch_layout; None: trainsim's Megatron order, the hidden state
    gathered over tp before the dispatch). Where there is one, the reshard into the experts' first op goes
    through it: from the router's layout with the hidden state's bytes (a slice), then onto the experts' with the
    routed tokens' (_read_bytes); out of the experts' last op the same way back (Megatron-Core's order)."""
    heads_parts, dispatch = parts
    dispatch_first = dispatch is not None
    full = _tensor_bytes(axis, spec, dev, dispatch)
    handed = handed_on(axis, dev)
    forward: list[_Found] = []
    backward: list[_Found] = []
    placement: Placement | None = None if kind == "embedding" else handed  # the lookup reads token ids
    producer: Op | None = None
    producer_read: Placement | None = placement  # the layout of what the producer read, before its reshard
    forks: dict[str, tuple[Placement, Placement, Placement]] = {}  # a norm's input, its need and its gradient's
    for op in fwd:
        if op.name in _BESIDE:  # it reads a tensor laid out as its producer's input was
            placement = producer_read
        producer_read = placement
        config = config_of(op)
        contracting = _contracting(axis, op)
        need = input_placement(config, size, contracting)
        if op.name in _SKIPS.values() and placement is not None and kind in ("block", "moe_block"):
            forks[op.name] = (placement, need, input_grad_placement(need, config, contracting))
        if op.name in _SKIPS and _SKIPS[op.name] in forks:  # the add's other input: the norm's
            forward_skip, backward_skip = _skip_reshards(forks[_SKIPS[op.name]], need,
                                                         input_grad_placement(need, config, contracting), full)
            forward += _named(layer_site(kind), axis, forward_skip)
            backward += _named(layer_site(kind), axis, backward_skip)
        if placement is not None:
            routed = dispatch_first and (_expert(op) or (producer is not None and _expert(producer)))
            site, read = _namer(axis, kind, producer, op), _read_bytes(axis, spec, dev, op, full, routed)
            grad = input_grad_placement(need, config, contracting)
            boundary = producer is not None and _expert(op) != _expert(producer)
            if boundary and kind == "moe_block" and dev.moe_dispatcher == "allgather":
                forward_steps, backward_steps = _allgather_dispatcher(axis, spec, dev, _expert(op))
                forward += _named(site, axis, forward_steps)
                backward += _named(site, axis, backward_steps)
            elif axis == "tp" and dispatch is not None and boundary:  # through the dispatched tokens' layout
                first, then = (full, read) if _expert(op) else (read, full)
                mid, mid_grad = _through(dispatch, placement), _through(dispatch, grad)
                forward += _named(site, axis, reshard(placement, mid, first))
                forward += _named(site, axis, reshard(mid, need, then))
                backward += _named(site, axis, reshard(mid_grad, output_grad_placement(placement), first))
                backward += _named(site, axis, reshard(grad, mid_grad, then))
            else:
                column = op.name if _megatron_column(axis, op, config, size) else ""
                forward += _named(site, axis, reshard(placement, need, read), column)
                backward += _named(site, axis, reshard(grad, output_grad_placement(placement), read), column)
        forward_extra, backward_extra = _op_collectives(axis, size, spec, dev, op, config, heads_parts)
        forward += forward_extra
        backward += backward_extra
        placement, producer = output_placement(config, size, contracting), op
    if placement is not None and kind != "head":  # the head hands on the loss
        site = _namer(axis, kind, producer, None)
        forward += _named(site, axis, reshard(placement, handed, full))
        backward += _named(site, axis, reshard(handed, output_grad_placement(placement), full))
    return forward, backward[::-1]


def reshard_tp(site: str, steps: tuple[ReshardStep, ...], column: str = "") -> list[_Found]:
    """A reshard over tp between two ops of a layer at `site` (attn, mlp, or the layer's: layer_site), named as
    layer_comms names it (site.kind: attn.ar, mlp.ag, block.ag)."""
    return _named(site, "tp", steps, column)


def op_tp_collectives(spec: TransformerSpec, dev: DeviceSlice, op: Op, config: OpConfig
                      ) -> tuple[list[_Found], list[_Found]]:
    """(forward, backward) collectives an op at `config` over tp needs inside itself (_op_collectives): an
    attention core split by query rows gathers the keys and values, a norm split by its features all-reduces
    its statistics."""
    return _op_collectives("tp", dev.tp, spec, dev, op, config, dev.tp)


def tp_comms(found: Sequence[_Found], phase: Literal["fwd", "bwd"], size: int) -> list[Comm]:
    """Found collectives over tp (reshard_tp, op_tp_collectives) as a layer's Comms."""
    return [Comm(name, step.collective, "tp", phase, step.buffer_bytes, _sub(step, size), column)
            for name, step, column in found]


def _op_collectives(axis: Axis, size: int, spec: TransformerSpec, dev: DeviceSlice, op: Op, config: OpConfig,
                    heads_parts: int) -> tuple[list[_Found], list[_Found]]:
    """(forward, backward) collectives an op needs inside itself, beyond the reshard of its input (the backward's
    in the reverse of the order the backward pass meets them, as _walk collects them): over cp the attention's
    keys and values of the whole sequence; over tp an attention core split by query rows gathers the keys and
    values (_tp_kv_gathers), a norm split by its features all-reduces its statistics (_norm_statistics)."""
    if axis == "cp" and op.kind == "attention":
        return cp_kv_exchange(size, _kv_bytes(spec, dev, heads_parts))
    if axis == "tp" and op.kind == "attention" and config.seq > 1:
        return _tp_kv_gathers(spec, dev, config)
    if axis == "tp" and op.kind == "norm" and config.out > 1:
        forward_stats, backward_stats = _norm_statistics(spec, dev, op, config)
        return forward_stats, backward_stats[::-1]
    return [], []


def _skip_reshards(fork: tuple[Placement, Placement, Placement], need: Placement, grad: Placement, full: float
                   ) -> tuple[tuple[ReshardStep, ...], tuple[ReshardStep, ...]]:
    """(forward, backward) reshards of a residual add's skip input (the tensor its norm reads: fork = the tensor's
    layout, the norm's input layout and its input gradient's) onto the add's layout `need` (its input gradient's:
    `grad`). Forward: none where the add reads it as the norm does (the norm's reshard made it), else from the
    tensor's layout. Backward: none where the add's input gradient lies as the norm's (they are summed, then
    resharded once: the walk's), else onto the tensor's gradient layout."""
    held, norm_need, norm_grad = fork
    forward = () if need == norm_need else reshard(held, need, full)
    backward = () if grad == norm_grad else reshard(grad, output_grad_placement(held), full)
    return forward, backward


def _through(dispatch: Placement, held: Placement) -> Placement:
    """The dispatched tokens' layout as the all-to-alls over ep carry a tensor `held` over tp: its partial sums
    (the experts' output or input gradient, partial over their tp ranks) travel through them unreduced where the
    tokens are split alike (the reduction then moves the hidden state: trainsim's order), else are reduced onto
    the dispatched tokens before (the routed tokens: Megatron-Core's reduce-scatter before the combine)."""
    alike = (held.batch, held.seq) == (dispatch.batch, dispatch.seq)
    return Placement(dispatch.group, dispatch.batch, dispatch.seq, partial=held.partial if alike else 1)


def _allgather_dispatcher(axis: Axis, spec: TransformerSpec, dev: DeviceSlice, into_experts: bool
                          ) -> tuple[tuple[ReshardStep, ...], tuple[ReshardStep, ...]]:
    """(forward, backward) collectives over `axis` of Megatron-Core's MoEAllGatherTokenDispatcher
    (megatron/core/transformer/moe/token_dispatcher.py, megatron-core 0.16.1) into the experts (into_experts) or
    out of them. token_dispatch all-gathers each rank's sequence share of the hidden state [S/tp x B, h], its
    routing probabilities [S/tp x B, E] (the activations' dtype unless moe_router_dtype asks fp32) and, without
    gradient, its routing map (bool) over the tp x ep group: a T ep-token buffer (T = the micro-batch's local
    tokens), whatever the routing; every rank's experts then pick their tokens from it. token_combine
    reduce-scatters the experts' unpermuted outputs [T ep, h] back over the same group (summing the expert tp
    ranks' partial sums with it). The backward runs the conjugates: the gathered hidden state's and
    probabilities' gradient reduce-scattered, the combine's gradient all-gathered. NB: one collective over
    tp x ep ranks there (tp fastest: consecutive ranks), priced here as its two stages, over tp (a T-token
    buffer) then over ep (T ep tokens; reduce-scatters in the reverse order): the same bytes cross each rank's
    links in a ring, one more latency term; and the three gathers of the dispatch as one (their latency terms
    not priced, as _with_probs)."""
    act, h, experts = BYTES_PER_DTYPE[dev.precision.activation_dtype], spec.hidden, spec.num_experts
    tokens = dev.local_tokens * (dev.ep if axis == "ep" else 1)  # the buffer this stage gathers
    size = dev.ep if axis == "ep" else dev.tp
    if into_experts:
        hidden_probs_map = float(tokens * (h * act + experts * act + experts * _BOOL_BYTES))
        return ((ReshardStep("all-gather", size, hidden_probs_map),),
                (ReshardStep("reduce-scatter", size, float(tokens * (h + experts) * act)),))
    combined = float(tokens * h * act)
    return (ReshardStep("reduce-scatter", size, combined),), (ReshardStep("all-gather", size, combined),)


def _check_allgather_dispatcher(fwd: Sequence[Op], dev: DeviceSlice, configs: Configs | None) -> None:
    """The all-gather dispatcher is priced at Megatron's configs of the router and the experts, under sp at
    tp > 1 (Megatron-Core refuses MoE training at tp > 1 without sp: MoELayer.forward, megatron/core/transformer/
    moe/moe_layer.py, 0.16.1); one short line where not."""
    if dev.tp == 1:
        return
    if not dev.sp:
        raise ConfigError("sp", False, "moe_dispatcher allgather at tp > 1 needs sequence parallelism "
                          "(Megatron-Core refuses MoE training at tp > 1 without it)")
    expert = next((op for op in fwd if _expert(op)), None)
    first = UNSPLIT if expert is None or configs is None else configs.get((expert.module_path, "tp"), UNSPLIT)
    megatron = configs is None or (max(first.out, first.reduce) == dev.tp
                                   and dispatch_layout(fwd, dev, configs) == Placement(dev.tp, 1, dev.tp))
    if not megatron:
        raise ConfigError("moe_dispatcher", "allgather", "priced at Megatron's split of the router and the "
                          "experts over tp only; give them no configs of their own, or use alltoall")


def _loss_statistics(fwd: Sequence[Op], dev: DeviceSlice, config_of: Callable[[Op], OpConfig]) -> list[Comm]:
    """The cross-entropy reading a class dimension split tp ways: each statistic's partial sums all-reduced."""
    loss = next((op for op in fwd if op.name == "cross_entropy"), None)
    if loss is None or config_of(loss).out == 1:
        return []
    return loss_statistics(config_of(loss), dev)


def loss_statistics(config: OpConfig, dev: DeviceSlice) -> list[Comm]:
    """A loss at `config` over tp reading its class dimension split config.out ways: its three per-token
    statistics (max logit, target logit, sum of exponentials) partial over those ranks, one fp32 all-reduce each
    (megatron/core/tensor_parallel/cross_entropy.py, megatron-core 0.9)."""
    whole = Placement(dev.tp, config.batch, config.seq)  # each statistic of the op's tokens
    steps = reshard(Placement(dev.tp, config.batch, config.seq, partial=config.out), whole,
                    dev.local_tokens * 4.0)  # fp32
    return [Comm(f"loss.{name}", step.collective, "tp", "fwd", step.buffer_bytes, _sub(step, dev.tp))
            for name in _STATISTICS for step in steps]


def _norm_statistics(spec: TransformerSpec, dev: DeviceSlice, op: Op, config: OpConfig
                     ) -> tuple[list[_Found], list[_Found]]:
    """(forward, backward) all-reduces of a norm splitting its hidden features `out` ways over tp: each rank
    normalises its h / out features of its tokens (1 / (batch x seq) of the local tokens), so every per-token sum
    over the hidden features is partial over the out ranks: one fp32 all-reduce each (_NORM_STATISTICS, in the
    order the pass needs them). LayerNorm: the sums of x and of x^2 (mean and variance), in the backward the sums
    of dy' = dy * gain and of dy' * xhat (dx = rstd (dy' - mean(dy') - xhat mean(dy' xhat))): Colossal-AI's 2D
    LayerNorm (colossalai/legacy/nn/layer/parallel_2d/layers.py LayerNorm2D.forward and _operation.py
    _Layernorm_2D.backward, colossalai 0.5.0: two all-reduces each way over the row group). RMSNorm: derived, the
    same with the mean terms dropped (dx = rrms (dy' - xhat mean(dy' xhat))): the sum of x^2, then of dy' xhat.
    NB: fp32, as PyTorch's layer_norm keeps its statistics in the accumulation type for half inputs; a fused
    kernel could all-reduce a token's two statistics in one collective (half the latency terms)."""
    split = Placement(dev.tp, config.batch, config.seq, partial=config.out)
    steps = reshard(split, Placement(dev.tp, config.batch, config.seq), dev.local_tokens * 4.0)  # fp32
    forward_names, backward_names = _NORM_STATISTICS[spec.norm]
    return ([(f"{op.name}.{name}", step, "") for name in forward_names for step in steps],
            [(f"{op.name}.{name}", step, "") for name in backward_names for step in steps])


def _sub(step: ReshardStep, size: int) -> int:
    """The sub-group a collective spans (ir.graph.Comm.ranks): its ranks where fewer than the axis' `size`."""
    return step.ranks if step.collective != "send-recv" and step.ranks < size else 0


def _namer(axis: Axis, kind: LayerKind, producer: Op | None, consumer: Op | None) -> str:
    """The site of a reshard between two ops: the reader's, else the producer's, else the layer's (the compiler
    places a collective after its site's last op); over ep the token dispatch or combine."""
    if axis == "ep":
        return "dispatch" if consumer is not None and _expert(consumer) else "combine"
    ops = [op for op in (consumer, producer) if op is not None]
    return next((s for s in (_site(op) for op in ops) if s), layer_site(kind))


def _named(site: str, axis: Axis, steps: tuple[ReshardStep, ...], column: str = "") -> list[_Found]:
    """Collectives named site.kind (attn.ag, mlp.rs, kv.ag); over ep the site alone. column: the column-parallel
    matmul whose input they reshard (ir.graph.Comm.column_input), '' for none."""
    return [(site if axis == "ep" else f"{site}.{_SHORT[step.collective]}", step, column) for step in steps]


def _megatron_column(axis: Axis, op: Op, config: OpConfig, size: int) -> bool:
    """Whether `op` is a column-parallel matmul at Megatron's split over the whole tp group (qkv, fc1, gate_up, the
    vocabulary projection; not an MoE's experts, which Megatron-Core runs as grouped GEMMs of their own):
    the ColumnParallelLinear whose backward Megatron overlaps with its collectives (ir.graph.Comm.column_input)."""
    return (axis == "tp" and op.kind == "matmul" and op.name in COLUMN and not _expert(op)
            and config == OpConfig(1, 1, size, 1))


def module_site(module_path: str) -> str:
    """The attention or MLP module an op runs in, by a part of its module path: the catalog's `attn`, `mlp`; a
    captured model's as Hugging Face names them (`self_attn`, `attention`, `ffn`, `feed_forward`); '' for neither.
    The sites a captured graph's collectives are named by (compile.shape_front_end) and its ops placed at
    (compile.context)."""
    parts = module_path.split(".")
    for site, words in (("attn", ("attn", "attention")), ("mlp", ("mlp", "ffn", "feed_forward"))):
        if any(word in part for part in parts for word in words):
            return site
    return ""


def _site(op: Op) -> str:
    parts = op.module_path.split(".")
    if "attn" in parts:
        return "attn"
    if "mlp" in parts or "moe" in parts:
        return "mlp"
    return ""


def layer_site(kind: LayerKind) -> str:
    """A block's own site: a reshard between its norms and residual adds and the hidden state it reads or hands
    on (block.ag: a block whose residual adds split the sequence without sp gathers what it hands on)."""
    return {"embedding": "embed", "head": "logits"}.get(kind, "block")


def _expert(op: Op) -> bool:
    return "moe" in op.module_path.split(".") and op.name != "router"


def _contracting(axis: Axis, op: Op) -> bool:
    """Whether the op's config splits a reduction dimension over the axis (a partial-sum maker): a matmul or the
    vocab-parallel lookup over tp; no op contracts over cp or ep."""
    return axis == "tp" and (op.kind in CONTRACTING or op.kind == "embedding")


def _tensor_bytes(axis: Axis, spec: TransformerSpec, dev: DeviceSlice, dispatch: Placement | None = None) -> float:
    """The whole tensor a reshard over `axis` moves: the hidden state of the micro-batch's local tokens over
    tp (over cp the attention's keys and values, _kv_bytes); over ep the tokens routed to top_k experts on
    every rank of the group: of all the micro-batch's local tokens (the hidden state gathered over tp before
    the dispatch), or, given the layout over tp of the tokens a rank dispatches (dispatch_layout), of those
    (its router's tokens, or its experts' where they run fewer: Megatron-Core's order, _read_bytes)."""
    hidden = float(dev.local_tokens * spec.hidden * BYTES_PER_DTYPE[dev.precision.activation_dtype])
    parts = 1 if dispatch is None else dispatch.batch * dispatch.seq
    if axis == "ep" and parts > 1:
        own = float(dev.local_tokens // parts * spec.hidden * BYTES_PER_DTYPE[dev.precision.activation_dtype])
        return own * spec.top_k * dev.ep
    return hidden * spec.top_k * dev.ep if axis == "ep" else hidden


def _read_bytes(axis: Axis, spec: TransformerSpec, dev: DeviceSlice, consumer: Op, hidden: float,
                routed: bool = False) -> float:
    """The whole tensor (over tp) that `consumer` reads from the op before it, the buffer a reshard over tp
    moves: q, k and v for the rope and the attention core, the scores for an unfused softmax, the attention's
    output for the projection, the ffn features (the routed tokens' in an MoE) for the activation and the second
    matmul, the logits for the cross-entropy; the hidden state for every other op (hidden: its bytes), or with
    `routed` the routed tokens' hidden states (top_k per token). Over cp and ep: `hidden` (_tensor_bytes). The
    dispatch into an expert (over ep, and the routed gather over tp) moves the copies' probabilities too
    (_with_probs).

    routed: a reshard into an expert's first matmul or out of its last where the experts' tp degree d is below
    tp or the router takes a config of its own (dispatch_layout). Megatron-Core's all-to-all dispatcher then
    runs the all-to-all over ep first, then the all-gather of the routed tokens over the ranks of the expert tp
    group that dispatched other tokens (and the reduce-scatter before the combine's all-to-all):
    MoEAlltoAllTokenDispatcher dispatch_postprocess / combine_preprocess,
    megatron/core/transformer/moe/token_dispatcher.py, megatron-core 0.16.1; and so at Megatron's configs of the
    router and the experts under sp at any ep (dispatch_layout). NB: at those configs without sp trainsim keeps
    its order (hidden bytes here, all local tokens over ep: _tensor_bytes)."""
    if axis == "ep" and _expert(consumer):
        return hidden * _with_probs(spec)
    if axis != "tp":
        return hidden
    parts = consumer.module_path.split(".")
    moe = "moe" in parts
    act, d = BYTES_PER_DTYPE[dev.precision.activation_dtype], spec.head_dim
    f = spec.expert_ffn if moe else spec.shared_expert_ffn_hidden if "shared" in parts else spec.ffn_hidden
    tokens = dev.local_tokens * (spec.top_k if moe else 1)
    if routed and consumer.name not in ("gelu", "fc2", "down", "swiglu"):
        routed_bytes = float(dev.local_tokens * spec.top_k * spec.hidden * act)
        return routed_bytes * _with_probs(spec) if _expert(consumer) else routed_bytes
    elements = {
        "rope": tokens * (spec.num_heads + 2 * spec.kv_heads) * d,
        "attention": tokens * (spec.num_heads + 2 * spec.kv_heads) * d,
        "softmax": tokens * spec.num_heads * dev.seq_len,
        "out_proj": tokens * spec.num_heads * d,
        **(_mla_reads(spec, tokens) if spec.mla is not None else {}),
        "gelu": tokens * f, "fc2": tokens * f, "down": tokens * f, "swiglu": tokens * 2 * f,
        "cross_entropy": tokens * spec.vocab,
    }.get(consumer.name)
    return hidden if elements is None else float(elements * act)


def _mla_reads(spec: TransformerSpec, tokens: int) -> dict[str, int]:
    """What the ops of a multi-head latent attention read (elements; module doc of ir.model_spec.MlaSpec): the
    query latent (q_up), the key-value latent and the rotary key (kv_up: Megatron-Core gathers both over tp under
    sp, multi_latent_attention.py get_query_key_value_tensors, megatron-core 0.16.1), the queries and keys (rope:
    their rotary parts), the queries, keys and values (the core), the heads' values (the projection)."""
    mla, heads = spec.mla, spec.num_heads
    assert mla is not None
    return {"q_up": tokens * mla.q_lora_rank, "kv_up": tokens * (mla.kv_lora_rank + mla.qk_rope_head_dim),
            "rope": tokens * (heads + 1) * mla.qk_rope_head_dim,
            "attention": tokens * (heads * mla.qk_head_dim + spec.kv_features),
            "out_proj": tokens * heads * mla.v_head_dim}


def ep_token_comms(spec: TransformerSpec, dev: DeviceSlice) -> tuple[Comm, ...]:
    """An MoE block's all-to-alls over ep where tp is 1, as layer_comms derives them at Megatron's configs: the
    dispatch of every local token's top_k routed copies (with their probabilities: _with_probs) and the combine
    of the experts' outputs, forward; their gradients backward, in the order the backward meets them. For a
    graph whose ops carry no Megatron names (a captured MoE: frontends.torch.moe). () at ep 1."""
    if dev.ep == 1:
        return ()
    if dev.tp != 1 or dev.cp != 1:
        raise ConfigError("tp x cp", dev.tp * dev.cp, "1 with ep > 1 on a graph without Megatron's op names")
    routed = _tensor_bytes("ep", spec, dev) / dev.ep  # the buffer an all-to-all moves a rank: T k h bytes
    dispatch, combine = routed * _with_probs(spec), routed
    return (Comm("dispatch", "all-to-all", "ep", "fwd", dispatch), Comm("combine", "all-to-all", "ep", "fwd", combine),
            Comm("combine", "all-to-all", "ep", "bwd", combine), Comm("dispatch", "all-to-all", "ep", "bwd", dispatch))


def _with_probs(spec: TransformerSpec) -> float:
    """The routed tokens' bytes with their routing probabilities as the dispatch moves them, over the tokens'
    alone: Megatron-Core's all-to-all dispatcher sends each routed copy's probability (in the router's dtype, the
    activations' unless moe_router_dtype asks fp32: TopKRouter.gating, megatron/core/transformer/moe/router.py)
    through the all-to-all over ep and the all-gather over tp beside its hidden state (token_dispatch,
    dispatch_postprocess, megatron/core/transformer/moe/token_dispatcher.py, megatron-core 0.16.1), and their
    gradient back in the backward; the combine moves the expert outputs alone (the probabilities were applied in
    the experts' activation). 1 + 1 / hidden. NB: one collective per pair here, where Megatron-Core issues two
    (the probabilities' latency term is not priced). 0.9.0 sends no probabilities (its unpermute applies them
    after the combine, keeping the combined expert outputs for their gradient)."""
    return 1.0 + 1.0 / spec.hidden


def cp_kv_exchange(size: int, kv_bytes: float) -> tuple[list[_Found], list[_Found]]:
    """(forward, backward) of an attention core's keys and values over a cp group of `size` ranks: those of the
    whole sequence all-gathered forward (kv.ag), their gradient reduce-scattered backward (kv.rs)."""
    return (_named("kv", "cp", reshard(Placement(size, seq=size), Placement(size), kv_bytes)),
            _named("kv", "cp", reshard(Placement(size, partial=size), Placement(size, seq=size), kv_bytes)))


def _tp_kv_gathers(spec: TransformerSpec, dev: DeviceSlice, config: OpConfig) -> tuple[list[_Found], list[_Found]]:
    """An attention core splitting its query rows (seq parts) over tp reads the keys and values of the whole
    sequence, of its heads (out parts): all-gathered over the seq parts; in the backward their gradient,
    partial over those ranks, reduce-scattered (as context parallelism does; Proteus Sec. V-B's patterns)."""
    act = BYTES_PER_DTYPE[dev.precision.activation_dtype]
    kv = float(dev.local_tokens * spec.kv_features * act)  # all heads: the tensor over tp
    split = Placement(dev.tp, config.batch, config.seq, config.out)
    whole = Placement(dev.tp, config.batch, 1, config.out)
    partial = Placement(dev.tp, config.batch, 1, config.out, config.seq)
    return (_named("attn.kv", "tp", reshard(split, whole, kv)),
            _named("attn.kv", "tp", reshard(partial, split, kv)))


def token_split_params(spec: TransformerSpec, fwd: Sequence[Op], config_of: Callable[[Op], OpConfig],
                       dev: DeviceSlice | None = None) -> dict[int, float]:
    """{k: parameters} of a layer's matmuls, its lookup (and, given the slice `dev`, its norms, positions and MoE
    router) whose config over tp splits their tokens k = batch x seq ways: each of those k tp ranks holds the
    weight part whole and makes its gradient from its own tokens, so the gradient is summed over them as well as
    over the data-parallel ranks, once per iteration, in the data-parallel gradient reduction (Megatron-LM sums
    the gradients of the weights sequence parallelism replicates over tp once per iteration too,
    finalize_model_grads, megatron-core 0.9, by an all-reduce of its own). A matmul's parameters as one rank holds
    them: its local weight (op.shape: batch, m, n, k) and a block's bias; a norm's (a block's or the head's): its
    gain (and a LayerNorm's bias), the 1/out of it the rank holds, where its config is not Megatron's; an MoE
    router's: its whole gating weight, where its config is not Megatron's; the lookup's (by tokens, its own
    config): the whole token table (vocab x hidden); the positions' (by tokens, their own config): the whole
    position table. NB: Megatron's own token-split weights (the norms and an MoE router under sp, a BERT transform
    under sp, a latent attention's down-projections: _DUPLICATED) are left out, as before."""
    out: dict[int, float] = {}
    for op in fwd:
        config = config_of(op)
        parts = config.batch * config.seq
        if parts == 1 or op.name in _DUPLICATED:
            continue
        if op.kind == "matmul" and replicable_module(op) in ("attn", "mlp", "head"):
            _, _, n, k = op.shape
            bias = n if spec.bias and replicable_module(op) in ("attn", "mlp") else 0
            out[parts] = out.get(parts, 0.0) + float(n * k + bias)
        elif op.kind == "norm" and replicable_module(op) == "tokens" and dev is not None and (
                config != megatron_tp(op, dev, dev.tp)):
            out[parts] = out.get(parts, 0.0) + float(norm_params(spec)) / config.out
        elif replicable_module(op) == "router" and dev is not None and config != megatron_tp(op, dev, dev.tp):
            out[parts] = out.get(parts, 0.0) + float(router_params(spec))
        elif op.module_path in _TABLES and dev is not None and config != megatron_tp(op, dev, dev.tp):
            out[parts] = out.get(parts, 0.0) + float(_TABLES[op.module_path](spec)) / config.out
        elif op.kind == "embedding":  # the lookup by tokens: the whole table on each of those ranks
            out[parts] = out.get(parts, 0.0) + float(spec.vocab * spec.hidden)
    return out


_TABLES: dict[str, Callable[[TransformerSpec], int]] = {  # the embedding's tables added to the tokens' vectors
    "embed.positions": lambda spec: spec.max_seq_len * spec.hidden,
    "embed.token_types": lambda spec: 2 * spec.hidden,  # BERT's two token types
}


def router_params(spec: TransformerSpec) -> int:
    """The parameters of an MoE's router: its gating weight, hidden features x experts (no bias)."""
    return spec.hidden * spec.num_experts


def norm_params(spec: TransformerSpec) -> int:
    """The parameters of one norm: its gain over the hidden features, and a LayerNorm's bias."""
    return spec.hidden * (2 if spec.norm == "layernorm" else 1)


def dispatch_layout(fwd: Sequence[Op], dev: DeviceSlice, configs: Configs | None) -> Placement | None:
    """How the tp ranks hold the tokens each dispatches to the experts (Placement over tp: batch and seq parts),
    or None for trainsim's order under Megatron's configs of the router and the experts without sp (the hidden
    state whole on every tp rank, each dispatching all its local tokens). Where the experts take a tp degree
    d < tp (Megatron-Core's expert_tensor_parallel_size, megatron/core/model_parallel_config.py, megatron-core
    0.16.1), the router a config of its own, or under sp Megatron's at any ep (module doc; at ep 1 the
    all-to-all is the identity: all_to_all in megatron/core/tensor_parallel/mappings.py returns its input on a
    group of one, and the routed tokens are still gathered over tp), each rank dispatches the tokens its router
    routed, as Megatron-Core's MoEAlltoAllTokenDispatcher does (megatron/core/transformer/moe/
    token_dispatcher.py, 0.16.1), sliced to its experts' tokens where the router ran more (a router whole beside
    experts on their ranks' sequence shares): the finer of the two token splits (dispatch_problem refuses splits
    that do not nest). None for a layer without experts."""
    router = next((op for op in fwd if replicable_module(op) == "router"), None)
    expert = next((op for op in fwd if _expert(op)), None)
    if router is None or expert is None or dev.tp == 1:
        return None
    if configs is None:
        gate, first = megatron_tp(router, dev, dev.tp), megatron_tp(expert, dev, dev.tp)
    else:
        gate = configs.get((router.module_path, "tp"), UNSPLIT)
        first = configs.get((expert.module_path, "tp"), UNSPLIT)
    if max(first.out, first.reduce) == dev.tp and gate == megatron_tp(router, dev, dev.tp) and not dev.sp:
        return None
    if first.batch * first.seq > gate.batch * gate.seq:
        return Placement(dev.tp, first.batch, first.seq)
    return Placement(dev.tp, gate.batch, gate.seq)


def dispatch_problem(fwd: Sequence[Op], dev: DeviceSlice, own: TpConfigs) -> str:
    """Why the layer's router and experts at their configs over tp (own: a tree's, own_configs) cannot be priced
    exactly ("" where they can): the tokens a rank dispatches (dispatch_layout) must be its router's or its
    experts', one split holding the other's parts whole: a router split by batch beside experts split by sequence
    (their d < tp ranks' sequence shares under sp), or token parts that do not divide each other, are not."""
    router = next((op for op in fwd if replicable_module(op) == "router"), None)
    expert = next((op for op in fwd if _expert(op)), None)
    if router is None or expert is None:
        return ""
    gate, first = (op_config("tp", op, dev, own) for op in (router, expert))
    routed, run = gate.batch * gate.seq, first.batch * first.seq
    if (gate.batch > 1 and first.seq > 1) or max(routed, run) % min(routed, run):
        return f"the router split {routed} ways by {'batch' if gate.batch > 1 else 'seq'} beside experts split " \
            f"{run} ways by seq (their tp degree below {dev.tp} under sp): each rank dispatches the tokens it " \
            "routed, which must hold its experts' tokens or lie within them; split the router by seq into parts " \
            f"dividing or divided by {run}"
    return ""


def _kv_bytes(spec: TransformerSpec, dev: DeviceSlice, heads_parts: int) -> float:
    """Keys and values of the whole sequence of a micro-batch, of this tp rank's heads (split heads_parts ways)."""
    act = BYTES_PER_DTYPE[dev.precision.activation_dtype]
    return float(dev.micro_batch * dev.seq_len * spec.kv_features // heads_parts * act)


def _heads_parts(fwd: Sequence[Op], dev: DeviceSlice, configs: Configs | None) -> int:
    """The parts the layer's attention heads are split into over tp: Megatron's tp, or the attention op's
    config's (1 where a tree runs the attention whole on each tp rank)."""
    core = next((op for op in fwd if op.kind == "attention"), None)
    if configs is None or core is None or dev.tp == 1:
        return dev.tp
    return configs.get((core.module_path, "tp"), UNSPLIT).out
