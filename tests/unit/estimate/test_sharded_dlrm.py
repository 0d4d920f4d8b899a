"""A DLRM with sharded embedding tables through both engines: an exact hand-checked schedule, the engines against
each other, per-rank memory and OOM, and the sharder comparison."""

import pytest

from trainsim.catalog import load_cluster
from trainsim.compile.lower_sharded_dlrm import closed_form_ends_s, lower_sharded_iteration
from trainsim.cost.embedding_lookup import RooflineLookup
from trainsim.cost.sharded_dlrm import RankMemory, RankWork, ShardedIteration
from trainsim.embedding.sharders import SHARDERS, shard
from trainsim.embedding.sharding import ShardingPlan, TableShard, uniform_plan
from trainsim.embedding.synthetic import generate_task
from trainsim.embedding.tables import Table, tables_from_spec
from trainsim.errors import ConfigError
from trainsim.estimate.result import Result
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import ShardedDlrmJob, dlrm_model, sharded_job
from trainsim.ir.model_spec import EmbeddingTable
from trainsim.search.sharding import compare_sharders
from trainsim.sim import simulate

CPU = load_cluster("local-cpu")


def predict(sjob: ShardedDlrmJob, engine: str = "analytical", lookups: RooflineLookup | None = None) -> Result:
    return estimate_sharded(sjob.job, sjob.graph, sjob.plan, engine, lookups=lookups, optimizer=sjob.optimizer)


def _iteration() -> ShardedIteration:
    t = Table(0, 10, 4, 1.0)
    plan = ShardingPlan(2, 2, (TableShard(t, "table-wise", (0,)),))
    works = (RankWork(1.0, 2.0, 1.0, 1.0, 1.0, 2.0, 0.5), RankWork(2.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5))
    memory = (RankMemory(1.0, 0.0, 0.0, 0.0),) * 2
    return ShardedIteration(plan, 1, works, memory, index_a2a_s=1.5, pooled_fwd_a2a_s=1.0, pooled_bwd_a2a_s=1.0,
                            grad_allreduce_s=0.5, capacity_bytes=10.0)


def test_exact_two_rank_schedule() -> None:
    # r0: lookups start at max(bottom 1, indices 1.5) and end at 3.5; r1's end at 2.5; the pooled all-to-all
    # waits for r0: 4.5; top fwd+bwd: 6.5; gradients back: 7.5; bottom bwd: 7.5; all-reduce: 8.0;
    # lookups bwd: r0 9.5, r1 8.5; optimizer: r0 10.0, r1 9.0.
    iteration = _iteration()
    assert closed_form_ends_s(iteration) == [10.0, 9.0]
    graph = lower_sharded_iteration(iteration)
    outcome = simulate(graph)
    ends = {t.name: outcome.end_s[t.tid] for t in graph.tasks}
    assert ends["r0:embeddings fwd"] == 3.5 and ends["r1:embeddings fwd"] == 2.5
    assert ends["r0:pooled-a2a-fwd"] == ends["r1:pooled-a2a-fwd"] == 4.5
    assert ends["r0:optimizer step"] == 10.0 and ends["r1:optimizer step"] == 9.0


def _model_and_tables(kind: str = "heavy", ranks: int = 2, seed: int = 3):  # type: ignore[no-untyped-def]
    tables = generate_task(kind, ranks, seed)  # type: ignore[arg-type]
    specs = tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling, zipf_alpha=t.zipf_alpha)
                  for t in tables)
    return dlrm_model("task", specs), tables_from_spec(specs)


@pytest.mark.parametrize("sharder", SHARDERS)
def test_engines_agree_for_every_sharder(sharder: str) -> None:
    model, tables = _model_and_tables()
    plan = shard(tables, sharder, 2, cap_bytes=1e10, seed=1)
    job = sharded_job(model, plan, CPU, 64)
    analytical, sim = predict(job, "analytical"), predict(job, "sim")
    assert sim.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=1e-12)
    assert sum(analytical.breakdown.values()) == pytest.approx(analytical.iteration_time_s)


def test_lookup_time_follows_the_plan() -> None:
    # Everything on rank 0 vs spread: the lopsided plan is slower, and rank 0 does all the lookups.
    model, tables = _model_and_tables()
    lopsided = ShardingPlan(2, 2, tuple(TableShard(t, "table-wise", (0,)) for t in tables), sharder="lopsided")
    balanced = shard(tables, "lookup-greedy", 2, cap_bytes=1e10)
    slow = predict(sharded_job(model, lopsided, CPU, 64))
    fast = predict(sharded_job(model, balanced, CPU, 64))
    assert slow.iteration_time_s > fast.iteration_time_s


def test_row_wise_balances_a_single_hot_table() -> None:
    model = dlrm_model("one", (EmbeddingTable(rows=100_000, dim=16, pooling_factor=50.0),))
    tables = tables_from_spec(model.tables)
    tw = ShardingPlan(4, 4, (TableShard(tables[0], "table-wise", (0,)),))
    rw = uniform_plan(tables, "row-wise", 4, 4)
    lookups = RooflineLookup(CPU.device)
    t_tw = predict(sharded_job(model, tw, CPU, 128), lookups=lookups)
    t_rw = predict(sharded_job(model, rw, CPU, 128), lookups=lookups)
    assert t_rw.iteration_time_s < t_tw.iteration_time_s


def test_oom_per_rank() -> None:
    # 3.2e9 rows x 1 dim x 4 bytes = 12.8 GB on one rank of a 16 GiB CPU "device" with 1 GiB reserved, and
    # adam's two states triple it: out of memory on that rank only.
    model = dlrm_model("big", (EmbeddingTable(rows=3_200_000_000, dim=1), EmbeddingTable(rows=10, dim=1)),
                       bottom_hidden=(4,), top_mlp=(4, 1))
    tables = tables_from_spec(model.tables)
    plan = ShardingPlan(2, 2, (TableShard(tables[0], "table-wise", (0,)), TableShard(tables[1], "table-wise", (1,))))
    fits = predict(sharded_job(model, plan, CPU, 8, "sgd"))
    assert not fits.oom
    over = predict(sharded_job(model, plan, CPU, 8, "adam"))
    assert over.oom and "out of memory on ranks [0]" in over.notes[-1]
    # rank 0: the table with adam's two states (3 x 12.8e9) + the dense MLPs' 86 parameters (bottom 13-4-1:
    # 61, top 4-4-1 on the interaction's 3 + 1 features: 25) as weights, gradients and two states (16 bytes)
    assert over.memory_breakdown["weights"] == 3 * 12.8e9 + 86 * 16


def test_plan_must_match_the_model() -> None:
    model, tables = _model_and_tables()
    plan = shard(tables[:-1], "naive", 2, cap_bytes=1e10)
    with pytest.raises(ConfigError, match="places"):
        sharded_job(model, plan, CPU, 64)


def test_compare_sharders_picks_the_fastest_and_counts_refusals() -> None:
    model, _ = _model_and_tables(ranks=4)
    report = compare_sharders(model, CPU, 4, 64)
    assert [o.sharder for o in report.outcomes] == list(SHARDERS)
    best = report.best
    assert best is not None and best.iteration_time_s == min(o.iteration_time_s for o in report.outcomes)
    tiny = compare_sharders(model, CPU, 4, 64, cap_fraction=1e-6)
    assert tiny.best is None and all("no rank has room" in o.refused for o in tiny.outcomes)


def test_sharded_job_takes_the_dense_precision() -> None:
    tables = (EmbeddingTable(rows=100, dim=8, pooling_factor=2.0),) * 2
    model = dlrm_model("tiny", tables, bottom_hidden=(16,), top_mlp=(8, 1))
    plan = uniform_plan(tables_from_spec(tables), "row-wise", 2, 2)
    default = sharded_job(model, plan, CPU, 4)
    fp32 = sharded_job(model, plan, CPU, 4, precision="fp32")
    matmuls = [op for layer in fp32.graph.layers for op in layer.fwd if op.kind == "matmul"]
    assert matmuls and {op.dtype for op in matmuls} == {"fp32"}
    assert default.job.parallel.precision == "bf16" and fp32.job.parallel.precision == "fp32"
