"""search objectives: memory headroom, a headroom floor, and the time and cost to train N tokens."""

import pytest
from typer.testing import CliRunner

import trainsim
from trainsim.cli.main import app
from trainsim.errors import ConfigError

SPACE = dict(num_gpus=8, global_batch=32, seq_len=1024, top_k=4, all_plans=True)


def test_memory_headroom_ranks_the_emptiest_plans_first() -> None:
    found = trainsim.search("gpt3-1.3b", objective="memory-headroom", **SPACE)  # type: ignore[arg-type]
    peaks = [p.peak_memory_gib for p in found.plans]
    assert peaks == sorted(peaks)
    fits = [p for p in found.all_plans or [] if not p.oom]
    assert peaks[0] == pytest.approx(min(p.peak_memory_gib for p in fits), rel=1e-9)
    assert all(p.headroom_gib == pytest.approx(found.memory_capacity_gib - p.peak_memory_gib) for p in found.plans)


def test_a_headroom_floor_refuses_the_fuller_plans() -> None:
    every = trainsim.search("gpt3-1.3b", **SPACE)  # type: ignore[arg-type]
    fits = [p for p in every.all_plans or [] if not p.oom]
    floor = every.memory_capacity_gib - sorted(p.peak_memory_gib for p in fits)[len(fits) // 2]  # half stay
    found = trainsim.search("gpt3-1.3b", min_headroom_gib=floor, **SPACE)  # type: ignore[arg-type]
    low = sum(every.memory_capacity_gib - p.peak_memory_gib < floor for p in fits)
    assert 0 < low < len(fits)
    assert found.infeasible["memory headroom"] == low and found.feasible == every.feasible - low
    assert found.tried == found.feasible + sum(found.infeasible.values())
    assert all(p.headroom_gib >= floor for p in found.plans)
    assert found.plans[0].tokens_per_s <= every.plans[0].tokens_per_s


def test_time_and_cost_to_train() -> None:
    found = trainsim.search("gpt3-1.3b", objective="cost", tokens=1e10, price_per_gpu_hour=2.5, **SPACE)  # type: ignore[arg-type]
    plain = trainsim.search("gpt3-1.3b", **SPACE)  # type: ignore[arg-type]
    assert [p.description for p in found.plans] == [p.description for p in plain.plans]  # fixed GPUs: same order
    for plan in found.plans:
        assert plan.time_to_train_s is not None and plan.time_to_train_s == 1e10 / plan.tokens_per_s
        assert plan.cost_to_train == pytest.approx(plan.time_to_train_s / 3600 * 8 * 2.5, rel=1e-12)
    assert found.objective == "cost" and "by cost" in found.title


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"objective": "speed"}, "objective"),
    ({"objective": "time-to-train"}, "tokens"),
    ({"objective": "cost", "tokens": 1e9}, "price_per_gpu_hour"),
    ({"tokens": -1.0}, "tokens"),
    ({"min_headroom_gib": float("nan")}, "min_headroom"),
])
def test_bad_objectives_are_one_line(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        trainsim.search("gpt3-125m", global_batch=8, **kwargs)
    assert str(caught.value).startswith(field) and "\n" not in str(caught.value)
    flags = [f"--{k.replace('_gib', '').replace('_', '-')}={v}" for k, v in kwargs.items()]
    out = CliRunner().invoke(app, ["search", "--model", "gpt3-125m", "--global-batch", "8", *flags])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1 and field in out.stderr
