"""Sharding plans of embedding tables across ranks, and what they cost each rank in memory and in traffic.

A table is placed one of five ways (the sharding types of torchrec, torchrec/distributed/types.py
ShardingType, torchrec 0.8):

- table-wise: the whole table on one rank, which looks it up for the global batch;
- column-wise: the dim split into blocks, one per rank of the group, each looked up for the global batch;
- row-wise: the rows split into contiguous blocks over all ranks; each rank looks up the indices that fall in
  its block for the global batch and produces partial pooled sums;
- table-row-wise: row-wise over the ranks of one node (torchrec's TWRW for multi-node jobs);
- data-parallel: every rank holds the table and looks up its local batch; its gradient is all-reduced.

Per iteration, with b samples per rank: the index all-to-all sends each rank's b samples' indices (and offsets)
to the ranks that look them up; the pooled-embedding all-to-all sends each looker-up's b x D_piece pooled
values (partial sums for row-wise pieces) to the rank that owns the samples; the backward all-to-all sends the
gradients of those pooled values back. NB: torchrec uses a reduce-scatter for row-wise pooled outputs; its
bytes per rank pair are the same as the all-to-all's, which is how they are counted here.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from trainsim.embedding.tables import INDEX_BYTES, OFFSET_BYTES, WEIGHT_BYTES, Table
from trainsim.errors import ConfigError

ShardKind = Literal["table-wise", "row-wise", "column-wise", "data-parallel", "table-row-wise"]
SHARD_KINDS: tuple[str, ...] = get_args(ShardKind)
Optimizer = Literal["sgd", "rowwise-adagrad", "adagrad", "adam"]
# Optimizer state per table element (fp32 values): FBGEMM's split_table_batched_embeddings_ops_training.py
# (fbgemm-gpu 0.8) keeps one momentum value per row for rowwise adagrad, one per element for adagrad, two for adam.
_STATE_PER_ROW = {"sgd": 0.0, "rowwise-adagrad": 1.0, "adagrad": 0.0, "adam": 0.0}
_STATE_PER_ELEMENT = {"sgd": 0.0, "rowwise-adagrad": 0.0, "adagrad": 1.0, "adam": 2.0}


@dataclass(frozen=True, slots=True)
class TableShard:
    """Where one table goes. ranks: the owner (table-wise), the column or row blocks' ranks in block order
    (column-wise, row-wise, table-row-wise), or every rank (data-parallel)."""

    table: Table
    kind: ShardKind
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShardPiece:
    """What one rank holds of one table and looks up each iteration.

    samples: samples looked up (the global batch, or the local batch for data-parallel pieces); pooling: the
    mean lookups per sample that land on this piece (a row block gets its share of the table's lookups)."""

    table: Table
    kind: ShardKind
    rank: int
    rows: int
    dim: int
    samples: int
    pooling: float

    @property
    def weight_bytes(self) -> float:
        return float(self.rows) * self.dim * WEIGHT_BYTES


def _blocks(total: int, parts: int) -> list[int]:
    """Sizes of `parts` contiguous blocks of `total` as torchrec cuts them: ceil-sized blocks, the rest last."""
    size = -(-total // parts)
    return [max(0, min(size, total - i * size)) for i in range(parts)]


@dataclass(frozen=True, slots=True)
class ShardingPlan:
    num_ranks: int
    ranks_per_node: int
    shards: tuple[TableShard, ...]
    sharder: str = "manual"
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_ranks < 1 or self.ranks_per_node < 1 or self.num_ranks % self.ranks_per_node:
            raise ConfigError("num_ranks", self.num_ranks,
                              f"must be a positive multiple of ranks_per_node={self.ranks_per_node}")
        for shard in self.shards:
            _check_shard(shard, self.num_ranks, self.ranks_per_node)

    def pieces(self, local_batch: int) -> list[list[ShardPiece]]:
        """Per rank, the pieces it holds and looks up, for `local_batch` samples per rank."""
        out: list[list[ShardPiece]] = [[] for _ in range(self.num_ranks)]
        global_batch = local_batch * self.num_ranks
        for shard in self.shards:
            table, kind = shard.table, shard.kind
            if kind == "table-wise":
                out[shard.ranks[0]].append(ShardPiece(table, kind, shard.ranks[0], table.rows, table.dim,
                                                      global_batch, table.pooling))
            elif kind == "column-wise":
                for rank, dim in zip(shard.ranks, _blocks(table.dim, len(shard.ranks)), strict=True):
                    out[rank].append(ShardPiece(table, kind, rank, table.rows, dim, global_batch, table.pooling))
            elif kind in ("row-wise", "table-row-wise"):
                # NB: hashed ids spread the hot rows (embedding.indices.rank_to_row), so a block's share of the
                # lookups is its share of the rows.
                for rank, rows in zip(shard.ranks, _blocks(table.rows, len(shard.ranks)), strict=True):
                    out[rank].append(ShardPiece(table, kind, rank, rows, table.dim, global_batch,
                                                table.pooling * rows / table.rows))
            else:
                for rank in shard.ranks:
                    out[rank].append(ShardPiece(table, kind, rank, table.rows, table.dim, local_batch,
                                                table.pooling))
        return out

    def table_bytes(self, optimizer: Optimizer) -> list[float]:
        """Per rank: the embedding weights it holds plus their optimizer state (and, for data-parallel tables,
        their dense gradient)."""
        per_rank = [0.0] * self.num_ranks
        for rank, pieces in enumerate(self.pieces(1)):
            for piece in pieces:
                per_rank[rank] += piece_state_bytes(piece, optimizer)
        return per_rank

    def pooled_bytes(self, local_batch: int, act_bytes: int = WEIGHT_BYTES) -> NDArray[np.float64]:
        """[src, dst] bytes of the forward pooled-embedding all-to-all (the backward one is its transpose)."""
        matrix = np.zeros((self.num_ranks, self.num_ranks))
        for pieces in self.pieces(local_batch):
            for piece in pieces:
                if piece.kind == "data-parallel":
                    continue
                matrix[piece.rank, :] += local_batch * piece.dim * act_bytes
        return matrix

    def index_bytes(self, local_batch: int) -> NDArray[np.float64]:
        """[src, dst] bytes of the index all-to-all: each rank's local samples' indices and offsets to the
        ranks that look them up."""
        matrix = np.zeros((self.num_ranks, self.num_ranks))
        for pieces in self.pieces(local_batch):
            for piece in pieces:
                if piece.kind == "data-parallel":
                    continue
                matrix[:, piece.rank] += local_batch * (piece.pooling * INDEX_BYTES + OFFSET_BYTES)
        return matrix

    def dense_table_gradient_bytes(self) -> float:
        """Bytes every rank all-reduces for the data-parallel tables' gradients."""
        return sum(s.table.weight_bytes for s in self.shards if s.kind == "data-parallel")

    def describe(self) -> str:
        by_rank: list[list[str]] = [[] for _ in range(self.num_ranks)]
        for shard in self.shards:
            tag = {"table-wise": "", "row-wise": "/rw", "column-wise": "/cw", "data-parallel": "/dp",
                   "table-row-wise": "/twrw"}[shard.kind]
            for rank in shard.ranks:
                by_rank[rank].append(f"t{shard.table.index}{tag}")
        return "; ".join(f"r{rank}: {' '.join(names) or '-'}" for rank, names in enumerate(by_rank))


def piece_state_bytes(piece: ShardPiece, optimizer: Optimizer) -> float:
    """Weights + optimizer state of a piece (+ the dense gradient of a data-parallel piece). NB: sharded
    pieces keep no gradient: FBGEMM's table-batched embedding fuses the optimizer into the backward."""
    elements = float(piece.rows) * piece.dim
    state = piece.rows * _STATE_PER_ROW[optimizer] + elements * _STATE_PER_ELEMENT[optimizer]
    gradient = elements if piece.kind == "data-parallel" else 0.0
    return (elements + state + gradient) * WEIGHT_BYTES


def message_bytes(matrix: NDArray[np.float64]) -> float:
    """Lin et al. Sec. III-C: the all-to-all's size for the cost model is the largest amount any rank sends
    or receives (self-traffic excluded)."""
    off = matrix - np.diag(np.diag(matrix))
    return float(max(off.sum(axis=1).max(initial=0.0), off.sum(axis=0).max(initial=0.0)))


def _check_shard(shard: TableShard, num_ranks: int, ranks_per_node: int) -> None:
    where = f"sharding.table{shard.table.index}"
    if shard.kind not in SHARD_KINDS:
        raise ConfigError(f"{where}.kind", shard.kind, f"choose one of: {', '.join(SHARD_KINDS)}")
    ranks = shard.ranks
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < num_ranks for r in ranks):
        raise ConfigError(f"{where}.ranks", list(ranks), f"must be distinct ranks in [0, {num_ranks})")
    if shard.kind == "table-wise" and len(ranks) != 1:
        raise ConfigError(f"{where}.ranks", list(ranks), "a table-wise table lives on exactly one rank")
    if shard.kind == "column-wise" and len(ranks) > shard.table.dim:
        raise ConfigError(f"{where}.ranks", list(ranks), f"more column blocks than dim={shard.table.dim}")
    if shard.kind in ("row-wise", "table-row-wise") and len(ranks) > shard.table.rows:
        raise ConfigError(f"{where}.ranks", list(ranks), f"more row blocks than rows={shard.table.rows}")
    if shard.kind == "data-parallel" and sorted(ranks) != list(range(num_ranks)):
        raise ConfigError(f"{where}.ranks", list(ranks), "a data-parallel table lives on every rank")
    if shard.kind == "table-row-wise" and len({r // ranks_per_node for r in ranks}) != 1:
        raise ConfigError(f"{where}.ranks", list(ranks), f"table-row-wise stays in one node of {ranks_per_node}")


def uniform_plan(tables: Sequence[Table], kind: ShardKind, num_ranks: int, ranks_per_node: int) -> ShardingPlan:
    """Every table sharded the same way (row/column-wise over all ranks, table-row-wise over node 0, or
    data-parallel): for tests and what-if comparisons."""
    if kind == "table-wise":
        raise ConfigError("kind", kind, "use a sharder to place whole tables")
    ranks = tuple(range(ranks_per_node if kind == "table-row-wise" else num_ranks))
    return ShardingPlan(num_ranks, ranks_per_node, tuple(TableShard(t, kind, ranks) for t in tables), sharder=kind)
