"""Analytic builder: TransformerSpec + DeviceSlice -> OpGraph (per device, forward and backward).

The feature collectives of TP, SP, CP and EP are not written here: strategy.megatron derives them from the
splits those axes make of each layer's ops (the resharding between ops' computation configs).

A block's attention and MLP are shaped by their own tensor-parallel degree: the job's tp (Megatron's split), or 1
where a strategy tree holds the module whole on every tp rank (block_layer's `replicated`: the tp ranks each run
the whole module and hold its whole weights; strategy.megatron.replicated_modules)."""

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
from trainsim.strategy.megatron import Configs, axis_sizes, layer_comms, op_config


def build_transformer(spec: TransformerSpec, dev: DeviceSlice) -> OpGraph:
    layers: list[Layer] = [_embedding(spec, dev)]
    dense_count = spec.num_layers - spec.num_moe_layers
    if dense_count:
        layers.append(block_layer(spec, dev, dense_count, moe=False))
    if spec.num_moe_layers:
        layers.append(block_layer(spec, dev, spec.num_moe_layers, moe=True))
    layers.append(_head(spec, dev))
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


def _attention_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, t: int) -> list[Op]:
    """norm1, the attention module split over t tensor-parallel ranks (1: whole), residual1."""
    tokens, rep = dev.local_tokens, _replicated_tokens(dev)
    act, lin, h, d = dev.precision.activation_dtype, dev.precision.linear_dtype, spec.hidden, spec.head_dim
    heads, kv_heads = spec.num_heads // t, max(1, spec.kv_heads // t)
    ops = [pointwise_op("norm1", "norm", f"{path}.norm1", act, rep * h, flops_per_element=5.0),
           matmul_op("qkv", f"{path}.attn.qkv", lin, tokens, (heads + 2 * kv_heads) * d, h)]
    if spec.position == "rope":
        ops.append(pointwise_op("rope", "elementwise", f"{path}.attn.rope", act, tokens * (heads + kv_heads) * d))
    ops.append(attention_op(f"{path}.attn.core", dev.precision.matmul_dtype, dev.micro_batch * heads,
                            tokens // dev.micro_batch, dev.seq_len, d, spec.causal, dev.attention))
    if not dev.fused_attention:
        ops.append(pointwise_op("softmax", "softmax", f"{path}.attn.softmax", act,
                                dev.micro_batch * heads * (tokens // dev.micro_batch) * dev.seq_len,
                                flops_per_element=5.0, selective=True))
    ops.append(matmul_op("out_proj", f"{path}.attn.out", lin, tokens, h, heads * d))
    ops.append(pointwise_op("residual1", "elementwise", f"{path}.residual1", act, rep * h, reads=2.0))
    return ops


def _mlp_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, tokens: int, experts_local: int,
             t: int) -> list[Op]:
    """The MLP (or each local expert's) split over t tensor-parallel ranks (1: whole)."""
    lin, act, h = dev.precision.linear_dtype, dev.precision.activation_dtype, spec.hidden
    f = spec.ffn_hidden // t
    routed = tokens * experts_local  # tokens processed by this device's experts (balanced routing)
    if spec.mlp == "swiglu":
        return [matmul_op("gate_up", f"{path}.mlp.gate_up", lin, routed, 2 * f, h),
                pointwise_op("swiglu", "elementwise", f"{path}.mlp.act", act, routed * f, reads=2.0,
                             flops_per_element=4.0),
                matmul_op("down", f"{path}.mlp.down", lin, routed, h, f)]
    return [matmul_op("fc1", f"{path}.mlp.fc1", lin, routed, f, h),
            pointwise_op("gelu", "elementwise", f"{path}.mlp.act", act, routed * f, flops_per_element=8.0),
            matmul_op("fc2", f"{path}.mlp.fc2", lin, routed, h, f)]


def block_layer(spec: TransformerSpec, dev: DeviceSlice, count: int, moe: bool,
                replicated: frozenset[str] = frozenset()) -> Layer:
    """`count` dense (or MoE) blocks as one device runs them: attention and MLP split over the slice's tp
    (Megatron's), except the modules in `replicated` ("attn", "mlp": strategy.megatron.replicable_module), which
    every tp rank runs whole (the tp=1 module's ops and weights), their collectives derived from those configs."""
    name = "moe_block" if moe else "block"
    path = f"blocks.{name}"
    act, h = dev.precision.activation_dtype, spec.hidden
    tokens, rep = dev.local_tokens, _replicated_tokens(dev)
    t_attn = 1 if "attn" in replicated else dev.tp
    t_mlp = 1 if "mlp" in replicated and not moe else dev.tp
    fwd = _attention_ops(spec, dev, path, t_attn)
    fwd.append(pointwise_op("norm2", "norm", f"{path}.norm2", act, rep * h, flops_per_element=5.0))
    if moe:
        fwd.append(matmul_op("router", f"{path}.moe.router", act, tokens, spec.num_experts, h))
        fwd.extend(_mlp_ops(spec, dev, f"{path}.moe", tokens, spec.top_k, t_mlp))
    else:
        fwd.extend(_mlp_ops(spec, dev, path, tokens, 1, t_mlp))
    fwd.append(pointwise_op("residual2", "elementwise", f"{path}.residual2", act, rep * h, reads=2.0))
    kind: LayerKind = "moe_block" if moe else "block"
    configs: Configs | None = {(op.module_path, axis): op_config(axis, op, dev, replicated) for op in fwd
                               for axis in axis_sizes(kind, dev)} if replicated else None
    comms = layer_comms(spec, dev, kind, fwd, configs)
    fwd_ops, bwd_ops = _with_backward(fwd)
    attn_params, mlp_params = _block_params(spec, moe)
    local_mlp = mlp_params / t_mlp / (dev.ep if moe else 1)
    return Layer(name, kind, count, fwd_ops, bwd_ops, comms,
                 attn_params / t_attn + local_mlp, attn_params + mlp_params,
                 _block_saved_bytes(spec, dev, moe, t_attn, t_mlp), rep * h * _act_bytes(dev))


def _block_saved_bytes(spec: TransformerSpec, dev: DeviceSlice, moe: bool, t_attn: int,
                       t_mlp: int) -> dict[str, float]:
    """Activations one block keeps for its backward pass, per micro-batch.

    Korthikanti et al. 2022 (eq. 1-5) generalized to any ffn size, grouped-query heads, SwiGLU and flash
    attention: for GPT with unfused attention it reduces to sbh(34 + 5as/h) (t=1),
    sbh(10 + 24/t + 5as/(ht)) (TP), and sbh/t(34 + 5as/h) (TP + SP). t_attn, t_mlp: the tensor-parallel
    degree of the attention and the MLP (1: the module runs whole on every tp rank; under SP it then keeps its
    gathered input, all local tokens, rather than the sequence share Megatron-LM re-gathers in the backward).
    """
    a2, h = _act_bytes(dev), spec.hidden
    tokens, rep = dev.local_tokens, _replicated_tokens(dev)
    heads, kv = spec.num_heads // t_attn, max(1, spec.kv_heads // t_attn)
    mask = 1.0 if spec.arch in ("gpt", "bert", "bloom") else 0.0  # dropout masks, one byte per element
    f_local = spec.ffn_hidden // t_mlp * (spec.top_k if moe else 1)
    whole_inputs = (t_attn < dev.tp) + (t_mlp < dev.tp) if dev.sp else 0  # modules reading gathered inputs
    # two norm inputs, qkv input, mlp input, two dropout masks
    replicated = rep * h * (4 * a2 + 2 * mask) + (tokens - rep) * h * a2 * whole_inputs
    qkv = tokens * (heads + 2 * kv) * spec.head_dim * a2
    out_in = tokens * heads * spec.head_dim * a2
    if spec.mlp == "swiglu":
        mlp = tokens * (3 * f_local) * a2  # gate and up outputs, the product
    else:
        mlp = tokens * (2 * f_local) * a2  # fc1 output, gelu output
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
    mlp_kept = tokens * f_local * a2 + (tokens * h * a2 if spec.mlp == "swiglu" else 0.0)
    op_level = rep * h * a2 + q_out + v_out + out_in + lse + mlp_kept
    return {"none": base + core, "selective": base, "full": rep * h * a2, "selective_op": op_level}


def _embedding(spec: TransformerSpec, dev: DeviceSlice) -> Layer:
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
    fwd_ops, bwd_ops = _with_backward(fwd)
    out = _replicated_tokens(dev) * h * _act_bytes(dev)
    comms = layer_comms(spec, dev, "embedding", fwd)
    return Layer("embedding", "embedding", 1, fwd_ops, bwd_ops, comms, params / dev.tp, params,
                 dict.fromkeys(("none", "selective", "full", "selective_op"), out), out)


def _head(spec: TransformerSpec, dev: DeviceSlice) -> Layer:
    """Final norm, vocabulary projection (vocab-parallel under TP) and fp32 cross-entropy."""
    act, h, tokens, v = dev.precision.activation_dtype, spec.hidden, dev.local_tokens, spec.vocab // dev.tp
    fwd: list[Op] = []
    extra_params = 0
    if spec.arch == "bert":  # the masked-LM transform (dense + GELU + LayerNorm) and the decoder bias
        fwd += [matmul_op("transform", "head.transform", dev.precision.linear_dtype, tokens, h, h),
                pointwise_op("transform_act", "elementwise", "head.transform.act", act, tokens * h,
                             flops_per_element=8.0)]
        extra_params = h * h + h + spec.vocab
    fwd += [pointwise_op("final_norm", "norm", "head.norm", act, _replicated_tokens(dev) * h,
                         flops_per_element=5.0),
            matmul_op("logits", "head.proj", dev.precision.linear_dtype, tokens, v, h),
           pointwise_op("cross_entropy", "loss", "head.loss", "fp32", tokens * v, reads=1.0, writes=1.0,
                        flops_per_element=4.0)]
    fwd_ops, bwd_ops = _with_backward(fwd)
    norm_params = h * (2 if spec.norm == "layernorm" else 1) + extra_params
    proj_params = 0 if spec.tied_embeddings else spec.vocab * h
    saved = _replicated_tokens(dev) * h * _act_bytes(dev) + tokens * v * 4.0  # norm input, fp32 softmax
    comms = layer_comms(spec, dev, "head", fwd)
    return Layer("head", "head", 1, fwd_ops, bwd_ops, comms, norm_params + proj_params / dev.tp,
                 norm_params + proj_params, dict.fromkeys(("none", "selective", "full", "selective_op"), saved), 0.0)
