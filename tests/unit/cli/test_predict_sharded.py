"""`trainsim predict --sharder/--sharding`: a DLRM with sharded embedding tables in both engines, its per-rank
memory and OOM, and one-line refusals."""

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from trainsim.catalog import load_cluster, load_model
from trainsim.cli.main import app
from trainsim.cost.pricing import make_pricer
from trainsim.embedding.sharders import MEMORY_CAP_FRACTION, shard
from trainsim.embedding.synthetic import generate_task
from trainsim.embedding.tables import tables_from_spec
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import dlrm_model, sharded_job
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable

runner = CliRunner()
GIB = 2.0**30
# Two tables of 2^20 rows x 64 fp32 values = 256 MiB each, on an 8-GPU H100 node.
MODEL = """name: two-tables
kind: dlrm
dense_features: 13
bottom_mlp: [64, 64]
top_mlp: [64, 1]
tables:
  - {rows: 1048576, dim: 64, pooling_factor: 30}
  - {rows: 1048576, dim: 64, pooling_factor: 2}
"""


def _files(tmp_path: Path, sharding: str) -> tuple[Path, Path]:
    model, plan = tmp_path / "two.yaml", tmp_path / "plan.yaml"
    model.write_text(MODEL)
    plan.write_text(sharding)
    return model, plan


def _predict(*args: str) -> dict:
    out = runner.invoke(app, ["predict", *args, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_sharder_flag_matches_the_sharded_engines_in_both_engines() -> None:
    args = ["--model", "dlrm-mlperf-terabyte", "--cluster", "dgx-h100-80gb", "--num-gpus", "8", "--micro-batch",
            "512", "--sharder", "size-lookup-greedy"]
    analytical, sim = _predict(*args), _predict(*args, "--engine", "sim")
    cluster, model = load_cluster("dgx-h100-80gb"), load_model("dlrm-mlperf-terabyte")
    assert isinstance(model, DlrmSpec)
    plan = shard(tables_from_spec(model.tables), "size-lookup-greedy", 8,
                 cap_bytes=MEMORY_CAP_FRACTION * cluster.device.hbm_bytes)
    sjob = sharded_job(model, plan, cluster, 512)
    direct = estimate_sharded(sjob.job, sjob.graph, plan, "analytical")
    assert analytical["iteration_time_s"] == direct.iteration_time_s
    assert abs(sim["iteration_time_s"] - direct.iteration_time_s) <= 1e-12 * direct.iteration_time_s
    assert analytical["strategy"]["dp"] == 8 and analytical["strategy"]["micro_batch"] == 512


def test_sharder_flag_keeps_the_jobs_precision() -> None:
    args = ["--model", "dlrm-mlperf-terabyte", "--cluster", "dgx-h100-80gb", "--num-gpus", "8", "--micro-batch",
            "512", "--sharder", "size-lookup-greedy", "--precision", "fp32"]
    data = _predict(*args)
    cluster, model = load_cluster("dgx-h100-80gb"), load_model("dlrm-mlperf-terabyte")
    assert isinstance(model, DlrmSpec)
    plan = shard(tables_from_spec(model.tables), "size-lookup-greedy", 8,
                 cap_bytes=MEMORY_CAP_FRACTION * cluster.device.hbm_bytes)
    fp32, bf16 = (sharded_job(model, plan, cluster, 512, precision=p) for p in ("fp32", "bf16"))
    expected = estimate_sharded(fp32.job, fp32.graph, plan, "analytical").iteration_time_s
    assert data["strategy"]["precision"] == "fp32"
    assert data["iteration_time_s"] == expected
    assert expected != estimate_sharded(bf16.job, bf16.graph, plan, "analytical").iteration_time_s


def test_sharding_file_places_tables_and_reports_each_rank_memory(tmp_path: Path) -> None:
    model, plan = _files(tmp_path, "sharding:\n  - {table: 0, kind: table-wise, ranks: [1]}\n"
                                   "  - {table: 1, kind: column-wise, ranks: [0, 1]}\n")
    data = _predict("--model", str(model), "--cluster", "dgx-h100-80gb", "--num-gpus", "2", "--micro-batch", "64",
                    "--sharding", str(plan))
    note = next(n for n in data["notes"] if n.startswith("per-rank memory"))
    # rank 0: half the columns of table 1 = 128 MiB; rank 1: table 0 (256 MiB) + the other half (128 MiB); sgd
    assert "r0 0.125 /" in note and "r1 0.375 /" in note and "OOM" not in note
    assert not data["oom"]


def test_a_plan_that_overfills_a_rank_is_oom_on_that_rank(tmp_path: Path) -> None:
    big = MODEL.replace("rows: 1048576, dim: 64, pooling_factor: 30", "rows: 400000000, dim: 64, pooling_factor: 30")
    model, plan = _files(tmp_path, "sharding:\n  - {table: 0, kind: table-wise, ranks: [0]}\n"
                                   "  - {table: 1, kind: table-wise, ranks: [1]}\n")
    model.write_text(big)  # table 0: 4e8 x 64 x 4 B = 95.4 GiB > 80 GiB
    data = _predict("--model", str(model), "--cluster", "dgx-h100-80gb", "--num-gpus", "2", "--sharding", str(plan))
    assert data["oom"]
    assert any(n == "out of memory on ranks [0]" for n in data["notes"])


def test_sharded_predict_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    model, plan = _files(tmp_path, "sharding:\n  - {table: 0, kind: table-wise, ranks: [0]}\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text("sharding:\n  - {table: 0, kind: table-wise, ranks: [0]}\n  - {table: 0, kind: row-wise}\n")
    kind = tmp_path / "kind.yaml"
    kind.write_text("sharding:\n  - {table: 0, kind: diagonal}\n  - {table: 1, kind: row-wise}\n")
    rank = tmp_path / "rank.yaml"
    rank.write_text("sharding:\n  - {table: 0, kind: table-wise, ranks: [5]}\n  - {table: 1, kind: row-wise}\n")
    base = ["predict", "--model", str(model), "--cluster", "dgx-h100-80gb", "--num-gpus", "2"]
    for args in (["--sharding", str(plan)],  # table 1 not placed
                 ["--sharding", str(dup)], ["--sharding", str(kind)], ["--sharding", str(rank)],
                 ["--sharder", "best-guess"], ["--sharder", "naive", "--sharding", str(plan)],
                 ["--sharder", "naive", "--engine", "replay"], ["--sharder", "naive", "--tp", "2"],
                 ["--sharder", "naive", "--lookup", str(tmp_path / "none.json")]):
        out = runner.invoke(app, [*base, *args])
        assert out.exit_code == 2, (args, out.output)
        assert out.output.count("\n") == 1 and out.output.startswith("error:"), (args, out.output)
    out = runner.invoke(app, ["predict", "--model", "gpt3-125m", "--sharder", "naive"])
    assert out.exit_code == 2 and "DLRM" in out.output, out.output


def test_sharded_predict_prices_dense_ops_with_the_costs_it_is_given(tmp_path: Path) -> None:
    # heavy0 on 2 ranks, batch 32, fp32: its dense ops are in the experiments' profile of dense ops
    db = Path(__file__).resolve().parents[3] / "data" / "recsys" / "cpu" / "dense_ops.db"
    tables = generate_task("heavy", 2, 0)
    model = dlrm_model("heavy0-r2", tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling,
                                                         zipf_alpha=t.zipf_alpha) for t in tables))
    path = tmp_path / "heavy0.yaml"
    path.write_text(yaml.safe_dump(model.model_dump(mode="json")))
    args = ["--model", str(path), "--cluster", "local-cpu", "--num-gpus", "2", "--micro-batch", "32",
            "--precision", "fp32", "--sharder", "size-lookup-greedy"]
    roofline = _predict(*args)["iteration_time_s"]
    profiled = _predict(*args, "--costs", "profiled", "--db", str(db))["iteration_time_s"]
    spec = load_model(str(path))
    assert isinstance(spec, DlrmSpec)
    cluster = load_cluster("local-cpu").with_num_gpus(2)
    plan = shard(tables_from_spec(spec.tables), "size-lookup-greedy", 2,
                 cap_bytes=MEMORY_CAP_FRACTION * cluster.device.hbm_bytes, ranks_per_node=1)
    sjob = sharded_job(spec, plan, cluster, 32, precision="fp32")
    direct = estimate_sharded(sjob.job, sjob.graph, plan, "analytical", make_pricer("profiled", db))
    assert profiled == direct.iteration_time_s != roofline


def test_sharded_predict_refuses_what_it_cannot_take() -> None:
    base = ["predict", "--model", "dlrm-mlperf-terabyte", "--cluster", "dgx-h100-80gb", "--num-gpus", "8",
            "--micro-batch", "512", "--sharder", "naive"]
    for extra, field in ((["--task-level", "op"], "task_level"), (["--stack", "megatron"], "stack")):
        out = runner.invoke(app, [*base, *extra])
        assert out.exit_code == 2 and field in out.output, out.output
