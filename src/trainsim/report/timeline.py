"""The simulated iteration of a Result as plain data (the `timeline` of `predict --json` with an engine that
simulates): what the HTML report draws, so a saved JSON file renders the same pictures as the run that made it.

    {"makespan_s": ..., "devices": [{"index", "name", "stage", "ranks", "capacity_bytes", "breakdown_at_peak"}],
     "tasks": [{"device", "stream", "name", "category", "phase", "micro_batch", "start_s", "end_s", "critical"}],
     "memory": [{"device", "time_s": [...], "bytes": [...]}]}

Times in seconds from the start of the iteration, memory in bytes. A task is listed once per simulated
device (a simulated device stands for every rank of its pipeline stage).
"""

from typing import Any

from trainsim.estimate.result import Timeline

# A memory timeline longer than this is thinned to the running maximum of each of MAX_MEMORY_POINTS windows,
# so the peak survives and the JSON stays small for op-level simulations.
MAX_MEMORY_POINTS = 4000


def timeline_to_dict(timeline: Timeline) -> dict[str, Any]:
    graph, outcome = timeline.exec_graph, timeline.outcome
    critical = set(outcome.critical_path)
    peaks = {memory.device: memory.breakdown_at_peak for memory in outcome.memory}
    devices = [{"index": device.index, "name": timeline.device_names[device.index], "stage": device.stage,
                "ranks": device.ranks, "capacity_bytes": device.capacity_bytes,
                "breakdown_at_peak": dict(peaks.get(device.index, device.static_breakdown))}
               for device in graph.devices]
    tasks = [{"device": task.device, "stream": task.stream, "name": task.name, "category": task.category or task.kind,
              "phase": task.phase,
              "micro_batch": task.micro_batch if task.micro_batch >= 0 else None,  # None: of no one micro-batch
              "start_s": outcome.start_s[task.tid],
              "end_s": outcome.end_s[task.tid], "critical": task.tid in critical}
             for task in graph.tasks]
    memory = []
    for device_memory in outcome.memory:
        times, values = _thinned(device_memory.timeline_s, device_memory.timeline_bytes)
        memory.append({"device": device_memory.device, "time_s": times, "bytes": values})
    return {"makespan_s": outcome.makespan_s, "devices": devices, "tasks": tasks, "memory": memory}


def _thinned(times: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    if len(times) <= MAX_MEMORY_POINTS:
        return list(times), list(values)
    step = -(-len(times) // MAX_MEMORY_POINTS)
    kept_t, kept_v = [], []
    for start in range(0, len(times), step):
        window = values[start:start + step]
        top = max(range(len(window)), key=window.__getitem__)
        kept_t.append(times[start + top])
        kept_v.append(window[top])
    return kept_t, kept_v
