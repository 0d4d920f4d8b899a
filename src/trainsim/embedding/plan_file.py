"""A sharding plan written by hand: a YAML or JSON file that places every table of a DLRM.

    sharding:
      - {table: 0, kind: table-wise, ranks: [1]}
      - {table: 1, kind: column-wise, ranks: [0, 1]}
      - {table: 2, kind: data-parallel}          # ranks: every rank (may be left out)
      - {table: 3, kind: row-wise}               # ranks: every rank in order (may be left out)

`table` is the table's position in the model (tables with `count` expanded, in order); every table appears
exactly once. The kinds are embedding.sharding's (table-wise, row-wise, column-wise, data-parallel,
table-row-wise); table-row-wise without ranks takes node 0's ranks.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from trainsim.catalog.files import read_mapping
from trainsim.embedding.sharding import SHARD_KINDS, ShardingPlan, ShardKind, TableShard
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError


def plan_from_mapping(data: dict[str, Any], tables: Sequence[Table], num_ranks: int, ranks_per_node: int,
                      name: str = "manual") -> ShardingPlan:
    entries = data.get("sharding")
    if not isinstance(entries, list) or not entries:
        raise ConfigError("sharding", type(entries).__name__, "a non-empty list of {table, kind, ranks} entries")
    placed: dict[int, TableShard] = {}
    for i, entry in enumerate(entries):
        where = f"sharding[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, type(entry).__name__, "a mapping {table, kind, ranks}")
        unknown = sorted(set(entry) - {"table", "kind", "ranks"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", "?", "allowed keys: table, kind, ranks")
        index = entry.get("table")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(tables):
            raise ConfigError(f"{where}.table", index, f"a table index in [0, {len(tables)})")
        if index in placed:
            raise ConfigError(f"{where}.table", index, "each table is placed once")
        kind = entry.get("kind")
        if kind not in SHARD_KINDS:
            raise ConfigError(f"{where}.kind", kind, f"choose one of: {', '.join(SHARD_KINDS)}")
        placed[index] = TableShard(tables[index], cast(ShardKind, kind),
                                   _ranks(entry.get("ranks"), cast(str, kind), num_ranks, ranks_per_node, where))
    missing = [i for i in range(len(tables)) if i not in placed]
    if missing:
        raise ConfigError("sharding", f"tables {missing[:5]}", "every table of the model must be placed")
    return ShardingPlan(num_ranks, ranks_per_node, tuple(placed[i] for i in range(len(tables))), sharder=name)


def _ranks(value: Any, kind: str, num_ranks: int, ranks_per_node: int, where: str) -> tuple[int, ...]:
    if value is None:
        if kind == "table-wise":
            raise ConfigError(f"{where}.ranks", None, "a table-wise table names its one rank, e.g. [0]")
        return tuple(range(ranks_per_node if kind == "table-row-wise" else num_ranks))
    if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        raise ConfigError(f"{where}.ranks", value, "a list of rank numbers")
    return tuple(value)


def read_plan(path: Path, tables: Sequence[Table], num_ranks: int, ranks_per_node: int) -> ShardingPlan:
    """The plan in `path` (checked against the model's tables and the ranks; bad input -> ConfigError)."""
    return plan_from_mapping(read_mapping(path), tables, num_ranks, ranks_per_node, name=f"file {path.name}")


def plan_to_mapping(plan: ShardingPlan) -> dict[str, Any]:
    """The plan as the mapping `plan_from_mapping` reads back (every table with its kind and ranks): a measured
    run records its plan in this form, so the run's file re-predicts with `trainsim predict --sharding FILE`."""
    return {"sharding": [{"table": shard.table.index, "kind": shard.kind, "ranks": list(shard.ranks)}
                         for shard in plan.shards]}
