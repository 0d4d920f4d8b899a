"""`trainsim measure --sharder/--sharding`: a DLRM with sharded embedding tables trained on 2 gloo ranks (index
and pooled all-to-alls, dense all-reduce), its run file re-predictable with `trainsim predict --sharding`, and
one-line refusals of what a DLRM run cannot take."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.catalog import load_cluster, load_model
from trainsim.cli.main import app
from trainsim.cost.embedding_lookup import RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import price_sharded_iteration
from trainsim.embedding.plan_file import plan_from_mapping
from trainsim.embedding.tables import tables_from_spec
from trainsim.estimate.trace_predict import overheads_from, simulate_trace
from trainsim.frontends.catalog.sharded_dlrm import sharded_job
from trainsim.ir.model_spec import DlrmSpec

runner = CliRunner()
CPU = load_cluster("local-cpu").with_num_gpus(2).on_one_node()
# Four tiny tables, one dim (the dot interaction), the bottom MLP ending at it, the top MLP at one logit.
MODEL = """name: tiny-dlrm
kind: dlrm
dense_features: 4
bottom_mlp: [16, 8]
top_mlp: [16, 1]
tables:
  - {rows: 200, dim: 8, pooling_factor: 3, zipf_alpha: 1.0}
  - {rows: 100, dim: 8, pooling_factor: 25}
  - {rows: 300, dim: 8, pooling_factor: 2}
  - {rows: 50, dim: 8, pooling_factor: 1}
"""
# Every sharding kind the ranks run, one table each.
EVERY_KIND = """sharding:
  - {table: 0, kind: table-wise, ranks: [1]}
  - {table: 1, kind: column-wise, ranks: [0, 1]}
  - {table: 2, kind: row-wise}
  - {table: 3, kind: data-parallel}
"""
SPANS = ["index-a2a launch", "bottom_mlp fwd", "index-a2a wait", "embeddings fwd", "pooled-a2a-fwd", "top_mlp fwd",
         "top_mlp bwd", "pooled-a2a-bwd launch", "bottom_mlp bwd", "grad-allreduce launch", "pooled-a2a-bwd wait",
         "embeddings bwd", "grad-allreduce wait", "optimizer step"]


def _model(tmp_path: Path, text: str = MODEL) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return path


def _measure(*args: str) -> dict:
    out = runner.invoke(app, ["measure", *args, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_measure_runs_every_sharding_kind_on_two_gloo_ranks_and_repredicts(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(EVERY_KIND)
    record = _measure("--model", str(_model(tmp_path)), "--num-gpus", "2", "--micro-batch", "4", "--sharding",
                      str(plan), "--iterations", "3", "--warmup", "1", "--out", str(tmp_path / "runs"),
                      "--run-id", "tiny")
    assert record["kind"] == "sharded-dlrm" and record["num_ranks"] == 2 and record["local_batch"] == 4
    assert len(record["iterations_s"]) == 3
    assert all(math.isfinite(t) and t > 0 for t in record["iterations_s"])
    assert record["iteration_s"] == sorted(record["iterations_s"])[1]  # the median of 3
    assert record["p10_s"] <= record["iteration_s"] <= record["p90_s"]
    assert [[e[0] for e in rank] for rank in record["rank_events"]] == [SPANS, SPANS]
    assert [len(c) for c in record["rank_cpu_s"]] == [len(SPANS)] * 2
    assert [(s["kind"], s["ranks"]) for s in record["sharding"]] == [
        ("table-wise", [1]), ("column-wise", [0, 1]), ("row-wise", [0, 1]), ("data-parallel", [0, 1])]
    assert len(record["load_avg"]) == 2
    assert record["allocator"] == "keep"  # the harness's default malloc policy, applied on both ranks (glibc)
    saved = tmp_path / "runs" / "tiny.json"
    assert json.loads(saved.read_text()) == record
    # the run file is a sharding file: it predicts exactly as the plan it measured
    predicted = [_predict(_model(tmp_path), path) for path in (saved, plan)]
    assert predicted[0]["iteration_time_s"] == predicted[1]["iteration_time_s"] > 0
    # and its spans are Algorithm 1's per-rank trace: every span maps to a priced term or a host overhead
    model = load_model(str(_model(tmp_path)))
    assert isinstance(model, DlrmSpec)
    measured_plan = plan_from_mapping(record, tables_from_spec(model.tables), 2, 2)
    sjob = sharded_job(model, measured_plan, CPU, 4, precision="fp32")
    it = price_sharded_iteration(sjob.graph, sjob.plan, sjob.job, Pricer(), RooflineLookup(CPU.device))
    events = [[(str(n), float(a), float(b)) for n, a, b in rank] for rank in record["rank_events"]]
    for replay in (False, True):
        assert 0.0 < simulate_trace(events, it, overheads_from([events]), replay=replay) < math.inf


def _predict(model: Path, sharding: Path) -> dict:
    out = runner.invoke(app, ["predict", "--model", str(model), "--cluster", "local-cpu", "--num-gpus", "2",
                              "--micro-batch", "4", "--precision", "fp32", "--sharding", str(sharding), "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_measure_runs_a_sharders_plan_and_prints_the_spans(tmp_path: Path) -> None:
    out = runner.invoke(app, ["measure", "--model", str(_model(tmp_path)), "--num-gpus", "2", "--micro-batch", "2",
                              "--sharder", "size-lookup-greedy", "--iterations", "1", "--warmup", "0", "--out",
                              str(tmp_path), "--phase-normalise"])
    assert out.exit_code == 0, out.output
    assert "tiny-dlrm: size-lookup-greedy on 2 ranks, local batch 2" in out.output
    assert all(span in out.output for span in SPANS)
    record = json.loads((tmp_path / "dlrm-tiny-dlrm-size-lookup-greedy-r2-b2.json").read_text())
    # --phase-normalise: the reference probe around the iteration on both ranks, its normalised time beside the raw
    assert set(record["phase_iteration_s"]) == {"reference"} and record["phase_iteration_s"]["reference"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--sharder", "best"], "sharder"),
    (["--sharder", "naive", "--sharding", "plan.yaml"], "not both"),
    (["--sharder", "naive", "--precision", "bf16"], "fp32"),
    (["--sharder", "naive", "--cluster", "dgx-h100-80gb"], "local gloo CPU ranks"),
    (["--sharder", "naive", "--suite", "local"], "suite"),
    (["--sharder", "naive", "--profile"], "profile"),
    (["--sharder", "naive", "--threads", "2"], "threads"),
    (["--sharder", "naive", "--memory-cap-gib", "1"], "memory_cap_gib"),
    (["--sharder", "naive", "--tp", "2", "--num-gpus", "4"], "dp"),
    (["--sharder", "naive", "--iterations", "0"], "iterations"),
    (["--sharder", "naive", "--timeout-s", "nan"], "timeout_s"),
    (["--seed", "3"], "seed"),
    (["--allocator", "keep"], "allocator"),
    (["--sharder", "naive", "--allocator", "jemalloc"], "keep, system"),
    (["--sharder", "naive", "--run-id", "../escape"], "run_id"),
])
def test_measure_refuses_what_a_sharded_dlrm_run_cannot_take(tmp_path: Path, args: list[str], message: str) -> None:
    model = _model(tmp_path)
    extra = [] if "--num-gpus" in args else ["--num-gpus", "2"]
    out = runner.invoke(app, ["measure", "--model", str(model), *extra, *args, "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("model", "args", "message"), [
    ("gpt2-124m", ["--num-gpus", "2"], "take a DLRM"),
    (MODEL, ["--num-gpus", "1"], "at least 2 ranks"),
    (MODEL, [], "--num-gpus"),
    (MODEL.replace("top_mlp: [16, 1]", "top_mlp: [16, 2]"), ["--num-gpus", "2"], "top_mlp"),
    (MODEL.replace("bottom_mlp: [16, 8]", "bottom_mlp: [16, 6]"), ["--num-gpus", "2"], "bottom_mlp"),
    (MODEL.replace("{rows: 50, dim: 8", "{rows: 50, dim: 4"), ["--num-gpus", "2"], "dim"),
])
def test_measure_refuses_a_model_the_ranks_cannot_build(tmp_path: Path, model: str, args: list[str],
                                                        message: str) -> None:
    name = model if "\n" not in model else str(_model(tmp_path, model))
    out = runner.invoke(app, ["measure", "--model", name, *args, "--sharder", "naive", "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output
