"""Flatten and check an ExecGraph into plain lists indexed by tid, the layout the engine's hot loop reads.

A *flow* is what progresses as one unit: a single task, or a collective (every task sharing a sync_key),
represented by its leader, the member with the lowest tid. Per-flow fields live at the leader's index.
"""

import math

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph

STREAMS = ("compute", "feature", "gradient")
STREAM_INDEX = {name: index for index, name in enumerate(STREAMS)}
NUM_STREAMS = len(STREAMS)


class GraphArrays:
    """Per-task lists (tid-indexed) and per-flow data of one ExecGraph, checked."""

    __slots__ = ("alloc_bytes", "categories", "category_of", "device_of", "flow_resources", "free_bytes", "is_compute",
                 "leader_of", "members", "names", "num_deps", "num_devices", "num_tasks", "priority",
                 "resource_capacity", "resource_names", "stream_of", "successors", "work")

    def __init__(self, graph: ExecGraph, launch_overhead_s: float) -> None:
        tasks = graph.tasks
        n = len(tasks)
        self.num_tasks = n
        self.num_devices = len(graph.devices)
        for index, device in enumerate(graph.devices):
            if device.index != index:
                raise ConfigError(f"devices[{index}].index", device.index, f"must equal its position {index}")
        self.names = [t.name for t in tasks]
        self.device_of = [t.device for t in tasks]
        self.is_compute = [t.kind == "compute" for t in tasks]
        self.work = [t.duration_s + launch_overhead_s if t.kind == "compute" else t.duration_s for t in tasks]
        self.priority = [t.priority for t in tasks]
        self.alloc_bytes = [t.alloc_bytes for t in tasks]
        self.free_bytes = [t.free_bytes for t in tasks]
        self.num_deps = [len(t.deps) for t in tasks]
        self.stream_of = self._streams(graph)
        self.successors = self._successors(graph)
        self.categories: list[str] = []
        self.category_of = self._categories(graph)
        self.resource_names: list[str] = []
        self.resource_capacity: list[float] = []
        self.leader_of: list[int] = [-1] * n
        self.members: dict[int, list[int]] = {}
        self.flow_resources: dict[int, tuple[int, ...]] = {}
        self._flows(graph)

    def _streams(self, graph: ExecGraph) -> list[int]:
        out = [0] * self.num_tasks
        num_devices = self.num_devices
        for tid, task in enumerate(graph.tasks):
            if task.tid != tid:
                raise ConfigError(f"tasks[{tid}].tid", task.tid, f"must equal its position {tid}")
            if not 0 <= task.device < num_devices:
                raise ConfigError(f"task {task.name!r}.device", task.device,
                                  f"must be a simulated device 0..{num_devices - 1}")
            if not (task.duration_s >= 0.0 and math.isfinite(task.duration_s)):
                raise ConfigError(f"task {task.name!r}.duration_s", task.duration_s, "must be finite and >= 0")
            stream = STREAM_INDEX.get(task.stream)
            if stream is None:
                raise ConfigError(f"task {task.name!r}.stream", task.stream, f"choose one of: {', '.join(STREAMS)}")
            out[tid] = task.device * NUM_STREAMS + stream
        return out

    def _successors(self, graph: ExecGraph) -> list[list[int]]:
        n = self.num_tasks
        succ: list[list[int]] = [[] for _ in range(n)]
        for tid, task in enumerate(graph.tasks):
            for dep in task.deps:
                if not 0 <= dep < n or dep == tid:
                    raise ConfigError(f"task {task.name!r}.deps", dep, f"must name another task 0..{n - 1}")
                succ[dep].append(tid)
        return succ

    def _categories(self, graph: ExecGraph) -> list[int]:
        index: dict[str, int] = {}
        out = [-1] * self.num_tasks
        for tid, task in enumerate(graph.tasks):
            if task.category:
                out[tid] = index.setdefault(task.category, len(index))
        self.categories = list(index)
        return out

    def _flows(self, graph: ExecGraph) -> None:
        """Group collectives by sync_key and give every comm flow its resources (union over its members)."""
        res_index: dict[str, int] = {}
        groups: dict[str, list[int]] = {}
        for tid, task in enumerate(graph.tasks):
            if task.sync_key:
                groups.setdefault(task.sync_key, []).append(tid)
            if task.resources and task.kind == "comm" and not task.sync_key:
                self.flow_resources[tid] = tuple(res_index.setdefault(r, len(res_index)) for r in task.resources)
        for key, members in groups.items():
            leader = members[0]
            seen_streams: set[int] = set()
            resources: dict[int, None] = {}
            for tid in members:
                if self.stream_of[tid] in seen_streams:
                    raise ConfigError(f"task {graph.tasks[tid].name!r}.sync_key", key,
                                      "two ranks of one collective cannot share a device's stream")
                seen_streams.add(self.stream_of[tid])
                self.leader_of[tid] = leader
                for r in graph.tasks[tid].resources if graph.tasks[tid].kind == "comm" else ():
                    resources[res_index.setdefault(r, len(res_index))] = None
            self.members[leader] = members
            # NB: the collective progresses as one unit, so it does the largest member's work.
            self.work[leader] = max(self.work[tid] for tid in members)
            if resources:
                self.flow_resources[leader] = tuple(resources)
        self.resource_names = list(res_index)
        self.resource_capacity = [graph.resource_capacity.get(name, 1.0) for name in self.resource_names]
        for name, capacity in zip(self.resource_names, self.resource_capacity, strict=True):
            if not (capacity > 0.0 and math.isfinite(capacity)):
                raise ConfigError(f"resource_capacity[{name!r}]", capacity, "must be finite and > 0")
