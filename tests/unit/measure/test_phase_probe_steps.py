"""The reference probe around every timed step (measure.phase: ProbeLog, busiest_phase_normalised_s; `trainsim
measure --phase-normalise`): the arithmetic on an exact tiny case, the option's refusal, and one real 2-rank run
that writes the probe timings."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_GPT_MODEL_YAML
from trainsim.cli.main import app
from trainsim.measure.phase import (
    ProbeLog,
    busiest_phase_normalised_s,
    fast_reference_s,
    pair_means_s,
    phase_scaled_s,
)

runner = CliRunner()


def test_two_ranks_steps_scale_by_their_own_probes_and_the_busiest_rank_is_taken_after():
    """Rank 0: steps of 10 and 15 ms, the second in a 1.5x slow phase (probes 1 / 1 and 1.4 / 1.6 ms); rank 1: two
    12 ms steps, both at 1.2 ms probes. Against a 1 ms fast phase rank 0 is 10 ms a step (raw mean 12.5) and rank 1
    10 ms too; raw, rank 1 (12 ms) would not be the busiest."""
    steps = [[0.010, 0.015], [0.012, 0.012]]
    pairs = [[(0.001, 0.001), (0.0014, 0.0016)], [(0.0012, 0.0012), (0.0011, 0.0013)]]
    assert pair_means_s(pairs[0]) == pytest.approx([0.001, 0.0015])
    assert phase_scaled_s(steps[0], pair_means_s(pairs[0]), 0.001) == pytest.approx([0.010, 0.010])
    assert busiest_phase_normalised_s(steps, pairs, 0.001) == pytest.approx(0.010)
    rank1_slower = [[0.010, 0.015], [0.012, 0.012]]
    faster_probes = [pairs[0], [(0.001, 0.001), (0.001, 0.001)]]
    assert busiest_phase_normalised_s(rank1_slower, faster_probes, 0.001) == pytest.approx(0.012)
    assert fast_reference_s([t for p in pairs for pair in p for t in pair]) == pytest.approx(0.001)
    with pytest.raises(ValueError):
        phase_scaled_s([0.01], [0.0], 0.001)


def test_the_probe_before_a_step_can_stand_for_it_alone():
    """Rank 0's second step with its probe before (1.4 ms) alone: 15 ms x 1 / 1.4 = 10.714 ms; mean (10 +
    10.714) / 2. The gloo threads' 2 ms of each step kept as measured: (8 x 1 / 1 + 2 + 13 / 1.4 + 2) / 2."""
    steps, pairs = [[0.010, 0.015]], [[(0.001, 0.001), (0.0014, 0.0016)]]
    assert pair_means_s(pairs[0], "before") == [0.001, 0.0014]
    assert busiest_phase_normalised_s(steps, pairs, 0.001, reference="before") == pytest.approx(
        (0.010 + 0.015 / 1.4) / 2)
    assert busiest_phase_normalised_s(steps, pairs, 0.001, [[0.002, 0.002]], "before") == pytest.approx(
        (0.008 + 0.002 + 0.013 / 1.4 + 0.002) / 2)
    with pytest.raises(ValueError, match="reference 'after'"):
        pair_means_s(pairs[0], "after")


class _CountingProbe:
    """A stand-in probe: its n-th timing is n ms, and it burns no CPU."""

    def __init__(self) -> None:
        self.calls = 0

    def time_s(self) -> float:
        self.calls += 1
        return self.calls * 1e-3


def test_a_probe_log_pairs_the_timing_before_a_step_with_the_one_after():
    log = ProbeLog(_CountingProbe())  # type: ignore[arg-type]  # NB: only time_s is used
    for _ in range(3):
        log.before()
        log.after()
    assert [t for pair in log.pairs_s for t in pair] == pytest.approx([0.001, 0.002, 0.003, 0.004, 0.005, 0.006])
    assert all(len(pair) == 2 for pair in log.pairs_s)
    with pytest.raises(AssertionError):
        log.after()


def test_phase_normalise_is_refused_with_a_suite():
    result = runner.invoke(app, ["measure", "--suite", "local", "--phase-normalise"])
    assert result.exit_code == 2, result.output
    assert "phase_normalise" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


PAIRS = """\
strategy_tree:
  schedule: {micro_batches: 1}
  split:
    - {path: "blocks.*.mlp.fc1", item: compute, dim: out, parts: 2}
    - {path: "blocks.*.mlp.fc2", item: compute, dim: reduce, parts: 2}
"""


def test_a_probed_two_rank_tree_run_records_the_probe_around_every_step(tmp_path: Path):
    pytest.importorskip("torch")
    model, tree = tmp_path / "tiny-gpt.yaml", tmp_path / "pairs.yaml"
    model.write_text(TINY_GPT_MODEL_YAML)
    tree.write_text(PAIRS)
    result = runner.invoke(app, ["measure", "--model", str(model), "--num-gpus", "2", "--micro-batch", "2",
                                 "--global-batch", "4", "--seq-len", "16", "--precision", "fp32", "--tree", str(tree),
                                 "--iterations", "2", "--warmup", "0", "--threads", "1", "--out",
                                 str(tmp_path / "runs"), "--run-id", "probed", "--json", "--phase-normalise"])
    assert result.exit_code == 0, result.output
    settings = json.loads(result.output)["settings"]
    pairs, steps = settings["phase_probe_s_per_rank"], settings["step_cpu_s_per_rank"]
    assert [len(p) for p in pairs] == [2, 2] and [len(s) for s in steps] == [2, 2]
    assert all(t > 0 for p in pairs for pair in p for t in pair) and all(len(pair) == 2 for p in pairs for pair in p)
    phase = settings["phase_normalised"]
    fast = fast_reference_s([t for p in pairs for pair in p for t in pair])
    assert phase["fast_probe_s"] == pytest.approx(fast, rel=1e-4)  # NB: the file rounds the timings
    assert phase["busiest_step_cpu_normalised_s"] == pytest.approx(busiest_phase_normalised_s(steps, pairs, fast),
                                                                    rel=1e-4)  # NB: the file rounds to 1 us
    assert phase["busiest_step_cpu_s"] == pytest.approx(max(sum(s) / 2 for s in steps), rel=1e-4)
    # the probes' CPU is the harness', left out of the run's CPU: what remains beside the steps and barriers is
    # less than the probes took
    for cpu, barrier, probe, rank_steps in zip(settings["cpu_s_per_rank"], settings["barrier_cpu_s_per_rank"],
                                               settings["probe_cpu_s_per_rank"], steps, strict=True):
        assert -2e-4 <= cpu - barrier - sum(rank_steps) < probe
