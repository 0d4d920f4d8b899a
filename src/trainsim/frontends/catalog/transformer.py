"""Analytic builder: TransformerSpec + DeviceSlice -> OpGraph (per device, forward and backward).

The feature collectives of TP, SP, CP and EP are not written here: strategy.megatron derives them from the
splits those axes make of each layer's ops (the resharding between ops' computation configs).

Each op of a block's attention and MLP, a block's norms and residual adds (dense or MoE), an MoE's router, the
lookup, the learned positions, BERT's token types and embedding norm, the head's norm, the logits and the
cross-entropy is shaped by its own
computation config over tp: Megatron's split over the job's tp, or the config a strategy tree gives it (the
builders' `own`, strategy.megatron.own_configs): (batch, seq, out, reduce) parts, each rank running the op on
1/(batch x seq) of the tokens, 1/out of its output features and 1/reduce of its reduction dimension, and holding
1/(out x reduce) of its weight (a config of none: the whole op on every tp rank; a norm split by its features,
out, runs and holds 1/out of them, as a residual add runs and the positions' or token types' table is held
split by features; the router, split by tokens or none, holds its weight whole). An MoE's experts
take Megatron's split over a degree d dividing tp, or none, and run the routed copies of their d ranks' tokens
under sp (_expert_tokens)."""

from collections.abc import Mapping

from trainsim.errors import ConfigError
from trainsim.frontends.catalog.latent_attention import mla_ops, mla_params
from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.flops import (
    attention_backward,
    attention_op,
    matmul_backward,
    matmul_op,
    pointwise_backward,
    pointwise_op,
)
from trainsim.ir.graph import ExpertShard, Layer, LayerKind, Op, OpGraph, OpKind
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.megatron import (
    ROW,
    Configs,
    TpConfigs,
    axis_sizes,
    layer_comms,
    norm_params,
    op_config,
    router_params,
)
from trainsim.strategy.placement import OpConfig


def build_transformer(spec: TransformerSpec, dev: DeviceSlice) -> OpGraph:
    layers: list[Layer] = [embedding_layer(spec, dev)]
    dense_count = spec.num_layers - spec.num_moe_layers
    if dense_count:
        layers.append(block_layer(spec, dev, dense_count, moe=False))
    if spec.num_moe_layers:
        layers.append(block_layer(spec, dev, spec.num_moe_layers, moe=True))
    layers.append(head_layer(spec, dev))
    return OpGraph(spec.name, tuple(layers), dev.local_tokens, dev.micro_batch,
                   leading_dense_blocks=spec.leading_dense_layers)


def _act_bytes(dev: DeviceSlice) -> int:
    return BYTES_PER_DTYPE[dev.precision.activation_dtype]


def _replicated_tokens(dev: DeviceSlice) -> int:
    """Tokens a device holds in the parts TP does not split (norms, dropout, residual): split by sp."""
    return dev.local_tokens // dev.tp if dev.sp else dev.local_tokens


def _with_backward(fwd: list[Op]) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    bwd: list[Op] = []
    for op in reversed(fwd):
        if op.kind == "matmul":
            bwd.extend(matmul_backward(op))
        elif op.kind == "attention":
            bwd.append(attention_backward(op))
        else:
            bwd.append(pointwise_backward(op))
    return tuple(fwd), tuple(bwd)


def _block_params(spec: TransformerSpec, moe: bool) -> tuple[float, float]:
    """(attention + norms, mlp) parameter counts of one block before sharding."""
    h, d = spec.hidden, spec.head_dim
    qkv_out = (spec.num_heads + 2 * spec.kv_heads) * d
    attn = h * qkv_out + spec.num_heads * d * h + ((qkv_out + h) if spec.bias else 0)
    if spec.mla is not None:
        attn = sum(mla_params(spec))
    norms = 2 * h * (2 if spec.norm == "layernorm" else 1)
    if moe:
        return attn + norms, _routed_params(spec) + _mlp_params(spec, spec.shared_expert_ffn_hidden)
    return attn + norms, _mlp_params(spec, spec.ffn_hidden)


def _mlp_params(spec: TransformerSpec, ffn: int) -> int:
    """One MLP's parameters at FFN width `ffn` (0: none)."""
    mats = 3 if spec.mlp == "swiglu" else 2
    return mats * spec.hidden * ffn + ((ffn + spec.hidden) if spec.bias and ffn else 0)


def _routed_params(spec: TransformerSpec) -> int:
    """An MoE block's routed experts at their width and its router (hidden x experts)."""
    return spec.num_experts * _mlp_params(spec, spec.expert_ffn) + spec.hidden * spec.num_experts


def _attention_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, c: Mapping[str, OpConfig],
                   rows: Mapping[str, int], widths: Mapping[str, int]) -> list[Op]:
    """norm1, the attention module with each op shaped at its config c[name] over tp (a multi-head latent
    attention at Megatron-Core's: latent_attention.mla_ops), residual1 (the norm and the residual add on
    rows[name] tokens: _token_rows, and widths[name] features: _norm_widths)."""
    tokens = dev.local_tokens
    act, lin, h, d = dev.precision.activation_dtype, dev.precision.linear_dtype, spec.hidden, spec.head_dim
    mb = dev.micro_batch
    norm1 = pointwise_op("norm1", "norm", f"{path}.norm1", act, rows["norm1"] * widths["norm1"],
                         flops_per_element=5.0)
    residual1 = pointwise_op("residual1", "elementwise", f"{path}.residual1", act,
                             rows["residual1"] * widths["residual1"], reads=2.0)
    if spec.mla is not None:
        return [norm1, *mla_ops(spec, dev, path, _replicated_tokens(dev)), residual1]

    def heads(name: str) -> tuple[int, int]:
        return spec.num_heads // c[name].out, max(1, spec.kv_heads // c[name].out)

    q, kv = heads("qkv")
    ops = [norm1,
           matmul_op("qkv", f"{path}.attn.qkv", lin, tokens // _token_parts(c["qkv"]), (q + 2 * kv) * d,
                     h // c["qkv"].reduce)]
    if spec.position == "rope":
        q, kv = heads("rope")
        ops.append(pointwise_op("rope", "elementwise", f"{path}.attn.rope", act,
                                tokens // _token_parts(c["rope"]) * (q + kv) * d))
    core = c["attention"]  # NB: a causal core split by query rows is taken as load-balanced (zig-zag rows)
    ops.append(attention_op(f"{path}.attn.core", dev.precision.matmul_dtype,
                            mb // core.batch * heads("attention")[0], tokens // mb // core.seq, dev.seq_len, d,
                            spec.causal, dev.attention))
    if not dev.fused_attention:
        soft = c["softmax"]
        ops.append(pointwise_op("softmax", "softmax", f"{path}.attn.softmax", act,
                                mb // soft.batch * heads("softmax")[0] * (tokens // mb // soft.seq) * dev.seq_len,
                                flops_per_element=5.0, selective=True))
    ops.append(matmul_op("out_proj", f"{path}.attn.out", lin, tokens // _token_parts(c["out_proj"]),
                         h // c["out_proj"].out, spec.num_heads // c["out_proj"].reduce * d))
    ops.append(residual1)
    return ops


def _token_parts(config: OpConfig) -> int:
    """The parts an op's config splits the tokens into (a device runs 1/parts of them)."""
    return config.batch * config.seq


def _mlp_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, tokens: int, experts_local: int,
             c: Mapping[str, OpConfig], f: int) -> list[Op]:
    """The MLP (or each local expert's) at FFN width f with each op shaped at its config c[name] over tp."""
    lin, act, h = dev.precision.linear_dtype, dev.precision.activation_dtype, spec.hidden
    routed = tokens * experts_local  # tokens processed by this device's experts (balanced routing)

    def rows(name: str) -> int:
        return routed // _token_parts(c[name])

    if spec.mlp == "swiglu":
        return [matmul_op("gate_up", f"{path}.mlp.gate_up", lin, rows("gate_up"), 2 * (f // c["gate_up"].out),
                          h // c["gate_up"].reduce),
                pointwise_op("swiglu", "elementwise", f"{path}.mlp.act", act, rows("swiglu") * (f // c["swiglu"].out),
                             reads=2.0, flops_per_element=4.0),
                matmul_op("down", f"{path}.mlp.down", lin, rows("down"), h // c["down"].out, f // c["down"].reduce)]
    return [matmul_op("fc1", f"{path}.mlp.fc1", lin, rows("fc1"), f // c["fc1"].out, h // c["fc1"].reduce),
            pointwise_op("gelu", "elementwise", f"{path}.mlp.act", act, rows("gelu") * (f // c["gelu"].out),
                         flops_per_element=8.0),
            matmul_op("fc2", f"{path}.mlp.fc2", lin, rows("fc2"), h // c["fc2"].out, f // c["fc2"].reduce)]


_ATTN_OPS = ("qkv", "rope", "attention", "softmax", "out_proj")
_MLP_OPS = ("fc1", "gelu", "fc2", "gate_up", "swiglu", "down")


def _mlp_op_names(spec: TransformerSpec) -> tuple[str, str, str]:
    """The MLP's first matmul, activation and second matmul, as _mlp_ops names them."""
    return ("gate_up", "swiglu", "down") if spec.mlp == "swiglu" else ("fc1", "gelu", "fc2")


def _expert_tokens(dev: DeviceSlice, d: int) -> int:
    """The tokens whose routed copies a rank's experts at tp degree d run: under sp the sequence shares of the d
    ranks of its expert tp group (Megatron-Core's expert tensor parallelism gathers them over those ranks after
    the dispatch: MoEAlltoAllTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py, megatron-core
    0.16.1), all the micro-batch's local tokens at d = tp (Megatron's split) or without sp."""
    return dev.local_tokens * d // dev.tp if dev.sp else dev.local_tokens


def block_layer(spec: TransformerSpec, dev: DeviceSlice, count: int, moe: bool,
                own: TpConfigs = frozenset()) -> Layer:
    """`count` dense (or MoE) blocks as one device runs them: attention and MLP split over the slice's tp
    (Megatron's), except the ops in `own` (of the attention or a dense MLP: strategy.megatron.replicable_module),
    shaped at their own configs over tp (module doc), the block's collectives derived from those configs."""
    name = "moe_block" if moe else "block"
    path = f"blocks.{name}"
    act, h = dev.precision.activation_dtype, spec.hidden
    if own and (spec.mla is not None or spec.shared_expert_ffn_hidden):
        what = "a multi-head latent attention" if spec.mla is not None else "shared experts"
        raise ConfigError("strategy tree", ", ".join(sorted(op for op, _ in own)), f"{spec.name} has {what}, "
                          "priced at Megatron-Core's split over tp only: give its blocks' ops no configs of their "
                          "own")
    given = dict(own)
    c = {op: given.get(op, _megatron(op, dev.tp)) for op in _ATTN_OPS + _MLP_OPS}
    rows = _token_rows(dev, given)
    widths = _norm_widths(spec, given)
    own_norms = tuple(given[name].out for name in ("norm1", "norm2") if name in given)
    fwd = _attention_ops(spec, dev, path, c, rows, widths)
    fwd.append(pointwise_op("norm2", "norm", f"{path}.norm2", act, rows["norm2"] * widths["norm2"],
                            flops_per_element=5.0))
    d = _weight_parts(c[_mlp_op_names(spec)[0]])  # the experts' tp degree (strategy.megatron.dispatch_layout)
    if moe:
        # Megatron's router runs the rank's own tokens: its sequence share under sp (TopKRouter.forward on the
        # MoE layer's input, which sp leaves split: megatron/core/transformer/moe/moe_layer.py, router.py, 0.9.0
        # and 0.16.1), all local tokens without
        router_tokens = (dev.local_tokens // _token_parts(given["router"]) if "router" in given
                         else _replicated_tokens(dev))
        if spec.shared_expert_ffn_hidden:  # a dense MLP on every token (Megatron-Core's SharedExpertMLP)
            fwd.extend(_mlp_ops(spec, dev, f"{path}.shared", dev.local_tokens, 1, c, spec.shared_expert_ffn_hidden))
        fwd.append(matmul_op("router", f"{path}.moe.router", act, router_tokens, spec.num_experts, h))
        fwd.extend(_mlp_ops(spec, dev, f"{path}.moe", _expert_tokens(dev, d), spec.top_k, _features_only(c),
                            spec.expert_ffn))
    else:
        fwd.extend(_mlp_ops(spec, dev, path, dev.local_tokens, 1, c, spec.ffn_hidden))
    fwd.append(pointwise_op("residual2", "elementwise", f"{path}.residual2", act,
                            rows["residual2"] * widths["residual2"], reads=2.0))
    kind: LayerKind = "moe_block" if moe else "block"
    comms = layer_comms(spec, dev, kind, fwd, _configs(kind, fwd, dev, own))
    fwd_ops, bwd_ops = _with_backward(fwd)
    if "router" in given:  # its input kept as it runs it
        rows["router"] = next(op.shape[1] for op in fwd if op.name == "router")
    return Layer(name, kind, count, fwd_ops, bwd_ops, comms,
                 _block_local_params(spec, dev, moe, c, own_norms, "router" in given),
                 sum(_block_params(spec, moe)), _block_saved_bytes(spec, dev, moe, c, (rows, widths)),
                 _replicated_tokens(dev) * h * _act_bytes(dev), expert_shard(spec, dev, d) if moe else None)


_TOKEN_OPS = ("norm1", "residual1", "norm2", "residual2")  # a block's ops outside attention, MLP and router


def _token_rows(dev: DeviceSlice, given: Mapping[str, OpConfig]) -> dict[str, int]:
    """The tokens each of a block's norms and residual adds runs: Megatron's (its sequence share under sp, all
    local tokens without), or 1/(batch x seq) of the local tokens at its config in `given` (a norm split by
    sequence without sp: per-op sequence parallelism; a norm whole under sp)."""
    return {name: dev.local_tokens // _token_parts(given[name]) if name in given else _replicated_tokens(dev)
            for name in _TOKEN_OPS}


def _norm_widths(spec: TransformerSpec, given: Mapping[str, OpConfig]) -> dict[str, int]:
    """The hidden features each of a block's norms and residual adds runs: all of them (Megatron's), or 1/out of
    them at its config in `given` (a norm split by its features: its statistics all-reduced,
    strategy.megatron._norm_statistics; a residual add: each rank adds its slice)."""
    return {name: spec.hidden // given[name].out if name in given else spec.hidden for name in _TOKEN_OPS}


def _megatron(name: str, tp: int) -> OpConfig:
    """Megatron's config over tp of a block's attention or MLP op (strategy.megatron.megatron_tp): the
    row-parallel matmuls split their reduction dimension, every other op its features."""
    return OpConfig(1, 1, 1, tp) if name in ROW else OpConfig(1, 1, tp, 1)


def _features_only(c: Mapping[str, OpConfig]) -> dict[str, OpConfig]:
    """The configs with their token parts left out (an MoE's experts: their tokens are _expert_tokens)."""
    return {name: OpConfig(1, 1, config.out, config.reduce) for name, config in c.items()}


def expert_params(spec: TransformerSpec, dev: DeviceSlice, d: int) -> float:
    """The parameters one rank holds of an MoE block's routed experts (with the router's, as this builder counts
    them): its ep share of the experts, each split over the experts' tp degree d."""
    return _routed_params(spec) / d / dev.ep


def expert_shard(spec: TransformerSpec, dev: DeviceSlice, d: int) -> ExpertShard:
    """The experts' part of the parameters one rank holds of an MoE block at expert tp degree d (expert_params
    less the router's share the builder counts with them: Megatron-Core's router weight is no expert parameter,
    its gradient is summed over the data-parallel group: megatron/core/transformer/moe/router.py, 0.16.1)."""
    return ExpertShard(expert_params(spec, dev, d) - router_params(spec) / d / dev.ep, d)


def _weight_parts(config: OpConfig) -> int:
    """The parts a matmul's config splits its weight into (a device holds 1/parts of it)."""
    return config.out * config.reduce


def _block_local_params(spec: TransformerSpec, dev: DeviceSlice, moe: bool, c: Mapping[str, OpConfig],
                        own_norms: tuple[int, ...] = (), own_router: bool = False) -> float:
    """The parameters one tp rank holds of a block: each matmul's weight (and bias) divided by its config's weight
    parts (out x reduce; a matmul split by tokens holds it whole); the norms' with qkv's (as Megatron-LM's
    builders here always counted them: divided by tp), except the norms a tree gives a config of their own
    (strategy.megatron.replicable_module "tokens"; own_norms: the parts each splits its features into), each held
    whole or, split by its features, 1/out of it (its gradient summed over the tp ranks that split its tokens:
    strategy.megatron.token_split_params); an MoE's router with the experts (divided by their tp degree and ep,
    as the builder always counted it), or held whole where a tree gives it a config of its own (own_router). A
    module whose matmuls share one divisor divides its count as a whole (the same figure, to the last bit, as
    before)."""
    attn_params, mlp_params = _block_params(spec, moe)
    first, _, second = _mlp_op_names(spec)
    w = {name: _weight_parts(c[name]) for name in ("qkv", "out_proj", first, second)}
    if spec.mla is not None:  # Megatron's configs only (block_layer); the norms with the split part, as above
        replicated = mla_params(spec)[0]
        attn = replicated + (attn_params - replicated) / dev.tp
    elif w["qkv"] == w["out_proj"]:
        attn = attn_params / w["qkv"]
    else:
        out_params = spec.num_heads * spec.head_dim * spec.hidden + (spec.hidden if spec.bias else 0)
        attn = (attn_params - out_params) / w["qkv"] + out_params / w["out_proj"]
    if own_norms:
        attn += sum(norm_params(spec) / out - norm_params(spec) / w["qkv"] for out in own_norms)
    if moe:  # the shared experts split over tp as a dense MLP at Megatron's split (block_layer)
        mlp = expert_params(spec, dev, w[first]) + _mlp_params(spec, spec.shared_expert_ffn_hidden) / dev.tp
        if own_router:
            mlp += router_params(spec) - router_params(spec) / w[first] / dev.ep
    elif w[first] == w[second]:
        mlp = mlp_params / w[first]
    else:
        second_params = spec.ffn_hidden * spec.hidden + (spec.hidden if spec.bias else 0)
        mlp = (mlp_params - second_params) / w[first] + second_params / w[second]
    return attn + mlp


def _block_saved_bytes(spec: TransformerSpec, dev: DeviceSlice, moe: bool, c: Mapping[str, OpConfig],
                       norms: tuple[Mapping[str, int], Mapping[str, int]]) -> dict[str, float]:
    """Activations one block keeps for its backward pass, per micro-batch.

    Korthikanti et al. 2022 (eq. 1-5) generalized to any ffn size, grouped-query heads, SwiGLU and flash
    attention: for GPT with unfused attention it reduces to sbh(34 + 5as/h) (t=1),
    sbh(10 + 24/t + 5as/(ht)) (TP), and sbh/t(34 + 5as/h) (TP + SP). c: each op's config over tp (Megatron's, or
    a tree's: its tokens, output and reduction features split as it says); a tensor is kept as the op that reads
    it in the backward holds it (q, k and v as the attention core, NB: its rows only where the core splits the
    sequence, the gathered keys and values gathered again; its output as the projection, the ffn features as the
    activation and the second matmul). Under SP a module whose first matmul does not take Megatron's split keeps
    its input as it reads it (all local tokens where it splits none), rather than the sequence share Megatron-LM
    re-gathers in the backward. norms: the tokens and features each norm runs (_token_rows, _norm_widths), its
    input kept as it holds it, and the tokens an MoE router at its own config runs (token_rows["router"]), its
    input kept so (NB: the dropout masks, the qkv and MLP inputs kept as Megatron's split keeps them whatever the
    norms' configs).
    """
    a2, h = _act_bytes(dev), spec.hidden
    tokens, rep = dev.local_tokens, _replicated_tokens(dev)
    core = c["attention"]
    heads, kv = spec.num_heads // core.out, max(1, spec.kv_heads // core.out)
    core_tokens = tokens // _token_parts(core)
    mask = 1.0 if spec.arch in ("gpt", "bert", "bloom") else 0.0  # dropout masks, one byte per element
    first, act, second = _mlp_op_names(spec)
    experts = spec.top_k if moe else 1
    ffn = spec.expert_ffn if moe else spec.ffn_hidden
    expert_tokens = _expert_tokens(dev, _weight_parts(c[first])) if moe else tokens

    def rows(op: str) -> int:  # tokens an op runs (an MoE's experts: their _expert_tokens)
        return expert_tokens if moe and op in _MLP_OPS else tokens // _token_parts(c[op])

    def f_out(op: str) -> int:  # ffn features an op writes
        return ffn // c[op].out * experts

    def f_in(op: str) -> int:  # ffn features a matmul reads
        return ffn // c[op].reduce * experts

    # modules reading gathered inputs (NB: an MoE's experts at their own tp degree keep their routed tokens'
    # features, not their input, as Megatron's split of the experts is counted)
    own_inputs = sum(max(0, rows(op) * (h // c[op].reduce) - rep * h) for op in ("qkv", first)
                     if c[op] != _megatron(op, dev.tp) and not (moe and op == first)) if dev.sp else 0
    # two norm inputs, qkv input, mlp input, two dropout masks
    # 0 at Megatron's configs; an MoE's router at its own config keeps its input as it runs it (the MLP input)
    token_rows, widths = norms
    norms_own = (token_rows["norm1"] * widths["norm1"] + token_rows["norm2"] * widths["norm2"]
                 + token_rows.get("router", rep) * h - 3 * rep * h) * a2
    replicated = rep * h * (4 * a2 + 2 * mask) + norms_own + own_inputs * a2
    qkv = core_tokens * (heads + 2 * kv) * spec.head_dim * a2
    out_in = rows("out_proj") * (spec.num_heads // c["out_proj"].reduce) * spec.head_dim * a2
    q_out, v_out = core_tokens * heads * spec.head_dim * a2, core_tokens * kv * spec.head_dim * a2
    if spec.mla is not None:  # the latents' norm and up-projection inputs (as the qkv input: rep), q, k, v
        mla = spec.mla
        replicated += rep * 2 * (mla.q_lora_rank + mla.kv_lora_rank) * a2
        q_out, v_out = core_tokens * heads * mla.qk_head_dim * a2, core_tokens * heads * mla.v_head_dim * a2
        qkv = 2 * q_out + v_out
        out_in = rows("out_proj") * heads * mla.v_head_dim * a2
    if spec.mlp == "swiglu":
        mlp = (rows(act) * 2 * f_out(act) + rows(second) * f_in(second)) * a2  # gate and up outputs, the product
    else:
        mlp = (rows(act) * f_out(act) + rows(second) * f_in(second)) * a2  # fc1 output, gelu output
    scores = dev.micro_batch // core.batch * heads * (tokens // dev.micro_batch // core.seq) * dev.seq_len * (
        2 * a2 + 1)
    lse = dev.micro_batch // core.batch * heads * (tokens // dev.micro_batch // core.seq) * 4.0
    attn_core = lse if dev.fused_attention else scores
    # an MoE's experts keep the routed tokens their first matmul reads for its weight gradient (Megatron-Core's
    # grouped GEMM saves its input: the dispatched, and over the expert tp group gathered, tokens; TEGroupedMLP,
    # megatron/core/transformer/moe/experts.py, megatron-core 0.16.1), top_k copies of the expert tokens
    routed = rows(first) * spec.top_k * (h // c[first].reduce) * a2 if moe else 0.0
    if moe:
        routed += _routing_saved_bytes(spec, dev, token_rows.get("router", rep), rows(act), f_out(act))
    if moe and spec.shared_expert_ffn_hidden:  # the shared experts' MLP on every token, as a dense one's
        shared = spec.shared_expert_ffn_hidden // dev.tp
        mlp += tokens * shared * (3 if spec.mlp == "swiglu" else 2) * a2
    base = replicated + qkv + out_in + mlp + routed
    # torchtitan's op-level selective checkpointing (torchtitan/models/llama3/infra/parallelize.py, torchtitan
    # 0.1.0, _save_list and _get_custom_policy): the block input (the checkpoint's) and the outputs of the
    # attention kernel and of every other matmul in the block's order (wq wk wv wo w1 w3 w2: wq, wv, w1, w2;
    # GPT's wq wk wv wo fc1 fc2: wq, wv, fc1) are kept, everything else is recomputed
    mlp_kept = rows(first) * f_out(first) * a2 + (tokens * h * a2 if spec.mlp == "swiglu" else 0.0)
    op_level = rep * h * a2 + q_out + v_out + out_in + lse + mlp_kept
    return {"none": base + attn_core, "selective": base, "full": rep * h * a2, "selective_op": op_level}


def _routing_saved_bytes(spec: TransformerSpec, dev: DeviceSlice, router_tokens: int, expert_tokens: int,
                         act_features: int) -> float:
    """What an MoE block keeps for its backward beyond its experts' matmul inputs and activations, per micro-batch,
    as Megatron-Core 0.16.1 keeps it (megatron/core/transformer/moe/moe_utils.py permute / unpermute, unfused,
    moe_permute_fusion's default; experts.py TEGroupedMLP): the permutation of the rank's routed tokens, an int64
    index per routed copy (index_select's and the combine's scatter_add's) and the routing map, a byte per token
    and expert (the probabilities' masked_select); the routed copies' probabilities (the router's dtype: the
    activations') kept by the weighted activation for its input's gradient (fused SwiGLU:
    weighted_bias_swiglu_impl, megatron/core/fusions/fused_bias_swiglu.py), and where the activation is not
    a gated one Megatron-Core fuses with them (GeLU: `activation_func(x) * permuted_probs`) its output too,
    which the product keeps for the probabilities' gradient. act_features: the activation's output features of
    a token's top_k copies on this rank."""
    probs = expert_tokens * spec.top_k * _act_bytes(dev)
    unfused = expert_tokens * act_features * _act_bytes(dev) if spec.mlp != "swiglu" else 0.0
    return router_tokens * spec.top_k * 8.0 + router_tokens * spec.num_experts + probs + unfused


def _configs(kind: LayerKind, fwd: list[Op], dev: DeviceSlice, own: TpConfigs) -> Configs | None:
    """The ops' configs over the model-parallel axes with the ops in `own` at their own configs over tp (None:
    Megatron's)."""
    return {(op.module_path, axis): op_config(axis, op, dev, own) for op in fwd
            for axis in axis_sizes(kind, dev)} if own else None


def embedding_layer(spec: TransformerSpec, dev: DeviceSlice, own: TpConfigs = frozenset()) -> Layer:
    """The embedding as one device runs it: the lookup vocab-parallel over tp (Megatron's: the table's rows
    split, partial sums), or over the rows its config in `own` splits (reduce; 1: the whole table on every tp
    rank), or by tokens (batch, seq: each rank looks up its own tokens in the whole table). The learned positions,
    BERT's token types and its embedding norm at a config of their own in `own` (pos_add, type_add, norm: by
    tokens, by hidden features, both, or none) run on their 1/(batch x seq) of the tokens and 1/out of the
    features, and hold 1/out of their table (the position table, the 2 token types) or gain and bias (by tokens,
    that share's gradient summed over those tp ranks: strategy.megatron.token_split_params)."""
    act, h, tokens = dev.precision.activation_dtype, spec.hidden, dev.local_tokens
    given = dict(own)
    lookup = given.get("lookup", OpConfig(1, 1, 1, dev.tp))
    fwd = [pointwise_op("lookup", "embedding", "embed.tokens", act, tokens // _token_parts(lookup) * h, reads=1.0)]
    params, shared, own_held = spec.vocab * h, spec.vocab * h, 0.0  # shared: split as the lookup's rows
    others: list[tuple[str, OpKind, str, int]] = []  # (name, kind, module path, parameters) after the lookup
    if spec.position == "learned":
        others.append(("pos_add", "elementwise", "embed.positions", spec.max_seq_len * h))
    if spec.arch == "bert":  # token-type embeddings (2 types) and the embedding LayerNorm
        others.append(("type_add", "elementwise", "embed.token_types", 2 * h))
        others.append(("norm", "norm", "embed.norm", 2 * h))
    for name, kind, module_path, count in others:
        config = given.get(name)
        elements = tokens * h if config is None else tokens // _token_parts(config) * (h // config.out)
        norm = kind == "norm"
        fwd.append(pointwise_op(name, kind, module_path, act, elements, reads=1.0 if norm else 2.0,
                                flops_per_element=5.0 if norm else 1.0))
        params += count
        shared += count if config is None else 0
        own_held += 0.0 if config is None else count / config.out
    comms = layer_comms(spec, dev, "embedding", fwd, _configs("embedding", fwd, dev, own))
    fwd_ops, bwd_ops = _with_backward(fwd)
    out = _replicated_tokens(dev) * h * _act_bytes(dev)
    return Layer("embedding", "embedding", 1, fwd_ops, bwd_ops, comms, shared / lookup.reduce + own_held, params,
                 dict.fromkeys(("none", "selective", "full", "selective_op"), out), out)


def head_layer(spec: TransformerSpec, dev: DeviceSlice, own: TpConfigs = frozenset()) -> Layer:
    """Final norm, vocabulary projection and fp32 cross-entropy: vocab-parallel under TP (Megatron's), or the
    norm, the projection or the cross-entropy at its config in `own` (final_norm: its tokens and features split
    as it says, its weights 1/out of them; logits, cross_entropy; none: the whole weight, all logits, on every tp
    rank)."""
    act, h, tokens = dev.precision.activation_dtype, spec.hidden, dev.local_tokens
    given = dict(own)
    proj, loss = (given.get(name, OpConfig(1, 1, dev.tp, 1)) for name in ("logits", "cross_entropy"))
    norm = given.get("final_norm")
    norm_rows, norm_width = (_replicated_tokens(dev), h) if norm is None else (
        tokens // _token_parts(norm), h // norm.out)
    fwd: list[Op] = []
    extra_params = 0
    if spec.arch == "bert":  # the masked-LM transform (dense + GELU + LayerNorm) and the decoder bias
        fwd += [matmul_op("transform", "head.transform", dev.precision.linear_dtype, tokens, h, h),
                pointwise_op("transform_act", "elementwise", "head.transform.act", act, tokens * h,
                             flops_per_element=8.0)]
        extra_params = h * h + h + spec.vocab
    fwd += [pointwise_op("final_norm", "norm", "head.norm", act, norm_rows * norm_width, flops_per_element=5.0),
            matmul_op("logits", "head.proj", dev.precision.linear_dtype, tokens // _token_parts(proj),
                      spec.vocab // proj.out, h // proj.reduce),
            pointwise_op("cross_entropy", "loss", "head.loss", "fp32",
                         tokens // _token_parts(loss) * (spec.vocab // loss.out), reads=1.0, writes=1.0,
                         flops_per_element=4.0)]
    comms = layer_comms(spec, dev, "head", fwd, _configs("head", fwd, dev, own))
    fwd_ops, bwd_ops = _with_backward(fwd)
    own_params = norm_params(spec) + extra_params
    held = own_params if norm is None else norm_params(spec) / norm.out + extra_params
    proj_params = 0 if spec.tied_embeddings else spec.vocab * h
    saved = norm_rows * norm_width * _act_bytes(dev) + tokens // _token_parts(loss) * (
        spec.vocab // loss.out) * 4.0  # norm input, the fp32 softmax
    return Layer("head", "head", 1, fwd_ops, bwd_ops, comms, held + proj_params / _weight_parts(proj),
                 own_params + proj_params, dict.fromkeys(("none", "selective", "full", "selective_op"), saved), 0.0)
