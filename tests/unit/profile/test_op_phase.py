"""Op samples timed against the reference probe (profile.ops.time_callable's probe, ProfileDB.add_op_probes) and
normalised to the machine's fast phase (ProfileDB.normalise_op_phases), exactly."""

from pathlib import Path

import pytest

from trainsim.measure.phase import ProbeLog
from trainsim.profile.database import Environment, OpSignature, ProfileDB
from trainsim.profile.ops import time_callable

ENV = Environment("cpu-local", "torch test", 1, "test cpu")
SIG = OpSignature("matmul", "mm", "fwd", "fp32", (1, 8, 8, 8))
OTHER = OpSignature("matmul", "mm", "fwd", "fp32", (1, 16, 8, 8))


class _FixedProbe:
    def __init__(self, timings_s: list[float]) -> None:
        self.timings_s = list(timings_s)

    def time_s(self) -> float:
        return self.timings_s.pop(0)


def test_every_sample_gets_the_probe_just_before_and_just_after_it():
    log = ProbeLog(_FixedProbe([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))  # type: ignore[arg-type]  # NB: only time_s
    ticks = iter(range(100))
    samples = time_callable(lambda: None, lambda: None, warmup=1, repeats=3, min_sample_s=0.0, max_inner=1,
                            clock=lambda: float(next(ticks)), probe=log)
    assert samples == [1.0, 1.0, 1.0]
    assert log.pairs_s == [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)]


def test_probed_samples_are_rewritten_to_the_fast_phase_and_unprobed_ops_left_alone(tmp_path: Path):
    """Three 10 ms samples, the middle one in a 1.5x slow phase (15 ms between probes of 1.4 and 1.6 ms): against a
    1 ms fast phase every sample is 10 ms, so the median moves 10 -> 10 and the p90 15 -> 10."""
    with ProfileDB.open(tmp_path / "p.db") as db:
        samples = [0.010, 0.015, 0.010]
        db.add_op_samples(ENV, SIG, samples)
        db.add_op_probes(ENV, SIG, samples, [(0.001, 0.001), (0.0014, 0.0016), (0.001, 0.001)])
        db.add_op_samples(ENV, OTHER, [0.020])
        assert db.probe_timings_s() == pytest.approx([0.001, 0.001, 0.0014, 0.0016, 0.001, 0.001])
        assert db.normalise_op_phases(0.001) == 1
        rows = {row.signature: row.stats for row in db.op_rows()}
        assert rows[SIG].median_s == pytest.approx(0.010) and rows[SIG].p90_s == pytest.approx(0.010)
        assert rows[OTHER].median_s == pytest.approx(0.020)
        with pytest.raises(ValueError):
            db.add_op_probes(ENV, SIG, [0.01], [])


def test_an_op_with_unprobed_samples_is_refused(tmp_path: Path):
    with ProfileDB.open(tmp_path / "p.db") as db:
        db.add_op_samples(ENV, SIG, [0.010, 0.011])
        db.add_op_probes(ENV, SIG, [0.012], [(0.001, 0.001)])
        db.add_op_samples(ENV, SIG, [0.012])
        with pytest.raises(ValueError, match="3 samples stored, 1 of them probed"):
            db.normalise_op_phases(0.001)
