"""Out-of-memory verdicts against one H100 80GB (data/ground-truth/h100/oom_verdicts.jsonl: 29 jobs run near and
over the device with scripts/gpu/probe.py, 2026-11-26). Proteus reports its verdict wrong for 2 of 180 plans;
here none of 29 is (two were while full recompute's working memory counted the head's logits a second time).
The bound is today's count: a change that gets a verdict wrong fails."""

from pathlib import Path

from conftest import module_from_file

ROOT = Path(__file__).resolve().parents[2]


def _verdicts() -> list[dict[str, object]]:
    module = module_from_file("scripts/oom_verdicts.py")
    return module.verdicts(ROOT / "data" / "ground-truth" / "h100" / "oom_verdicts.jsonl")


def test_every_h100_verdict_is_right() -> None:
    rows = _verdicts()
    assert len(rows) == 29
    assert sum(row["observed"] == "oom" for row in rows) == 8  # the probe set straddles the device's capacity
    wrong = [row["job"] for row in rows if row["observed"] != row["predicted"]]
    assert not wrong, wrong
