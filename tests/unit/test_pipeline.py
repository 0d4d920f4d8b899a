"""The pipeline: front-end -> OpGraph -> engine(job, graph, plan) -> Result, from Python and from the command line,
for every engine and front-end."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import EXEC_TRACES
from trainsim.catalog import load_cluster, load_model
from trainsim.cli.main import app
from trainsim.errors import ConfigError, UnknownNameError
from trainsim.estimate.engines import ENGINES, make_engine, shape_engines
from trainsim.estimate.result import Result
from trainsim.frontends.registry import ModelSource
from trainsim.job import Job, make_job
from trainsim.pipeline import GraphCache, graph_for, predict
from trainsim.strategy.parallel import ParallelSpec

RUNNER = CliRunner()
TRACES = EXEC_TRACES


def _job(num_gpus: int = 8, **strategy: object) -> Job:
    par = ParallelSpec.model_validate({"micro_batch": 1, "seq_len": 1024, "global_batch": 16, **strategy})
    return make_job(load_model("gpt3-125m"), load_cluster("dgx-a100-80gb").with_num_gpus(num_gpus), par)


@pytest.mark.parametrize("engine", ["analytical", "precision-aware", "sim"])
def test_every_shape_engine_takes_the_same_inputs_and_returns_a_result(engine: str) -> None:
    job = _job(tp=2, pp=2)
    graph = graph_for(job)
    result = make_engine(engine).estimate(job, graph)
    assert isinstance(result, Result) and result.engine == engine
    assert result == predict(job, engine)  # the one-call pipeline builds the same graph
    assert sum(result.breakdown.values()) == pytest.approx(result.iteration_time_s)
    assert (result.timeline is not None) == ENGINES.get(engine).timeline


def test_shape_engines_leave_out_replay_and_unknown_engines_list_the_choices() -> None:
    assert shape_engines() == ["analytical", "precision-aware", "sim"]
    with pytest.raises(UnknownNameError, match="analytical, flexflow-sim, precision-aware, replay, sim, sim-plain"):
        make_engine("exact")


def test_graph_cache_builds_one_graph_per_device_slice() -> None:
    graphs = GraphCache()
    a, b, c = _job(tp=2), _job(tp=2, zero=1), _job(tp=4)
    assert graphs.get(a) is graphs.get(b)  # zero does not change the per-device shapes
    assert graphs.get(c) is not graphs.get(a)
    assert graphs.get(a) == graph_for(a)
    with pytest.raises(UnknownNameError, match="frontend"):
        GraphCache("onnx")


def test_the_catalog_model_source_is_the_catalog_graph() -> None:
    job = _job()
    source = ModelSource("gpt3-125m")
    assert source.model_spec() == job.model
    assert graph_for(job, source) == graph_for(job)


def test_predict_replays_a_trace_through_the_trace_front_end() -> None:
    """The trace fixes the ranks and the micro-batch: predict takes them from it."""
    out = RUNNER.invoke(app, ["predict", "--frontend", "trace", "--model", str(TRACES), "--engine", "replay",
                              "--cluster", "local-cpu", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["engine"] == "replay" and data["iteration_time_s"] > 0
    assert any("trace replay of 2 ranks" in note for note in data["notes"])


def test_replay_of_a_model_without_a_trace_is_one_line() -> None:
    out = RUNNER.invoke(app, ["predict", "--engine", "replay"])
    assert out.exit_code == 2 and "--frontend trace" in out.stderr and "Traceback" not in out.output


def test_a_trace_asked_to_run_on_other_ranks_is_refused() -> None:
    out = RUNNER.invoke(app, ["predict", "--frontend", "trace", "--model", str(TRACES), "--engine", "replay",
                              "--cluster", "local-cpu", "--num-gpus", "4"])
    assert out.exit_code == 2 and "num_gpus=4" in out.stderr


def test_unknown_front_ends_are_one_line_everywhere(tmp_path: Path) -> None:
    for args in (["predict", "--frontend", "onnx"], ["search", "--frontend", "onnx", "--global-batch", "8"],
                 ["validate", str(tmp_path), "--frontend", "onnx"]):
        out = RUNNER.invoke(app, args)
        assert out.exit_code == 2, args
        assert "frontend='onnx'" in out.stderr and "catalog" in out.stderr, args


def test_search_through_a_front_end_counts_what_it_cannot_build(tmp_path: Path) -> None:
    """A front-end that cannot split a model refuses the plans that would need it; the search counts them."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = {"model_type": "llama", "_name_or_path": "tiny-llama", "num_hidden_layers": 2, "hidden_size": 128,
              "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 256, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = RUNNER.invoke(app, ["search", "--frontend", "torch", "--model", str(path), "--num-gpus", "2",
                              "--global-batch", "4", "--seq-len", "64", "--max-micro-batch", "2", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["plans"] and all(plan["strategy"]["tp"] == 1 for plan in data["plans"])
    assert data["infeasible"].get("tp", 0) > 0


def test_a_model_source_refuses_what_its_front_end_cannot_read() -> None:
    with pytest.raises(ConfigError, match="trace"):
        ModelSource("no/such/dir", "trace").model_spec()
