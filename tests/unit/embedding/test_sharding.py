"""Sharding plans: pieces, per-rank memory, all-to-all volumes (hand-computed), and the six sharders of Lin et
al. Table III on a hand-made table set."""

import numpy as np
import pytest

from trainsim.embedding.sharders import SHARDERS, shard
from trainsim.embedding.sharding import ShardingPlan, TableShard, message_bytes, uniform_plan
from trainsim.embedding.synthetic import generate_task
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError, InfeasiblePlanError, UnknownNameError

# E, D, L chosen so each cost function orders them differently.
TABLES = (Table(0, 1000, 4, 10.0), Table(1, 10, 4, 50.0), Table(2, 100, 8, 3.0), Table(3, 10_000, 4, 2.0))
BIG_CAP = 1e12


def owners(sharder: str, ranks: int = 3) -> list[list[int]]:
    plan = shard(TABLES, sharder, ranks, cap_bytes=BIG_CAP)
    out: list[list[int]] = [[] for _ in range(ranks)]
    for s in plan.shards:
        out[s.ranks[0]].append(s.table.index)
    return out


def test_naive_is_index_mod_ranks() -> None:
    assert owners("naive") == [[0, 3], [1], [2]]


def test_size_greedy() -> None:
    # cost E: t3 10000 -> r0, t0 1000 -> r1, t2 100 -> r2, t1 10 -> r2 (100 < 1000)
    assert owners("size-greedy") == [[3], [0], [1, 2]]


def test_lookup_greedy() -> None:
    # cost L*D: t1 200 -> r0, t0 40 -> r1, t2 24 -> r2, t3 8 -> r2 (24 < 40)
    assert owners("lookup-greedy") == [[1], [0], [2, 3]]


def test_norm_lookup_greedy() -> None:
    # cost L/E: t1 5 -> r0, t2 0.03 -> r1, t0 0.01 -> r2, t3 0.0002 -> r2 (0.01 < 0.03)
    assert owners("norm-lookup-greedy") == [[1], [2], [0, 3]]


def test_size_lookup_greedy() -> None:
    # cost L*D*log10(E): t1 200, t0 120, t2 48, t3 32 -> r0, r1, r2, then r2 (48 < 120)
    assert owners("size-lookup-greedy") == [[1], [0], [2, 3]]


def test_random_is_seeded_and_places_every_table_once() -> None:
    a = shard(TABLES, "random", 3, cap_bytes=BIG_CAP, seed=7)
    b = shard(TABLES, "random", 3, cap_bytes=BIG_CAP, seed=7)
    assert a == b
    assert sorted(s.table.index for s in a.shards) == [0, 1, 2, 3]


def test_memory_cap_moves_or_refuses() -> None:
    # t0 16 kB -> r0, t1 160 B -> r1, t2 3.2 kB -> r2; t3 (160 kB) does not fit r0 under 170 kB: r1 takes it.
    plan = shard(TABLES, "naive", 3, cap_bytes=170_000.0)
    assert plan.table_bytes("sgd") == [16_000.0, 160_160.0, 3200.0]
    assert plan.notes == ("t3: rank 0 full, placed on rank 1",)
    with pytest.raises(InfeasiblePlanError, match="no rank has room"):
        shard(TABLES, "size-greedy", 3, cap_bytes=100_000.0)


def test_every_sharder_respects_the_cap_on_a_generated_task() -> None:
    tables = generate_task("heavy", 4, seed=1)
    cap = 1.2 * sum(t.weight_bytes for t in tables) / 4
    for sharder in SHARDERS:
        plan = shard(tables, sharder, 4, cap_bytes=cap, seed=1)
        assert max(plan.table_bytes("sgd")) <= cap


def test_optimizer_state_bytes() -> None:
    plan = ShardingPlan(1, 1, (TableShard(TABLES[0], "table-wise", (0,)),))
    assert plan.table_bytes("sgd") == [16_000.0]
    assert plan.table_bytes("rowwise-adagrad") == [16_000.0 + 4_000.0]
    assert plan.table_bytes("adam") == [48_000.0]
    dp = ShardingPlan(2, 2, (TableShard(TABLES[0], "data-parallel", (0, 1)),))
    assert dp.table_bytes("sgd") == [32_000.0, 32_000.0]  # weights + dense gradient on every rank


def test_all_to_all_volumes_table_wise() -> None:
    t0, t1 = Table(0, 1000, 4, 10.0), Table(1, 10, 4, 50.0)
    plan = ShardingPlan(2, 2, (TableShard(t0, "table-wise", (0,)), TableShard(t1, "table-wise", (1,))))
    # pooled: the owner sends b x D x 4 = 2 x 4 x 4 = 32 bytes of each rank's samples
    assert plan.pooled_bytes(2).tolist() == [[32.0, 32.0], [32.0, 32.0]]
    assert message_bytes(plan.pooled_bytes(2)) == 32.0
    # indices: every rank sends b x (L x 8 + 8): 176 bytes for t0 to r0, 816 for t1 to r1
    assert plan.index_bytes(2).tolist() == [[176.0, 816.0], [176.0, 816.0]]
    assert message_bytes(plan.index_bytes(2)) == 816.0


def test_row_and_column_wise_pieces_and_volumes() -> None:
    t = Table(0, 10, 4, 5.0)
    rw = uniform_plan((t,), "row-wise", 2, 2)
    pieces = rw.pieces(2)
    assert [(p.rows, p.samples, p.pooling) for p in pieces[0] + pieces[1]] == [(5, 4, 2.5), (5, 4, 2.5)]
    assert rw.pooled_bytes(2).tolist() == [[32.0, 32.0], [32.0, 32.0]]  # partial sums of b x D
    assert rw.index_bytes(2).tolist() == [[56.0, 56.0], [56.0, 56.0]]  # 2 x (2.5 x 8 + 8)
    cw = uniform_plan((Table(0, 10, 6, 5.0),), "column-wise", 2, 2)
    assert [p.dim for ps in cw.pieces(2) for p in ps] == [3, 3]
    assert cw.pooled_bytes(2).tolist() == [[24.0, 24.0], [24.0, 24.0]]
    dp = uniform_plan((t,), "data-parallel", 2, 2)
    assert np.all(dp.pooled_bytes(2) == 0) and dp.dense_table_gradient_bytes() == 160.0
    assert [p.samples for ps in dp.pieces(2) for p in ps] == [2, 2]


def test_table_row_wise_stays_in_a_node() -> None:
    t = Table(0, 10, 4, 5.0)
    plan = uniform_plan((t,), "table-row-wise", 4, 2)
    assert [len(ps) for ps in plan.pieces(1)] == [1, 1, 0, 0]
    with pytest.raises(ConfigError, match="one node"):
        ShardingPlan(4, 2, (TableShard(t, "table-row-wise", (1, 2)),))


def test_bad_plans() -> None:
    with pytest.raises(UnknownNameError, match="sharder"):
        shard(TABLES, "smart", 2, cap_bytes=BIG_CAP)
    with pytest.raises(ConfigError, match="exactly one rank"):
        ShardingPlan(2, 2, (TableShard(TABLES[0], "table-wise", (0, 1)),))
    with pytest.raises(ConfigError, match="distinct ranks"):
        ShardingPlan(2, 2, (TableShard(TABLES[0], "row-wise", (0, 2)),))
    with pytest.raises(ConfigError, match="cap_bytes"):
        shard(TABLES, "naive", 2, cap_bytes=float("nan"))
