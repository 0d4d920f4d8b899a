"""The pipeline split settings on the command line and in job files: listed by `predict --help`, read from a
job file (a list or a comma-separated string), refused in one line when the model cannot take them."""

import json
from pathlib import Path

from typer.testing import CliRunner

from trainsim.cli.main import app

RUNNER = CliRunner()
SPLIT_FLAGS = ("--first-stage-layers", "--last-stage-layers", "--embedding-in-split", "--loss-in-split",
               "--stage-layers")
JOB = ["--model", "gpt3-1.3b", "--num-gpus", "8", "--pp", "4", "--global-batch", "32", "--json"]


def test_predict_help_lists_the_split_flags() -> None:
    result = RUNNER.invoke(app, ["predict", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in SPLIT_FLAGS:
        assert flag in result.stdout, flag
    assert "num_layers_in_first_pipeline_stage" in result.stdout


def test_stage_layers_flag_and_job_file_give_the_same_prediction(tmp_path: Path) -> None:
    by_flag = RUNNER.invoke(app, ["predict", *JOB, "--stage-layers", "5,7,7,5"])
    assert by_flag.exit_code == 0, by_flag.output
    job_file = tmp_path / "job.yaml"
    job_file.write_text("strategy:\n  stage_layers: [5, 7, 7, 5]\n")
    by_file = RUNNER.invoke(app, ["predict", str(job_file), *JOB])
    assert by_file.exit_code == 0, by_file.output
    first, second = json.loads(by_flag.stdout), json.loads(by_file.stdout)
    assert first["iteration_time_s"] == second["iteration_time_s"]
    assert "stage_layers=5,7,7,5" in first["job"]
    even = json.loads(RUNNER.invoke(app, ["predict", *JOB]).stdout)
    assert even["iteration_time_s"] != first["iteration_time_s"]


def test_bad_split_is_one_line_exit_2() -> None:
    result = RUNNER.invoke(app, ["predict", *JOB, "--stage-layers", "6,6,6,5"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "stage_layers='6,6,6,5' is invalid: sums to 23; must equal the model's 24 layers" in lines[0]
    assert "Traceback" not in result.output
