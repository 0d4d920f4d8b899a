"""docs/inputs.md: its examples are valid inputs, and mistakes in a job file name every unknown key with its line
and keep the place of a syntax error."""

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainsim
from conftest import REPO_DIR
from trainsim.cli.main import app
from trainsim.errors import ConfigError, InputFileError

RUNNER = CliRunner()
BLOCKS = re.findall(r"^```yaml\n(.*?)^```", (REPO_DIR / "docs" / "inputs.md").read_text(), re.M | re.S)


def test_the_documented_examples_are_valid_inputs(tmp_path: Path) -> None:
    job, model, cluster = (tmp_path / name for name in ("job.yaml", "model.yaml", "cluster.yaml"))
    for path, block in zip((job, model, cluster), BLOCKS, strict=True):
        path.write_text(block)
    r = trainsim.predict(job_file=job, model=str(model), cluster=str(cluster), num_gpus=None)
    assert r.model == "my-gpt" and r.cluster == "my-cluster" and r.num_gpus == 16
    assert r.strategy is not None and (r.strategy["tp"], r.strategy["pp"], r.strategy["dp"]) == (2, 2, 4)


def test_every_unknown_key_is_named_with_its_line(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt3-125m\nstrategy:\n  tp: 2\n  micro_bach: 2\nfoo: 1\n")
    with pytest.raises(ConfigError) as caught:
        trainsim.predict(job_file=job)
    message = str(caught.value)
    assert "micro_bach (line 4), did you mean micro_batch?" in message and "foo (line 5)" in message
    assert "=2" not in message  # values are never echoed
    out = RUNNER.invoke(app, ["predict", str(job)])
    assert out.exit_code == 2 and out.stderr.strip() == f"error: {message}"


@pytest.mark.parametrize(("name", "text", "place"), [
    ("job.yaml", "model: gpt3-125m\n  tp: [2\n", "(line 2, column 5)"),
    ("job.json", '{"model": "gpt3-125m",\n "tp": }', "(line 2, column 8)"),
])
def test_syntax_errors_keep_their_line_and_column(tmp_path: Path, name: str, text: str, place: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputFileError, match=re.escape(place)):
        trainsim.predict(job_file=path)
