"""Analytic builder: TransformerSpec + DeviceSlice -> OpGraph (per device, forward and backward).

The feature collectives of TP, SP, CP and EP are not written here: strategy.megatron derives them from the
splits those axes make of each layer's ops (the resharding between ops' computation configs).

Each op of a block's attention and MLP (or an MoE's experts), the lookup, the logits and the cross-entropy is
shaped by its own tensor-parallel degree: the job's tp (Megatron's split), or the degree d dividing tp a strategy
tree gives it (the builders' `degrees`: each rank runs 1/d of the op and holds 1/d of its weight; d = 1: the whole
op on every tp rank; an expert runs the routed copies of its d ranks' tokens under sp: _expert_tokens;
strategy.megatron.op_degrees)."""

from collections.abc import Mapping

from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.flops import (
    attention_backward,
    attention_op,
    matmul_backward,
    matmul_op,
    pointwise_backward,
    pointwise_op,
)
from trainsim.ir.graph import Layer, LayerKind, Op, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.megatron import Configs, Degrees, axis_sizes, layer_comms, op_config


def build_transformer(spec: TransformerSpec, dev: DeviceSlice) -> OpGraph:
    layers: list[Layer] = [embedding_layer(spec, dev)]
    dense_count = spec.num_layers - spec.num_moe_layers
    if dense_count:
        layers.append(block_layer(spec, dev, dense_count, moe=False))
    if spec.num_moe_layers:
        layers.append(block_layer(spec, dev, spec.num_moe_layers, moe=True))
    layers.append(head_layer(spec, dev))
    return OpGraph(spec.name, tuple(layers), dev.local_tokens, dev.micro_batch)


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
    norms = 2 * h * (2 if spec.norm == "layernorm" else 1)
    mats = 3 if spec.mlp == "swiglu" else 2
    mlp = mats * h * spec.ffn_hidden + ((spec.ffn_hidden + h) if spec.bias else 0)
    if moe:
        mlp = spec.num_experts * mlp + h * spec.num_experts
    return attn + norms, mlp


def _attention_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, t: Mapping[str, int]) -> list[Op]:
    """norm1, the attention module with each op split over its t[name] tensor-parallel ranks (1: whole),
    residual1."""
    tokens, rep = dev.local_tokens, _replicated_tokens(dev)
    act, lin, h, d = dev.precision.activation_dtype, dev.precision.linear_dtype, spec.hidden, spec.head_dim

    def heads(name: str) -> tuple[int, int]:
        return spec.num_heads // t[name], max(1, spec.kv_heads // t[name])

    q, kv = heads("qkv")
    ops = [pointwise_op("norm1", "norm", f"{path}.norm1", act, rep * h, flops_per_element=5.0),
           matmul_op("qkv", f"{path}.attn.qkv", lin, tokens, (q + 2 * kv) * d, h)]
    if spec.position == "rope":
        q, kv = heads("rope")
        ops.append(pointwise_op("rope", "elementwise", f"{path}.attn.rope", act, tokens * (q + kv) * d))
    ops.append(attention_op(f"{path}.attn.core", dev.precision.matmul_dtype, dev.micro_batch * heads("attention")[0],
                            tokens // dev.micro_batch, dev.seq_len, d, spec.causal, dev.attention))
    if not dev.fused_attention:
        ops.append(pointwise_op("softmax", "softmax", f"{path}.attn.softmax", act,
                                dev.micro_batch * heads("softmax")[0] * (tokens // dev.micro_batch) * dev.seq_len,
                                flops_per_element=5.0, selective=True))
    ops.append(matmul_op("out_proj", f"{path}.attn.out", lin, tokens, h, heads("out_proj")[0] * d))
    ops.append(pointwise_op("residual1", "elementwise", f"{path}.residual1", act, rep * h, reads=2.0))
    return ops


def _mlp_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, tokens: int, experts_local: int,
             t: Mapping[str, int]) -> list[Op]:
    """The MLP (or each local expert's) with each op split over its t[name] tensor-parallel ranks (1: whole)."""
    lin, act, h, f = dev.precision.linear_dtype, dev.precision.activation_dtype, spec.hidden, spec.ffn_hidden
    routed = tokens * experts_local  # tokens processed by this device's experts (balanced routing)
    if spec.mlp == "swiglu":
        return [matmul_op("gate_up", f"{path}.mlp.gate_up", lin, routed, 2 * (f // t["gate_up"]), h),
                pointwise_op("swiglu", "elementwise", f"{path}.mlp.act", act, routed * (f // t["swiglu"]),
                             reads=2.0, flops_per_element=4.0),
                matmul_op("down", f"{path}.mlp.down", lin, routed, h, f // t["down"])]
    return [matmul_op("fc1", f"{path}.mlp.fc1", lin, routed, f // t["fc1"], h),
            pointwise_op("gelu", "elementwise", f"{path}.mlp.act", act, routed * (f // t["gelu"]),
                         flops_per_element=8.0),
            matmul_op("fc2", f"{path}.mlp.fc2", lin, routed, h, f // t["fc2"])]


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
                degrees: Degrees = frozenset()) -> Layer:
    """`count` dense (or MoE) blocks as one device runs them: attention and MLP split over the slice's tp
    (Megatron's), except the ops in `degrees` (of the attention, a dense MLP or an MoE's experts:
    strategy.megatron.replicable_module), split over their own degree d (1: every tp rank runs the whole op and
    holds its weight; an expert runs the routed copies of its d ranks' tokens, _expert_tokens), the block's
    collectives derived from those configs."""
    name = "moe_block" if moe else "block"
    path = f"blocks.{name}"
    act, h = dev.precision.activation_dtype, spec.hidden
    rep = _replicated_tokens(dev)
    given = dict(degrees)
    t = {op: given.get(op, dev.tp) for op in _ATTN_OPS + _MLP_OPS}
    fwd = _attention_ops(spec, dev, path, t)
    fwd.append(pointwise_op("norm2", "norm", f"{path}.norm2", act, rep * h, flops_per_element=5.0))
    if moe:
        fwd.append(matmul_op("router", f"{path}.moe.router", act, dev.local_tokens, spec.num_experts, h))
        fwd.extend(_mlp_ops(spec, dev, f"{path}.moe", _expert_tokens(dev, t[_mlp_op_names(spec)[0]]), spec.top_k,
                            t))
    else:
        fwd.extend(_mlp_ops(spec, dev, path, dev.local_tokens, 1, t))
    fwd.append(pointwise_op("residual2", "elementwise", f"{path}.residual2", act, rep * h, reads=2.0))
    kind: LayerKind = "moe_block" if moe else "block"
    comms = layer_comms(spec, dev, kind, fwd, _configs(kind, fwd, dev, degrees))
    fwd_ops, bwd_ops = _with_backward(fwd)
    return Layer(name, kind, count, fwd_ops, bwd_ops, comms, _block_local_params(spec, dev, moe, t),
                 sum(_block_params(spec, moe)), _block_saved_bytes(spec, dev, moe, t), rep * h * _act_bytes(dev))


def expert_params(spec: TransformerSpec, dev: DeviceSlice, d: int) -> float:
    """The parameters one rank holds of an MoE block's experts (with the router's, as this builder counts them):
    its ep share of the experts, each split over the experts' tp degree d."""
    return _block_params(spec, True)[1] / d / dev.ep


def _block_local_params(spec: TransformerSpec, dev: DeviceSlice, moe: bool, t: Mapping[str, int]) -> float:
    """The parameters one tp rank holds of a block: each matmul's weight (and bias) divided by its op's degree;
    the norms' with qkv's (as Megatron-LM's builders here always counted them: divided by tp). A module whose
    ops share one degree divides its count as a whole (the same figure, to the last bit, as before)."""
    attn_params, mlp_params = _block_params(spec, moe)
    first, _, second = _mlp_op_names(spec)
    if t["qkv"] == t["out_proj"]:
        attn = attn_params / t["qkv"]
    else:
        out_params = spec.num_heads * spec.head_dim * spec.hidden + (spec.hidden if spec.bias else 0)
        attn = (attn_params - out_params) / t["qkv"] + out_params / t["out_proj"]
    if moe:
        mlp = expert_params(spec, dev, t[first])
    elif t[first] == t[second]:
        mlp = mlp_params / t[first]
    else:
        second_params = spec.ffn_hidden * spec.hidden + (spec.hidden if spec.bias else 0)
        mlp = (mlp_params - second_params) / t[first] + second_params / t[second]
    return attn + mlp


def _block_saved_bytes(spec: TransformerSpec, dev: DeviceSlice, moe: bool, t: Mapping[str, int]) -> dict[str, float]:
    """Activations one block keeps for its backward pass, per micro-batch.

    Korthikanti et al. 2022 (eq. 1-5) generalized to any ffn size, grouped-query heads, SwiGLU and flash
    attention: for GPT with unfused attention it reduces to sbh(34 + 5as/h) (t=1),
    sbh(10 + 24/t + 5as/(ht)) (TP), and sbh/t(34 + 5as/h) (TP + SP). t: each op's tensor-parallel degree (1: the
    op runs whole on every tp rank); a tensor is kept as the op that reads it in the backward holds it (q, k and
    v as the attention core, its output as the projection, the ffn features as the activation and the second
    matmul). Under SP a module whose first matmul runs whole keeps its gathered input, all local tokens, rather
    than the sequence share Megatron-LM re-gathers in the backward.
    """
    a2, h = _act_bytes(dev), spec.hidden
    tokens, rep = dev.local_tokens, _replicated_tokens(dev)
    heads, kv = spec.num_heads // t["attention"], max(1, spec.kv_heads // t["attention"])
    mask = 1.0 if spec.arch in ("gpt", "bert", "bloom") else 0.0  # dropout masks, one byte per element
    first, act, second = _mlp_op_names(spec)

    mlp_tokens = _expert_tokens(dev, t[first]) if moe else tokens

    def f_local(op: str) -> int:
        return spec.ffn_hidden // t[op] * (spec.top_k if moe else 1)

    # modules reading gathered inputs (NB: an MoE's experts at tp degree d keep their routed tokens' features,
    # not their input, as Megatron's split of the experts is counted)
    whole_inputs = (t["qkv"] < dev.tp) + (t[first] < dev.tp and not moe) if dev.sp else 0
    # two norm inputs, qkv input, mlp input, two dropout masks
    replicated = rep * h * (4 * a2 + 2 * mask) + (tokens - rep) * h * a2 * whole_inputs
    qkv = tokens * (heads + 2 * kv) * spec.head_dim * a2
    out_in = tokens * (spec.num_heads // t["out_proj"]) * spec.head_dim * a2
    if spec.mlp == "swiglu":
        mlp = mlp_tokens * (2 * f_local(act) + f_local(second)) * a2  # gate and up outputs, the product
    else:
        mlp = mlp_tokens * (f_local(act) + f_local(second)) * a2  # fc1 output, gelu output
    scores = dev.micro_batch * heads * (tokens // dev.micro_batch) * dev.seq_len * (2 * a2 + 1)
    lse = dev.micro_batch * heads * (tokens // dev.micro_batch) * 4.0
    core = lse if dev.fused_attention else scores
    base = replicated + qkv + out_in + mlp
    # torchtitan's op-level selective checkpointing (torchtitan/models/llama3/infra/parallelize.py, torchtitan
    # 0.1.0, _save_list and _get_custom_policy): the block input (the checkpoint's) and the outputs of the
    # attention kernel and of every other matmul in the block's order (wq wk wv wo w1 w3 w2: wq, wv, w1, w2;
    # GPT's wq wk wv wo fc1 fc2: wq, wv, fc1) are kept, everything else is recomputed
    q_out = tokens * heads * spec.head_dim * a2
    v_out = tokens * kv * spec.head_dim * a2
    mlp_kept = mlp_tokens * f_local(first) * a2 + (tokens * h * a2 if spec.mlp == "swiglu" else 0.0)
    op_level = rep * h * a2 + q_out + v_out + out_in + lse + mlp_kept
    return {"none": base + core, "selective": base, "full": rep * h * a2, "selective_op": op_level}


def _configs(kind: LayerKind, fwd: list[Op], dev: DeviceSlice, degrees: Degrees) -> Configs | None:
    """The ops' configs over the model-parallel axes with the ops in `degrees` split over their own degree of tp
    (None: Megatron's)."""
    return {(op.module_path, axis): op_config(axis, op, dev, degrees) for op in fwd
            for axis in axis_sizes(kind, dev)} if degrees else None


def embedding_layer(spec: TransformerSpec, dev: DeviceSlice, degrees: Degrees = frozenset()) -> Layer:
    """The embedding as one device runs it: the lookup vocab-parallel over tp (Megatron's: the table's rows
    split, partial sums), or over the lookup's degree in `degrees` (1: the whole table on every tp rank)."""
    act, h, tokens = dev.precision.activation_dtype, spec.hidden, dev.local_tokens
    fwd = [pointwise_op("lookup", "embedding", "embed.tokens", act, tokens * h, reads=1.0)]
    params = spec.vocab * h
    if spec.position == "learned":
        fwd.append(pointwise_op("pos_add", "elementwise", "embed.positions", act, tokens * h, reads=2.0))
        params += spec.max_seq_len * h
    if spec.arch == "bert":  # token-type embeddings (2 types) and the embedding LayerNorm
        fwd += [pointwise_op("type_add", "elementwise", "embed.token_types", act, tokens * h, reads=2.0),
                pointwise_op("norm", "norm", "embed.norm", act, tokens * h, flops_per_element=5.0)]
        params += 2 * h + 2 * h
    comms = layer_comms(spec, dev, "embedding", fwd, _configs("embedding", fwd, dev, degrees))
    fwd_ops, bwd_ops = _with_backward(fwd)
    out = _replicated_tokens(dev) * h * _act_bytes(dev)
    t = dict(degrees).get("lookup", dev.tp)
    return Layer("embedding", "embedding", 1, fwd_ops, bwd_ops, comms, params / t, params,
                 dict.fromkeys(("none", "selective", "full", "selective_op"), out), out)


def head_layer(spec: TransformerSpec, dev: DeviceSlice, degrees: Degrees = frozenset()) -> Layer:
    """Final norm, vocabulary projection and fp32 cross-entropy: vocab-parallel under TP (Megatron's), or the
    projection or the cross-entropy over its degree in `degrees` (logits, cross_entropy; 1: the whole weight, all
    logits, on every tp rank)."""
    act, h, tokens = dev.precision.activation_dtype, spec.hidden, dev.local_tokens
    given = dict(degrees)
    t_logits, t_loss = (given.get(name, dev.tp) for name in ("logits", "cross_entropy"))
    fwd: list[Op] = []
    extra_params = 0
    if spec.arch == "bert":  # the masked-LM transform (dense + GELU + LayerNorm) and the decoder bias
        fwd += [matmul_op("transform", "head.transform", dev.precision.linear_dtype, tokens, h, h),
                pointwise_op("transform_act", "elementwise", "head.transform.act", act, tokens * h,
                             flops_per_element=8.0)]
        extra_params = h * h + h + spec.vocab
    fwd += [pointwise_op("final_norm", "norm", "head.norm", act, _replicated_tokens(dev) * h,
                         flops_per_element=5.0),
            matmul_op("logits", "head.proj", dev.precision.linear_dtype, tokens, spec.vocab // t_logits, h),
            pointwise_op("cross_entropy", "loss", "head.loss", "fp32", tokens * (spec.vocab // t_loss), reads=1.0,
                         writes=1.0, flops_per_element=4.0)]
    comms = layer_comms(spec, dev, "head", fwd, _configs("head", fwd, dev, degrees))
    fwd_ops, bwd_ops = _with_backward(fwd)
    norm_params = h * (2 if spec.norm == "layernorm" else 1) + extra_params
    proj_params = 0 if spec.tied_embeddings else spec.vocab * h
    saved = _replicated_tokens(dev) * h * _act_bytes(dev) + tokens * (spec.vocab // t_loss) * 4.0  # norm input,
    # the fp32 softmax
    return Layer("head", "head", 1, fwd_ops, bwd_ops, comms, norm_params + proj_params / t_logits,
                 norm_params + proj_params, dict.fromkeys(("none", "selective", "full", "selective_op"), saved), 0.0)
