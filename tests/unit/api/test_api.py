"""The Python API: the same answers as the command line's JSON, objects and names alike, typed results that
round-trip through JSON, and one-line errors for bad input."""

import doctest
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainsim
from conftest import REPO_DIR, fake_run, tiny_job
from trainsim.api import functions, results
from trainsim.api.prediction import Strategy
from trainsim.catalog import load_cluster, load_model
from trainsim.cli.main import app
from trainsim.errors import ConfigError, InputFileError
from trainsim.measure.results import save_run
from trainsim.search import pareto
from trainsim.strategy.parallel import ParallelSpec

RUNNER = CliRunner()
PREDICT = dict(model="gpt3-125m", num_gpus=8, tp=2, global_batch=32, seq_len=512)
PREDICT_ARGS = ["predict", "--model", "gpt3-125m", "--num-gpus", "8", "--tp", "2", "--global-batch", "32",
                "--seq-len", "512", "--json"]
SEARCH_ARGS = ["search", "--model", "gpt3-125m", "--num-gpus", "8", "--global-batch", "16", "--seq-len", "256",
               "--top-k", "3", "--json"]


def _cli_json(args: list[str]) -> dict:
    out = RUNNER.invoke(app, args)
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


@pytest.mark.parametrize("engine", ["analytical", "sim"])
def test_predict_equals_the_command_lines_json(engine: str) -> None:
    api_dict = trainsim.predict(**PREDICT, engine=engine).to_dict()  # type: ignore[arg-type]
    assert api_dict == _cli_json([*PREDICT_ARGS, "--engine", engine])
    assert api_dict["schema"] == {"name": "trainsim.prediction", "version": 1}
    assert ("timeline" in api_dict) == (engine == "sim")


def test_objects_give_the_same_prediction_as_names() -> None:
    by_name = trainsim.predict(**PREDICT)  # type: ignore[arg-type]
    by_object = trainsim.predict(load_model("gpt3-125m"), load_cluster("dgx-a100-80gb"), 8,
                                 strategy=ParallelSpec(tp=2, global_batch=32, seq_len=512))
    assert by_object.to_dict() == by_name.to_dict()
    # flags override the strategy object, as command-line flags override a job file
    assert trainsim.predict(**PREDICT, strategy=ParallelSpec(tp=4)).to_dict() == by_name.to_dict()  # type: ignore[arg-type]


def test_job_file_and_flags(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt3-125m\nnum_gpus: 8\nstrategy:\n  tp: 4\n  global_batch: 32\n  seq_len: 512\n")
    from_file = trainsim.predict(job_file=job, tp=2)
    assert from_file.to_dict() == trainsim.predict(**PREDICT).to_dict()  # type: ignore[arg-type]
    cli = _cli_json(["predict", str(job), "--tp", "2", "--json"])
    assert cli == from_file.to_dict()


def test_search_equals_the_command_lines_json() -> None:
    found = trainsim.search("gpt3-125m", num_gpus=8, global_batch=16, seq_len=256, top_k=3)
    assert found.to_dict() == _cli_json(SEARCH_ARGS)
    everything = trainsim.search("gpt3-125m", num_gpus=8, global_batch=16, seq_len=256, top_k=3, all_plans=True)
    assert everything.to_dict() == _cli_json([*SEARCH_ARGS, "--all"])
    assert found.best is not None and found.best.rank == 1
    assert found.to_dict()["schema"]["name"] == "trainsim.search" and "all_plans" not in found.to_dict()


def test_search_lists_every_plan_priced_with_its_pareto_front() -> None:
    found = trainsim.search("gpt3-125m", num_gpus=8, global_batch=16, seq_len=256, top_k=3, all_plans=True)
    points = found.all_plans or []
    refused_not_oom = sum(n for reason, n in found.infeasible.items() if reason != "out of memory")
    assert len(points) == found.tried - refused_not_oom
    assert sum(not p.oom for p in points) == found.feasible
    fits = [p for p in points if not p.oom]
    front = [p for p in fits if p.pareto]
    assert front and not any(p.pareto for p in points if p.oom)
    for index, p in enumerate(fits):
        # on the front exactly when no plan that fits is as good on both and better on one, and no earlier plan
        # has the same numbers (of equal plans the first is kept)
        key = (p.tokens_per_s, p.peak_memory_gib)
        dominated = any(q.tokens_per_s >= p.tokens_per_s and q.peak_memory_gib <= p.peak_memory_gib
                        and (q.tokens_per_s, q.peak_memory_gib) != key for q in fits)
        repeated = any((q.tokens_per_s, q.peak_memory_gib) == key for q in fits[:index])
        assert p.pareto == (not dominated and not repeated), p
    best = max(fits, key=lambda p: (p.tokens_per_s, -p.peak_memory_gib))
    assert best.pareto and best.tokens_per_s == pytest.approx(found.plans[0].tokens_per_s)


def test_pareto_front_exact_tiny_case() -> None:
    #          fast+big      slow+small    dominated     equal to 0
    points = [(10.0, 8.0), (5.0, 2.0), (4.0, 3.0), (10.0, 8.0), (7.0, 2.0)]
    assert pareto.pareto_front(points) == {0, 4}


@pytest.fixture
def measured_folder(tmp_path: Path) -> Path:
    job = tiny_job(2, dp=2)
    save_run(fake_run("tiny-dp2.r1", job, [0.10, 0.10, 0.10]), tmp_path)
    save_run(fake_run("tiny-dp2.r2", job, [0.12, 0.12, 0.12]), tmp_path)
    return tmp_path


def test_validate_equals_the_command_lines_json(measured_folder: Path) -> None:
    found = trainsim.validate(measured_folder, engine="analytical")
    assert found.to_dict() == _cli_json(["validate", str(measured_folder), "--engine", "analytical", "--json"])
    assert found.engines == ["analytical"] and len(found.runs) == 4
    (entry,) = [e for e in found.summary if e["source"] == "ALL" and e["metric"] == "iteration_time_s"]
    assert found.mape_pct() == entry["mape_pct"] > 0
    with pytest.raises(ConfigError, match="no such engine"):
        found.mape_pct("sim")


def test_validate_reports_progress(measured_folder: Path) -> None:
    seen: list[tuple[int, int]] = []
    trainsim.validate(measured_folder, engine="analytical", progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]  # 2 runs x 2 metrics (time, peak memory)


def test_results_round_trip_through_json(tmp_path: Path) -> None:
    prediction = trainsim.simulate(model="gpt3-125m", num_gpus=8, pp=2, global_batch=16)
    path = tmp_path / "r.json"
    path.write_text(prediction.to_json())
    loaded = trainsim.load(path)
    assert isinstance(loaded, trainsim.Prediction) and loaded.to_dict() == prediction.to_dict()
    assert loaded.result is None and prediction.result is not None
    found = trainsim.search("gpt3-125m", num_gpus=8, global_batch=16, seq_len=256, top_k=2)
    path.write_text(found.to_json())
    assert trainsim.load(path).to_dict() == found.to_dict()


def test_unknown_result_keys_survive_a_round_trip() -> None:
    data = trainsim.predict(**PREDICT).to_dict()  # type: ignore[arg-type]
    data["iteration_time_band_s"] = [0.9, 1.1]  # a key a newer Result carries
    assert trainsim.Prediction.from_dict(data).to_dict() == data


def test_repr_and_html_repr_name_the_numbers() -> None:
    prediction = trainsim.predict(**PREDICT)  # type: ignore[arg-type]
    text = repr(prediction)
    assert text.startswith("Prediction(gpt3-125m") and f"{prediction.tokens_per_s:,.0f} tokens/s" in text
    assert "MFU" in text and "GiB" in text
    assert "<table" in prediction._repr_html_() and "tokens/s" in prediction._repr_html_()
    found = trainsim.search("gpt3-125m", num_gpus=8, global_batch=16, seq_len=256, top_k=2)
    assert "#1 " in repr(found) and "<table" in found._repr_html_()


def test_strategy_keywords_are_the_command_lines_names() -> None:
    assert set(Strategy.__annotations__) == set(ParallelSpec.model_fields)


@pytest.mark.parametrize(("call", "field"), [
    (lambda: trainsim.predict(model="gpt3-125m", tp=3), "tp"),
    (lambda: trainsim.predict(model="no-such-model"), "model"),
    (lambda: trainsim.predict(engine="oracle"), "engine"),
    (lambda: trainsim.predict(strategy={"tpp": 2}), "strategy"),
    (lambda: trainsim.predict(micro_batch=0), "micro_batch"),
    (lambda: trainsim.search("gpt3-125m"), "global_batch"),
    (lambda: trainsim.search("gpt3-125m", global_batch=8, top_k=0), "top_k"),
    (lambda: trainsim.search("gpt3-125m", global_batch=8, precision="fp7"), "precision"),
    (lambda: trainsim.predict(model="gpt3-125m").write_trace("t.json"), "engine"),
])
def test_bad_input_is_one_line_naming_the_field(call: object, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        call()  # type: ignore[operator]
    assert field in str(caught.value) and "\n" not in str(caught.value)


def test_load_refuses_what_is_not_a_result(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"(?i)no such file"):
        trainsim.load(tmp_path / "missing.json")
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(InputFileError, match=r"a\.json is not valid JSON \(line 1, column 2\)"):
        trainsim.load(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"plans": []}')
    with pytest.raises(ConfigError, match="schema"):
        trainsim.load(tmp_path / "b.json")
    (tmp_path / "c.json").write_text('{"schema": {"name": "trainsim.prediction", "version": 1}, "engine": "x"}')
    with pytest.raises(ConfigError, match="iteration_time_s: Field required") as caught:
        trainsim.load(tmp_path / "c.json")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("module", [trainsim, functions, pareto])
def test_docstring_examples_run(module: object) -> None:
    failures, tried = doctest.testmod(module, raise_on_error=False, verbose=False)  # type: ignore[arg-type]
    assert tried > 0 and failures == 0


def test_the_committed_json_schemas_are_the_models(tmp_path: Path) -> None:
    written = results.write_schemas(tmp_path)
    committed = REPO_DIR / "docs" / "schema"
    for path in written:
        assert (committed / path.name).read_text() == path.read_text(), (
            f"docs/schema/{path.name} is stale: python -c 'import trainsim; trainsim.write_schemas(\"docs/schema\")'")


def test_json_output_follows_its_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO_DIR / "docs" / "schema" / "prediction.schema.json").read_text())
    jsonschema.validate(_cli_json([*PREDICT_ARGS, "--engine", "sim"]), schema)


def test_the_api_page_examples_run() -> None:
    failures, tried = doctest.testfile(str(REPO_DIR / "docs" / "api.md"), module_relative=False,
                                       optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("engine", ["analytical", "sim", "precision-aware"])
def test_breakdown_keys_are_the_same_for_every_engine(engine: str) -> None:
    from trainsim.estimate.result import BREAKDOWN_KEYS

    prediction = trainsim.predict(model="gpt3-125m", engine=engine, pp=2, global_batch=16)
    assert list(prediction.breakdown) == list(BREAKDOWN_KEYS)
    assert sum(prediction.breakdown.values()) == pytest.approx(prediction.iteration_time_s, rel=1e-9)
    assert prediction.result is not None
    assert {k: v for k, v in prediction.breakdown.items() if v} == {
        k: v for k, v in prediction.result.breakdown.items() if v}
