"""Collective microbenchmarks on either clock: the busiest rank's samples, a real CPU-clock run, bad input."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import PROFILE_ENV
from trainsim.cli.main import app
from trainsim.errors import ConfigError
from trainsim.profile.collectives import busiest_rank_samples, profile_collectives
from trainsim.profile.database import ProfileDB


def test_the_busiest_rank_is_the_one_with_the_highest_median() -> None:
    # rank 1 has the single largest sample (9.0) but rank 0 the higher median: rank 0's samples are reported
    assert busiest_rank_samples([[2.0, 3.0, 4.0], [1.0, 1.0, 9.0]]) == [2.0, 3.0, 4.0]
    assert busiest_rank_samples([[1.0, 1.0, 9.0], [2.0, 3.0, 4.0]]) == [2.0, 3.0, 4.0]
    assert busiest_rank_samples([[2.0, 2.0], [1.0, 3.0]]) == [2.0, 2.0]  # equal medians: the first rank


def test_cpu_clock_run_on_two_local_processes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with ProfileDB.open(tmp_path / "cpu.sqlite") as db:
        summary = profile_collectives(db, PROFILE_ENV, collectives=("all-gather",), sizes=(4096,), warmup=1,
                                      repeats=2, timeout_s=120, clock="cpu", calls_per_sample=2)
        assert summary.failure == "" and summary.measured == 1
        (row,) = list(db.collective_rows("cpu-local"))
        assert row.collective == "all-gather" and row.world_size == 2 and row.stats.repeats == 2
        assert row.stats.median_s > 0


@pytest.mark.parametrize(("field", "kwargs"), [("clock", {"clock": "gpu"}),
                                               ("calls_per_sample", {"calls_per_sample": 0}),
                                               ("calls_per_sample", {"calls_per_sample": 10_001})])
def test_bad_clock_or_calls_per_sample_is_refused_before_any_process_starts(
        tmp_path: Path, field: str, kwargs: dict[str, object]) -> None:
    with ProfileDB.open(tmp_path / "bad.sqlite") as db, pytest.raises(ConfigError, match=field):
        profile_collectives(db, PROFILE_ENV, collectives=("all-reduce",), sizes=(4096,), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("flags", "fragment"), [(["--collective-clock", "gpu"], "collective_clock"),
                                                 (["--calls-per-sample", "0"], "calls_per_sample")])
def test_profile_refuses_a_bad_collective_clock_or_calls_per_sample(flags: list[str], fragment: str) -> None:
    result = CliRunner().invoke(app, ["profile", "--no-ops", *flags])
    assert result.exit_code == 2 and fragment in result.output
