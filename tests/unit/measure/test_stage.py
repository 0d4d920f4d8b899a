"""Stages measured for real on one CPU rank (tiny models), kept in the database and read back."""

import pytest

pytest.importorskip("torch")

from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage import build_stage, measure_stages
from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec

DENSE = TransformerSpec(name="tiny", arch="gpt", num_layers=2, hidden=32, ffn_hidden=64, num_heads=2, vocab=128,
                        max_seq_len=16)
MOE = TransformerSpec(name="tiny-moe", arch="gpt", num_layers=2, hidden=32, ffn_hidden=64, num_heads=2, vocab=128,
                      max_seq_len=16, num_experts=4, top_k=1, moe_every=2)
ONE = Mesh(1, 1)


def test_stage_modules_hold_their_units():
    whole = build_stage(DENSE, 0, 4)
    assert whole.embed is not None and whole.head is not None and list(whole.layers) == ["0", "1"]
    middle = build_stage(DENSE, 2, 3)
    assert middle.embed is None and middle.head is None and list(middle.layers) == ["1"]
    moe = build_stage(MOE, 1, 3)
    assert type(moe.layers["1"].mlp).__name__ == "MoE" and type(moe.layers["0"].mlp).__name__ == "MLP"


def test_measured_stage_states_and_activations():
    timings = measure_stages(DENSE, [StageSpec(0, 4, ONE, IntraPlan()), StageSpec(1, 2, ONE, IntraPlan())], 2, 16,
                             warmup=1, iterations=2)
    whole, block = timings
    params = sum(p.numel() for p in build_stage(DENSE, 0, 4).parameters())
    assert whole.state_bytes == 16 * params
    assert 0 < block.activation_bytes < whole.activation_bytes
    assert all(t.latency_s > 0 for t in timings)


def test_database_resumes(tmp_path):
    db = StageDatabase(tmp_path / "profile.sqlite")
    stage = StageSpec(1, 3, ONE, IntraPlan())
    first = MeasuredStageCosts(MOE, 2, 16, db, warmup=1, iterations=2)
    got = first.estimate(stage)
    assert got is not None and first.measured_now == 1
    again = MeasuredStageCosts(MOE, 2, 16, db)
    assert again.estimate(stage) == got and again.measured_now == 0
    # tp over MoE blocks and dp not dividing the micro-batch are not run
    assert again.estimate(StageSpec(1, 3, Mesh(1, 2), IntraPlan(2, 1))) is None
    assert again.estimate(StageSpec(1, 3, Mesh(1, 4), IntraPlan(1, 4))) is None
    db.close()


def test_rounds_in_rotated_order_cancel_a_drift_over_the_pass():
    """Three stages of equal cost measured while the machine slows (+1 ms per place in the pass): one pass prices
    them 10, 11 and 12 ms by the order alone; three rotated passes give each 10, 11 and 12 ms once, median 11."""
    from trainsim.measure.stage import StageTiming
    from trainsim.measure.stage_db import measured_rounds

    batch = [StageSpec(a, a + 1, ONE, IntraPlan()) for a in (1, 2, 3)]
    orders: list[list[StageSpec]] = []

    def drifting(order: list[StageSpec]) -> list[StageTiming]:
        orders.append(order)
        return [StageTiming(0.010 + 0.001 * place, 100.0, 7.0, (0.010 + 0.001 * place,)) for place in range(3)]

    one = measured_rounds(batch, 1, drifting)
    assert [t.latency_s for t in one] == pytest.approx([0.010, 0.011, 0.012])
    orders.clear()
    three = measured_rounds(batch, 3, drifting)
    assert orders == [batch, batch[1:] + batch[:1], batch[2:] + batch[:2]]
    assert [t.latency_s for t in three] == pytest.approx([0.011] * 3)
    assert [sorted(t.samples_s) for t in three] == [pytest.approx([0.010, 0.011, 0.012])] * 3
    assert all((t.state_bytes, t.activation_bytes) == (100.0, 7.0) for t in three)
    with pytest.raises(ValueError, match="rounds=0"):
        measured_rounds(batch, 0, drifting)


def test_measured_stage_costs_measure_each_batch_in_every_round(tmp_path, monkeypatch):
    """The measured source runs its batch `rounds` times and keeps the median; a rerun reads the database."""
    import trainsim.measure.stage as stage_module
    from trainsim.measure.stage import StageTiming

    calls: list[int] = []

    def fake(model, stages, micro_batch, seq_len, warmup, iterations, threads=1):
        calls.append(len(stages))
        return [StageTiming(0.001 * len(calls), 1.0, 1.0, (0.001 * len(calls),)) for _ in stages]

    monkeypatch.setattr(stage_module, "measure_stages", fake)
    db = StageDatabase(tmp_path / "profile.sqlite")
    source = MeasuredStageCosts(DENSE, 2, 16, db, rounds=3)
    source.prefetch([StageSpec(1, 2, ONE, IntraPlan()), StageSpec(2, 3, ONE, IntraPlan())])
    assert calls == [2, 2, 2] and source.measured_now == 2
    assert source.estimate(StageSpec(1, 2, ONE, IntraPlan())).latency_s == pytest.approx(0.002)  # type: ignore[union-attr]
    again = MeasuredStageCosts(DENSE, 2, 16, db, rounds=3)
    assert again.estimate(StageSpec(2, 3, ONE, IntraPlan())).latency_s == pytest.approx(0.002)  # type: ignore[union-attr]
    assert calls == [2, 2, 2]
    db.close()
