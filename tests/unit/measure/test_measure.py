"""trainsim measure: the PyTorch model matches the IR, the harness runs real strategies on tiny models (every
strategy of one job reaches the same loss), a crashing or hanging rank fails fast with one line, results round
trip, and measured runs read back as runs.csv rows that rebuild their job."""

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import MEASURED_GPT, MEASURED_LLAMA, fake_run, tiny_job
from trainsim.catalog.model_files import parse_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.measure.launch import (
    FAULT_ENV,
    MeasureFailedError,
    UnsupportedJobError,
    check_supported,
    free_port,
    launch,
    make_spec,
)
from trainsim.measure.results import IterationStats, MeasuredRun, load_run, load_runs, measured_stack, save_run

RUNNER = CliRunner()
MEASURED_MOE: dict[str, Any] = {**MEASURED_GPT, "name": "tiny-moe", "num_experts": 4, "top_k": 1, "moe_every": 2}


def tspec(data: dict[str, Any]) -> TransformerSpec:
    spec = parse_model(data)
    assert isinstance(spec, TransformerSpec)
    return spec


# --- no torch needed ---


def test_iteration_stats_are_percentiles() -> None:
    stats = IterationStats.of([float(i) for i in range(1, 12)])
    assert (stats.median_s, stats.p10_s, stats.p90_s, stats.min_s, stats.max_s) == (6.0, 2.0, 10.0, 1.0, 11.0)


def test_results_round_trip(tmp_path: Path) -> None:
    run = fake_run()
    path = save_run(run, tmp_path)
    assert path.name == "r1.json" and not list(tmp_path.glob(".*tmp"))  # atomic: no temporary left behind
    data = json.loads(path.read_text())
    assert data["iteration_time_s"]["median_s"] == pytest.approx(0.115)
    assert data["tokens_per_s"] == pytest.approx(run.tokens_per_iteration / 0.115)
    back = load_run(path)
    assert back == run
    expected = tiny_job(2, dp=2)  # on the stack measure runs it with: DDP, buckets overlapped
    assert back.make_job() == dataclasses.replace(expected, stack=measured_stack(expected.parallel))
    assert back.make_job().stack.name == "ddp" and back.make_job().stack.grad_reduce_overlap
    assert load_runs(tmp_path) == [run]


def test_a_file_that_is_not_a_run_is_refused(tmp_path: Path) -> None:
    from trainsim.errors import InputFileError

    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(InputFileError, match="not a measured run"):
        load_runs(tmp_path)


@pytest.mark.parametrize(("job", "message"), [
    (lambda: tiny_job(2, cp=2), "cp=2 is not measured"),
    (lambda: tiny_job(1, precision="fp16"), "bf16 or amp-bf16"),
    (lambda: tiny_job(2, dp=2, precision="bf16"), "bf16 is measured on one rank"),
    (lambda: tiny_job(4, tp=2, dp=2), "FSDP2 only"),
    (lambda: tiny_job(2, model={**MEASURED_GPT, "vocab": 511}, tp=2), "vocab=511"),
    (lambda: tiny_job(2, pp=2, schedule="zb-h1", global_batch=4), "schedule=zb-h1"),
    (lambda: tiny_job(2, pp=2, global_batch=2), "at least pp micro-batches"),
    (lambda: tiny_job(2, model=MEASURED_MOE, tp=2), "tp=1 and zero<2 only"),
    (lambda: tiny_job(2, model=MEASURED_MOE, dp=2, zero=2), "tp=1 and zero<2 only"),
    (lambda: tiny_job(2, model=MEASURED_MOE, ep=2), "ep=2 is not measured"),
    (lambda: tiny_job(1, model={**MEASURED_MOE, "expert_ffn_hidden": 64}),
     "expert_ffn_hidden of tiny-moe is not built"),
    (lambda: tiny_job(1, model={**MEASURED_LLAMA, "mla": {"kv_lora_rank": 8, "qk_nope_head_dim": 8,
                                                          "qk_rope_head_dim": 8, "v_head_dim": 16}}),
     "mla of tiny-llama is not built"),
])
def test_unsupported_jobs_are_refused(job: Any, message: str) -> None:
    with pytest.raises(UnsupportedJobError, match=message):
        check_supported(job(), "cpu")


def test_cli_refuses_an_unsupported_job_with_one_line(tmp_path: Path) -> None:
    from trainsim.cli.main import app

    result = RUNNER.invoke(app, ["measure", "--model", "gpt3-125m", "--cp", "2", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cp=2 is not measured" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing started


def test_suite_lists_its_jobs_and_keeps_to_four_ranks() -> None:
    from trainsim.cli.main import app
    from trainsim.measure.suite import LOCAL_SUITE

    for job in LOCAL_SUITE:
        built = job.job()
        check_supported(built, "cpu")
        assert built.num_gpus <= 4
    result = RUNNER.invoke(app, ["measure", "--suite", "local", "--list"])
    assert result.exit_code == 0, result.output
    assert "gpt-dp2-pp2-fp32" in result.stdout and "llama-tp2-sp-bf16" in result.stdout


def test_measured_runs_read_back_as_rows_that_rebuild_the_job(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import trainsim.validate.runs as runs
    from trainsim.measure.suite import LOCAL_SUITE
    from trainsim.validate.measured import read_measured

    defaults = runs.row_defaults()
    patched = {**defaults, "cluster_for_gpu": {**defaults["cluster_for_gpu"], "cpu-local": "local-cpu"}}
    monkeypatch.setattr(runs, "row_defaults", lambda: patched)
    jobs = {j.name: j.job() for j in LOCAL_SUITE if j.name in ("gpt-tp2-sp-fp32", "llama-pp2-1f1b-bf16")}
    for name, job in jobs.items():
        save_run(fake_run(name, job), tmp_path)
    rows = read_measured(tmp_path)
    assert [(r.run_id, r.metric) for r in rows] == [
        ("gpt-tp2-sp-fp32", "iteration_time_s"), ("gpt-tp2-sp-fp32", "peak_memory_gib"),
        ("llama-pp2-1f1b-bf16", "iteration_time_s"), ("llama-pp2-1f1b-bf16", "peak_memory_gib")]
    assert rows[0].measured == pytest.approx(0.115) and rows[1].measured == pytest.approx(3.0)
    fields = rows[0].fields
    assert (fields["gpu"], fields["cluster"], fields["num_gpus"], fields["gpus_per_node"]) == \
        ("cpu-local", "local-cpu", "2", "2")
    assert (fields["tp"], fields["sp"], fields["precision"], fields["notes"]) == ("2", "1", "fp32", "")
    for row in rows[::2]:
        rebuilt = runs.job_from_row(row.fields)
        assert rebuilt.skipped is None and rebuilt.job is not None
        measured = jobs[row.run_id]
        assert rebuilt.job.parallel == measured.parallel
        same = {"name", "num_kv_heads"}
        assert rebuilt.job.model.model_dump(exclude=same) == measured.model.model_dump(exclude=same)
        assert rebuilt.job.model.kv_heads == measured.model.kv_heads  # type: ignore[union-attr]
        assert rebuilt.job.num_gpus == measured.num_gpus and rebuilt.job.cluster.num_nodes == 1


# --- PyTorch ---


def test_torch_model_has_the_parameters_of_the_op_graph() -> None:
    pytest.importorskip("torch")
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.measure.model import build_model, param_count
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.precision import policy_for

    for data in (MEASURED_GPT, MEASURED_LLAMA, {**MEASURED_GPT, "name": "tiny-bloom", "position": "alibi"}):
        spec = tspec(data)
        graph = build_graph(spec, DeviceSlice(1, 8, policy_for("bf16")))
        assert param_count(build_model(spec)) == graph.param_count()


def test_pipeline_chunks_compute_the_whole_model() -> None:
    torch = pytest.importorskip("torch")
    from trainsim.measure.model import build_chunk, build_model, split_layers

    for data in (MEASURED_GPT, MEASURED_LLAMA):
        spec = tspec({**data, "num_layers": 4})
        tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
        whole = build_model(spec, seed=3)(tokens)
        x = tokens
        for plan in split_layers(4, 4):
            x = build_chunk(spec, plan, seed=3)(x)
        torch.testing.assert_close(x, whole)


def test_moe_layers_get_experts_and_chunks_compute_the_whole_model() -> None:
    """With experts, every moe_every-th block's MLP is top-k experts, seeded with its layer: pipeline chunks of
    an MoE model compute what the whole model does (as the dense chunks do)."""
    torch = pytest.importorskip("torch")
    from trainsim.measure.model import MLP, MoE, build_chunk, build_model, split_layers

    spec = tspec({**MEASURED_MOE, "num_layers": 4})
    whole = build_model(spec, seed=3, experts=True)
    assert [type(whole.layers[str(i)].mlp) for i in range(4)] == [MLP, MoE, MLP, MoE]
    assert all(isinstance(block.mlp, MLP) for block in build_model(spec).layers.values())
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    x = tokens
    for plan in split_layers(4, 2):
        x = build_chunk(spec, plan, seed=3, experts=True)(x)
    torch.testing.assert_close(x, whole(tokens))


def _measure(job: Job, out: Path, timeout_s: float = 90.0, **kwargs: Any) -> MeasuredRun:
    spec = make_spec(job, out, iterations=2, warmup=1, timeout_s=timeout_s, **kwargs)
    return load_run(launch(spec, job.num_gpus))


def test_dp_and_pp_runs_measure_and_agree(tmp_path: Path) -> None:
    """dp=2, pp=2 (1F1B, two micro-batches) and dp=2 x pp=2 (four ranks, micro-batches of one) train the same
    model (GPT: the tied embedding crosses the pipeline) on the same global batch: the same loss."""
    pytest.importorskip("torch")
    dp = _measure(tiny_job(2, dp=2), tmp_path)
    pp = _measure(tiny_job(2, pp=2, global_batch=4), tmp_path)
    both = _measure(tiny_job(4, dp=2, pp=2, micro_batch=1, global_batch=4, schedule="gpipe"), tmp_path)
    for run in (dp, pp, both):
        assert len(run.iteration_times_s) == 2 and all(t > 0 for t in run.iteration_times_s)
        assert all(m > 2**20 for m in run.peak_memory_bytes)
        assert run.settings["backend"] == "gloo" and run.versions["torch"]
        # the training thread's CPU time is part of the process's (which adds gloo's and the sampler's threads)
        threads, process = run.settings["thread_cpu_s_per_rank"], run.settings["cpu_s_per_rank"]
        assert len(threads) == run.world_size and all(0 < t <= p + 1e-3 for t, p in zip(threads, process, strict=True))
        barriers = run.settings["barrier_cpu_s_per_rank"]  # the harness' barriers: part of the process' CPU time
        assert len(barriers) == run.world_size and all(0 <= b < p for b, p in zip(barriers, process, strict=True))
        assert dp.final_loss is not None and run.final_loss == pytest.approx(dp.final_loss, rel=1e-5)
    assert (dp.world_size, pp.world_size, both.world_size) == (2, 2, 4)
    assert {p.name for p in tmp_path.glob("*.json")} == {f"{r.run_id}.json" for r in (dp, pp, both)}


def test_moe_runs_measure_and_agree(tmp_path: Path) -> None:
    """An MoE model (experts on every rank) trains to the same loss data parallel and pipelined."""
    pytest.importorskip("torch")
    dp = _measure(tiny_job(2, model=MEASURED_MOE, dp=2), tmp_path)
    pp = _measure(tiny_job(2, model=MEASURED_MOE, pp=2, global_batch=4), tmp_path)
    assert dp.final_loss is not None and pp.final_loss == pytest.approx(dp.final_loss, rel=1e-5)
    assert all(len(run.iteration_times_s) == 2 for run in (dp, pp))


def test_moe_data_parallel_runs_when_an_expert_gets_no_token_on_a_rank(tmp_path: Path) -> None:
    """One token per rank, top 1 of 4 experts: three experts get no token on each rank, and DDP must not wait for
    their gradients (it failed so on the MoE job's even dp-4 split)."""
    pytest.importorskip("torch")
    run = _measure(tiny_job(2, model=MEASURED_MOE, dp=2, seq_len=1, micro_batch=1, global_batch=2), tmp_path)
    assert len(run.iteration_times_s) == 2 and run.final_loss is not None


def test_tensor_parallel_and_fsdp_agree(tmp_path: Path) -> None:
    """LLaMA (GQA, RoPE, SwiGLU) in bf16 autocast: tp=2 with sequence parallelism and FSDP2 (zero=3) on dp=2."""
    pytest.importorskip("torch")
    tp = _measure(tiny_job(2, MEASURED_LLAMA, tp=2, sp=True, global_batch=4, precision="amp-bf16"), tmp_path)
    fsdp = _measure(tiny_job(2, MEASURED_LLAMA, dp=2, zero=3, precision="amp-bf16"), tmp_path)
    assert tp.final_loss is not None and fsdp.final_loss == pytest.approx(tp.final_loss, rel=1e-2)


def _workers_alive(marker: str) -> list[int]:
    alive = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    alive.append(int(proc.name))
            except OSError:
                continue
    return alive


@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_a_failing_rank_fails_the_run_within_the_timeout(fault: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import time

    monkeypatch.setenv(FAULT_ENV, f"{fault}:1")
    # A crash is reported when it happens, so its run gets room for slow rank start-up on a loaded host; a hang
    # is only ever ended by the timeout, so that one is short.
    timeout_s = 60.0 if fault == "crash" else 8.0
    start = time.monotonic()
    with pytest.raises(MeasureFailedError) as caught:
        _measure(tiny_job(2, dp=2), tmp_path, timeout_s=timeout_s)
    message = str(caught.value)
    assert "\n" not in message
    if fault == "crash":
        assert "rank 1 failed: RuntimeError: injected crash on rank 1" in message
    else:
        assert f"did not finish within the timeout of {timeout_s:g} s" in message
        assert time.monotonic() - start < timeout_s + 15
    assert not list(tmp_path.glob("*.json"))
    assert not _workers_alive(str(tmp_path))  # every rank's process group is gone


def test_worker_runs_under_torchrun_environment(tmp_path: Path) -> None:
    """What torchrun does: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and start the worker module."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    (tmp_path / "model.yaml").write_text(json.dumps(MEASURED_GPT))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps({"model": str(tmp_path / "model.yaml"), "cluster": "local-cpu",
                                    "num_gpus": 1, "seq_len": 32, "micro_batch": 2, "precision": "amp-bf16"}))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # NB: as torchrun's caller would pick one (racy)
    env.pop(FAULT_ENV, None)
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "trainsim.measure.worker", "--job", str(job_file), "--out", str(out),
                    "--iterations", "2", "--warmup", "0", "--device", "cpu", "--run-id", "torchrun"],
                   env=env, check=True, timeout=120, capture_output=True)
    run = load_run(out / "torchrun.json")
    assert run.world_size == 1 and run.make_job().parallel.precision == "amp-bf16"


def test_the_suite_profiles_every_distinct_shape_once() -> None:
    from trainsim.profile.suite import suite_shapes

    shapes = suite_shapes("local")
    keys = [(model.name, shape.precision.name, shape.tp, shape.sp, shape.zero) for model, shape in shapes]
    assert len(keys) == len(set(keys))
    assert ("gpt-small", "fp32", 2, True, 0) in keys and ("llama-small", "amp-bf16", 1, False, 3) in keys
    assert ("gpt-small", "fp32", 1, False, 0) in keys  # dp, pp and recompute jobs share the 1-rank shapes
    assert all(shape.micro_batch == 4 and shape.seq_len == 128 for _, shape in shapes)


@pytest.mark.parametrize("impl", ["fused", "foreach", "loop"])
def test_measure_runs_the_adam_step_the_job_names(impl: str) -> None:
    torch = pytest.importorskip("torch")
    from trainsim.measure.parallelize import make_optimizer

    job = tiny_job(1, optimizer_impl=impl)
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(4))], job, None)  # type: ignore[arg-type]
    assert (optimizer.defaults["fused"], optimizer.defaults["foreach"]) == (impl == "fused", impl == "foreach")


def test_measure_defaults_to_torchs_own_adam_step_and_records_it() -> None:
    from trainsim.cli.measure import job_from_flags
    from trainsim.measure.suite import LOCAL_SUITE

    assert job_from_flags(None, {"dp": 2}).parallel.optimizer_impl == "loop"  # a CPU here
    assert job_from_flags(None, {"dp": 2, "optimizer_impl": "fused"}).parallel.optimizer_impl == "fused"
    assert {job.job().parallel.optimizer_impl for job in LOCAL_SUITE} == {"loop"}


def test_the_rendezvous_socket_is_bound_on_loopback_and_held() -> None:
    """Rank 0 inherits a socket that is already listening: nothing off the host can connect, and no other process
    can take the port between picking and binding it (issue 12)."""
    import socket

    from trainsim.measure.launch import _store_socket

    listener = _store_socket()
    try:
        host, port = listener.getsockname()
        assert host == "127.0.0.1" and port > 0 and listener.get_inheritable()
        with socket.create_connection((host, port), timeout=5):  # listening already: a peer connects at once
            pass
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # held: the port cannot be taken
    finally:
        listener.close()
