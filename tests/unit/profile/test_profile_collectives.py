"""Collective microbenchmarks on either clock: the busiest rank's samples, a real CPU-clock run (back to back and
after compute on the calling thread), bad input."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import PROFILE_ENV
from trainsim.cli.main import app
from trainsim.errors import ConfigError
from trainsim.profile.collectives import (
    busiest_rank_samples,
    interleaved_call_cost_s,
    pooled_stats,
    profile_collectives,
)
from trainsim.profile.database import ProfileDB, TimingStats


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


def test_a_call_after_compute_costs_the_process_cpu_less_the_callers_compute() -> None:
    # 4 calls, each after compute: the process spent 10 ms, the calling thread 6 ms of it in the gaps -> 1 ms a call
    assert interleaved_call_cost_s(0.010, 0.006, 4) == pytest.approx(0.001, abs=1e-15)
    assert interleaved_call_cost_s(0.010, 0.0, 4) == 0.0025  # back to back: the plain mean


def test_sweeps_pool_to_the_median_of_their_medians() -> None:
    sweeps = [TimingStats(1.0e-3, 0.5e-3, 2.0e-3, 9), TimingStats(3.0e-3, 1.0e-3, 4.0e-3, 27),
              TimingStats(2.0e-3, 0.8e-3, 9.0e-3, 27)]
    assert pooled_stats(sweeps) == TimingStats(2.0e-3, 0.8e-3, 4.0e-3, 63)
    assert pooled_stats(sweeps[:2]) == TimingStats(2.0e-3, 0.75e-3, 3.0e-3, 36)  # two: the mean of the pair
    with pytest.raises(ConfigError, match="sweeps"):
        pooled_stats([])


def test_cpu_clock_run_with_compute_between_calls(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with ProfileDB.open(tmp_path / "gap.sqlite") as db:
        summary = profile_collectives(db, PROFILE_ENV, collectives=("all-reduce",), sizes=(4096,), warmup=1,
                                      repeats=2, timeout_s=120, clock="cpu", calls_per_sample=1, gap_s=0.2)
        assert summary.failure == "" and summary.measured == 1
        (row,) = list(db.collective_rows("cpu-local"))
        # the 0.2 s of compute before each call is the caller's, left out of the sample: what is left is the call
        assert 0.0 < row.stats.median_s < 0.1


@pytest.mark.parametrize(("field", "kwargs"), [("clock", {"clock": "gpu"}),
                                               ("gap_s", {"clock": "cpu", "gap_s": -0.001}),
                                               ("gap_s", {"clock": "cpu", "gap_s": 1.5}),
                                               ("gap_s", {"clock": "wall", "gap_s": 0.002}),
                                               ("calls_per_sample", {"calls_per_sample": 0}),
                                               ("calls_per_sample", {"calls_per_sample": 10_001})])
def test_bad_clock_calls_per_sample_or_gap_is_refused_before_any_process_starts(
        tmp_path: Path, field: str, kwargs: dict[str, object]) -> None:
    with ProfileDB.open(tmp_path / "bad.sqlite") as db, pytest.raises(ConfigError, match=field):
        profile_collectives(db, PROFILE_ENV, collectives=("all-reduce",), sizes=(4096,), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("flags", "fragment"), [(["--collective-clock", "gpu"], "collective_clock"),
                                                 (["--calls-per-sample", "0"], "calls_per_sample"),
                                                 (["--collective-gap-ms", "2"], "collective_gap_ms"),
                                                 (["--collective-clock", "cpu", "--collective-gap-ms", "-1"],
                                                  "collective_gap_ms")])
def test_profile_refuses_a_bad_collective_clock_calls_per_sample_or_gap(flags: list[str], fragment: str) -> None:
    result = CliRunner().invoke(app, ["profile", "--no-ops", *flags])
    assert result.exit_code == 2 and fragment in result.output
