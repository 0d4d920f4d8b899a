"""`trainsim graph`: text and JSON output, the catalog and torch front-ends, and one-line errors (exit 2)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from trainsim.cli.graph import summarize
from trainsim.cli.main import app
from trainsim.frontends.registry import FRONTENDS

RUNNER = CliRunner()
GPT2 = {"model_type": "gpt2", "n_layer": 3, "n_embd": 128, "n_head": 4, "vocab_size": 1000, "n_positions": 256,
        "bos_token_id": 0, "eos_token_id": 0}


def _graph(*args: str) -> Result:
    return RUNNER.invoke(app, ["graph", *args])


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def gpt2_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    return path


def test_catalog_json_has_the_contract_keys() -> None:
    result = _graph("--model", "gpt3-125m", "--seq-len", "512", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("forward_flops", "backward_flops", "parameter_bytes", "num_ops", "activation_bytes", "layers",
                "ops_by_kind"):
        assert key in data
    assert data["backward_flops"] == pytest.approx(2 * data["forward_flops"], rel=0.1)
    assert data["parameter_bytes"] == data["parameters"] * 2  # bf16 weights
    assert [layer["count"] for layer in data["layers"]] == [1, 12, 1]


def test_catalog_text_lists_layers_kinds_and_totals() -> None:
    result = _graph("--model", "gpt3-125m", "--seq-len", "256", "--precision", "fp32")
    assert result.exit_code == 0, result.output
    for text in ("block", "embedding", "head", "matmul", "forward", "backward", "parameters", "activations"):
        assert text in result.stdout


def test_summary_of_a_catalog_graph() -> None:
    graph = FRONTENDS.get("catalog").inspect("gpt3-125m", 1, 128, "bf16")
    summary = summarize(graph, "bf16", "catalog")
    assert summary["num_ops"] == graph.num_ops == sum(summary["ops_by_kind"].values())
    assert summary["forward_flops"] == graph.total_flops("fwd")


def test_frontends_are_a_registry() -> None:
    assert {"catalog", "torch"} <= set(FRONTENDS.names())


def test_hf_config_through_both_front_ends(gpt2_config: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    results = {}
    for frontend in ("catalog", "torch"):
        result = _graph("--model", str(gpt2_config), "--frontend", frontend, "--micro-batch", "2",
                        "--seq-len", "128", "--precision", "amp-bf16", "--json")
        assert result.exit_code == 0, result.output
        results[frontend] = json.loads(result.stdout)
    torch_total = results["torch"]["forward_flops"] + results["torch"]["backward_flops"]
    catalog_total = results["catalog"]["forward_flops"] + results["catalog"]["backward_flops"]
    assert torch_total == pytest.approx(catalog_total, rel=0.01)
    assert results["torch"]["parameter_bytes"] == results["catalog"]["parameter_bytes"]
    assert results["torch"]["ops_by_dtype"].keys() >= {"bf16", "fp32"}
    assert [layer["count"] for layer in results["torch"]["layers"]] == [1, 3, 1]


def test_catalog_model_through_the_torch_front_end() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = _graph("--model", "gpt3-125m", "--frontend", "torch", "--seq-len", "128", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["layers"][1]["count"] == 12


@pytest.mark.parametrize(("args", "expected"), [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "gpt3-125m", "--frontend", "nope"], "nope"),
    (["--model", "gpt3-125m", "--precision", "fp64"], "fp64"),
    (["--model", "gpt3-125m", "--seq-len", "0"], "seq_len=0"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    assert expected in _one_error_line(_graph(*args))


def test_torch_front_end_rejects_a_cnn() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert "resnet50" in _one_error_line(_graph("--model", "resnet50", "--frontend", "torch"))
