"""The split executor's cost per reshard step beyond its collective (profile/reshard_overhead.py)."""

from pathlib import Path
from typing import Any

import pytest

from conftest import PROFILE_ENV, ConstantCosts
from trainsim.cost.profiled import ProfiledCosts
from trainsim.errors import ConfigError
from trainsim.profile.database import ProfileDB
from trainsim.profile.reshard_overhead import (
    PHASES,
    RESHARD_COLLECTIVES,
    ReshardOverhead,
    excess_s,
    measure_reshard_overhead,
    store_reshard_overhead,
)


def test_the_excess_is_the_median_executor_call_less_the_bare_one_and_the_engines_start() -> None:
    """Medians over rounds: 300 us against 100 us bare, less a 40 us start of the autograd engine for a
    backward; one disturbed round (900 us) does not move it; never below 0."""
    assert excess_s([3e-4, 3e-4, 9e-4], [1e-4, 1e-4, 1e-4]) == pytest.approx(2e-4)
    assert excess_s([3e-4, 3e-4, 9e-4], [1e-4, 1e-4, 1e-4], [4e-5, 4e-5, 4e-5]) == pytest.approx(1.6e-4)
    assert excess_s([1e-4], [2e-4]) == 0.0


def test_rounds_must_pair_up() -> None:
    with pytest.raises(ConfigError, match="rounds"):
        excess_s([1e-4, 1e-4], [1e-4])
    with pytest.raises(ConfigError, match="rounds"):
        excess_s([], [])


@pytest.mark.parametrize(("field", "kwargs"), [("world_size", {"world_size": 1}), ("calls", {"calls": 0}),
                                               ("rounds", {"rounds": 0}), ("elements", {"elements": 0})])
def test_bad_probe_settings_are_refused(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=field):
        measure_reshard_overhead(**kwargs)


def test_a_real_two_rank_probe_prices_every_collective_and_phase_and_stores_them(tmp_path: Path) -> None:
    result = measure_reshard_overhead(world_size=2, elements=64, calls=2, rounds=1, timeout_s=120.0, probed=True)
    assert result.probe_s is not None and len(result.probe_s) == 2 and all(p > 0.0 for p in result.probe_s)
    keys = [(c, p) for c in RESHARD_COLLECTIVES for p in PHASES]
    assert sorted(result.per_step_s) == sorted(keys)
    assert all(len(v) == 2 and all(x >= 0.0 for x in v) for v in result.per_step_s.values())
    assert all(executor > 0.0 and bare > 0.0 for v in result.calls_s.values() for executor, bare, _ in v)
    stored = ReshardOverhead({key: [1e-4, 3e-4] for key in keys}, result.calls_s, 2, 64, 2, 1)
    with ProfileDB.open(tmp_path / "p.sqlite") as db:
        store_reshard_overhead(db, PROFILE_ENV, stored)
    costs = ProfiledCosts(tmp_path / "p.sqlite", "cpu-local", ConstantCosts(1.0))
    assert costs.executor_reshard_s("cpu-local", "all-gather", "bwd") == pytest.approx(2e-4)  # the ranks' median


def test_the_cli_refuses_a_bad_deadline_in_one_line() -> None:
    from typer.testing import CliRunner

    from trainsim.cli.main import app

    result = CliRunner().invoke(app, ["profile", "--reshard-overhead", "--timeout-s", "0"])
    assert result.exit_code == 2
    assert "timeout_s" in result.output and "Traceback" not in result.output
