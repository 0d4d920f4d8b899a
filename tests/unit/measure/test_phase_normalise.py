"""Stage runs timed against a reference probe (measure.phase) and normalised to the machine's fast phase
(measure.stage_db.normalise_phases; `trainsim stages collect --phase-normalise`)."""

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import STAGE_GPT_YAML
from trainsim.measure.phase import fast_reference_s, phase_normalised_s
from trainsim.measure.stage_db import StageDatabase, normalise_phases
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec

ONE = Mesh(1, 1)


def test_fast_reference_is_a_low_quantile():
    timings = [1.0 + 0.01 * i for i in range(100)]  # 1.00 .. 1.99
    assert fast_reference_s(list(reversed(timings))) == pytest.approx(1.05)
    assert fast_reference_s([2.0]) == 2.0
    with pytest.raises(ValueError):
        fast_reference_s([])


def test_a_run_in_the_slow_phase_normalises_to_the_fast_one():
    """The same 10 ms stage run 3 times in the fast phase (probe 1 ms) and twice 1.5x slower (probe 1.5 ms): the
    raw median mixes the phases; the normalised runs are all 10 ms."""
    samples = [0.010, 0.015, 0.010, 0.015, 0.010]
    references = [0.001, 0.0015, 0.001, 0.0015, 0.001]
    assert phase_normalised_s(samples, references, 0.001) == pytest.approx(0.010)
    slow_majority = [0.015, 0.015, 0.010]
    assert phase_normalised_s(slow_majority, [0.0015, 0.0015, 0.001], 0.001) == pytest.approx(0.010)
    with pytest.raises(ValueError):
        phase_normalised_s([0.01], [0.001, 0.001], 0.001)


def test_normalise_phases_rewrites_probed_stages_only(tmp_path: Path):
    db = StageDatabase(tmp_path / "stages.sqlite")
    probed, plain = StageSpec(0, 2, ONE, IntraPlan()), StageSpec(2, 4, ONE, IntraPlan())
    db.put("m", 2, 8, 1, probed, StageEstimate(0.015, 1.0, 2.0), [0.015, 0.015, 0.010])
    db.put_phase("m", 2, 8, 1, probed, 0.015, [0.0015, 0.0015, 0.001])
    db.put("m", 2, 8, 1, plain, StageEstimate(0.020, 1.0, 2.0), [0.020])
    assert normalise_phases(db, "m", 2, 8, 1) == 0.001
    got = db.get("m", 2, 8, 1, probed)
    assert got is not None and got.latency_s == pytest.approx(0.010)
    assert db.phase_rows("m", 2, 8, 1)[0].raw_latency_s == 0.015
    assert db.get("m", 2, 8, 1, plain) == StageEstimate(0.020, 1.0, 2.0)
    assert normalise_phases(db, "other", 2, 8, 1) != normalise_phases(db, "other", 2, 8, 1)  # NaN: none probed
    db.close()


def test_each_mesh_takes_its_own_fast_phase_reference(tmp_path: Path):
    """Two ranks report the slower rank's probe: a 2-rank stage whose probe always reads 2 ms is in its fast phase,
    not twice as slow as a 1-rank stage probed at 1 ms."""
    db = StageDatabase(tmp_path / "stages.sqlite")
    one, two = StageSpec(0, 2, ONE, IntraPlan()), StageSpec(0, 2, Mesh(1, 2), IntraPlan(1, 2))
    db.put("m", 2, 8, 1, one, StageEstimate(0.010, 1.0, 2.0), [0.010, 0.010])
    db.put_phase("m", 2, 8, 1, one, 0.010, [0.001, 0.001])
    db.put("m", 2, 8, 1, two, StageEstimate(0.006, 1.0, 2.0), [0.006, 0.006])
    db.put_phase("m", 2, 8, 1, two, 0.006, [0.002, 0.002])
    assert normalise_phases(db, "m", 2, 8, 1) == 0.001  # the first mesh in key order: one device
    got_one, got_two = db.get("m", 2, 8, 1, one), db.get("m", 2, 8, 1, two)
    assert got_one is not None and got_one.latency_s == pytest.approx(0.010)
    assert got_two is not None and got_two.latency_s == pytest.approx(0.006)
    db.close()


def test_measured_stages_carry_the_probe_around_each_run():
    pytest.importorskip("torch")
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.measure.stage import measure_stages

    model = TransformerSpec(name="tiny", arch="gpt", num_layers=2, hidden=16, ffn_hidden=32, num_heads=2, vocab=64,
                            max_seq_len=8)
    stages = [StageSpec(1, 3, ONE, IntraPlan())]
    probed = measure_stages(model, stages, 2, 8, warmup=0, iterations=3, probe=True)[0]
    assert len(probed.reference_s) == 3 and all(r > 0 for r in probed.reference_s)
    assert measure_stages(model, stages, 2, 8, warmup=0, iterations=2)[0].reference_s == ()


MODEL_YAML = STAGE_GPT_YAML.format(name="phase-tiny")


def _collect(model: Path, db: Path, *extra: str) -> dict:
    from trainsim.cli.main import app

    result = CliRunner().invoke(app, ["stages", "collect", "--model", str(model), "--db", str(db), "--micro-batch",
                                      "2", "--seq-len", "8", "--warmup", "0", "--iterations", "3", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_collect_phase_normalise_stores_raw_and_normalised(tmp_path: Path):
    pytest.importorskip("torch")
    model = tmp_path / "tiny.yaml"
    model.write_text(MODEL_YAML)
    plain_db, probed_db = tmp_path / "plain.sqlite", tmp_path / "probed.sqlite"
    plain = _collect(model, plain_db)
    assert "fast_reference_s" not in plain
    with sqlite3.connect(plain_db) as conn:  # no probe: the database has no stage_phase table
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name='stage_phase'").fetchone() is None
    probed = _collect(model, probed_db, "--phase-normalise")
    fast = probed["fast_reference_s"]
    assert fast > 0
    with sqlite3.connect(probed_db) as conn:
        rows = conn.execute("SELECT t.latency_s, t.samples, p.raw_latency_s, p.references_s FROM stage_times t "
                            "JOIN stage_phase p USING (first, end_unit)").fetchall()
    assert len(rows) == 10  # 4 units: every stage probed
    for latency, samples, raw, references in rows:
        runs, probes = json.loads(samples), json.loads(references)
        assert sorted(runs)[1] == pytest.approx(raw)  # the raw median of 3 runs
        assert latency == pytest.approx(phase_normalised_s(runs, probes, fast))


def test_two_ranks_report_the_probe_too():
    pytest.importorskip("torch")
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.measure.stage import measure_stages

    model = TransformerSpec(name="tiny", arch="gpt", num_layers=2, hidden=16, ffn_hidden=32, num_heads=2, vocab=64,
                            max_seq_len=8)
    timing = measure_stages(model, [StageSpec(1, 3, Mesh(1, 2), IntraPlan(1, 2))], 2, 8, warmup=0, iterations=2,
                            probe=True)[0]
    assert len(timing.reference_s) == 2 and all(r > 0 for r in timing.reference_s)
