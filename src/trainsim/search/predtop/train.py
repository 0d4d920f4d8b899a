"""Training and evaluating PredTOP's predictors (sec. IV-B6 to IV-B8, sec. VIII-A).

Per mesh and intra plan, a model maps a stage's DAG to its latency. Training: Adam (beta 0.9, 0.999), learning
rate 1e-3 with cosine decay to 0 over the epochs, batches of 32 (fewer for small sets: batch_size), MAE loss
(eq. 3; by default relative to each stage's latency: train), early stopping when the validation loss has not
improved for `patience` epochs, keeping the best weights (the paper: 500 epochs, patience 200). Targets are
latencies divided by the training set's mean, so one learning rate serves every mesh.
Seeded and single-threaded: a rerun gives the same model.

Splits (sec. VIII-A): a training fraction of the samples (10% to 80%), a separate 10% for validation, the rest
for testing; MRE (eq. 5) on the test part.
"""

import math
import random
import time
from dataclasses import dataclass

import torch
from torch import nn

from trainsim.search.predtop.dag import StageDag
from trainsim.search.predtop.models import Batch, make_batch, make_model

LEARNING_RATE = 1e-3
BATCH_SIZE = 32
STEPS_PER_EPOCH = 4  # the paper's: 30% of 409 GPT-3 stages in batches of 32


def batch_size(count: int) -> int:
    """32 as the paper, smaller when the training set is small, so that an epoch still takes STEPS_PER_EPOCH
    optimizer steps (16 samples in one batch of 32 gave 38 steps in all before early stopping: underfit)."""
    return max(1, min(BATCH_SIZE, math.ceil(count / STEPS_PER_EPOCH)))
VALIDATION_FRACTION = 0.1


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
    scale_s: float
    epochs_run: int
    train_time_s: float
    relative: bool = True

    def predict_s(self, dags: list[StageDag]) -> list[float]:
        self.model.eval()
        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(dags), BATCH_SIZE):
                batch = make_batch(dags[start:start + BATCH_SIZE])
                values = self.model(batch)
                out.extend(float(v) * self.scale_s for v in values)
        return out


def _batches(dags: list[StageDag], targets: torch.Tensor, rng: random.Random) -> list[tuple[Batch, torch.Tensor]]:
    """Shuffled batches of graphs of similar size (less padding): sorted by size, cut into batches, shuffled."""
    order = sorted(range(len(dags)), key=lambda i: (dags[i].num_nodes, rng.random()))
    size = batch_size(len(dags))
    starts = list(range(0, len(order), size))
    rng.shuffle(starts)
    return [(make_batch([dags[i] for i in order[s:s + size]]), targets[order[s:s + size]]) for s in starts]


def train(kind: str, dags: list[StageDag], latencies_s: list[float], validation: tuple[list[StageDag], list[float]],
          *, epochs: int = 500, patience: int = 200, seed: int = 0, relative: bool = True) -> Predictor:
    """Fit a model of `kind` (transformer | gcn | gat) to the stages' latencies. relative: each absolute error
    is divided by the stage's latency (the MAE of eq. 3 made relative, which is what MRE scores: on the latency
    itself the MAE neglects the smallest stages, and an embedding alone at 1.8 ms missed by 3 ms is 170% of
    MRE); False is the paper's MAE."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    start = time.perf_counter()
    scale = sum(latencies_s) / len(latencies_s)
    model = make_model(kind)
    def target(y: float) -> float:
        return y / scale

    targets = torch.tensor([target(y) for y in latencies_s], dtype=torch.float32)
    val_batch = make_batch(validation[0])
    val_targets = torch.tensor([target(y) for y in validation[1]], dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.999))
    rng = random.Random(seed)
    best_loss, best_state, since, ran = math.inf, None, 0, 0
    for epoch in range(epochs):
        ran = epoch + 1
        for group in optimizer.param_groups:  # cosine decay from LEARNING_RATE to 0 over the epochs
            group["lr"] = 0.5 * LEARNING_RATE * (1.0 + math.cos(math.pi * epoch / epochs))
        model.train()
        for batch, y in _batches(dags, targets, rng):
            optimizer.zero_grad()
            loss = ((model(batch) - y).abs() / (y if relative else 1.0)).mean()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = float(((model(val_batch) - val_targets).abs() / (val_targets if relative else 1.0)).mean())
        if val_loss < best_loss:
            best_loss, since = val_loss, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            since += 1
            if since >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return Predictor(kind, model, scale, ran, time.perf_counter() - start, relative)


def mre_percent(predicted: list[float], measured: list[float]) -> float:
    """Mean relative error, eq. 5."""
    return 100.0 * sum(abs(p - y) / y for p, y in zip(predicted, measured, strict=True)) / len(measured)
