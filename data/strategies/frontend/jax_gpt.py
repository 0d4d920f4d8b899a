"""A JAX train step for the JAX front-end's splits over tp (docs/strategy-tree.md, "Splits over tp on a captured
graph"): 4 pre-norm GPT blocks (hidden 256, 4 heads, ffn 1024, tanh GELU; causal attention written as einsums)
in jax.numpy, with jax.named_scope around each module: block0/ln1, block0/attn/qkv, block0/attn (the einsums and
the softmax), block0/attn/proj, block0/ln2, block0/mlp/fc1, block0/mlp/fc2, ...; the loss (mean of squares of
the last block's output) is unscoped. Each Dense is its matmul and its bias add, both in the Dense's scope.

trainsim predict --frontend jax --model data/strategies/frontend/jax_gpt.py:train_step --cluster local-cpu \
    --num-gpus 2 --tp 2 --micro-batch 4 --global-batch 4 --seq-len 128 --precision fp32 --engine sim \
    --tree data/strategies/frontend/jax-gpt-tp2-megatron.yaml
"""

from typing import Any

import jax
import jax.numpy as jnp

HIDDEN, HEADS, FFN, BLOCKS = 256, 4, 1024, 4
_SHAPES = {"gain1": (HIDDEN,), "bias1": (HIDDEN,), "wqkv": (HIDDEN, 3 * HIDDEN), "bqkv": (3 * HIDDEN,),
           "wo": (HIDDEN, HIDDEN), "bo": (HIDDEN,), "gain2": (HIDDEN,), "bias2": (HIDDEN,), "w1": (HIDDEN, FFN),
           "b1": (FFN,), "w2": (FFN, HIDDEN), "b2": (HIDDEN,)}


def _dense(x: Any, w: Any, b: Any, name: str) -> Any:
    with jax.named_scope(name):
        return x @ w + b


def _layer_norm(x: Any, gain: Any, bias: Any, name: str) -> Any:
    with jax.named_scope(name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * gain + bias


def _attention(p: dict[str, Any], x: Any) -> Any:
    batch, seq, _ = x.shape
    head_dim = HIDDEN // HEADS
    with jax.named_scope("attn"):
        qkv = _dense(x, p["wqkv"], p["bqkv"], "qkv")
        q, k, v = (t.reshape(batch, seq, HEADS, head_dim) for t in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(head_dim))
        scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(batch, seq, HIDDEN)
        return _dense(out, p["wo"], p["bo"], "proj")


def _block(p: dict[str, Any], x: Any, index: int) -> Any:
    with jax.named_scope(f"block{index}"):
        x = x + _attention(p, _layer_norm(x, p["gain1"], p["bias1"], "ln1"))
        y = _layer_norm(x, p["gain2"], p["bias2"], "ln2")
        with jax.named_scope("mlp"):
            return x + _dense(jax.nn.gelu(_dense(y, p["w1"], p["b1"], "fc1")), p["w2"], p["b2"], "fc2")


def _step(params: list[dict[str, Any]], x: Any) -> Any:
    def loss(params: list[dict[str, Any]]) -> Any:
        y = x
        for index, p in enumerate(params):
            y = _block(p, y, index)
        return (y**2).mean()

    return jax.value_and_grad(loss)(params)


def train_step(*, micro_batch: int, seq_len: int, precision: str) -> tuple[Any, tuple[Any, ...]]:
    """The factory `--model jax_gpt.py:train_step` calls: (the step, its example arguments as shapes)."""
    del precision  # fp32 throughout
    block = {key: jax.ShapeDtypeStruct(shape, jnp.float32) for key, shape in _SHAPES.items()}
    return _step, ([dict(block) for _ in range(BLOCKS)],
                   jax.ShapeDtypeStruct((micro_batch, seq_len, HIDDEN), jnp.float32))
