"""Predictive trace simulation (Lin et al. Algorithm 1) of per-rank DLRM traces: kernel-model durations with host
overheads from traces (exact hand-checked times), and replay as its special case."""

import pytest

from trainsim.cost.sharded_dlrm import RankMemory, RankWork, ShardedIteration
from trainsim.embedding.sharding import ShardingPlan, TableShard
from trainsim.embedding.tables import Table
from trainsim.estimate.trace_predict import overheads_from, simulate_trace

ORDER = ("index-a2a launch", "bottom_mlp fwd", "index-a2a wait", "embeddings fwd", "pooled-a2a-fwd", "top_mlp fwd",
         "top_mlp bwd", "pooled-a2a-bwd launch", "bottom_mlp bwd", "grad-allreduce launch", "pooled-a2a-bwd wait",
         "embeddings bwd", "grad-allreduce wait", "optimizer step")


def _iteration() -> ShardedIteration:
    plan = ShardingPlan(2, 2, (TableShard(Table(0, 10, 4, 1.0), "table-wise", (0,)),))
    works = (RankWork(1.0, 2.0, 1.0, 1.0, 1.0, 2.0, 0.5), RankWork(2.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5))
    return ShardedIteration(plan, 1, works, (RankMemory(0.0, 0.0, 0.0, 0.0),) * 2, 1.5, 1.0, 1.0, 0.5, 10.0)


def _spans(durations: dict[str, float]) -> list[tuple[str, float, float]]:
    out, t = [], 0.0
    for name in ORDER:
        out.append((name, t, t + durations.get(name, 0.0)))
        t += durations.get(name, 0.0)
    return out


def test_predicted_from_kernel_models_and_overheads() -> None:
    # Launches cost 0.1 s of host time each. r0: index all-to-all 0.1-1.6, lookups 1.6-3.6; r1's end at 2.6; the
    # pooled all-to-all 3.6-4.6; top fwd+bwd to 6.6; launch to 6.7, gradients back 6.7-7.7 while the bottom MLP's
    # backward runs; launch to 7.8, all-reduce 7.8-8.3; lookups bwd r0 7.8-9.8; optimizer to 10.3.
    spans = _spans({})
    overheads = {"index-a2a launch": 0.1, "pooled-a2a-bwd launch": 0.1, "grad-allreduce launch": 0.1}
    assert simulate_trace([spans, spans], _iteration(), overheads) == pytest.approx(10.3)


def test_replay_reproduces_the_traced_iteration() -> None:
    # Both ranks traced the same spans; collectives take their traced time, so replay ends where the trace ends.
    durations: dict[str, float] = dict.fromkeys(ORDER, 0.25)
    spans = _spans(durations)
    assert simulate_trace([spans, spans], _iteration(), {}, replay=True) == pytest.approx(spans[-1][2])


def test_overheads_are_means_of_host_spans() -> None:
    a = _spans({"index-a2a launch": 0.2, "bottom_mlp fwd": 5.0})
    b = _spans({"index-a2a launch": 0.4})
    assert overheads_from([[a], [b]]) == pytest.approx({"index-a2a launch": 0.3, "pooled-a2a-bwd launch": 0.0,
                                                        "grad-allreduce launch": 0.0})
