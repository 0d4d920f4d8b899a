"""The Proteus paper's S1/S2 strategy trees shipped in data/strategies/proteus: each predicts with the command
line its first lines give, and the S2 plans do what the paper uses them for."""

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app

RUNNER = CliRunner()
TREES = Path(__file__).resolve().parents[3] / "data" / "strategies" / "proteus"
MODELS = ("resnet50", "inception-v3", "vgg19", "gpt2", "gpt2-1.5b", "dlrm")


def _predict(name: str) -> dict[str, object]:
    path = TREES / f"{name}.yaml"
    line = next(line for line in path.read_text().splitlines() if line.startswith("# trainsim predict"))
    args = shlex.split(line[len("# trainsim "):])
    args[args.index("--tree") + 1] = str(path)
    result = RUNNER.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_model_has_an_s1_and_an_s2_tree() -> None:
    assert sorted(p.stem for p in TREES.glob("*.yaml")) == sorted(f"{m}-{s}" for m in MODELS for s in ("s1", "s2"))


@pytest.mark.parametrize("model", ["resnet50", "inception-v3", "vgg19", "gpt2", "gpt2-1.5b"])
def test_s2_op_sharding_inserts_resharding_that_s1_has_not(model: str) -> None:
    s1, s2 = _predict(f"{model}-s1"), _predict(f"{model}-s2")
    breakdown1, breakdown2 = s1["breakdown"], s2["breakdown"]
    assert isinstance(breakdown1, dict) and isinstance(breakdown2, dict)
    assert breakdown1.get("comm", 0.0) == 0.0 < breakdown2["comm"]


def test_dlrm_partitioned_tables_fit_where_data_parallel_runs_out_of_memory() -> None:
    s1, s2 = _predict("dlrm-s1"), _predict("dlrm-s2")
    assert s1["oom"] is True and s2["oom"] is False
    assert isinstance(s1["peak_memory_bytes"], float) and isinstance(s2["peak_memory_bytes"], float)
    assert s2["peak_memory_bytes"] < s1["peak_memory_bytes"] / 4
