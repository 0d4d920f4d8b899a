"""Model files by path: Hugging Face config.json mapping, trainsim model mappings, errors for bad files.

The fixtures are trimmed copies of the published config.json files (only the keys the mapper reads plus a few
it must ignore).
"""

import json
from pathlib import Path
from typing import Any

import pytest

from trainsim.catalog import load_model
from trainsim.catalog.hf_config import model_from_file
from trainsim.errors import ConfigError, InputFileError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for

GPT2 = {  # openai-community/gpt2
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_inner": None, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
    "activation_function": "gelu_new",
}
LLAMA = {  # meta-llama/Llama-2-70b-hf
    "_name_or_path": "meta-llama/Llama-2-70b-hf", "architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "max_position_embeddings": 4096,
    "num_attention_heads": 64,
    "num_hidden_layers": 80, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "vocab_size": 32000, "torch_dtype": "float16",
}
MISTRAL = {  # mistralai/Mistral-7B-v0.1
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096, "tie_word_embeddings": False,
    "vocab_size": 32000,
}
QWEN2 = {  # Qwen/Qwen2-7B
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072, "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 152064,
}
MIXTRAL = {  # mistralai/Mixtral-8x7B-v0.1
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "tie_word_embeddings": False, "vocab_size": 32000,
}
DEEPSEEK_V3 = {  # transformers 5.24.0 models/deepseek_v3/configuration_deepseek_v3.py defaults
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
BERT = {  # google-bert/bert-base-uncased
    "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768, "intermediate_size": 3072,
    "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 2,
    "vocab_size": 30522,
}


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _spec(tmp_path: Path, data: dict[str, Any], name: str = "config.json") -> TransformerSpec:
    spec = model_from_file(_write(tmp_path, name, data))
    assert isinstance(spec, TransformerSpec)
    return spec


def test_gpt2(tmp_path: Path) -> None:
    spec = _spec(tmp_path, GPT2, "gpt2.json")
    assert spec.name == "gpt2"  # no _name_or_path: the file stem
    shape = (spec.arch, spec.num_layers, spec.hidden, spec.num_heads, spec.ffn_hidden)
    assert shape == ("gpt", 12, 768, 12, 3072)
    assert (spec.vocab, spec.max_seq_len, spec.mlp, spec.position, spec.tied_embeddings) == (
        50257, 1024, "gelu", "learned", True)
    assert load_model(str(tmp_path / "gpt2.json")) == spec


def test_gpt2_with_explicit_n_inner(tmp_path: Path) -> None:
    assert _spec(tmp_path, {**GPT2, "n_inner": 1000}).ffn_hidden == 1000


def test_llama(tmp_path: Path) -> None:
    spec = _spec(tmp_path, LLAMA)
    assert spec.name == "meta-llama/Llama-2-70b-hf"
    assert (spec.arch, spec.num_layers, spec.hidden, spec.ffn_hidden) == ("llama", 80, 8192, 28672)
    assert (spec.num_heads, spec.kv_heads, spec.vocab, spec.max_seq_len) == (64, 8, 32000, 4096)
    assert (spec.mlp, spec.norm, spec.position, spec.bias, spec.tied_embeddings) == (
        "swiglu", "rmsnorm", "rope", False, False)


def test_llama_without_kv_heads_is_multi_head(tmp_path: Path) -> None:
    data = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    assert _spec(tmp_path, data).kv_heads == 64


def test_mistral(tmp_path: Path) -> None:
    spec = _spec(tmp_path, MISTRAL)
    assert (spec.num_layers, spec.hidden, spec.ffn_hidden, spec.kv_heads, spec.max_seq_len) == (
        32, 4096, 14336, 8, 32768)
    assert not spec.is_moe


def test_qwen2_has_bias(tmp_path: Path) -> None:
    spec = _spec(tmp_path, QWEN2)
    assert (spec.num_layers, spec.hidden, spec.ffn_hidden, spec.num_heads, spec.kv_heads) == (
        28, 3584, 18944, 28, 4)
    assert spec.vocab == 152064
    assert spec.bias  # NB: approximates the q/k/v-only biases


def test_mixtral(tmp_path: Path) -> None:
    spec = _spec(tmp_path, MIXTRAL)
    assert (spec.arch, spec.num_experts, spec.top_k, spec.moe_every, spec.num_moe_layers) == (
        "mixtral", 8, 2, 1, 32)
    catalog = load_model("mixtral-8x7b")
    assert isinstance(catalog, TransformerSpec)
    shape = ("num_layers", "hidden", "ffn_hidden", "num_heads", "kv_heads", "vocab", "num_experts", "top_k")
    assert all(getattr(spec, key) == getattr(catalog, key) for key in shape)


def test_bert(tmp_path: Path) -> None:
    spec = _spec(tmp_path, BERT)
    assert (spec.arch, spec.causal, spec.num_layers, spec.hidden, spec.ffn_hidden) == (
        "bert", False, 12, 768, 3072)
    assert (spec.vocab, spec.max_seq_len) == (30522, 512)


def test_model_type_guessed_from_architectures(tmp_path: Path) -> None:
    data = {k: v for k, v in LLAMA.items() if k != "model_type"}
    assert _spec(tmp_path, data).arch == "llama"


def test_unknown_model_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model_type.*supported: bert, deepseek_v2, deepseek_v3, gpt2, llama"):
        model_from_file(_write(tmp_path, "config.json", {**LLAMA, "model_type": "mamba"}))


def test_missing_required_key_names_it(tmp_path: Path) -> None:
    data = {k: v for k, v in LLAMA.items() if k != "hidden_size"}
    with pytest.raises(ConfigError, match="hidden_size") as info:
        model_from_file(_write(tmp_path, "config.json", data))
    assert info.value.field.endswith("hidden_size")


def test_wrong_type_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_file(_write(tmp_path, "config.json", {**LLAMA, "num_hidden_layers": "eighty"}))


def test_invalid_json_is_an_input_file_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", ')
    with pytest.raises(InputFileError, match="not valid JSON"):
        model_from_file(path)


def test_missing_file_is_an_input_file_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read"):
        load_model(str(tmp_path / "absent.json"))


def test_trainsim_yaml_mapping(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nnum_layers: 2\nhidden: 64\nffn_hidden: 256\nnum_heads: 4\nvocab: 1000\n")
    spec = model_from_file(path)
    assert isinstance(spec, TransformerSpec)
    assert (spec.name, spec.num_layers, spec.hidden) == ("tiny", 2, 64)


def test_trainsim_json_mapping_without_hf_keys(tmp_path: Path) -> None:
    data = {"name": "tiny-cnn", "kind": "cnn", "layers": [
        {"type": "conv", "name": "c", "in_channels": 3, "out_channels": 8, "kernel": [3, 3],
         "out_hw": [4, 4]}]}
    spec = model_from_file(_write(tmp_path, "tiny.json", data))
    assert spec.kind == "cnn" and spec.name == "tiny-cnn"


def test_trainsim_mapping_with_an_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nnum_layers: 2\nhidden: 64\nffn_hidden: 256\nnum_heads: 4\nvocab: 1000\n"
                    "layerz: 3\n")
    with pytest.raises(ConfigError, match="layerz"):
        model_from_file(path)


def test_a_checkpoint_config_is_named_after_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-gpt2-checkpoint"
    folder.mkdir()
    assert _spec(folder, GPT2).name == "tiny-gpt2-checkpoint"  # config.json: the folder, not "config"
    assert model_from_file(folder / "config.json").name == "tiny-gpt2-checkpoint"


def test_deepseek_v3_is_the_catalog_s_and_counts_its_published_parameters(tmp_path: Path) -> None:
    """DeepSeek-AI 2024, DeepSeek-V3 Technical Report, sec. 4.2: 671B parameters, 37B activated per token."""
    spec = _spec(tmp_path, DEEPSEEK_V3)
    assert (spec.leading_dense_layers, spec.num_moe_layers, spec.expert_ffn, spec.shared_expert_ffn_hidden) == (
        3, 58, 2048, 2048)
    assert spec.mla is not None and (spec.mla.q_lora_rank, spec.mla.qk_head_dim) == (1536, 192)
    catalog = load_model("deepseek-v3")
    different = {"name", "source", "published_params", "arch", "num_kv_heads"}  # kv heads: 128 = all of them
    assert spec.model_dump(exclude=different) == catalog.model_dump(exclude=different)
    assert isinstance(catalog, TransformerSpec) and spec.kv_heads == catalog.kv_heads
    total = build_transformer(spec, DeviceSlice(micro_batch=1, seq_len=128, precision=policy_for("bf16"))
                              ).param_count()
    assert total == pytest.approx(671e9, rel=0.001)
    assert total - spec.idle_expert_params == pytest.approx(37e9, rel=0.02)
