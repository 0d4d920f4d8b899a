"""Every code block of README.md runs: each Python block as it is, each `trainsim` command of the bash blocks
through the command line, in a sandbox folder where the README's example inputs exist.

The sandbox stands in for a user's folder: `job.yaml`, `path/to/config.json` (a two-layer GPT-2 config),
`my_model.py:build` (an nn.Module factory), `traces/` (the 2-rank DDP trace of tests/fixtures),
`data/ground-truth/h200` with the first RUNS of the repository's measured runs (without their profile database)
and `../shared/data/calibration/runs.csv` and the package's `measurements/runs.csv` with the first ROWS runs of the
real file, `my_runs.csv` with its first CALIBRATE_ROWS, so the commands over
thousands of runs finish in seconds. The set-up commands (pip install, pytest) are not run
here - `.ci/run` runs them - but the extras they name must exist.
"""

import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import EXEC_TRACES, REPO_DIR
from trainsim.cli.main import app

README = REPO_DIR / "README.md"
SHARED = REPO_DIR.parent / "shared"
ROWS = 24
CALIBRATE_ROWS = 12  # the calibrate example's own runs: its fits and 5-fold cross-validation predict each run
RUNS = 3
GPT2_CONFIG = ('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_ctx": 2048, "n_embd": 64, '
               '"n_head": 4, "n_inner": null, "n_layer": 2, "n_positions": 2048, "vocab_size": 512, '
               '"activation_function": "gelu_new"}')
FACTORY = '''from torch import nn


def build(micro_batch, seq_len):
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)), [(micro_batch, seq_len, 32)]
'''
JOB = "model: gpt3-125m\ncluster: dgx-a100-80gb\nnum_gpus: 8\nstrategy:\n  tp: 2\n  global_batch: 32\n"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.MULTILINE | re.DOTALL)


def shell_commands() -> list[str]:
    """Each command of the bash blocks: continuation lines joined, comments dropped, `a && b` split."""
    commands = []
    for block in code_blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


TRAINSIM = [c for c in shell_commands() if c.startswith("trainsim ")]
SETUP = [c for c in shell_commands() if not c.startswith("trainsim ")]


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "work"
    (work / "path" / "to").mkdir(parents=True)
    (work / "path" / "to" / "config.json").write_text(GPT2_CONFIG)
    (work / "my_model.py").write_text(FACTORY)
    (work / "job.yaml").write_text(JOB)
    shutil.copytree(EXEC_TRACES, work / "traces")
    measured = work / "data" / "ground-truth" / "h200"
    measured.mkdir(parents=True)
    for run in sorted((REPO_DIR / "data" / "ground-truth" / "h200").glob("*.json"))[:RUNS]:
        shutil.copy(run, measured)
    shipped = REPO_DIR / "src" / "trainsim" / "catalog" / "data" / "measurements"
    rows = shipped.joinpath("runs.csv").read_text().splitlines(keepends=True)[:ROWS + 1]
    (work / "src" / "trainsim" / "catalog" / "data" / "measurements").mkdir(parents=True)
    (work / "src" / "trainsim" / "catalog" / "data" / "measurements" / "runs.csv").write_text("".join(rows))
    # a user's own measured runs (the calibrate example)
    (work / "my_runs.csv").write_text("".join(rows[:CALIBRATE_ROWS + 1]))
    shutil.copy(REPO_DIR / "src" / "trainsim" / "catalog" / "data" / "calibration" / "fitted.yaml",
                work / "my_cluster.yaml")  # what that example writes (each command runs in a fresh sandbox)
    runs = SHARED / "data" / "calibration" / "runs.csv"
    if runs.is_file():
        (tmp_path / "shared" / "data" / "calibration").mkdir(parents=True)
        lines = runs.read_text().splitlines(keepends=True)
        (tmp_path / "shared" / "data" / "calibration" / "runs.csv").write_text("".join(lines[:ROWS + 1]))
    monkeypatch.chdir(work)
    return work


def test_the_readme_has_code_to_run() -> None:
    assert len(code_blocks("python")) >= 2 and len(TRAINSIM) >= 10 and SETUP


@pytest.mark.parametrize("block", code_blocks("python"), ids=lambda b: b.splitlines()[0][:40])
def test_python_block_runs(block: str, sandbox: Path) -> None:
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})


@pytest.mark.parametrize("command", TRAINSIM)
def test_trainsim_command_runs(command: str, sandbox: Path) -> None:
    args = shlex.split(command)[1:]
    needs = {"torch": ("--frontend torch", "my_model.py"), "jax": ("--frontend jax",)}
    for module, markers in needs.items():
        if any(marker in command for marker in markers):
            pytest.importorskip(module)
    if "../shared/" in command and not (sandbox.parent / "shared").is_dir():
        pytest.skip(f"{SHARED} is not here")
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, f"{command}\n{out.output}"
    assert out.stdout.strip() or out.stderr.strip()


@pytest.mark.parametrize("command", SETUP)
def test_setup_commands_name_what_exists(command: str) -> None:
    extras = set(tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    if "pip install" in command:
        named = re.search(r"-e '?\.(?:\[([\w,]+)\])?'?", command)
        assert named is not None, command
        assert set(filter(None, (named.group(1) or "").split(","))) <= extras
    else:
        assert command == "python3 -m pytest", command
