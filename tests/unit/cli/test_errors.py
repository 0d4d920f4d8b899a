"""`trainsim predict` on bad input: exit code 2, one line on stderr naming the field and the value, no
traceback (STYLE.md rule 6). Plus the JSON output contract and the no-torch rule of DESIGN.md."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from trainsim.cli.main import app

RUNNER = CliRunner()  # click >= 8.2 keeps result.stderr apart from result.stdout


def _predict(*args: str) -> Result:
    return RUNNER.invoke(app, ["predict", *args])


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


# (flags, text the error line must contain: the field and the value)
FLAG_CASES = {
    "tp does not divide num_heads": (["--tp", "3", "--num-gpus", "3"], ["tp=3", "num_heads=16"]),
    "pp larger than the layers": (["--model", "gpt3-125m", "--pp", "16", "--num-gpus", "16"],
                                  ["pp=16", "num_layers=12"]),
    "degrees do not multiply to the GPUs": (["--tp", "2", "--dp", "2"], ["tp*pp*dp*cp=4", "(8)"]),
    "global batch not divisible": (["--micro-batch", "2", "--global-batch", "12"],
                                   ["global_batch=12", "8 x 2 = 16"]),
    "tp zero": (["--tp", "0"], ["tp=0"]),
    "negative micro-batch": (["--micro-batch", "-1"], ["micro_batch=-1"]),
    "zero GPUs": (["--num-gpus", "0"], ["num_gpus=0"]),
    "GPUs not whole nodes": (["--num-gpus", "12"], ["num_gpus=12", "gpus_per_node=8"]),
    "zero stage 4": (["--zero", "4"], ["zero=4"]),
    "seq-len zero": (["--seq-len", "0"], ["seq_len=0"]),
    "global batch zero": (["--global-batch", "0"], ["global_batch=0"]),
    "sp without tp": (["--sp"], ["sp=True", "tp"]),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_bad_flags_exit_2_with_one_line(case: str) -> None:
    flags, expected = FLAG_CASES[case]
    line = _one_error_line(_predict(*flags))
    for text in expected:
        assert text in line, line


NAME_CASES = {
    "model": (["--model", "no-such-model"], "model='no-such-model'", ["gpt3-1.3b", "gpt3-175b"]),
    "cluster": (["--cluster", "no-such-cluster"], "cluster='no-such-cluster'", ["dgx-a100-80gb"]),
    "precision": (["--precision", "fp7"], "precision='fp7'",
                  ["fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16", "fp8"]),
    "recompute": (["--recompute", "some"], "recompute='some'", ["none", "selective", "full"]),
    "schedule": (["--schedule", "zb-v"], "schedule='zb-v'", ["gpipe", "1f1b", "interleaved-1f1b"]),
    "attention": (["--attention", "flash4"], "attention='flash4'", ["flash2", "flash3", "math"]),
    "optimizer_impl": (["--optimizer-impl", "sgd"], "optimizer_impl='sgd'", ["fused", "foreach", "loop"]),
    "engine": (["--engine", "no-such-engine"], "engine='no-such-engine'", ["analytical"]),
}


@pytest.mark.parametrize("case", list(NAME_CASES))
def test_unknown_names_list_the_choices(case: str) -> None:
    flags, named, choices = NAME_CASES[case]
    line = _one_error_line(_predict(*flags))
    assert named in line, line
    assert "choose one of" in line
    for choice in choices:
        assert choice in line, (choice, line)


FILE_CASES = {
    "invalid YAML": ("job.yaml", "tp: [1, 2\n", ["job.yaml", "not valid YAML"]),
    "invalid JSON": ("job.json", '{"tp": 2,}', ["job.json", "not valid JSON"]),
    "unknown key": ("job.yaml", "tp: 2\nbogus: 1\n", ["unknown key bogus (line 2)"]),
    "unknown key under strategy": ("job.yaml", "strategy:\n  tp: 2\n  wat: 3\n", ["unknown key wat (line 3)"]),
    "top level not a mapping": ("job.yaml", "- 1\n- 2\n", ["job.yaml", "mapping"]),
    "empty file": ("job.yaml", "", ["job.yaml", "mapping"]),
    "tp not an integer": ("job.yaml", "tp: abc\n", ["tp='abc'"]),
    "tp fractional": ("job.yaml", "tp: 2.5\n", ["tp=2.5"]),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_job_files_exit_2_with_one_line(case: str, tmp_path: Path) -> None:
    name, text, expected = FILE_CASES[case]
    path = tmp_path / name
    path.write_text(text)
    line = _one_error_line(_predict(str(path)))
    for fragment in expected:
        assert fragment in line, line


def test_job_file_with_non_mapping_strategy(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("strategy: 5\n")
    line = _one_error_line(_predict(str(path)))
    assert "strategy" in line and "5" in line, line


def test_job_file_with_boolean_degree(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("tp: true\n")
    line = _one_error_line(_predict(str(path)))
    assert "tp=True" in line, line


def test_missing_job_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    line = _one_error_line(_predict(str(missing)))
    assert str(missing) in line and "cannot read" in line, line


def test_missing_cluster_file(tmp_path: Path) -> None:
    missing = tmp_path / "cluster.yaml"
    line = _one_error_line(_predict("--cluster", str(missing)))
    assert str(missing) in line, line


def test_missing_model_file(tmp_path: Path) -> None:
    missing = tmp_path / "model.yaml"
    line = _one_error_line(_predict("--model", str(missing)))
    assert str(missing) in line, line


def _trainsim_command() -> list[str]:
    exe = shutil.which("trainsim")
    return [exe] if exe else [sys.executable, "-c", "from trainsim.cli.main import main; main()"]


@pytest.mark.parametrize(("args", "fragment"), [
    (["--tp", "0"], "tp=0"),
    (["--precision", "fp7"], "precision='fp7'"),
])
def test_installed_command_exit_2_one_line(args: list[str], fragment: str) -> None:
    proc = subprocess.run([*_trainsim_command(), "predict", *args], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert proc.stdout == ""


def test_installed_command_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("tp: [1, 2\n")
    proc = subprocess.run([*_trainsim_command(), "predict", str(path)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not valid YAML" in proc.stderr, proc.stderr


def test_predict_json_prints_one_object() -> None:
    result = _predict("--json")
    assert result.exit_code == 0, (result.output, result.exception)
    data = json.loads(result.stdout)  # the whole of stdout is one JSON value
    assert isinstance(data, dict)
    numbers = ("iteration_time_s", "tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu",
               "peak_memory_gib")
    for key in numbers:
        assert isinstance(data[key], float) and data[key] > 0, key
    assert isinstance(data["oom"], bool)
    breakdown = data["breakdown"]
    assert isinstance(breakdown, dict) and breakdown
    assert all(isinstance(seconds, float) and seconds >= 0 for seconds in breakdown.values())
    # The breakdown is seconds that add up to the iteration time (Result docstring).
    assert sum(breakdown.values()) == pytest.approx(data["iteration_time_s"], rel=1e-9)
    # samples/s x seq_len = tokens/s (default seq_len 2048).
    assert data["tokens_per_s"] == pytest.approx(2048 * data["samples_per_s"], rel=1e-12)


NO_TORCH_SCRIPT = """
import importlib.abc, sys

class Watch(importlib.abc.MetaPathFinder):
    tried = []
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            self.tried.append(name)
        return None

sys.meta_path.insert(0, Watch())
from typer.testing import CliRunner
from trainsim.cli.main import app
result = CliRunner().invoke(app, ["predict", "--json"])
assert result.exit_code == 0, (result.output, result.exception)
print("torch" in sys.modules, Watch.tried, "numpy" in sys.modules)
"""


def test_predict_does_not_import_torch_or_numpy() -> None:
    # DESIGN.md: `trainsim predict` on the analytical engine does not import torch (not even try to); numpy
    # costs ~0.1 s of a 0.4 s process (benchmarks/bench_startup.py), so the default predict leaves it out too.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False [] False", proc.stdout


def test_profile_embedding_names_a_bad_gpu_timing(tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["profile-embedding", "--csv", str(tmp_path / "b.csv"), "--timing", "wall"])
    line = _one_error_line(result)
    assert "timing='wall'" in line and "kernel, events" in line
