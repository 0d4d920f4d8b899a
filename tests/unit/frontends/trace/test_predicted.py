"""Predictive simulation of execution traces (frontends.trace.predicted): kernel models, host overheads, the
predicted graph's durations and structure."""

import math

import pytest

from conftest import EXEC_TRACES
from trainsim.errors import ConfigError
from trainsim.estimate.trace_predict import iteration_s
from trainsim.frontends.trace.load import load_trace_directory
from trainsim.frontends.trace.predicted import (
    KernelModels,
    OpSample,
    deduct_profiler,
    dilate_traces,
    host_overheads,
    op_samples,
    op_work,
    predicted_trace_graph,
    profiler_op_s,
    recorded_per_op,
)
from trainsim.frontends.trace.to_exec_graph import to_exec_graph


def test_kernel_model_is_a_power_law_per_op() -> None:
    # linear: 1 us at 999 FLOPs (+1 = 1e3), 100 us at 999,999 (+1 = 1e6): t = 1e-6 * ((w + 1) / 1e3) ** (2/3)
    models = KernelModels.fit([OpSample("aten::linear", 999.0, 1e-6), OpSample("aten::linear", 999_999.0, 1e-4),
                               OpSample("aten::relu", 10.0, 3e-6), OpSample("aten::relu", 10.0, 5e-6)])
    assert models.seconds("aten::linear", 31_622.0) == pytest.approx(1e-6 * (31_623 / 1e3) ** (2 / 3))
    assert models.seconds("aten::relu", 1e9) == pytest.approx(math.sqrt(15) * 1e-6)  # one work: geometric mean
    assert models.seconds("aten::gelu", 1.0) == pytest.approx(4e-6)  # never seen: the median of all samples
    with pytest.raises(ConfigError):
        KernelModels.fit([])


def test_predicted_graph_keeps_the_structure_and_prices_every_task() -> None:
    traces = load_trace_directory(EXEC_TRACES)
    replay = to_exec_graph(traces, start_offsets="zero")
    kernels = KernelModels.fit(op_samples(traces))
    overheads = host_overheads([to_exec_graph(traces)])
    assert "start offset" not in overheads and overheads["step tail"] > 0.0
    graph = predicted_trace_graph(traces, kernels, overheads, lambda kind, nbytes, ranks: 1e-3 + nbytes / 1e9)
    assert [(t.name, t.deps, t.sync_key) for t in graph.tasks] == [(t.name, t.deps, t.sync_key) for t in replay.tasks]
    ops = [{op.node_id: op for op in trace.ops.values()} for trace in traces]
    for task in graph.tasks:
        node = task.name.rsplit("#", 1)[-1].split(" ")[0]
        op = ops[task.device].get(int(node)) if node.isdigit() else None
        if task.kind == "comm":
            assert op is not None and op.collective is not None
            assert task.duration_s == pytest.approx(1e-3 + op.collective.nbytes / 1e9)
        elif task.category != "overhead":
            assert op is not None
            assert task.duration_s == kernels.seconds(op.name, op_work(traces[task.device], op))
    assert 0.0 < iteration_s(graph) < math.inf


def test_recorded_ops_are_each_top_level_op_and_what_nests_under_it() -> None:
    trace = load_trace_directory(EXEC_TRACES)[0]
    recorded = recorded_per_op(trace)
    top = trace.top_level()
    assert set(recorded) == {op.node_id for op in top}
    for op in top:
        assert recorded[op.node_id] == op.measured + sum(d.measured for d in trace.descendants(op))


def test_profiler_cost_is_the_traced_step_beyond_the_untraced_iteration_per_recorded_op() -> None:
    trace = load_trace_directory(EXEC_TRACES)[0]
    assert trace.step >= 0
    recorded = sum(recorded_per_op(trace).values())
    step_s = trace.ops[trace.step].duration_s
    assert profiler_op_s([([trace], step_s - recorded * 20e-6)]) == pytest.approx(20e-6, rel=1e-9)
    assert profiler_op_s([([trace], step_s + 1.0)]) == 0.0  # an untraced iteration slower than the traced one
    with pytest.raises(ConfigError, match="ProfilerStep"):
        profiler_op_s([])


def test_deducting_the_profiler_shortens_op_tasks_only_and_never_below_zero() -> None:
    traces = load_trace_directory(EXEC_TRACES)
    recorded = [recorded_per_op(t) for t in traces]
    before = to_exec_graph(traces, start_offsets="zero")
    after = deduct_profiler(to_exec_graph(traces, start_offsets="zero"), traces, 1e-6)
    shortened = 0
    for b, a in zip(before.tasks, after.tasks, strict=True):
        node = b.name.rsplit("#", 1)[-1].split(" ")[0]
        if b.kind == "comm" or b.category == "overhead" or not node.isdigit():
            assert a.duration_s == b.duration_s
            continue
        assert a.duration_s == max(0.0, b.duration_s - recorded[b.device].get(int(node), 0) * 1e-6)
        shortened += a.duration_s < b.duration_s
    assert shortened > 0
    gone = deduct_profiler(to_exec_graph(traces, start_offsets="zero"), traces, 1.0)
    assert all(t.duration_s == 0.0 for t in gone.tasks
               if t.kind != "comm" and t.category != "overhead" and t.name.rsplit("#", 1)[-1].split(" ")[0].isdigit())


def test_dilating_the_traces_stretches_every_duration_and_the_replayed_iteration_alike() -> None:
    traces = load_trace_directory(EXEC_TRACES)
    replay = to_exec_graph(traces, start_offsets="zero")
    dilate_traces(traces, 1.5)
    stretched = to_exec_graph(traces, start_offsets="zero")
    assert [t.name for t in stretched.tasks] == [t.name for t in replay.tasks]
    for before, after in zip(replay.tasks, stretched.tasks, strict=True):
        # host gaps are differences of Kineto's absolute times (~4.8e6 s here, a double's step ~1e-9 s): a few
        # of those steps, far below the trace's 1 us resolution
        assert after.duration_s == pytest.approx(before.duration_s * 1.5, rel=1e-6, abs=5e-9)
    assert iteration_s(stretched) == pytest.approx(1.5 * iteration_s(replay), rel=1e-6)
    with pytest.raises(ConfigError, match="factor"):
        dilate_traces(traces, 0.0)
