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
    names = ("job.yaml", "model.yaml", "cluster.yaml", "inline.yaml")
    job, model, cluster, inline = (tmp_path / name for name in names)
    for path, block in zip((job, model, cluster, inline), BLOCKS, strict=True):
        path.write_text(block)
    r = trainsim.predict(job_file=job, model=str(model), cluster=str(cluster), num_gpus=None)
    assert r.model == "my-gpt" and r.cluster == "my-cluster" and r.num_gpus == 16
    assert r.strategy is not None and (r.strategy["tp"], r.strategy["pp"], r.strategy["dp"]) == (2, 2, 4)
    r = trainsim.predict(job_file=job, model=str(model), cluster=str(inline), num_gpus=None, precision="fp8")
    assert r.cluster == "my-accelerator-box" and r.num_gpus == 16 and r.peak_flops_per_gpu == 1800e12


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


def _cli_error(*args: str) -> str:
    out = RUNNER.invoke(app, ["predict", *args])
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_model_file_names_every_unknown_and_missing_key_and_bad_value_with_its_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a short path: the line's 300 characters go to the problems
    model = Path("m.yaml")
    model.write_text("name: m1\nnum_layers: 2\nhidden: -3\nnum_heads: 4\nvocab: 100\nmax_seq: 16\nbogus: 3\n")
    assert _cli_error("--model", str(model)) == (
        f"error: {model}: unknown keys max_seq (line 6, did you mean max_seq_len?); bogus (line 7); missing key "
        "ffn_hidden; hidden=-3 (line 3) is invalid: Input should be greater than 0; the keys a model file takes: "
        "docs/inputs.md")


@pytest.mark.parametrize(("text", "expected"), [
    ("kind: cnn\nname: c\nbogus: 1\n", "unknown key bogus (line 3)"),
    ("name: m\nnum_layers: true\nhidden: 32\nnum_heads: 4\nvocab: 100\nffn_hidden: 5\n",
     "num_layers=True (line 2) is invalid: must be a number, not true or false"),
    ("kind: resnet\nname: r\n", "kind='resnet' (line 1) is invalid: choose one of: transformer, cnn, dlrm, opaque"),
    ("name: m\nnum_layers: 2\nhidden: 30\nnum_heads: 4\nvocab: 100\nffn_hidden: 5\n",
     "m.yaml: hidden=30 must be divisible by num_heads=4"),
])
def test_model_file_problems_name_their_line(tmp_path: Path, text: str, expected: str) -> None:
    model = tmp_path / "m.yaml"
    model.write_text(text)
    assert expected in _cli_error("--model", str(model))


def test_a_cluster_file_names_every_unknown_and_missing_key_with_its_line(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cluster = Path("c.yaml")
    cluster.write_text("name: c1\ndevice: a100-sxm4-80gb\ngpus_per_node: x\nnum_nodes: 1\nintra_nodes: nvlink3\n")
    assert _cli_error("--cluster", str(cluster)) == (
        f"error: {cluster}: unknown key intra_nodes (line 5, did you mean intra_node?); missing keys intra_node, "
        "inter_node; gpus_per_node='x' (line 3) is invalid: Input should be a valid integer, unable to parse "
        "string as an integer; the keys a cluster file takes: docs/inputs.md")


def test_an_inline_device_names_its_nested_keys(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c1\ngpus_per_node: 8\nnum_nodes: 1\nintra_node: nvlink3\ninter_node: ib-hdr-200\n"
                       "device:\n  name: x\n  peak_flops_per_s: {fp32: 1TFLOP/s}\n  hbm_bytes: 1GiB\n  hbm_bw: 3\n")
    line = _cli_error("--cluster", str(cluster))
    assert "unknown key device.hbm_bw (line 10)" in line and "missing key device.hbm_bw_bytes_per_s" in line


def test_problems_past_the_one_line_limit_are_counted(tmp_path: Path) -> None:
    """20 unknown keys and 5 missing: as many as fit the 300-character line, in order, then the count."""
    from trainsim.errors import MAX_MESSAGE_CHARS

    model = tmp_path / "m.yaml"
    model.write_text("name: m\n" + "".join(f"extra_{i}: 1\n" for i in range(20)))
    line = _cli_error("--model", str(model))
    assert len(line) <= MAX_MESSAGE_CHARS and "..." not in line
    named = re.findall(r"extra_(\d+) \(line (\d+)\)", line)
    assert [(int(i), int(n)) for i, n in named] == [(i, i + 2) for i in range(len(named))] and len(named) >= 5
    assert f"; and {25 - len(named)} more problems; the keys a model file takes: docs/inputs.md" in line


def test_a_bad_value_from_a_job_file_names_its_line(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt3-125m\nnum_gpus: 8\nprecision: fp9\n")
    assert _cli_error(str(job)).startswith(f"error: {job} line 3: precision='fp9' is invalid: choose one of")
    assert _cli_error(str(job), "--precision", "fp7").startswith("error: precision='fp7' is invalid")  # the flag's


@pytest.mark.parametrize(("flag", "text", "place"), [
    ("--model", "name: m\nnum_layers: [2\n", "(line 3, column 1)"),
    ("--cluster", "name: c\n  device: x\n", "(line 2, column 9)"),
])
def test_model_and_cluster_syntax_errors_keep_their_line_and_column(tmp_path: Path, flag: str, text: str,
                                                                    place: str) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    assert place in _cli_error(flag, str(path))
