"""Tables that read well anywhere: the search table fits 80 columns (settings every plan shares become one
line), no cell is cut to an ellipsis, and --csv exports the tables."""

import csv
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainsim
from trainsim.cli.main import app
from trainsim.report.search import render_search_data

RUNNER = CliRunner()
SEARCH = ["search", "--model", "gpt3-1.3b", "--num-gpus", "8", "--global-batch", "64", "--top-k", "5"]


def test_search_table_fits_80_columns_in_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    data = trainsim.search("gpt3-1.3b", num_gpus=8, global_batch=64, top_k=5).to_dict()
    text = re.sub(r"\x1b\[[0-9;]*m", "", render_search_data(data, terminal=True))  # (styles: no width)
    lines = text.splitlines()
    assert max(len(line) for line in lines[1:]) <= 80 and "…" not in text
    shared = next(line for line in lines if line.startswith("every plan shown: "))
    plans = data["plans"]
    for name, key in (("tp", "tp"), ("pp", "pp"), ("vpp", "vpp")):  # constant across these five plans
        assert {p["strategy"][key] for p in plans} == {plans[0]["strategy"][key]}
        assert f"{name} {plans[0]['strategy'][key]}" in shared


def test_the_ep_column_shows_only_where_a_plan_spreads_its_experts() -> None:
    """A dense search's table and shared line name no ep; where a plan shown has ep > 1 the table gets its
    column (the values read from each plan's strategy)."""
    data = trainsim.search("gpt3-1.3b", num_gpus=8, global_batch=64, top_k=5).to_dict()
    header = next(line for line in render_search_data(data).splitlines() if line.lstrip().startswith("#"))
    assert " ep " not in f"{header} " and "ep 1" not in render_search_data(data)
    data["plans"][1]["strategy"]["ep"] = 2
    lines = render_search_data(data).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    assert re.search(r"\bep\b", header)
    column = header.split().index("ep")
    rows = [line.split() for line in lines[lines.index(header) + 2:] if re.match(r"\s*[1-5]\s", line)]
    assert [row[column] for row in rows] == ["1", "2", "1", "1", "1"]


def test_search_csv_has_a_row_per_plan(tmp_path: Path) -> None:
    out = RUNNER.invoke(app, [*SEARCH, "--json", "--csv", str(tmp_path / "plans.csv")])
    assert out.exit_code == 0, out.output
    plans = json.loads(out.stdout)["plans"]
    rows = list(csv.DictReader((tmp_path / "plans.csv").open()))
    assert [int(r["rank"]) for r in rows] == [p["rank"] for p in plans]
    assert [float(r["tokens_per_s"]) for r in rows] == [p["tokens_per_s"] for p in plans]
    assert [int(r["strategy.tp"]) for r in rows] == [p["strategy"]["tp"] for p in plans]
    everything = RUNNER.invoke(app, [*SEARCH, "--all", "--csv", str(tmp_path / "all.csv")])
    assert everything.exit_code == 0
    assert sum(1 for _ in csv.DictReader((tmp_path / "all.csv").open())) > len(plans)


def test_csv_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    out = RUNNER.invoke(app, [*SEARCH, "--csv", str(tmp_path / "no" / "plans.csv")])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1 and "csv=" in out.stderr


def test_version() -> None:
    out = RUNNER.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.stdout.strip() == f"trainsim {trainsim.__version__}"


def test_typer_internals_are_not_imported() -> None:
    import ast

    from conftest import REPO_DIR

    for path in (REPO_DIR / "src" / "trainsim").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(name.startswith("typer._") for name in names), path


def test_unknown_names_suggest_the_closest(tmp_path: Path) -> None:
    out = RUNNER.invoke(app, ["predict", "--model", "gpt3-13"])
    assert out.exit_code == 2 and "did you mean gpt3-13b" in out.stderr
    out = RUNNER.invoke(app, ["predict", "--cluster", "dgx-h10-80gb"])
    assert out.exit_code == 2 and "did you mean dgx-h100-80gb" in out.stderr


def test_validate_prints_the_summary_by_default_and_rows_on_request(tmp_path: Path) -> None:
    from conftest import fake_run, tiny_job
    from trainsim.measure.results import save_run

    save_run(fake_run("tiny-dp2.r1", tiny_job(2, dp=2), [0.10, 0.10, 0.10]), tmp_path)
    summary = RUNNER.invoke(app, ["validate", str(tmp_path), "--engine", "analytical"])
    rows = RUNNER.invoke(app, ["validate", str(tmp_path), "--engine", "analytical", "--rows"])
    assert summary.exit_code == rows.exit_code == 0
    assert "MAPE" in summary.stdout and "tiny-dp2.r1" not in summary.stdout and "tiny-dp2.r1" in rows.stdout
    out = RUNNER.invoke(app, ["validate", str(tmp_path), "--engine", "analytical", "--csv", str(tmp_path / "r.csv")])
    assert out.exit_code == 0 and len(list(csv.DictReader((tmp_path / "r.csv").open()))) == 2


def test_a_model_without_tokens_prints_samples_per_second() -> None:
    cnn = RUNNER.invoke(app, ["predict", "--model", "resnet50", "--global-batch", "256"])
    gpt = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m"])
    assert cnn.exit_code == gpt.exit_code == 0
    assert "tokens/s" not in cnn.stdout and "samples/s" in cnn.stdout
    assert "tokens/s" in gpt.stdout and "samples/s" in gpt.stdout


def test_a_cpu_prints_its_flop_rate_in_gflops() -> None:
    out = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m", "--cluster", "local-cpu", "--num-gpus", "2",
                              "--precision", "fp32", "--seq-len", "128", "--global-batch", "2"])
    assert out.exit_code == 0, out.output
    assert "0.0 TFLOP/s" not in out.stdout and re.search(r"model FLOP/s +\d+\.\d\d GFLOP/s per GPU", out.stdout)


def test_the_mfu_formula_is_printed_once_with_explain() -> None:
    plain = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m"])
    explained = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m", "--explain"])
    assert plain.exit_code == explained.exit_code == 0
    assert "MFU = " not in plain.stdout and explained.stdout.count("MFU = ") == 1


def test_profiled_costs_without_a_database_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    default = RUNNER.invoke(app, ["predict", "--costs", "profiled"])
    named = RUNNER.invoke(app, ["predict", "--costs", "profiled", "--db", str(tmp_path / "p.db")])
    assert default.exit_code == named.exit_code == 2
    assert "run `trainsim profile` first" in default.stderr and "leave out --db" not in default.stderr
    assert f"trainsim profile --db {tmp_path / 'p.db'}" in named.stderr and "leave out --db" in named.stderr
