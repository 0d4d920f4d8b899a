"""Tiny Hugging Face configs the compile tests capture through the torch front-end (two blocks of width 64, four
heads, a 512-token vocabulary), shared so every differential against the catalog reads the same model."""

from typing import Any

GPT2: dict[str, Any] = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
                        "n_positions": 64, "bos_token_id": None, "eos_token_id": None}
LLAMA: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 176,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                         "max_position_embeddings": 64}
