"""The share of a device's parameters whose Adam state stays zero: embedding-table rows no lookup touches.

torch's CPU AdamW (torch.optim.adamw, torch 2.x, the foreach path) takes the square root of exp_avg_sq every step;
where a row's gradient has always been zero exp_avg_sq is exactly zero, and torch's CPU sqrt is several times
slower over zeros than over positive values on this machine (profile.ops.measure_optimizer(zero_state=True) times
the step over all-zero gradients; cost/profiled.py mixes the two curves by this share). A zero gradient over a
state that was written before costs nothing extra: the mechanism is the state, not the gradient.

A row stays zero while no lookup of the batches the state has seen draws it. Each lookup draws a row on its own
(measure/split_model.make_data: torch.randint per table, one index per sample), so with `lookups` draws from a
table of `rows` rows with probabilities p_i, row i is untouched with probability (1 - p_i) ** lookups, and the
expected untouched share is their mean: (1 - 1 / rows) ** lookups for uniform indices.

Which batches the state has seen is a property of the run: trainsim measure's split executor
(StackSpec.split_executor) draws the step's micro-batches once and trains on them every iteration
(measure/split_model.SplitTrainer.data), so its untouched rows stay untouched; a training job that draws new
batches each step has touched every row after a few thousand steps, and nothing is priced for it. Tables sharded
over devices (rows or columns) keep the same expected share per device. Dense layers' zeros (ReLUs dead for the
whole batch) depend on the data and the weights, which the graph does not carry: not priced.
"""

import math

from trainsim.errors import ConfigError
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable
from trainsim.strategy.parallel import ParallelSpec

_CHUNK_ROWS = 1 << 20  # rows priced at once under Zipf indices


def untouched_row_share(rows: int, lookups: float, zipf_alpha: float = 0.0) -> float:
    """Expected share of a table's `rows` that none of `lookups` independent draws hits; draws uniform, or row i
    with probability proportional to (i + 1) ** -zipf_alpha (EmbeddingTable.zipf_alpha)."""
    if not (isinstance(rows, int) and rows > 0):
        raise ConfigError("rows", rows, "must be a positive integer")
    if not (math.isfinite(lookups) and lookups >= 0):
        raise ConfigError("lookups", lookups, "must be a finite number >= 0")
    if not (math.isfinite(zipf_alpha) and zipf_alpha >= 0):
        raise ConfigError("zipf_alpha", zipf_alpha, "must be a finite number >= 0")
    if zipf_alpha == 0.0:
        return (1.0 - 1.0 / rows) ** lookups
    import numpy as np

    def weights(start: int) -> "np.ndarray":  # rows start .. start + _CHUNK_ROWS: memory bounded whatever `rows`
        return np.arange(start + 1, min(rows, start + _CHUNK_ROWS) + 1, dtype=np.float64) ** -zipf_alpha

    starts = range(0, rows, _CHUNK_ROWS)
    total = sum(float(weights(start).sum()) for start in starts)
    untouched = sum(float(((1.0 - weights(start) / total) ** lookups).sum()) for start in starts)
    return untouched / rows


def step_lookups(table: EmbeddingTable, parallel: ParallelSpec) -> float:
    """Lookups of one table (one of its `count` copies) over one step's micro-batches of the whole data-parallel
    group: every rank's samples reach a table's gradient (all-reduced, or looked up by the global batch)."""
    return parallel.micro_batch * parallel.dp * parallel.num_micro_batches * table.pooling_factor


def zero_state_share(model: DlrmSpec, parallel: ParallelSpec) -> float:
    """The share of the embedding layer's parameters whose optimizer state stays zero when the state has seen
    only one step's batches (the split executor's runs: see the module docstring)."""
    params = sum(t.rows * t.dim * t.count for t in model.tables)
    zero = sum(t.rows * t.dim * t.count * untouched_row_share(t.rows, step_lookups(t, parallel), t.zipf_alpha)
               for t in model.tables)
    return zero / params
