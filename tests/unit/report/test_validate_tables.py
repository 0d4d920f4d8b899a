"""The validate report's per-job tables: a job measured once has no spread (NaN in memory, null in JSON)."""

import math

from trainsim.report.validate import jobs_markdown


def _job(spread: float | None) -> dict[str, object]:
    return {"job": "gpt3-125m", "repeats": 1, "measured": 0.5, "spread_pct": spread,
            "predicted": {"analytical": 0.55}, "error_pct": {"analytical": 10.0}}


def test_a_job_measured_once_has_a_blank_spread_whether_nan_or_null() -> None:
    for spread in (math.nan, None):
        line = jobs_markdown([_job(spread)], ["analytical"]).splitlines()[-1]
        assert line == "| gpt3-125m | 0.5 |  | 0.55 (+10.0) |"


def test_a_measured_spread_is_printed_to_one_decimal() -> None:
    assert "| 3.2 |" in jobs_markdown([_job(3.21)], ["analytical"])
