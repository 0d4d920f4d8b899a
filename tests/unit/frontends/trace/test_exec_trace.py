"""The execution-trace front-end and the L3 trace replay: the committed 2-rank gloo DDP traces
(scripts/capture_ddp_trace.py) and hand-made tiny traces with exact replay times."""

import gzip
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import EXEC_TRACES, REPO_DIR
from trainsim.catalog import load_cluster
from trainsim.errors import ConfigError, InputFileError
from trainsim.estimate.engines import make_engine
from trainsim.estimate.replay import replay_exec_graph, replay_measured
from trainsim.frontends.registry import FRONTENDS
from trainsim.frontends.trace.load import (
    Collective,
    RankTrace,
    TraceOp,
    check_collectives,
    collective_groups,
    find_trace_files,
    graph_from_trace_files,
    load_execution_traces,
    load_trace_directory,
    to_exec_graph,
)
from trainsim.frontends.trace.measured import measured_trace_files
from trainsim.frontends.trace.to_exec_graph import collective_duration
from trainsim.job import make_job
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.parallel import ParallelSpec

FIXTURES = EXEC_TRACES
HIDDEN, LAYERS = 256, 3  # scripts/capture_ddp_trace.py


@pytest.fixture(scope="module")
def ddp() -> list[RankTrace]:
    return load_trace_directory(FIXTURES)


def _collective(op: TraceOp) -> Collective:
    assert op.collective is not None
    return op.collective


# ---- the captured DDP traces -----------------------------------------------------------------------------------
def test_parse_both_ranks(ddp: list[RankTrace]) -> None:
    assert [t.rank for t in ddp] == [0, 1]
    for trace in ddp:
        assert trace.world_size == 2 and trace.host
        assert len(trace.ops) == 304
        top = trace.top_level()
        assert len(top) == 66
        names = [op.name for op in top]
        assert names.count("aten::linear") == LAYERS + 1 and names.count("AddmmBackward0") == LAYERS + 1
        assert names.count("c10d::allreduce_") == 3 and names[-1] == "aten::_foreach_add_"
        phases = [op.phase for op in top]
        assert phases[:10] == ["fwd"] * 10 and phases[-1] == "optimizer" and phases.count("bwd") == 55
        assert sum(op.measured for op in trace.ops.values()) >= 300  # all but the trace's root records
        assert trace.ops[trace.step].name.startswith("ProfilerStep#")
        start, end = trace.step_window_s()
        assert 1e-3 < end - start < 1.0
        linear = next(op for op in top if op.name == "aten::linear")
        assert [t.shape for t in linear.inputs] == [(64, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN,)]
        assert linear.inputs[0].dtype == "float32" and linear.outputs[0].shape == (64, HIDDEN)
        assert trace.descendants(linear) and all(trace.ops[c].parent == linear.node_id for c in linear.children)
    assert "ProfilerStep" not in ddp[0].pretty() and "c10d::allreduce_" in ddp[0].pretty(limit=100)


def test_collectives_match_across_ranks(ddp: list[RankTrace]) -> None:
    assert check_collectives(ddp) == []
    groups = collective_groups(ddp)
    assert sorted(groups) == ["0#0", "0#1", "0#2"]
    for members in groups.values():
        assert sorted(rank for rank, _ in members) == [0, 1]
        for _, op in members:
            collective = _collective(op)
            assert collective.kind == "all-reduce" and collective.pg_name == "0"
            assert collective.is_async and collective.exec_duration_s > 0
            assert op.phase == "bwd"
    # one bucket per layer: the last layer's (and the output layer's) gradients first
    sizes = [_collective(groups[key][0][1]).nbytes for key in sorted(groups)]
    assert sizes == [4.0 * (HIDDEN * HIDDEN + HIDDEN + HIDDEN + 1), 4.0 * (HIDDEN * HIDDEN + HIDDEN),
                     4.0 * (HIDDEN * HIDDEN + HIDDEN)]


def test_exec_graph_builds_and_simulates_without_deadlock(ddp: list[RankTrace]) -> None:
    graph = to_exec_graph(ddp)
    assert len(graph.devices) == 2
    comms = [t for t in graph.tasks if t.kind == "comm"]
    assert len(comms) == 6 and {t.stream for t in comms} == {"gradient"} and {t.category for t in comms} == {"dp_comm"}
    outcome = simulate(graph)
    assert all(end >= 0.0 for end in outcome.end_s)
    for key in {t.sync_key for t in comms}:
        a, b = (t.tid for t in comms if t.sync_key == key)
        assert outcome.start_s[a] == outcome.start_s[b] and outcome.end_s[a] == outcome.end_s[b]
    # DDP copies the reduced buckets back into the gradients: those copies wait for the all-reduces
    waiting = [t for t in graph.tasks if any(graph.tasks[d].kind == "comm" for d in t.deps)]
    assert len(waiting) >= 6
    assert {t.category for t in graph.tasks} == {"compute", "overhead", "dp_comm", "optimizer"}


def test_replay_is_close_to_the_measured_step() -> None:
    traces, kinetos = find_trace_files(FIXTURES)
    outcome, summary = replay_measured(measured_trace_files(traces, kinetos))
    # measured on the 2-core development machine while other work ran: 8.541 ms (rank 0) and 6.926 ms (rank 1)
    assert summary.measured_step_s == pytest.approx((8.541e-3, 6.926e-3), abs=1e-6)
    assert abs(summary.error) < 0.10, summary.pretty()
    assert summary.replayed_iteration_s == pytest.approx(8.055e-3, rel=0.01)
    assert summary.collectives == 3 and outcome.makespan_s > 0
    assert set(summary.critical_path_s) <= {"compute", "overhead", "dp_comm", "optimizer"}
    _, together = replay_measured(measured_trace_files(traces, kinetos, start_offsets="zero"))
    assert abs(together.error) < 0.20 and together.start_offset_s == (0.0, 0.0)
    assert "error" in summary.pretty()


def test_measured_trace_is_what_replay_replays() -> None:
    traces, kinetos = find_trace_files(FIXTURES)
    for offsets in ("measured", "zero"):
        measured = measured_trace_files(traces, kinetos, start_offsets=offsets)
        _, from_measured = replay_exec_graph(measured.exec_graph, measured.measured_step_s, ranks=measured.ranks,
                                             start_offset_s=measured.start_offset_s)
        _, replayed = replay_measured(measured)
        assert from_measured == replayed
    with pytest.raises(ConfigError, match="Kineto"):
        measured_trace_files(traces)


def test_the_replay_engine_answers_predict_with_a_result() -> None:
    """Trace replay is a peer of the other engines: the trace front-end's graph in, a Result out, whose
    iteration is the replayed one and whose breakdown adds up to it."""
    frontend = FRONTENDS.get("trace")
    source = str(FIXTURES)
    spec = frontend.model_spec(source)
    job = make_job(spec, load_cluster("local-cpu").with_num_gpus(2), ParallelSpec(micro_batch=64, seq_len=1))
    probe = frontend.graph(source, job)
    result = make_engine("replay").estimate(job, probe)
    assert probe.measured is not None
    _, comparison = replay_measured(probe.measured, SimOptions())
    assert result.engine == "replay" and result.iteration_time_s == pytest.approx(comparison.replayed_iteration_s)
    assert sum(result.breakdown.values()) == pytest.approx(result.iteration_time_s)
    assert result.timeline is not None and result.timeline.device_names == ("rank 0", "rank 1")
    assert any("trace replay of 2 ranks" in note for note in result.notes)
    with pytest.raises(ConfigError, match="replays measured execution traces"):
        make_engine("replay").estimate(job, probe.__class__(probe.model_name, probe.layers,
                                                            probe.tokens_per_micro_batch,
                                                            probe.samples_per_micro_batch))


def test_op_graph_of_one_rank() -> None:
    graph = graph_from_trace_files(str(FIXTURES))
    params = LAYERS * (HIDDEN * HIDDEN + HIDDEN) + HIDDEN + 1
    assert graph.param_count() == params
    gemm = 2.0 * 64 * HIDDEN * HIDDEN
    matmul_fwd = sum(op.flops for layer in graph.layers for op in layer.fwd if op.kind == "matmul")
    assert matmul_fwd == pytest.approx(LAYERS * gemm + 2.0 * 64 * HIDDEN)
    # the first layer's input needs no gradient: its backward has the weight gradient alone
    matmul_bwd = sum(op.flops for layer in graph.layers for op in layer.bwd if op.kind == "matmul")
    assert matmul_bwd == pytest.approx((2 * LAYERS - 1) * gemm + 2 * 2.0 * 64 * HIDDEN)
    assert graph.samples_per_micro_batch == 64
    with pytest.raises(ConfigError):
        graph_from_trace_files(str(FIXTURES / "missing"))
    with pytest.raises(ConfigError):
        graph_from_trace_files(str(FIXTURES), rank=7)


def test_parsing_needs_no_torch() -> None:
    code = ("import sys; from trainsim.frontends.trace.load import load_trace_directory; "
            f"traces = load_trace_directory({str(FIXTURES)!r}); "
            "assert 'torch' not in sys.modules, 'torch was imported'; print(len(traces))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_without_kineto_there_are_no_times(ddp: list[RankTrace]) -> None:
    traces, _ = find_trace_files(FIXTURES)
    bare = load_execution_traces(traces)
    assert [t.rank for t in bare] == [0, 1]
    assert not any(op.measured for op in bare[0].ops.values())
    assert check_collectives(bare) == []
    assert len(bare[0].top_level()) == len(ddp[0].top_level())
    graph = to_exec_graph(bare)
    assert all(task.duration_s == 0.0 for task in graph.tasks)
    simulate(graph)
    with pytest.raises(ConfigError):
        measured_trace_files(traces)


# ---- hand-made traces: exact replay -------------------------------------------------------------------------
def _tensor(tensor_id: int, numel: int = 4) -> list[Any]:
    return [tensor_id, tensor_id, 0, numel, 4, "cpu"]


def _node(node_id: int, name: str, parent: int, rf: int, *, inputs: Sequence[Any] = (),
          outputs: Sequence[Any] = (), scalars: Sequence[Any] = (), scope: int = 0, seq: int = -1,
          tid: int = 1) -> dict[str, Any]:
    def block(tensors: list[Any], extra: list[Any]) -> dict[str, Any]:
        return {"values": [*tensors, *extra], "shapes": [[t[3]] for t in tensors] + [[] for _ in extra],
                "types": ["Tensor(float)"] * len(tensors) + ["Int" for _ in extra]}

    attrs = [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "scope", "type": "uint64", "value": scope},
             {"name": "seq_id", "type": "int64", "value": seq}, {"name": "tid", "type": "uint64", "value": tid}]
    return {"id": node_id, "name": name, "ctrl_deps": parent, "inputs": block(list(inputs), list(scalars)),
            "outputs": block(list(outputs), []), "attrs": attrs}


def _event(name: str, rf: int, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Record function id": rf}}


def _allreduce_rank(rank: int, mm_us: tuple[float, float], call_us: tuple[float, float],
                    exec_us: tuple[float, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """ProfilerStep (0-100 us): mm, an async all-reduce of mm's output, an add_ reading the reduced tensor.
    The gloo record opens inside the call and the add_ is nested under it, as real traces do."""
    nodes = [_node(1, "[pytorch|profiler|execution_trace|thread]", 1, 0, scope=7),
             _node(2, "ProfilerStep#1", 1, 1, scope=7),
             _node(3, "aten::mm", 2, 2, inputs=[_tensor(7), _tensor(8)], outputs=[_tensor(10)], seq=1),
             _node(4, "c10d::allreduce_", 2, 3, inputs=[_tensor(10)], outputs=[_tensor(10)]),
             _node(5, "gloo:all_reduce", 4, 4, inputs=[_tensor(10)], scope=7),
             _node(6, "aten::add_", 5, 5, inputs=[_tensor(10), _tensor(11)], outputs=[_tensor(10)])]
    events = [_event("ProfilerStep#1", 1, 0.0, 100.0), _event("aten::mm", 2, mm_us[0], mm_us[1] - mm_us[0]),
              _event("c10d::allreduce_", 3, call_us[0], call_us[1] - call_us[0]),
              _event("gloo:all_reduce", 4, exec_us[0], exec_us[1] - exec_us[0], tid=2),
              _event("aten::add_", 5, 82.0, 8.0)]
    et = {"schema": "1.1.1-chakra.0.0.4", "nodes": nodes}
    kineto = {"traceEvents": events, "host_name": "box", "distributedInfo": {"rank": rank, "world_size": 2}}
    return et, kineto


def _write(tmp_path: Path, name: str, data: dict[str, Any], compress: bool = False) -> Path:
    path = tmp_path / (name + (".gz" if compress else ""))
    if compress:
        with gzip.open(path, "wt") as handle:
            json.dump(data, handle)
    else:
        path.write_text(json.dumps(data))
    return path


def _two_ranks(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    et0, k0 = _allreduce_rank(0, (10.0, 30.0), (30.0, 35.0), (36.0, 80.0))  # waits for rank 1
    et1, k1 = _allreduce_rank(1, (10.0, 60.0), (60.0, 65.0), (66.0, 80.0))  # arrives last
    ets = [_write(tmp_path, "rank0.et.json", et0, compress=True), _write(tmp_path, "rank1.et.json", et1)]
    kinetos = [_write(tmp_path, "rank0.kineto.json", k0, compress=True), _write(tmp_path, "rank1.kineto.json", k1)]
    return ets, kinetos


def test_tiny_allreduce_replays_exactly(tmp_path: Path) -> None:
    ets, kinetos = _two_ranks(tmp_path)
    traces = load_execution_traces(ets, kinetos)
    for trace in traces:
        add = trace.ops[6]
        assert add.parent == 2  # moved out of the gloo record and the c10d call it was nested under
        assert [op.name for op in trace.top_level()] == ["aten::mm", "c10d::allreduce_", "aten::add_"]
        assert add.phase == "fwd"
    graph = to_exec_graph(traces)
    comms = [t for t in graph.tasks if t.kind == "comm"]
    # transfer: the last rank's start (66 us) to the first rank's end (80 us)
    assert [t.duration_s for t in comms] == pytest.approx([14e-6, 14e-6])
    outcome, summary = replay_exec_graph(graph, [100e-6, 100e-6], start_offset_s=[0.0, 0.0])
    # rank 1's call ends at 65 us -> the collective runs 65-79 -> host gap 2 -> add_ 81-89 -> step tail 10
    for tid in (t.tid for t in comms):
        assert outcome.start_s[tid] == pytest.approx(65e-6) and outcome.end_s[tid] == pytest.approx(79e-6)
    assert summary.replayed_step_s == pytest.approx((99e-6, 99e-6))
    assert summary.error == pytest.approx(-0.01)
    assert summary.critical_path_s["comm"] == pytest.approx(14e-6)  # outside a backward pass: feature stream
    _, via_files = replay_measured(measured_trace_files(ets, kinetos))
    assert via_files.replayed_step_s == pytest.approx((99e-6, 99e-6))


def test_collective_duration_rules() -> None:
    assert collective_duration([(36.0, 44.0), (66.0, 14.0)], shared_clock=True) == 14.0
    assert collective_duration([(0.0, 44.0), (5.0, 14.0)], shared_clock=False) == 14.0
    assert collective_duration([(0.0, 50.0), (90.0, 20.0)], shared_clock=True) == 20.0  # clocks disagree
    assert collective_duration([(0.0, 7.0)], shared_clock=True) == 7.0


def test_missing_collective_is_reported(tmp_path: Path) -> None:
    et0, _ = _allreduce_rank(0, (10.0, 30.0), (30.0, 35.0), (36.0, 80.0))
    et1, _ = _allreduce_rank(1, (10.0, 60.0), (60.0, 65.0), (66.0, 80.0))
    et1["nodes"] = [n for n in et1["nodes"] if n["id"] not in (4, 5)]
    traces = load_execution_traces([_write(tmp_path, "rank0.et.json", et0), _write(tmp_path, "rank1.et.json", et1)])
    problems = check_collectives(traces)
    assert len(problems) == 1 and "default#0" in problems[0] and "[0]" in problems[0]


def test_point_to_point_pairs_send_with_recv(tmp_path: Path) -> None:
    step = [_node(1, "ProfilerStep#1", 1, 1, scope=7)]
    send = _node(2, "c10d::send", 1, 2, inputs=[_tensor(5, 1024)], scalars=[1, 0])
    recv = _node(2, "c10d::recv_", 1, 2, inputs=[_tensor(6, 1024)], scalars=[0, 0])
    paths = [_write(tmp_path, "rank0.et.json", {"nodes": [*step, send]}),
             _write(tmp_path, "rank1.et.json", {"nodes": [*step, recv]})]
    traces = load_execution_traces(paths)
    keys = [_collective(t.collectives()[0]).sync_key for t in traces]
    assert keys == ["default:0->1:p2p#0", "default:0->1:p2p#0"]
    assert [_collective(t.collectives()[0]).peer for t in traces] == [1, 0]
    assert check_collectives(traces) == []
    graph = to_exec_graph(traces)
    assert [t.stream for t in graph.tasks if t.kind == "comm"] == ["compute", "compute"]  # synchronous
    simulate(graph)


def test_kineto_events_without_rf_ids_match_by_name_and_order(tmp_path: Path) -> None:
    et, kineto = _allreduce_rank(0, (10.0, 30.0), (30.0, 35.0), (36.0, 80.0))
    for event in kineto["traceEvents"]:
        del event["args"]["Record function id"]
        event["args"]["External id"] = 1
    kineto["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": 12.0, "dur": 6.0,
                                  "args": {"External id": 1}})
    (trace,) = load_execution_traces([_write(tmp_path, "rank0.et.json", et)],
                                     [_write(tmp_path, "rank0.kineto.json", kineto)])
    assert trace.ops[3].duration_s == pytest.approx(20e-6)
    assert trace.ops[3].device_duration_s == pytest.approx(6e-6)
    assert trace.step_window_s() == pytest.approx((0.0, 100e-6))


def test_bad_inputs_fail_loudly(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.et.json"
    bad.write_text("{not json")
    with pytest.raises(InputFileError):
        load_execution_traces([bad])
    bad.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(InputFileError, match="nodes"):
        load_execution_traces([bad])
    with pytest.raises(ConfigError):
        load_execution_traces([])
    with pytest.raises(ConfigError):
        load_execution_traces([bad], [None, None])
    with pytest.raises(ConfigError):
        find_trace_files(_empty(tmp_path))
    ets, _ = _two_ranks(tmp_path)
    with pytest.raises(ConfigError, match="one trace per rank"):
        load_execution_traces([ets[1], ets[1]])
    with pytest.raises(ConfigError):
        to_exec_graph([])
    with pytest.raises(ConfigError):
        to_exec_graph(load_execution_traces(ets), start_offsets="late")  # type: ignore[arg-type]


def _empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_replay_options_pass_through(tmp_path: Path) -> None:
    ets, kinetos = _two_ranks(tmp_path)
    graph = to_exec_graph(load_execution_traces(ets, kinetos), cpu_gaps=False)
    assert all("gap" not in t.name and "tail" not in t.name for t in graph.tasks)
    _, summary = replay_exec_graph(graph, [100e-6, 100e-6], options=SimOptions(launch_overhead_s=1e-6))
    assert summary.replayed_iteration_s < 100e-6 and not math.isnan(summary.error)
    with pytest.raises(ConfigError):
        replay_exec_graph(graph, [100e-6])


@pytest.mark.skipif(not os.environ.get("TRAINSIM_CAPTURE"), reason="runs 2-rank DDP; set TRAINSIM_CAPTURE=1")
def test_capture_script_writes_both_ranks(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = REPO_DIR / "scripts" / "capture_ddp_trace.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--gzip"], check=True, timeout=300)
    traces = load_trace_directory(tmp_path)
    assert [t.rank for t in traces] == [0, 1] and check_collectives(traces) == []
