"""trainsim.compare and `trainsim compare A B`: the faster plan, the terms that add up to each plan's time, the
plan diff, the same answer from job files, saved predictions and keyword mappings."""

import doctest
import importlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainsim
from trainsim.cli.main import app
from trainsim.errors import ConfigError

RUNNER = CliRunner()
A = {"model": "gpt3-125m", "num_gpus": 8, "global_batch": 32, "seq_len": 512}
B = {**A, "tp": 2, "pp": 2, "zero": 1}


@pytest.fixture
def job_files(tmp_path: Path) -> tuple[Path, Path]:
    paths = []
    for name, plan in (("a", A), ("b", B)):
        path = tmp_path / f"{name}.yaml"
        path.write_text("".join(f"{key}: {value}\n" for key, value in plan.items()))
        paths.append(path)
    return paths[0], paths[1]


def test_terms_add_up_and_the_faster_plan_is_named() -> None:
    found = trainsim.compare(A, B)
    a, b = found.a.iteration_time_s, found.b.iteration_time_s
    assert sum(t.a for t in found.time_terms) == pytest.approx(a, rel=1e-12)
    assert sum(t.b for t in found.time_terms) == pytest.approx(b, rel=1e-12)
    assert sum(t.change for t in found.time_terms) == pytest.approx(b - a, rel=1e-9)
    assert found.faster == ("a" if a < b else "b") and found.speedup == pytest.approx(max(a, b) / min(a, b))
    assert found.plan_changes == {"tp": [1, 2], "pp": [1, 2], "dp": [8, 2], "zero": [0, 1]}
    changes = [abs(t.change) for t in found.time_terms]
    assert changes == sorted(changes, reverse=True)
    assert sum(t.b for t in found.memory_terms) == pytest.approx(found.b.peak_memory_gib, rel=1e-9)
    assert found.explanation[2].startswith(("A is", "B is")) and "plan: tp 1 -> 2" in found.explanation[3]


def test_a_plan_against_itself_is_the_same() -> None:
    found = trainsim.compare(A, A)
    assert found.faster == "same" and found.speedup == 1.0 and found.plan_changes == {}
    assert all(t.change == 0 for t in found.time_terms + found.memory_terms)


def test_cli_equals_the_api_for_job_files_and_saved_predictions(job_files: tuple[Path, Path], tmp_path: Path) -> None:
    out = RUNNER.invoke(app, ["compare", str(job_files[0]), str(job_files[1]), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data == trainsim.compare(A, B).to_dict() == trainsim.compare(*job_files).to_dict()
    assert data["schema"] == {"name": "trainsim.comparison", "version": 1}
    saved = tmp_path / "a.json"
    saved.write_text(trainsim.predict(**A).to_json())  # type: ignore[arg-type]
    assert trainsim.compare(saved, job_files[1]).to_dict() == data
    text = RUNNER.invoke(app, ["compare", str(job_files[0]), str(job_files[1])])
    assert "time, term by term (A -> B):" in text.stdout and "peak memory per GPU" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()[2:]) <= 80  # the terms fit a terminal


def test_bad_plans_are_one_line(job_files: tuple[Path, Path], tmp_path: Path) -> None:
    out = RUNNER.invoke(app, ["compare", str(job_files[0]), str(tmp_path / "missing.yaml")])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1 and "missing.yaml" in out.stderr
    with pytest.raises(ConfigError, match="tp"):
        trainsim.compare(A, {**A, "tp": 3})


def test_docstring_example_runs() -> None:
    module = importlib.import_module("trainsim.api.comparison")
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0
