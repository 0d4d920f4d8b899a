"""The six sharders of Lin et al. Table III: each places whole tables (table-wise) on ranks.

Indexing sharders pick a rank per table directly (naive: table index mod ranks; random: a seeded uniform
draw). Greedy sharders sort the tables by a cost function, most costly first, and put each on the rank with the
least accumulated cost that still has room (Sec. V-A; the greedy of facebookresearch/dlrm's sharding in
torchrec's partitioners, "greedy" perf partitioner, torchrec 0.8). Room: the tables' weights and optimizer
state on a rank stay within the memory cap, 80% of the device memory in the paper (Sec. IV-B1).

NB: where an indexing sharder's rank has no room left, the table goes to the next rank (in rank order) that
has; the plan's notes say so. Where no rank has room, InfeasiblePlanError.
"""

import math
from collections.abc import Callable, Sequence

import numpy as np

from trainsim.embedding.sharding import Optimizer, ShardingPlan, ShardPiece, TableShard, piece_state_bytes
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError, InfeasiblePlanError
from trainsim.registry import Registry

MEMORY_CAP_FRACTION = 0.8  # Lin et al. Sec. IV-B1: tables on a rank stay under 80% of the GPU's DRAM

CostFunction = Callable[[Table], float]
# Table III cost functions (c): x.E, x.L * x.D, x.L / x.E, x.L * x.D * log10(x.E)
COST_FUNCTIONS: dict[str, CostFunction] = {
    "size-greedy": lambda t: float(t.rows),
    "lookup-greedy": lambda t: t.pooling * t.dim,
    "norm-lookup-greedy": lambda t: t.pooling / t.rows,
    "size-lookup-greedy": lambda t: t.pooling * t.dim * math.log10(t.rows),
}
SHARDERS: tuple[str, ...] = ("naive", "random", *COST_FUNCTIONS)


def _state_bytes(table: Table, optimizer: Optimizer) -> float:
    return piece_state_bytes(ShardPiece(table, "table-wise", 0, table.rows, table.dim, 1, table.pooling), optimizer)


class _Placer:
    """Tables placed so far, per rank, under the memory cap."""

    def __init__(self, num_ranks: int, cap_bytes: float, optimizer: Optimizer) -> None:
        self.used = [0.0] * num_ranks
        self.cost = [0.0] * num_ranks
        self.cap = cap_bytes
        self.optimizer: Optimizer = optimizer
        self.owner: dict[int, int] = {}
        self.notes: list[str] = []

    def fits(self, rank: int, table: Table) -> bool:
        return self.used[rank] + _state_bytes(table, self.optimizer) <= self.cap

    def place(self, rank: int, table: Table, cost: float = 0.0) -> None:
        self.used[rank] += _state_bytes(table, self.optimizer)
        self.cost[rank] += cost
        self.owner[table.index] = rank

    def place_near(self, wanted: int, table: Table) -> None:
        n = len(self.used)
        for step in range(n):
            rank = (wanted + step) % n
            if self.fits(rank, table):
                if step:
                    self.notes.append(f"t{table.index}: rank {wanted} full, placed on rank {rank}")
                self.place(rank, table)
                return
        self._refuse(table)

    def _refuse(self, table: Table) -> None:
        need = _state_bytes(table, self.optimizer)
        raise InfeasiblePlanError("embedding-oom", f"table {table.describe()} needs {need / 1e9:.3f} GB and no rank "
                                  f"has room under the cap {self.cap / 1e9:.3f} GB (used: "
                                  f"{', '.join(f'{u / 1e9:.3f}' for u in self.used)} GB)")


def _greedy(placer: _Placer, tables: Sequence[Table], cost: CostFunction) -> None:
    for table in sorted(tables, key=lambda t: (-cost(t), t.index)):
        ranks = [r for r in range(len(placer.used)) if placer.fits(r, table)]
        if not ranks:
            placer._refuse(table)
        placer.place(min(ranks, key=lambda r: (placer.cost[r], r)), table, cost(table))


PlaceTables = Callable[[_Placer, Sequence[Table], int], None]
SHARDER_REGISTRY: Registry[PlaceTables] = Registry("sharder")


@SHARDER_REGISTRY.register("naive")
def _naive(placer: _Placer, tables: Sequence[Table], seed: int) -> None:
    for table in tables:
        placer.place_near(table.index % len(placer.used), table)


@SHARDER_REGISTRY.register("random")
def _random(placer: _Placer, tables: Sequence[Table], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for table in tables:
        placer.place_near(int(rng.integers(len(placer.used))), table)


for _name, _cost in COST_FUNCTIONS.items():
    SHARDER_REGISTRY.add(_name, lambda placer, tables, seed, cost=_cost: _greedy(placer, tables, cost))


def shard(tables: Sequence[Table], sharder: str, num_ranks: int, *, cap_bytes: float,
          optimizer: Optimizer = "sgd", ranks_per_node: int = 0, seed: int = 0) -> ShardingPlan:
    """Place every table table-wise with `sharder` (one of SHARDERS)."""
    place = SHARDER_REGISTRY.get(sharder)
    if num_ranks < 1:
        raise ConfigError("num_ranks", num_ranks, "must be at least 1")
    if not cap_bytes > 0 or not math.isfinite(cap_bytes):
        raise ConfigError("cap_bytes", cap_bytes, "must be a positive finite number of bytes")
    placer = _Placer(num_ranks, cap_bytes, optimizer)
    place(placer, tables, seed)
    shards = tuple(TableShard(t, "table-wise", (placer.owner[t.index],)) for t in tables)
    return ShardingPlan(num_ranks, ranks_per_node or num_ranks, shards, sharder=sharder, notes=tuple(placer.notes))
