"""A JAX train step for the JAX front-end's splits over tp (docs/strategy-tree.md, "Splits over tp on a captured
graph"): 4 pre-norm residual blocks of a two-Dense MLP (hidden 256, ffn 1024, tanh GELU), written in jax.numpy
with jax.named_scope around each module, the name stack Flax-style code gives its equations (block0/ln,
block0/mlp/fc1, block0/mlp/fc2, ...); the loss (mean of squares) is unscoped. Each Dense is its matmul and its
bias add, both in the Dense's scope.

trainsim predict --frontend jax --model data/strategies/frontend/jax_mlp.py:train_step --cluster local-cpu \
    --num-gpus 2 --tp 2 --micro-batch 4 --global-batch 4 --seq-len 128 --precision fp32 --engine sim \
    --tree data/strategies/frontend/jax-mlp-tp2-megatron.yaml
"""

from typing import Any

import jax
import jax.numpy as jnp

HIDDEN, FFN, BLOCKS = 256, 1024, 4


def _dense(x: Any, w: Any, b: Any, name: str) -> Any:
    with jax.named_scope(name):
        return x @ w + b


def _layer_norm(x: Any, gain: Any, bias: Any) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * gain + bias


def _block(p: dict[str, Any], x: Any, index: int) -> Any:
    with jax.named_scope(f"block{index}"):
        with jax.named_scope("ln"):
            y = _layer_norm(x, p["gain"], p["bias"])
        with jax.named_scope("mlp"):
            y = jax.nn.gelu(_dense(y, p["w1"], p["b1"], "fc1"))
            return x + _dense(y, p["w2"], p["b2"], "fc2")


def _step(params: list[dict[str, Any]], x: Any) -> Any:
    def loss(params: list[dict[str, Any]]) -> Any:
        y = x
        for index, p in enumerate(params):
            y = _block(p, y, index)
        return (y**2).mean()

    return jax.value_and_grad(loss)(params)


def train_step(*, micro_batch: int, seq_len: int, precision: str) -> tuple[Any, tuple[Any, ...]]:
    """The factory `--model jax_mlp.py:train_step` calls: (the step, its example arguments as shapes)."""
    del precision  # fp32 throughout
    shapes = {"gain": (HIDDEN,), "bias": (HIDDEN,), "w1": (HIDDEN, FFN), "b1": (FFN,), "w2": (FFN, HIDDEN),
              "b2": (HIDDEN,)}
    block = {key: jax.ShapeDtypeStruct(shape, jnp.float32) for key, shape in shapes.items()}
    return _step, ([dict(block) for _ in range(BLOCKS)],
                   jax.ShapeDtypeStruct((micro_batch, seq_len, HIDDEN), jnp.float32))
