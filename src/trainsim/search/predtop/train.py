"""Training and evaluating PredTOP's predictors (sec. IV-B6 to IV-B8, sec. VIII-A).

Per mesh and intra plan, a model maps a stage's DAG to its latency. Training: Adam (beta 0.9, 0.999), learning
rate 1e-3 with cosine decay to 0 over the epochs, batches of 32 (fewer for small sets: batch_size), MAE loss
(eq. 3; by default relative to each stage's latency: train), early stopping when the validation loss has not
improved for `patience` epochs, keeping the best weights (the paper: 500 epochs, patience 200).
Normalisation: node features are standardised with the training nodes' mean and spread (sec. IV-B3 scales the
tensor dimensions logarithmically so that they do not dominate; the cost features are logs already), the
pooled sum is divided by the training graphs' mean node count, and the latency by the training mean. Targets
(TARGETS): "log" (the default) compares log latencies: the model's output r gives the latency softplus(r) (so
that add pooling keeps its additive reading) and the MAE of eq. 3 is taken on log latency, which is the relative
error to first order, so a 1 ms stage weighs as much as a 500 ms one (MRE, eq. 5, is what is scored);
"relative" divides each absolute error by the stage's latency; "absolute" is the paper's plain MAE.
Seeded and single-threaded: a rerun gives the same model.

Splits (sec. VIII-A): a training fraction of the samples (10% to 80%), a separate 10% for validation, the rest
for testing; MRE (eq. 5) on the test part.
"""

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from trainsim.search.predtop.dag import StageDag
from trainsim.search.predtop.models import Batch, make_batch, make_model

LEARNING_RATE = 1e-3
BATCH_SIZE = 32
STEPS_PER_EPOCH = 4  # the paper's: 30% of 409 GPT-3 stages in batches of 32


def batch_size(count: int, fixed: int = 0) -> int:
    """`fixed` graphs per step where given (the paper's 32: sec. IV-B6); by default 32, smaller when the training
    set is small, so that an epoch still takes STEPS_PER_EPOCH optimizer steps (16 samples in one batch of 32
    gave 38 steps in all before early stopping: underfit)."""
    if fixed > 0:
        return fixed
    return max(1, min(BATCH_SIZE, math.ceil(count / STEPS_PER_EPOCH)))
VALIDATION_FRACTION = 0.1
TARGETS = ("log", "relative", "absolute")


@dataclass(frozen=True, slots=True)
class Split:
    train: list[int]
    validation: list[int]
    test: list[int]


def split(count: int, train_fraction: float, seed: int) -> Split:
    if not 0.0 < train_fraction < 1.0 - VALIDATION_FRACTION + 1e-9:
        raise ValueError(f"train_fraction={train_fraction}: must be in (0, 0.9]")
    order = list(range(count))
    random.Random(seed).shuffle(order)
    n_train = max(1, round(train_fraction * count))
    n_val = max(1, round(VALIDATION_FRACTION * count))
    return Split(order[:n_train], order[n_train:n_train + n_val], order[n_train + n_val:])


@dataclass(slots=True)
class Predictor:
    """A trained model and the scale of its targets."""

    kind: str
    model: nn.Module
    target: str
    center: float  # unused (0): kept in saved files for a later offset
    scale: float  # the training latencies' mean, s
    feature_mean: np.ndarray
    feature_std: np.ndarray
    epochs_run: int
    train_time_s: float
    best_validation_loss: float = math.inf
    train_cpu_s: float = 0.0  # CPU time of the training thread (torch runs one thread here)

    def normalised(self, dags: list[StageDag]) -> list[StageDag]:
        return [replace(dag, features=((dag.features - self.feature_mean) / self.feature_std).astype(np.float32))
                for dag in dags]

    def to_target(self, latency_s: float) -> float:
        return latency_s / self.scale

    def to_latency_s(self, value: float) -> float:
        if self.target == "log":
            return _softplus(value) * self.scale
        return value * self.scale

    def predict_s(self, dags: list[StageDag]) -> list[float]:
        self.model.eval()
        out: list[float] = []
        with torch.no_grad():
            normal = self.normalised(dags)
            for start in range(0, len(normal), BATCH_SIZE):
                values = self.model(make_batch(normal[start:start + BATCH_SIZE]))
                out.extend(self.to_latency_s(float(v)) for v in values)
        return out


def _batches(dags: list[StageDag], targets: torch.Tensor, device: str,
             fixed: int = 0) -> list[tuple[Batch, torch.Tensor]]:
    """Batches of graphs of similar size (less padding): sorted by size and cut into batches of batch_size,
    built once and kept on the device; train() shuffles their order every epoch."""
    order = sorted(range(len(dags)), key=lambda i: (dags[i].num_nodes, i))
    size = batch_size(len(dags), fixed)
    return [(make_batch([dags[i] for i in order[s:s + size]]).to(device), targets[order[s:s + size]].to(device))
            for s in range(0, len(order), size)]


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """One leaf tensor holding every parameter of `model`, with its gradient: each parameter and its .grad become
    views of the two, so that Adam updates them all in a few kernels instead of about eight per parameter tensor
    (the DAG Transformer has 56; one tensor at a time that was about a fifth of a training step on this CPU). The
    updates are the same element by element; gradients accumulate into the views, so zero them with
    set_to_none=False. Every parameter must have one dtype and device."""
    params = list(model.parameters())
    if len({(p.dtype, p.device) for p in params}) != 1:
        raise ValueError("flat_parameters: the parameters differ in dtype or device")
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        view = slice(offset, offset + p.numel())
        flat[view].copy_(p.detach().reshape(-1))
        p.data = flat[view].view_as(p)
        p.grad = grad[view].view_as(p)
        offset += p.numel()
    flat.requires_grad_(True)
    flat.grad = grad
    return flat


def _softplus(value: float) -> float:
    return value + math.log1p(math.exp(-value)) if value > 0 else math.log1p(math.exp(value))


def _loss(output: torch.Tensor, y: torch.Tensor, target: str) -> torch.Tensor:
    """MAE (eq. 3) on the target: on log latency ("log"), relative to each stage ("relative"), or plain."""
    if target == "log":
        return (torch.log(nn.functional.softplus(output) + 1e-9) - torch.log(y)).abs().mean()
    error = (output - y).abs()
    return (error / y if target == "relative" else error).mean()


def prepare(dags: list[StageDag], latencies_s: list[float], kind: str, target: str) -> Predictor:
    """An untrained predictor with the training set's feature and target normalisation."""
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: must be one of {', '.join(TARGETS)}")
    stacked = np.concatenate([dag.features for dag in dags])
    mean = stacked.mean(axis=0)
    std = stacked.std(axis=0)
    std[std < 1e-6] = 1.0
    model = make_model(kind)
    model.get_buffer("pool_scale").fill_(len(dags) / sum(dag.num_nodes for dag in dags))
    return Predictor(kind, model, target, 0.0, sum(latencies_s) / len(latencies_s), mean.astype(np.float32),
                     std.astype(np.float32), 0, 0.0)


def train(kind: str, dags: list[StageDag], latencies_s: list[float], validation: tuple[list[StageDag], list[float]],
          *, epochs: int = 500, patience: int = 200, seed: int = 0, target: str = "log",
          device: str = "cpu", batch_graphs: int = 0,
          on_epoch: Callable[[int, float, nn.Module], None] | None = None) -> Predictor:
    """Fit a model of `kind` (transformer | gcn | gat) to the stages' latencies (Adam, cosine decay, MAE, early
    stopping on the validation stages' loss, the best weights kept). batch_graphs: graphs per step (0: batch_size's
    rule). on_epoch(epoch, validation loss, model) after each epoch's validation, for diagnostics (it must leave
    the model as it found it)."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    start, cpu_start = time.perf_counter(), time.thread_time()
    predictor = prepare(dags, latencies_s, kind, target)
    model = predictor.model.to(device)
    targets = torch.tensor([predictor.to_target(y) for y in latencies_s], dtype=torch.float32)
    batches = _batches(predictor.normalised(dags), targets, device, batch_graphs)
    val_batch = make_batch(predictor.normalised(validation[0])).to(device)
    val_targets = torch.tensor([predictor.to_target(y) for y in validation[1]], dtype=torch.float32).to(device)
    # one flat tensor (flat_parameters): the same Adam, a handful of kernels per step
    optimizer = torch.optim.Adam([flat_parameters(model)], lr=LEARNING_RATE, betas=(0.9, 0.999), foreach=False)
    rng = random.Random(seed)
    best_loss, best_state, since, ran = math.inf, None, 0, 0
    for epoch in range(epochs):
        ran = epoch + 1
        for group in optimizer.param_groups:  # cosine decay from LEARNING_RATE to 0 over the epochs
            group["lr"] = 0.5 * LEARNING_RATE * (1.0 + math.cos(math.pi * epoch / epochs))
        model.train()
        rng.shuffle(batches)
        for batch, y in batches:
            optimizer.zero_grad(set_to_none=False)
            loss = _loss(model(batch), y, target)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = float(_loss(model(val_batch), val_targets, target))
        if on_epoch is not None:
            on_epoch(epoch, val_loss, model)
        if val_loss < best_loss:
            best_loss, since = val_loss, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            since += 1
            if since >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    predictor.model = model.cpu()
    predictor.epochs_run = ran
    predictor.train_time_s = time.perf_counter() - start
    predictor.train_cpu_s = time.thread_time() - cpu_start
    predictor.best_validation_loss = best_loss
    return predictor


def mre_percent(predicted: list[float], measured: list[float]) -> float:
    """Mean relative error, eq. 5."""
    return 100.0 * sum(abs(p - y) / y for p, y in zip(predicted, measured, strict=True)) / len(measured)
