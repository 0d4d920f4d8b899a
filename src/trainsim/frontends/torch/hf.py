"""Hugging Face models through the torch front-end: a config (config.json mapping or PretrainedConfig) -> OpGraph.

The model is built from its config under FakeTensorMode (no weights, nothing read from the hub) with at most two
hidden layers, traced once, and its block counted num_hidden_layers times, so ingesting an 80-layer config costs
what a 2-layer one does. Imports torch and transformers; load it lazily.

Conventions, chosen so that the trace matches what the analytic catalog models for the same config:
- the language-modelling head of the family: GPT2LMHeadModel, BertForMaskedLM, AutoModelForCausalLM otherwise;
- inputs input_ids and labels of shape (micro_batch, seq_len), so the loss is part of the step;
- SDPA attention; attention-probability dropout set to 0 (a fused kernel applies it inside, at no extra FLOPs,
  and CPU kernels would otherwise fall back to unfused math), hidden dropout kept;
- decoders count attention as causal (a fused kernel skips the masked half) although HF passes a mask tensor;
- a mixture of experts (Mixtral's num_local_experts > 1) traces its router as the model runs it and balanced
  routing for its experts (torch.moe: every expert T k / E routed token copies, as the catalog prices), without
  the router's auxiliary load-balancing loss (output_router_logits off, the model's default).
"""

import contextlib
from collections.abc import Iterator
from typing import Any

from trainsim.errors import ConfigError
from trainsim.frontends.torch.capture import TensorSpec, graph_from_module
from trainsim.frontends.torch.moe import is_moe_config, mixtral_config, with_balanced_routing
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.precision import Precision

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout")
_ENCODERS = frozenset({"bert", "roberta", "distilbert", "electra", "albert"})
TRACED_LAYERS = 2


def graph_from_hf_config(config: Any, *, micro_batch: int, seq_len: int, precision: Precision = "fp32",
                         name: str | None = None, fused: bool = False, ep: int = 1) -> OpGraph:
    """config: a config.json mapping or a transformers.PretrainedConfig; fused: see capture.graph_from_module;
    ep: a mixture of experts traced as one rank of an expert-parallel group runs it (torch.moe)."""
    hf_config = to_pretrained_config(config)
    model_type = str(getattr(hf_config, "model_type", ""))
    layer_key = next((key for key in _LAYER_KEYS if isinstance(getattr(hf_config, key, None), int)), None)
    if layer_key is None:
        raise ConfigError("config", model_type, "has no num_hidden_layers / n_layer to find the repeated blocks")
    num_layers = int(getattr(hf_config, layer_key))
    traced_config = training_config(hf_config, min(num_layers, TRACED_LAYERS))
    inputs = {"input_ids": TensorSpec((micro_batch, seq_len), "int64"),
              "labels": TensorSpec((micro_batch, seq_len), "int64")}
    label = name or str(getattr(hf_config, "_name_or_path", "") or model_type)
    if ep > 1 and not is_moe_config(traced_config):
        raise ConfigError("ep", ep, f"1 for {model_type}, which has no experts")
    build = (lambda: with_balanced_routing(model_for(traced_config), ep)) if is_moe_config(traced_config) else (
        lambda: model_for(traced_config))
    with _quiet_transformers():
        return graph_from_module(build, inputs, precision=precision,
                                 micro_batch=micro_batch, seq_len=seq_len, name=label,
                                 causal_attention=model_type not in _ENCODERS, repeat_count=num_layers,
                                 fused=fused)


def training_config(config: Any, num_layers: int | None = None) -> Any:
    """The PretrainedConfig the front-end traces (and `trainsim measure --frontend torch` trains): the module
    doc's conventions (attention-probability dropout 0, no KV cache, SDPA); num_layers: the hidden layers kept
    (default: the config's)."""
    hf_config = to_pretrained_config(config)
    layer_key = next((key for key in _LAYER_KEYS if isinstance(getattr(hf_config, key, None), int)), None)
    if layer_key is None:
        raise ConfigError("config", str(getattr(hf_config, "model_type", "")),
                          "has no num_hidden_layers / n_layer to find the repeated blocks")
    traced = hf_config.to_dict()
    if num_layers is not None:
        traced[layer_key] = num_layers
    for key in _ATTENTION_DROPOUT_KEYS:
        if key in traced:
            traced[key] = 0.0
    traced["use_cache"] = False
    traced_config = type(hf_config).from_dict(traced)
    traced_config._attn_implementation = "sdpa"
    return traced_config


def hf_config_from_spec(spec: TransformerSpec) -> dict[str, Any]:
    """A catalog transformer as a Hugging Face config.json mapping of the family with the same structure:
    gpt -> gpt2 (learned positions, GELU, LayerNorm), llama-style (RoPE, SwiGLU, RMSNorm) -> llama, bert -> bert,
    a Mixtral-shaped mixture of experts -> mixtral (torch.moe.mixtral_config)."""
    if spec.is_moe:
        return mixtral_config(spec)
    if spec.mla is not None:
        raise ConfigError(f"model {spec.name}", "mla", "the torch front-end maps attention with q, k and v "
                          "projections per head only, not a multi-head latent attention")
    if spec.mlp == "swiglu" and spec.norm == "rmsnorm" and spec.position == "rope":
        return {"model_type": "llama", "_name_or_path": spec.name, "num_hidden_layers": spec.num_layers,
                "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden,
                "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.kv_heads,
                "vocab_size": spec.vocab, "max_position_embeddings": spec.max_seq_len,
                "attention_bias": spec.bias, "tie_word_embeddings": spec.tied_embeddings}
    if spec.mlp == "gelu" and spec.norm == "layernorm" and spec.position == "learned" and spec.bias:
        if not spec.causal:
            return {"model_type": "bert", "_name_or_path": spec.name, "num_hidden_layers": spec.num_layers,
                    "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden,
                    "num_attention_heads": spec.num_heads, "vocab_size": spec.vocab,
                    "max_position_embeddings": spec.max_seq_len, "tie_word_embeddings": spec.tied_embeddings}
        return {"model_type": "gpt2", "_name_or_path": spec.name, "n_layer": spec.num_layers, "n_embd": spec.hidden,
                "n_head": spec.num_heads, "n_inner": spec.ffn_hidden, "vocab_size": spec.vocab,
                "n_positions": spec.max_seq_len, "tie_word_embeddings": spec.tied_embeddings,
                "bos_token_id": None, "eos_token_id": None}
    raise ConfigError(f"model {spec.name}", f"{spec.mlp}/{spec.norm}/{spec.position}",
                      "the torch front-end maps gelu/layernorm/learned (GPT-2, BERT) and swiglu/rmsnorm/rope "
                      "(LLaMA) transformers; give a Hugging Face config.json for others")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers warns about config values a synthetic config leaves at their defaults (token ids)."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


def to_pretrained_config(config: Any) -> Any:
    import transformers

    if isinstance(config, transformers.PretrainedConfig):
        return config
    if not isinstance(config, dict):
        raise ConfigError("config", type(config).__name__, "must be a config.json mapping or a PretrainedConfig")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError("config.model_type", model_type, "required to build the model with transformers")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        with _quiet_transformers():
            return transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise ConfigError("config.model_type", model_type, f"transformers cannot build it: {exc}") from None


def model_for(config: Any) -> Any:
    """The family's language-modelling model, built from the config (call under FakeTensorMode)."""
    import transformers

    model_type = getattr(config, "model_type", "")
    if model_type == "gpt2":
        return transformers.GPT2LMHeadModel(config)
    if model_type in _ENCODERS:
        return transformers.AutoModelForMaskedLM.from_config(config)
    return transformers.AutoModelForCausalLM.from_config(config)
