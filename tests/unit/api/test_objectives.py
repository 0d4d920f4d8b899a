"""search objectives: memory headroom, a headroom floor, and the time, cost and energy to train N tokens."""

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
    ({"objective": "energy"}, "tokens"),
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


def test_energy_to_train_at_the_devices_catalog_power() -> None:
    """dgx-a100-80gb: A100 SXM4 at its 400 W datasheet maximum; energy = time x 8 GPUs x 400 W."""
    found = trainsim.search("gpt3-1.3b", objective="energy", tokens=1e10, price_per_gpu_hour=2.5, **SPACE)  # type: ignore[arg-type]
    plain = trainsim.search("gpt3-1.3b", **SPACE)  # type: ignore[arg-type]
    assert [p.description for p in found.plans] == [p.description for p in plain.plans]  # fixed GPUs: same order
    for plan in found.plans:
        assert plan.time_to_train_s is not None and plan.cost_to_train is not None
        assert plan.energy_to_train_kwh == pytest.approx(plan.time_to_train_s * 8 * 400 / 3.6e6, rel=1e-12)
    assert found.objective == "energy" and "by energy" in found.title
    out = CliRunner().invoke(app, ["search", "--model", "gpt3-1.3b", "--num-gpus", "8", "--global-batch", "32",
                                   "--seq-len", "1024", "--top-k", "2", "--tokens", "1e10", "--objective",
                                   "energy"])
    assert out.exit_code == 0, out.output
    kwh = found.plans[0].energy_to_train_kwh or 0.0
    shown = f"{kwh:,.0f}" if kwh >= 100 else f"{kwh:.3g}"  # as the table prints it (report/search.py)
    assert "kWh" in out.stdout and shown in out.stdout


def test_a_device_without_stated_power_has_no_energy() -> None:
    """gb200: its datasheet states rack power only; the energy objective says so, tokens alone leave it out."""
    with pytest.raises(ConfigError, match="gb200 states no max_power_w"):
        trainsim.search("gpt3-125m", "gb200-nvl72", 8, global_batch=8, objective="energy", tokens=1e9)
    found = trainsim.search("gpt3-125m", "gb200-nvl72", 8, global_batch=8, tokens=1e9, top_k=1)
    assert found.plans[0].time_to_train_s is not None and found.plans[0].energy_to_train_kwh is None


def test_every_gpu_with_a_datasheet_power_states_it() -> None:
    from trainsim.catalog import load_device

    watts = {name: load_device(name).max_power_w for name in (
        "a100-sxm4-80gb", "a100-sxm4-40gb", "a40", "rtx-a5500", "rtx-3090", "h100-sxm5-80gb", "h100-pcie",
        "h100-sxm5-96gb-500w", "h200-sxm-141gb", "v100-sxm2-32gb", "v100-sxm2-16gb", "gv100", "titan-xp", "b200")}
    assert watts == {"a100-sxm4-80gb": 400, "a100-sxm4-40gb": 400, "a40": 300, "rtx-a5500": 230, "rtx-3090": 350,
                     "h100-sxm5-80gb": 700, "h100-pcie": 350, "h100-sxm5-96gb-500w": 500, "h200-sxm-141gb": 700,
                     "v100-sxm2-32gb": 300, "v100-sxm2-16gb": 300, "gv100": 250, "titan-xp": 250, "b200": 1000}
