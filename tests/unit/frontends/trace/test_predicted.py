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
    host_overheads,
    op_samples,
    op_work,
    predicted_trace_graph,
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
