"""Predictive trace simulation (Lin et al. Algorithm 1) of per-rank DLRM traces: kernel-model durations with host
overheads from traces (exact hand-checked times), and replay as its special case."""

import pytest

from trainsim.cost.sharded_dlrm import RankMemory, RankWork, ShardedIteration
from trainsim.embedding.sharding import ShardingPlan, TableShard
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError
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


def test_cpu_time_replay_takes_compute_from_thread_cpu_and_collectives_from_the_trace() -> None:
    # Wall spans of 0.25 s each: index all-to-all 0.5 s (launch end to wait end), pooled fwd 0.25, pooled bwd
    # 0.75, all-reduce 0.75. Every span used 0.1 s of CPU: launch 0-0.1, index a2a 0.1-0.6, bottom fwd 0.1-0.2,
    # lookups 0.6-0.7, pooled a2a 0.7-0.95, top fwd+bwd to 1.15, launch to 1.25, gradients back 1.25-2.0, bottom
    # bwd 1.25-1.35, launch to 1.45, all-reduce 1.45-2.2, lookups bwd 2.0-2.1, optimizer 2.2-2.3.
    spans = _spans(dict.fromkeys(ORDER, 0.25))
    cpu = [[0.1] * len(ORDER)] * 2
    assert simulate_trace([spans, spans], _iteration(), {}, replay=True, cpu_s=cpu) == pytest.approx(2.3)


def test_cpu_time_replay_refuses_mismatched_cpu_times() -> None:
    spans = _spans({})
    with pytest.raises(ConfigError, match="cpu_s"):
        simulate_trace([spans, spans], _iteration(), {}, replay=True, cpu_s=[[0.1], [0.1]])
    with pytest.raises(ConfigError, match="cpu_s"):
        simulate_trace([spans, spans], _iteration(), {}, cpu_s=[[0.1] * len(ORDER)] * 2)
