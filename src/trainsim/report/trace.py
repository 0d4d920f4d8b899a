"""Chrome / Perfetto trace-event JSON of one simulated iteration (open it in ui.perfetto.dev or chrome://tracing).

Naming scheme (the trace-event format: Trace Event Format, Google, 2016 revision):
- a process per simulated device, named by the engine ("stage S (N ranks)": a simulated device stands for the
  N identical ranks of pipeline stage S); its threads are its streams: "compute", "feature comm" (tensor-,
  context-, expert- and pipeline-parallel transfers), "gradient comm" (data-parallel collectives);
- a complete event ("X") per task, named as the compiler names it (layer, phase and micro-batch: "L6.block bwd",
  "send act mb0 vs0->"), its category the breakdown key it counts under (compute, tp_comm, pp_comm, ...), its
  args the layer, micro-batch, stage, phase, category, kind, sync key and whether it is on the critical path;
- a "sync wait: NAME" event (category sync_wait) while a collective rank holds its stream waiting for partners;
- flow arrows ("s" then "f", binding to the enclosing slices): category "pipeline", named "pp transfer", from a
  task to the task on another simulated device that depends on it (a pipeline send to the stage that waits
  for it); category "collective", named "collective KEY", from the first participant of a collective seen
  from several simulated devices to each other participant;
- a counter ("C") named "memory" per device: allocated bytes.
Times are microseconds, as the format requires; they are rounded to whole nanoseconds so that consecutive
tasks on one stream touch but never overlap.
"""

import json
from pathlib import Path
from typing import Any

from trainsim.catalog.files import write_atomic
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph
from trainsim.sim.arrays import STREAMS
from trainsim.sim.outcome import SimOutcome

_THREAD_NAMES = {"compute": "compute", "feature": "feature comm", "gradient": "gradient comm"}
_THREAD_ID = {name: index + 1 for index, name in enumerate(STREAMS)}
_MEMORY_THREAD = 0


def _us(seconds: float) -> float:
    return round(seconds * 1e9) / 1e3


def trace_events(graph: ExecGraph, outcome: SimOutcome, device_names: list[str] | None = None) -> list[dict[str, Any]]:
    """The trace events, metadata first, then tasks in tid order, then memory counters."""
    if device_names is not None and len(device_names) != len(graph.devices):
        raise ConfigError("device_names", len(device_names), f"must name all {len(graph.devices)} simulated devices")
    events: list[dict[str, Any]] = []
    for device in graph.devices:
        name = (device_names[device.index] if device_names else
                f"device {device.index} (stage {device.stage}, {device.ranks} ranks)")
        events.append({"ph": "M", "name": "process_name", "pid": device.index, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": device.index, "tid": 0,
                       "args": {"sort_index": device.index}})
        for stream, thread in _THREAD_ID.items():
            events.append({"ph": "M", "name": "thread_name", "pid": device.index, "tid": thread,
                           "args": {"name": _THREAD_NAMES[stream]}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": device.index, "tid": thread,
                           "args": {"sort_index": thread}})
    critical = set(outcome.critical_path)
    for task in graph.tasks:
        thread = _THREAD_ID[task.stream]
        start_ns = round(outcome.start_s[task.tid] * 1e9)
        end_ns = round(outcome.end_s[task.tid] * 1e9)
        dispatch_ns = round(outcome.dispatch_s[task.tid] * 1e9)
        if dispatch_ns < start_ns:
            events.append({"ph": "X", "name": f"sync wait: {task.name}", "cat": "sync_wait", "pid": task.device,
                           "tid": thread, "ts": dispatch_ns / 1e3, "dur": (start_ns - dispatch_ns) / 1e3,
                           "args": {"sync_key": task.sync_key}})
        events.append({"ph": "X", "name": task.name, "cat": task.category or task.kind, "pid": task.device,
                       "tid": thread, "ts": start_ns / 1e3, "dur": (end_ns - start_ns) / 1e3,
                       "args": {"layer": task.layer, "micro_batch": task.micro_batch, "stage": task.stage,
                                "phase": task.phase, "category": task.category, "kind": task.kind,
                                "sync_key": task.sync_key, "critical": task.tid in critical}})
    events += flow_events(graph, outcome)
    for memory in outcome.memory:
        for time_s, value in zip(memory.timeline_s, memory.timeline_bytes, strict=True):
            events.append({"ph": "C", "name": "memory", "pid": memory.device, "tid": _MEMORY_THREAD,
                           "ts": _us(time_s), "args": {"allocated_bytes": value}})
    return events


def flow_events(graph: ExecGraph, outcome: SimOutcome) -> list[dict[str, Any]]:
    """The flow arrows of the naming scheme: pipeline transfers across simulated devices, collective
    participation. An arrow starts inside its source slice (a transfer: at its middle; a collective, whose
    participants start together: at its start) and ends where its target starts."""
    arrows: list[tuple[str, str, int, int]] = []  # (category, name, source tid, target tid)
    for task in graph.tasks:
        for dep in task.deps:
            if graph.tasks[dep].device != task.device:
                arrows.append(("pipeline", "pp transfer", dep, task.tid))
    participants: dict[str, list[int]] = {}
    for task in graph.tasks:
        if task.sync_key:
            participants.setdefault(task.sync_key, []).append(task.tid)
    for key, tids in participants.items():
        if len({graph.tasks[tid].device for tid in tids}) > 1:
            arrows += [("collective", f"collective {key}", tids[0], other) for other in tids[1:]]
    events: list[dict[str, Any]] = []
    for flow_id, (category, name, source, target) in enumerate(arrows, start=1):
        src, dst = graph.tasks[source], graph.tasks[target]
        end_s = outcome.end_s[source] if category == "pipeline" else outcome.start_s[source]
        from_ns = round((outcome.start_s[source] + end_s) / 2 * 1e9)
        events.append({"ph": "s", "id": flow_id, "name": name, "cat": category, "pid": src.device,
                       "tid": _THREAD_ID[src.stream], "ts": from_ns / 1e3})
        events.append({"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": category, "pid": dst.device,
                       "tid": _THREAD_ID[dst.stream], "ts": round(outcome.start_s[target] * 1e9) / 1e3})
    return events


def write_chrome_trace(graph: ExecGraph, outcome: SimOutcome, path: str | Path,
                       device_names: list[str] | None = None) -> Path:
    """Write {"traceEvents": [...]} to `path` atomically (a temporary file in the same folder, then os.replace)."""
    target = Path(path)
    document = {"traceEvents": trace_events(graph, outcome, device_names), "displayTimeUnit": "ms",
                "otherData": {"makespan_s": outcome.makespan_s, "oom": outcome.oom}}
    write_atomic(target, json.dumps(document, separators=(",", ":")))
    return target
