"""A small multilayer perceptron in numpy: the learned kernel model of Lin et al. Sec. III-E (after Zha et al.'s
DreamShard cost head), here one network with two outputs, log forward and log backward time.

Trained full-batch with Adam on standardized inputs and log targets (a squared error in log time is a relative
error in time); seeded, so the same rows give the same weights. Weights are plain lists in a JSON file that
`trainsim profile embedding --fit` writes; nothing here is typed by hand.
"""

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trainsim.errors import ConfigError, InputFileError

Array = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Mlp:
    """y = x W + c + mlp(x) on standardized x: a linear part (a power law in the log features) that the network
    corrects. NB: the linear part keeps predictions sane outside the sampled region, where a bare ReLU network
    on a few hundred noisy rows extrapolated by orders of magnitude."""

    mean: Array
    scale: Array
    weights: tuple[Array, ...]
    biases: tuple[Array, ...]
    linear: Array  # (features + 1, outputs): W over c
    low: Array  # the training rows' feature range: inputs are clamped to it (no extrapolation)
    high: Array
    out_low: Array  # the training targets' range: outputs are clamped to it
    out_high: Array

    def predict(self, features: Array) -> Array:
        """Rows of features -> rows of outputs (the log times)."""
        x = (np.clip(np.atleast_2d(features), self.low, self.high) - self.mean) / self.scale
        h = x
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return np.clip(h + x @ self.linear[:-1] + self.linear[-1], self.out_low, self.out_high)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(), "linear": self.linear.tolist(),
                "low": self.low.tolist(), "high": self.high.tolist(), "out_low": self.out_low.tolist(),
                "out_high": self.out_high.tolist(),
                "weights": [w.tolist() for w in self.weights], "biases": [b.tolist() for b in self.biases]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Mlp":
        return cls(np.array(data["mean"]), np.array(data["scale"]), tuple(np.array(w) for w in data["weights"]),
                   tuple(np.array(b) for b in data["biases"]), np.array(data["linear"]), np.array(data["low"]),
                   np.array(data["high"]), np.array(data["out_low"]), np.array(data["out_high"]))

    @classmethod
    def load(cls, path: Path) -> "Mlp":
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as exc:
            raise InputFileError(f"cannot read the lookup model {path}: {exc}") from None


def fit_mlp(features: Array, targets: Array, *, hidden: tuple[int, ...] = (64, 64), epochs: int = 3000,
            learning_rate: float = 3e-3, seed: int = 0, validation_share: float = 0.2) -> Mlp:
    """Fit rows of features to rows of targets: the linear part by least squares, then the network on what it
    leaves (mean squared error, Adam, full batch). Early stopping: a seeded
    `validation_share` of the rows is held out of the fit, and the weights with the least validation error
    (checked every 25 epochs) are kept."""
    if features.ndim != 2 or targets.ndim != 2 or len(features) != len(targets) or len(features) < 2:
        raise ConfigError("features", features.shape, "need at least two rows of features and targets")
    rng = np.random.default_rng(seed)
    mean, scale = features.mean(axis=0), features.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    order = rng.permutation(len(features))
    held = round(validation_share * len(features)) if len(features) >= 10 else 0
    x_all = (features - mean) / scale
    all_targets = targets
    design = np.concatenate([x_all, np.ones((len(x_all), 1))], 1)
    solution = np.linalg.lstsq(design[order[held:]], targets[order[held:]], rcond=None)
    linear = np.asarray(solution[0], dtype=np.float64)
    residual = targets - design @ linear
    x, targets = x_all[order[held:]], residual[order[held:]]
    x_val, y_val = x_all[order[:held]], residual[order[:held]]
    sizes = (x.shape[1], *hidden, targets.shape[1])
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        params += [rng.normal(0.0, np.sqrt(2.0 / fan_in), (fan_in, fan_out)), np.zeros(fan_out)]
    moments = [np.zeros_like(p) for p in params]
    squares = [np.zeros_like(p) for p in params]
    best: tuple[float, list[Array]] = (float("inf"), list(params))
    for step in range(1, epochs + 1):
        grads = _gradients(params, x, targets)
        for i, g in enumerate(grads):
            moments[i] = 0.9 * moments[i] + 0.1 * g
            squares[i] = 0.999 * squares[i] + 0.001 * g * g
            m_hat, v_hat = moments[i] / (1 - 0.9**step), squares[i] / (1 - 0.999**step)
            params[i] = params[i] - learning_rate * m_hat / (np.sqrt(v_hat) + 1e-8)
        if held and step % 25 == 0:
            error = float(((_forward(params, x_val) - y_val) ** 2).mean())
            if error < best[0]:
                best = (error, list(params))
    kept = best[1] if held else params
    out_low, out_high = all_targets.min(axis=0), all_targets.max(axis=0)
    return Mlp(mean, scale, tuple(kept[0::2]), tuple(kept[1::2]), linear, features.min(axis=0),
               features.max(axis=0), out_low, out_high)


def _activations(params: list[Array], x: Array) -> list[Array]:
    """The input and every layer's output (ReLU between layers, none after the last)."""
    activations = [x]
    h = x
    layers = len(params) // 2
    for i in range(layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < layers - 1:
            h = np.maximum(h, 0.0)
        activations.append(h)
    return activations


def _forward(params: list[Array], x: Array) -> Array:
    return _activations(params, x)[-1]


def _gradients(params: list[Array], x: Array, y: Array) -> list[Array]:
    activations = _activations(params, x)
    h = activations[-1]
    layers = len(params) // 2
    delta = 2.0 * (h - y) / len(x)
    grads: list[Array] = [np.zeros(0)] * len(params)
    for i in reversed(range(layers)):
        grads[2 * i] = activations[i].T @ delta
        grads[2 * i + 1] = delta.sum(axis=0)
        if i:
            delta = (delta @ params[2 * i].T) * (activations[i] > 0)
    return grads
