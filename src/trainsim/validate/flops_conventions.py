"""Named FLOP conventions of published MFU and TFLOP/s figures, and the conversion of a prediction to them.

trainsim has one MFU (Result.mfu, MFU_FORMULA): the model FLOPs of the op graph / (iteration time x GPUs x dense
peak). A source that counts model FLOPs its own way reports MFU = its FLOP count / (the same time x GPUs x peak),
so validate converts a prediction by the ratio of the two FLOP counts, under the convention the row states
(its flops_convention cell), else its source is stated to use (row_defaults.yaml: data facts), else model FLOPs.
"""

from collections.abc import Callable
from dataclasses import replace

from trainsim.errors import TrainsimError
from trainsim.estimate.result import Result
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.registry import Registry
from trainsim.strategy.parallel import ParallelSpec

# model, plan (its sequence length and recomputation), parameter count -> the FLOPs counted per token
FlopsPerToken = Callable[[TransformerSpec, ParallelSpec, float], float]
FLOPS_CONVENTIONS: Registry[FlopsPerToken] = Registry("flops convention")


@FLOPS_CONVENTIONS.register("6nd")
def six_nd(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """6 N per token: 2 FLOPs per multiply-add, forward + backward = 3 x forward, every weight once (Kaplan et
    al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1)."""
    return 6.0 * params


@FLOPS_CONVENTIONS.register("6nd+attention")
def six_nd_attention(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """6 N per token for the weights plus 12 L h s per token for the attention scores and values, without causal
    masking (PaLM, Chowdhery et al. 2022, app. B); llm-foundry's MFU counts the same."""
    return six_nd(model, plan, params) + 12.0 * model.num_layers * model.hidden * plan.seq_len


@FLOPS_CONVENTIONS.register("6nd-embedding+attention")
def six_nd_attention_without_embedding(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """torchtitan's count: 6 (N - the input embedding's parameters) + 12 L h s, every score counted
    (torchtitan/models/llama3/model/args.py get_nparams_and_flops, torchtitan 0.1.0)."""
    return six_nd_attention(model, plan, params - model.vocab * model.hidden)


@FLOPS_CONVENTIONS.register("6nd+attention+recompute")
def hardware_flops(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """FLOPs as the hardware executes them: 6nd+attention plus the forward pass that activation recomputation
    repeats (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", sec. 5):
    the whole forward (2 N + 4 L h s per token) under full recomputation, the attention core (4 L h s) under
    selective recomputation."""
    attention_forward = 4.0 * model.num_layers * model.hidden * plan.seq_len
    repeated = {"full": 2.0 * params + attention_forward, "selective": attention_forward}.get(plan.recompute, 0.0)
    return six_nd_attention(model, plan, params) + repeated


@FLOPS_CONVENTIONS.register("megatron-eq3")
def megatron_eq3(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """Megatron-LM's count, eq. 3 of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM", sec. 5.1): F = 96 B s l h^2 (1 + s / 6h + V / 16 l h) per iteration, GEMMs only,
    the recomputed forward included whether or not the run recomputes; per token 96 l h^2 + 16 l h s + 6 h V.
    The formula as printed (a 4h MLP and full attention), whatever the model's layout: it is the source's count."""
    layers, hidden = model.num_layers, model.hidden
    return 96.0 * layers * hidden**2 + 16.0 * layers * hidden * plan.seq_len + 6.0 * hidden * model.vocab


MEGATRON_VOCAB_MULTIPLE = 128  # megatron/training/arguments.py: --make-vocab-size-divisible-by 128, times tp


def _megatron_per_token(model: TransformerSpec, plan: ParallelSpec, score_share: float) -> float:
    """Megatron's count per token: 12 L h ffn g k (g = 3/2 for a gated MLP, k the experts a token is routed to in
    an MoE block at their width, and its shared experts', 1 in a dense one) + 12 L h^2 (1 + G/H + score_share
    s/h) + 6 h V_padded, with V padded to a multiple of 128 x tp."""
    layers, hidden = model.num_layers, model.hidden
    gated = 1.5 if model.mlp == "swiglu" else 1.0
    ffn_widths = (model.num_moe_layers * (model.top_k * model.expert_ffn + model.shared_expert_ffn_hidden)
                  + (layers - model.num_moe_layers) * model.ffn_hidden)  # an MoE block's experts at their width
    multiple = MEGATRON_VOCAB_MULTIPLE * plan.tp
    padded_vocab = -(-model.vocab // multiple) * multiple
    if model.mla is not None:
        attention_flops = _megatron_mla_per_token(model, plan, score_share)
    else:
        attention = 1.0 + model.kv_heads / model.num_heads + score_share * plan.seq_len / hidden
        attention_flops = 12.0 * layers * hidden**2 * attention
    return 12.0 * ffn_widths * hidden * gated + attention_flops + 6.0 * hidden * padded_vocab


def _megatron_mla_per_token(model: TransformerSpec, plan: ParallelSpec, score_share: float) -> float:
    """A multi-head latent attention's FLOPs per token in Megatron-Bridge's count (megatron/bridge/training/utils/
    flop_utils.py, megatron-bridge 0.3.1, multi_latent_attention branch): 6 L (q_lora (h + H d_qk + 1) [h H d_qk
    without a query latent] + kv_lora (h + H (d_nope + d_v) + 1) + h d_rope + H d_v h + share s H (d_qk + d_v)),
    d_qk = d_nope + d_rope; its scores at half (score_share 1/2), or all of them (1). NB: no multi-token-prediction
    layers (the count adds them where the run has them; a row states none)."""
    mla, h, heads = model.mla, model.hidden, model.num_heads
    assert mla is not None
    qk = mla.qk_head_dim
    q_term = mla.q_lora_rank * (h + heads * qk + 1) if mla.q_lora_rank else h * heads * qk
    kv_term = mla.kv_lora_rank * (h + heads * (mla.qk_nope_head_dim + mla.v_head_dim) + 1)
    core = score_share * plan.seq_len * heads * (qk + mla.v_head_dim)
    per_layer = q_term + kv_term + h * mla.qk_rope_head_dim + heads * mla.v_head_dim * h + core
    return 6.0 * model.num_layers * per_layer


@FLOPS_CONVENTIONS.register("megatron")
def megatron(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, core_r0.9.0, with grouped-query
    attention and gated MLPs), what NeMo prints as model TFLOP/s: every attention score counted, no input
    embedding. NeMo 24.07's printed TFLOP/s over its printed tokens/s is this count to 0.1% (Llama 2 7B: 46.07
    GFLOP per token; Llama 3 8B: 57.95)."""
    return _megatron_per_token(model, plan, score_share=1.0)


@FLOPS_CONVENTIONS.register("megatron-causal")
def megatron_causal(model: TransformerSpec, plan: ParallelSpec, params: float) -> float:
    """Megatron-Bridge's count (megatron/bridge/training/utils/flop_utils.py, megatron-bridge 0.3.1): Megatron's
    with half the attention scores, "only half of the attention matrix is non-zero" under the causal mask (its
    performance summary: 51.5 GFLOP per token for Llama 3 8B at 8,192 tokens, this count)."""
    return _megatron_per_token(model, plan, score_share=0.5)


def convention_flops(convention: str, job: Job, params: float) -> float:
    """Model FLOPs of one iteration of `job` counted under the named convention."""
    if not isinstance(job.model, TransformerSpec):
        raise TrainsimError(f"the {convention} FLOP convention counts transformers only, not {job.model.name}")
    per_token = FLOPS_CONVENTIONS.get(convention)(job.model, job.parallel, params)
    return per_token * job.tokens_per_iteration


def in_convention(result: Result, job: Job, params: float, convention: str) -> Result:
    """The prediction's MFU and TFLOP/s per GPU with the model FLOPs counted under `convention` (time, GPUs and
    peak unchanged: Result.mfu's own definition, applied to the other FLOP count)."""
    flops = convention_flops(convention, job, params)
    scale = flops / result.model_flops_per_iteration
    return replace(result, model_flops_per_iteration=flops, mfu=result.mfu * scale,
                   tflops_per_gpu=result.tflops_per_gpu * scale)
