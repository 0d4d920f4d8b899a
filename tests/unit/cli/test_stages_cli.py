"""`trainsim stages collect | train | evaluate` end to end on 1 rank with a 2-layer model (4 units, 10 stages),
resumability, the saved predictors, bad inputs (exit 2, one line), and the Ray fan-out on a local instance."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import STAGE_GPT_YAML
from trainsim.cli.main import app

torch = pytest.importorskip("torch")

RUNNER = CliRunner()
MODEL_YAML = STAGE_GPT_YAML.format(name="stages-tiny")


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(MODEL_YAML)
    return path


def _common(model: Path, db: Path) -> list[str]:
    return ["--model", str(model), "--db", str(db), "--micro-batch", "2", "--seq-len", "8"]


def _collect(model: Path, db: Path, *extra: str) -> dict:
    result = RUNNER.invoke(app, ["stages", "collect", *_common(model, db), "--warmup", "0", "--iterations", "1",
                                 "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_collect_train_evaluate_end_to_end(model: Path, tmp_path: Path) -> None:
    db = tmp_path / "stages.sqlite"
    first = _collect(model, db, "--chunk", "3")  # 4 measuring calls
    assert first["settings"]["1x1/tp1-dp1"]["stages"] == 10  # 4 units: 4 * 5 / 2 ranges
    assert first["settings"]["1x1/tp1-dp1"]["measured_now"] == 10
    again = _collect(model, db)  # resumable: nothing is measured twice
    assert again["settings"]["1x1/tp1-dp1"]["measured_now"] == 0

    out = tmp_path / "predictors.pt"
    trained = RUNNER.invoke(app, ["stages", "train", *_common(model, db), "--out", str(out), "--kinds", "all",
                                  "--epochs", "2", "--patience", "2", "--fraction", "0.5", "--json"])
    assert trained.exit_code == 0, trained.output
    assert set(json.loads(trained.stdout)["settings"]["1x1/tp1-dp1"]) == {"transformer", "gcn", "gat"}
    from trainsim.search.predtop.experiment import load_predictors

    loaded = load_predictors(out)
    assert set(loaded["predictors"]["1x1/tp1-dp1"]) == {"transformer", "gcn", "gat"}

    evaluated = RUNNER.invoke(app, ["stages", "evaluate", *_common(model, db), "--kinds", "transformer",
                                    "--fractions", "0.3,0.5", "--seeds", "0,1", "--epochs", "2", "--patience",
                                    "2", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    entry = json.loads(evaluated.stdout)["settings"]["1x1/tp1-dp1"]
    assert entry["samples"] == 10
    assert [row["fraction"] for row in entry["table"]] == [0.5, 0.3]
    assert [(row["train"], row["test"]) for row in entry["table"]] == [(5, 4), (3, 6)]
    assert len(entry["runs"]) == 4 and all(r["mre"] >= 0 for r in entry["runs"])
    text = RUNNER.invoke(app, ["stages", "evaluate", *_common(model, db), "--kinds", "transformer",
                               "--fractions", "0.3", "--seeds", "0", "--epochs", "1", "--patience", "1"])
    assert text.exit_code == 0 and "1x1/tp1-dp1: 10 stages" in text.stdout


@pytest.mark.parametrize(("args", "field"), [
    (["collect", "--meshes", "1x"], "meshes"),
    (["collect", "--plans", "pp"], "plans"),
    (["collect", "--iterations", "0"], "iterations"),
    (["collect", "--micro-batch", "0"], "micro_batch"),
    (["collect", "--seq-len", "9"], "seq_len"),
    (["collect", "--plans", "tp", "--meshes", "1x2"], "plans"),
    (["evaluate", "--fractions", "0.9"], "fractions"),
    (["evaluate", "--kinds", "mlp"], "kinds"),
    (["evaluate", "--seeds", "x"], "seeds"),
    (["evaluate", "--epochs", "0"], "epochs"),
    (["evaluate", "--dag-source", "onnx"], "dag_source"),
    (["evaluate", "--workers", "0"], "workers"),
    (["evaluate", "--target", "mse"], "target"),
    (["evaluate", "--batch-size", "-1"], "batch_size"),
    (["evaluate", "--layers", "ops"], "layers"),
    (["evaluate", "--threads", "-1"], "threads"),
    (["collect", "--threads", "0"], "threads"),
    (["collect", "--chunk", "0"], "chunk"),
    (["train", "--out", "p.pt", "--fraction", "0.95"], "fractions"),
])
def test_bad_inputs_exit_2(model: Path, tmp_path: Path, args: list[str], field: str) -> None:
    db = tmp_path / "stages.sqlite"
    db.write_bytes(b"")
    result = RUNNER.invoke(app, ["stages", args[0], *_common(model, db), *args[1:]])
    assert result.exit_code == 2, result.output
    assert field in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_alpa_layers_join_the_embedding_to_the_first_block(model: Path, tmp_path: Path) -> None:
    """--layers alpa: the tiny model's units [embedding, block 0, block 1, head] cluster into [embedding + block 0,
    block 1 + head] (the head's one matrix product is under Alpa's FLOPs bound), so 3 stages of the 10 units'."""
    db = tmp_path / "stages.sqlite"
    assert _collect(model, db)["settings"]["1x1/tp1-dp1"]["stages"] == 10
    result = RUNNER.invoke(app, ["stages", "evaluate", *_common(model, db), "--layers", "alpa", "--kinds",
                                 "transformer", "--fractions", "0.3", "--seeds", "0", "--epochs", "1", "--patience",
                                 "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["boundaries"] == [0, 2, 4] and out["layers"] == "alpa"
    assert out["settings"]["1x1/tp1-dp1"]["samples"] == 3  # [0,2), [0,4), [2,4): fewer than a split needs
    assert "note" in out["settings"]["1x1/tp1-dp1"]


def test_evaluate_runs_file_resumes(model: Path, tmp_path: Path) -> None:
    """--runs: each fit is appended as it finishes; a rerun with more seeds runs only the new ones, and fits of
    other options (here: epochs) are not taken for these."""
    db, runs = tmp_path / "stages.sqlite", tmp_path / "runs.jsonl"
    _collect(model, db)
    args = ["stages", "evaluate", *_common(model, db), "--kinds", "gcn", "--fractions", "0.5", "--patience", "1",
            "--runs", str(runs), "--json"]
    first = RUNNER.invoke(app, [*args, "--seeds", "0", "--epochs", "1"])
    assert first.exit_code == 0, first.output
    assert len(runs.read_text().splitlines()) == 1
    second = RUNNER.invoke(app, [*args, "--seeds", "0,1", "--epochs", "1"])
    assert second.exit_code == 0, second.output
    lines = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [(r["seed"], r["epochs"]) for r in lines] == [(0, 1), (1, 1)]
    entry = json.loads(second.stdout)["settings"]["1x1/tp1-dp1"]
    assert json.loads(first.stdout)["settings"]["1x1/tp1-dp1"]["runs"][0] in entry["runs"]
    assert len(entry["runs"]) == 2
    third = RUNNER.invoke(app, [*args, "--seeds", "0", "--epochs", "2"])  # other options: run again
    assert third.exit_code == 0 and len(runs.read_text().splitlines()) == 3
    runs.write_text("not json\n")
    bad = RUNNER.invoke(app, [*args, "--seeds", "0", "--epochs", "1"])
    assert bad.exit_code == 2 and "runs" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_evaluate_without_a_database_exits_2(model: Path, tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["stages", "evaluate", *_common(model, tmp_path / "none.sqlite")])
    assert result.exit_code == 2 and "stages collect" in result.output


def test_ray_fan_out_matches_local(model: Path, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'trainsim[ray]')")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        db = tmp_path / "stages.sqlite"
        collected = _collect(model, db, "--ray", "local")
        assert collected["settings"]["1x1/tp1-dp1"]["measured_now"] == 10
        args = [*_common(model, db), "--kinds", "transformer", "--fractions", "0.5", "--seeds", "0", "--epochs",
                "2", "--patience", "2", "--json"]
        remote = json.loads(RUNNER.invoke(app, ["stages", "evaluate", *args, "--ray", "local"]).stdout)
        local = json.loads(RUNNER.invoke(app, ["stages", "evaluate", *args]).stdout)
        assert remote["settings"]["1x1/tp1-dp1"]["runs"][0]["mre"] == pytest.approx(
            local["settings"]["1x1/tp1-dp1"]["runs"][0]["mre"], rel=1e-6)
    finally:
        ray.shutdown()


def test_ray_without_the_extra_is_one_line(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as where the extra is not installed
    result = RUNNER.invoke(app, ["stages", "collect", *_common(model, tmp_path / "s.sqlite"), "--ray", "local"])
    assert result.exit_code == 2 and "trainsim[ray]" in result.output
    assert len(result.output.strip().splitlines()) == 1
