"""Model files given by path: a trainsim model mapping (YAML or JSON) or a Hugging Face config.json.

A JSON file with `model_type` or `architectures` is read as a Hugging Face transformers config and mapped to a
TransformerSpec; anything else is a trainsim model mapping, validated like a catalog entry.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsim.catalog.files import read_mapping
from trainsim.catalog.model_files import parse_model, parse_model_file
from trainsim.errors import ConfigError
from trainsim.ir.model_spec import ModelSpec

_HF_KEYS = ("model_type", "architectures")


def model_from_file(path: Path) -> ModelSpec:
    data = read_mapping(path)
    if path.suffix == ".json" and any(key in data for key in _HF_KEYS):
        return model_from_hf_config(data, name=hf_model_name(data, path), where=str(path))
    return parse_model_file(data, path)


def hf_model_name(config: dict[str, Any], path: Path) -> str:
    """The model's name: its `_name_or_path` where the config records one, else the file's stem, except that
    a Hugging Face checkpoint's `config.json` is named after its folder (the model), not "config"."""
    if config.get("_name_or_path"):
        return str(config["_name_or_path"])
    if path.stem == "config" and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem


def model_from_hf_config(config: dict[str, Any], name: str, where: str = "config.json") -> ModelSpec:
    """Map a Hugging Face config mapping to a TransformerSpec (validated like a catalog entry)."""
    model_type = _model_type(config)
    mapper = _MAPPERS.get(model_type)
    if mapper is None:
        raise ConfigError(f"{where}.model_type", model_type, "supported: " + ", ".join(sorted(_MAPPERS)))
    fields = mapper(_Reader(config, where))
    return parse_model({"name": name, "source": f"Hugging Face config ({model_type})", **fields}, where=where)


def _model_type(config: dict[str, Any]) -> str:
    """model_type, or the family guessed from architectures[0] (e.g. LlamaForCausalLM -> llama)."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type
    architectures = config.get("architectures") or []
    first = architectures[0] if isinstance(architectures, list) and architectures else ""
    families = (("GPT2", "gpt2"), ("Llama", "llama"), ("Mistral", "mistral"), ("Mixtral", "mixtral"),
                ("Qwen2", "qwen2"), ("Bert", "bert"))
    for prefix, family in families:
        if str(first).startswith(prefix):
            return family
    return str(first or model_type)


class _Reader:
    """Typed access to the config; a missing (or null) required key is a ConfigError naming it."""

    def __init__(self, config: dict[str, Any], where: str) -> None:
        self._config = config
        self._where = where

    def integer(self, key: str, default: int | None = None) -> int:
        value = self._config.get(key)
        if value is None:
            value = default
        if value is None:
            raise ConfigError(f"{self._where}.{key}", None, "required key is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self._where}.{key}", value, "must be an integer")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self._where}.{key}", value, "must be true or false")
        return value

    def has(self, key: str) -> bool:
        return self._config.get(key) is not None


def _gpt2(cfg: _Reader) -> dict[str, Any]:
    hidden = cfg.integer("n_embd")
    return {
        "arch": "gpt", "num_layers": cfg.integer("n_layer"), "hidden": hidden,
        "num_heads": cfg.integer("n_head"),
        "ffn_hidden": cfg.integer("n_inner") if cfg.has("n_inner") else 4 * hidden,
        "vocab": cfg.integer("vocab_size"), "max_seq_len": cfg.integer("n_positions", 1024),
        "mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True,
        "tied_embeddings": cfg.flag("tie_word_embeddings", True),
    }


def _llama_like(cfg: _Reader, arch: str, bias: bool) -> dict[str, Any]:
    heads = cfg.integer("num_attention_heads")
    return {
        "arch": arch, "num_layers": cfg.integer("num_hidden_layers"), "hidden": cfg.integer("hidden_size"),
        "ffn_hidden": cfg.integer("intermediate_size"), "num_heads": heads,
        "num_kv_heads": cfg.integer("num_key_value_heads", heads), "vocab": cfg.integer("vocab_size"),
        "max_seq_len": cfg.integer("max_position_embeddings", 4096),
        "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": bias,
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
    }


def _llama(cfg: _Reader) -> dict[str, Any]:
    return _llama_like(cfg, "llama", bias=cfg.flag("attention_bias", False))


def _qwen2(cfg: _Reader) -> dict[str, Any]:
    # NB: Qwen2 has biases on the q/k/v projections only; bias=true also counts the output-projection and MLP
    # biases (a few hidden-size vectors per layer, < 0.1% of the parameters).
    return _llama_like(cfg, "llama", bias=True)


def _mixtral(cfg: _Reader) -> dict[str, Any]:
    fields = _llama_like(cfg, "mixtral", bias=False)
    fields.update(num_experts=cfg.integer("num_local_experts"), top_k=cfg.integer("num_experts_per_tok"),
                  moe_every=1)
    return fields


def _deepseek(cfg: _Reader) -> dict[str, Any]:
    """DeepSeek-V2 / V3 (transformers 5.24.0 models/deepseek_v2 and deepseek_v3 configuration files): routed
    experts and shared ones at moe_intermediate_size, the first first_k_dense_replace blocks dense at
    intermediate_size, every moe_layer_freq-th block after them an MoE, multi-head latent attention (q_lora_rank
    null: the queries not compressed)."""
    fields = _llama_like(cfg, "llama", bias=False)
    width = cfg.integer("moe_intermediate_size")
    fields.update(num_experts=cfg.integer("n_routed_experts"), top_k=cfg.integer("num_experts_per_tok"),
                  moe_every=cfg.integer("moe_layer_freq", 1), expert_ffn_hidden=width,
                  shared_expert_ffn_hidden=cfg.integer("n_shared_experts", 0) * width,
                  leading_dense_layers=cfg.integer("first_k_dense_replace", 0),
                  mla={"q_lora_rank": cfg.integer("q_lora_rank", 0), "kv_lora_rank": cfg.integer("kv_lora_rank"),
                       "qk_nope_head_dim": cfg.integer("qk_nope_head_dim"),
                       "qk_rope_head_dim": cfg.integer("qk_rope_head_dim"), "v_head_dim": cfg.integer("v_head_dim")})
    return fields


def _bert(cfg: _Reader) -> dict[str, Any]:
    return {
        "arch": "bert", "num_layers": cfg.integer("num_hidden_layers"), "hidden": cfg.integer("hidden_size"),
        "ffn_hidden": cfg.integer("intermediate_size"), "num_heads": cfg.integer("num_attention_heads"),
        "vocab": cfg.integer("vocab_size"), "max_seq_len": cfg.integer("max_position_embeddings", 512),
        "mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True,
        "tied_embeddings": cfg.flag("tie_word_embeddings", True), "causal": False,
    }


_MAPPERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "llama": _llama,
    "mistral": lambda cfg: _llama_like(cfg, "llama", bias=False),
    "qwen2": _qwen2,
    "mixtral": _mixtral,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "bert": _bert,
}
