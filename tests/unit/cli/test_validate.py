"""`trainsim validate DIR`: every engine on a folder of measured runs, repeats grouped per job; bad input."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import fake_run, tiny_job
from trainsim.cli.main import app
from trainsim.measure.results import save_run
from trainsim.validate.compare import by_job, engine_choices, job_name
from trainsim.validate.predict_runs import RowPrediction

RUNNER = CliRunner()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    job = tiny_job(2, dp=2)
    save_run(fake_run("tiny-dp2.r1", job, [0.10, 0.10, 0.10]), tmp_path)
    save_run(fake_run("tiny-dp2.r2", job, [0.12, 0.12, 0.12]), tmp_path)
    return tmp_path


def test_a_folder_is_scored_by_every_engine_with_repeats_grouped(folder: Path) -> None:
    result = RUNNER.invoke(app, ["validate", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["engines"] == ["analytical", "precision-aware", "sim"]
    assert len(data["runs"]) == 3 * 2 * 2  # engines x runs x metrics (time, peak memory)
    times = [s for s in data["summary"] if s["source"] == "ALL" and s["metric"] == "iteration_time_s"]
    assert [s["engine"] for s in times] == data["engines"] and all(s["n"] == 2 for s in times)
    (job,) = data["jobs"]
    assert (job["job"], job["repeats"]) == ("tiny-dp2", 2)
    assert job["measured"] == pytest.approx(0.11) and job["spread_pct"] == pytest.approx(0.02 / 0.11 * 100)
    predicted = job["predicted"]["analytical"]
    assert job["error_pct"]["analytical"] == pytest.approx((predicted - 0.11) / 0.11 * 100)


def test_markdown_table_has_a_row_per_job(folder: Path) -> None:
    result = RUNNER.invoke(app, ["validate", str(folder), "--engine", "analytical", "--markdown"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "| job | measured s | spread % | analytical s (error %) |"
    assert len(lines) == 3 and lines[2].startswith("| tiny-dp2 | 0.11 | 18.2 |")


@pytest.mark.parametrize(("args", "field"), [
    (["--engine", "oracle"], "engine"),
    (["--costs", "guessed"], "costs"),
])
def test_bad_choices_are_one_line_and_exit_2(folder: Path, args: list[str], field: str) -> None:
    result = RUNNER.invoke(app, ["validate", str(folder), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0]


def test_profiled_costs_without_a_database_is_one_line(folder: Path, tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["validate", str(folder), "--costs", "profiled", "--db",
                                 str(tmp_path / "missing.db")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "missing.db" in result.stderr


def test_engine_choices_and_job_names() -> None:
    labels = [c.label for c in engine_choices("analytical,sim", "both")]
    assert labels == ["analytical", "sim", "analytical+profiled", "sim+profiled"]
    assert job_name("gpt-dp2-fp32.r12") == "gpt-dp2-fp32" and job_name("gpt3-1.3b") == "gpt3-1.3b"


def test_by_job_averages_the_repeats() -> None:
    rows = {"e": [RowPrediction("j.r1", "s", "iteration_time_s", 1.0, 1.5, "e", None),
                  RowPrediction("j.r2", "s", "iteration_time_s", 3.0, 2.5, "e", None),
                  RowPrediction("j.r1", "s", "peak_memory_gib", 9.0, 9.0, "e", None)]}
    (job,) = by_job(rows)
    assert (job["measured"], job["spread_pct"], job["predicted"]["e"], job["error_pct"]["e"]) == \
        (2.0, 100.0, 2.0, 0.0)
