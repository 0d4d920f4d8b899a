"""measure.dlrm_rank.run_interleaved: a task's configs take one iteration each in turn, warm-up rounds first."""

from collections.abc import Iterator
from typing import Any

import pytest

from trainsim.errors import ConfigError
from trainsim.measure import dlrm_rank
from trainsim.measure.dlrm import measure_dlrm


def test_configs_take_one_iteration_each_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[tuple[str, int]] = []

    def fake(torch: Any, dist: Any, rank: int, world: int, plan: Any, dense: Any, batch: int,
             seed: int, probes: Any, hooks: Any = None) -> Iterator[dict[str, Any]]:
        for it in range(100):
            order.append((plan, it))
            yield {"iteration_s": float(it), "events": [], "plan": plan}

    monkeypatch.setattr(dlrm_rank, "config_iterations", fake)
    configs: list[Any] = [("a", {}, 8, 0), ("b", {}, 8, 0), ("c", {}, 8, 0)]  # plans stand in as names
    out = dlrm_rank.run_interleaved(None, None, 1, 2, configs, iterations=2, warmup=1)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("c", 2)]
    assert [[r["plan"] for r in o["records"]] for o in out] == [["a", "a"], ["b", "b"], ["c", "c"]]
    assert [[r["iteration_s"] for r in o["records"]] for o in out] == [[1.0, 2.0]] * 3  # warm-up left out
    assert all(o["rank"] == 1 for o in out)


def test_measure_refuses_a_bad_group() -> None:
    with pytest.raises(ConfigError, match="group"):
        measure_dlrm([], group=0)


def test_traced_iterations_follow_the_measured_ones_in_their_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.measure import dlrm_trace

    traced: list[tuple[str, str]] = []

    def fake(torch: Any, dist: Any, rank: int, world: int, plan: Any, dense: Any, batch: int,
             seed: int, probes: Any, hooks: Any = None) -> Iterator[dict[str, Any]]:
        for it in range(100):
            yield {"iteration_s": float(it), "events": [], "plan": plan}

    def fake_trace(step: Any, hooks: Any, rank: int, folder: str, barrier: Any) -> dict[str, Any]:
        record = next(step)
        traced.append((folder, record["plan"]))
        return record

    class Dist:
        barrier = None

    monkeypatch.setattr(dlrm_rank, "config_iterations", fake)
    monkeypatch.setattr(dlrm_trace, "traced_iteration", fake_trace)
    configs: list[Any] = [("a", {}, 8, 0), ("b", {}, 8, 0), ("c", {}, 8, 0)]
    out = dlrm_rank.run_interleaved(None, Dist(), 0, 2, configs, iterations=2, warmup=0,
                                    trace_dirs=[("A", 1), ("", 0), ("C", 2)])
    assert traced == [("A", "a"), ("C/t0", "c"), ("C/t1", "c")]
    assert [o.get("traced_s") for o in out] == [[2.0], None, [2.0, 3.0]]  # after the 2 measured iterations
