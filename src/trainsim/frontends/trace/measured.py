"""What a traced run measured, as the OpGraph's MeasuredTrace: the per-rank execution traces (with their Kineto
traces for measured durations) lowered to one ExecGraph, with each rank's measured step and start offset.

After Lin et al.'s multi-GPU model: the replay keeps each rank's measured op durations
and program order. start_offsets="measured" starts each rank where its step started relative to the earliest
rank (the skew the trace shows); "zero" starts all ranks together.
"""

import math
from collections.abc import Sequence
from pathlib import Path

from trainsim.errors import ConfigError
from trainsim.frontends.trace.load import load_execution_traces
from trainsim.frontends.trace.rank_trace import RankTrace
from trainsim.frontends.trace.to_exec_graph import StartOffsets, to_exec_graph
from trainsim.ir.graph import MeasuredTrace


def measured_trace(traces: Sequence[RankTrace], *, start_offsets: StartOffsets = "measured",
                   kineto_paths: object = None) -> MeasuredTrace:
    """The MeasuredTrace of loaded rank traces (sorted by rank); every rank needs its Kineto trace.
    kineto_paths: only named in the error when a rank has none."""
    windows = [trace.step_window_s() for trace in traces]
    if not windows or any(math.isnan(start) for start, _ in windows):
        raise ConfigError("kineto_paths", kineto_paths, "trace replay needs the Kineto trace of every rank "
                          "(measured durations)")
    origin = min(start for start, _ in windows)
    offsets = tuple(start - origin if start_offsets == "measured" else 0.0 for start, _ in windows)
    return MeasuredTrace(exec_graph=to_exec_graph(traces, start_offsets=start_offsets),
                         ranks=tuple(trace.rank for trace in traces),
                         measured_step_s=tuple(end - start for start, end in windows), start_offset_s=offsets)


def measured_trace_files(paths: Sequence[str | Path], kineto_paths: Sequence[str | Path | None] | None = None, *,
                         start_offsets: StartOffsets = "measured") -> MeasuredTrace:
    """The MeasuredTrace of execution-trace files (one per rank) and their Kineto traces."""
    traces = load_execution_traces(paths, kineto_paths)
    return measured_trace(traces, start_offsets=start_offsets, kineto_paths=kineto_paths)
