"""Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2, sec. 2.1) as Megatron-Core builds and splits it over
tp: its parameters and its forward ops, shaped per device (ir.model_spec.MlaSpec). The collectives its split
inserts are strategy.megatron's (the latents gathered before the up-projections under sp)."""

from trainsim.ir.flops import attention_op, matmul_op, pointwise_op
from trainsim.ir.graph import Op
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice


def mla_params(spec: TransformerSpec) -> tuple[int, int]:
    """(replicated over tp, split over tp) parameters of a multi-head latent attention (ir.model_spec.MlaSpec):
    the down-projections and the latents' norms are held whole on every tp rank (Megatron-Core's TELinear in
    "duplicated" mode), the up-projections are column-parallel and the output projection row-parallel
    (megatron/core/models/gpt/gpt_layer_specs.py and transformer/multi_latent_attention.py, megatron-core
    0.16.1; no bias but the output projection's, add_bias_linear)."""
    mla, h, heads = spec.mla, spec.hidden, spec.num_heads
    assert mla is not None
    gain = 2 if spec.norm == "layernorm" else 1
    kv_down = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + gain * mla.kv_lora_rank
    q_proj = mla.q_lora_rank * heads * mla.qk_head_dim if mla.q_lora_rank else h * heads * mla.qk_head_dim
    q_down = h * mla.q_lora_rank + gain * mla.q_lora_rank
    kv_up = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out = heads * mla.v_head_dim * h + (h if spec.bias else 0)
    return q_down + kv_down, q_proj + kv_up + out


def mla_ops(spec: TransformerSpec, dev: DeviceSlice, path: str, own: int) -> list[Op]:
    """A multi-head latent attention at Megatron-Core's split over tp (megatron-core 0.16.1, mla_params): the
    down-projections (to the query latent, and to the key-value latent and the rotary key) and the latents'
    RMSNorms run on each rank's `own` tokens (its sequence share under sp, else all local tokens on every tp
    rank); the up-projections (to the queries, or one query projection without a query latent; to the keys
    without position and the values) split the heads over tp, reading the latents gathered over tp under sp
    (strategy.megatron: the collectives); the rotary embedding of the queries' and the shared key's rotary
    parts, the core at the queries' and keys' head dim and the values', the output projection row-parallel."""
    mla = spec.mla
    assert mla is not None
    tokens, mb, tp = dev.local_tokens, dev.micro_batch, dev.tp
    act, lin, h = dev.precision.activation_dtype, dev.precision.linear_dtype, spec.hidden
    heads = spec.num_heads // tp
    kv_down = [matmul_op("kv_down", f"{path}.attn.kv_down", lin, own, mla.kv_lora_rank + mla.qk_rope_head_dim, h),
               pointwise_op("kv_norm", "norm", f"{path}.attn.kv_norm", act, own * mla.kv_lora_rank,
                            flops_per_element=5.0)]
    if mla.q_lora_rank:
        ops = [matmul_op("q_down", f"{path}.attn.q_down", lin, own, mla.q_lora_rank, h), kv_down[0],
               pointwise_op("q_norm", "norm", f"{path}.attn.q_norm", act, own * mla.q_lora_rank,
                            flops_per_element=5.0), kv_down[1],
               matmul_op("q_up", f"{path}.attn.q_up", lin, tokens, heads * mla.qk_head_dim, mla.q_lora_rank)]
    else:
        ops = [*kv_down, matmul_op("q_proj", f"{path}.attn.q_proj", lin, tokens, heads * mla.qk_head_dim, h)]
    ops += [matmul_op("kv_up", f"{path}.attn.kv_up", lin, tokens, heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                      mla.kv_lora_rank),
            pointwise_op("rope", "elementwise", f"{path}.attn.rope", act,
                         tokens * (heads + 1) * mla.qk_rope_head_dim),
            attention_op(f"{path}.attn.core", dev.precision.matmul_dtype, mb * heads, tokens // mb, dev.seq_len,
                         mla.qk_head_dim, spec.causal, dev.attention, value_dim=mla.v_head_dim)]
    if not dev.fused_attention:
        ops.append(pointwise_op("softmax", "softmax", f"{path}.attn.softmax", act,
                                mb * heads * (tokens // mb) * dev.seq_len, flops_per_element=5.0, selective=True))
    ops.append(matmul_op("out_proj", f"{path}.attn.out", lin, tokens, h, heads * mla.v_head_dim))
    return ops
