"""Flatten and check an ExecGraph into plain lists indexed by tid, the layout the engine's hot loop reads.

A *flow* is what progresses as one unit: a single task, or a collective (every task sharing a sync_key),
represented by its leader, the member with the lowest tid. Per-flow fields live at the leader's index.
"""

import math
from operator import contains

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph

STREAMS = ("compute", "feature", "gradient")
STREAM_INDEX = {name: index for index, name in enumerate(STREAMS)}
NUM_STREAMS = len(STREAMS)


class GraphArrays:
    """Per-task lists (tid-indexed) and per-flow data of one ExecGraph, checked."""

    __slots__ = ("alloc_bytes", "categories", "category_of", "device_of", "flow_resources", "free_bytes",
                 "has_flow_resources", "is_compute", "leader_of", "members", "names", "num_deps", "num_devices",
                 "num_tasks", "priority", "resource_capacity", "resource_names", "run_next", "stream_of", "successors",
                 "work")

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
        durations = [t.duration_s for t in tasks]
        self.work = [d + launch_overhead_s if c else d for d, c in zip(durations, self.is_compute, strict=True)]
        self.priority = [t.priority for t in tasks]
        self.alloc_bytes = [t.alloc_bytes for t in tasks]
        self.free_bytes = [t.free_bytes for t in tasks]
        deps = [t.deps for t in tasks]
        self.num_deps = list(map(len, deps))
        self.stream_of = self._streams(graph, durations)
        self.successors = self._successors(graph, deps)
        self.categories: list[str] = []
        self.category_of = self._categories(graph)
        self.resource_names: list[str] = []
        self.resource_capacity: list[float] = []
        self.leader_of: list[int] = [-1] * n
        self.members: dict[int, list[int]] = {}
        self.flow_resources: list[tuple[int, ...] | None] = [None] * n
        self.has_flow_resources = False
        self._flows(graph)
        self.run_next = self._runs()

    def _streams(self, graph: ExecGraph, durations: list[float]) -> list[int]:
        """Each task's stream index (device x NUM_STREAMS + stream), after checking tid, device, duration
        and stream; a graph that fails a whole-list check is checked task by task for the error to report."""
        tasks, num_devices = graph.tasks, self.num_devices
        streams = [STREAM_INDEX.get(t.stream, -1) for t in tasks]
        total_s = sum(durations)  # NB: finite only if no duration is NaN or infinite
        if tasks and not ([t.tid for t in tasks] == list(range(self.num_tasks))
                          and min(self.device_of) >= 0 and max(self.device_of) < num_devices
                          and math.isfinite(total_s) and min(durations) >= 0.0 and min(streams) >= 0):
            self._check_tasks(graph)
        return [device * NUM_STREAMS + stream for device, stream in zip(self.device_of, streams, strict=True)]

    def _check_tasks(self, graph: ExecGraph) -> None:
        num_devices = self.num_devices
        for tid, task in enumerate(graph.tasks):
            if task.tid != tid:
                raise ConfigError(f"tasks[{tid}].tid", task.tid, f"must equal its position {tid}")
            if not 0 <= task.device < num_devices:
                raise ConfigError(f"task {task.name!r}.device", task.device,
                                  f"must be a simulated device 0..{num_devices - 1}")
            if not (task.duration_s >= 0.0 and math.isfinite(task.duration_s)):
                raise ConfigError(f"task {task.name!r}.duration_s", task.duration_s, "must be finite and >= 0")
            if task.stream not in STREAM_INDEX:
                raise ConfigError(f"task {task.name!r}.stream", task.stream, f"choose one of: {', '.join(STREAMS)}")

    def _successors(self, graph: ExecGraph, deps: list[tuple[int, ...]]) -> list[list[int]]:
        n = self.num_tasks
        named = [dep for task_deps in deps for dep in task_deps]
        if named and not (min(named) >= 0 and max(named) < n and not any(map(contains, deps, range(n)))):
            for tid, task in enumerate(graph.tasks):
                for dep in task.deps:
                    if not 0 <= dep < n or dep == tid:
                        raise ConfigError(f"task {task.name!r}.deps", dep, f"must name another task 0..{n - 1}")
        succ: list[list[int]] = [[] for _ in range(n)]
        for tid, task_deps in enumerate(deps):
            for dep in task_deps:
                succ[dep].append(tid)
        return succ

    def _categories(self, graph: ExecGraph) -> list[int]:
        names = [t.category for t in graph.tasks]
        self.categories = [name for name in dict.fromkeys(names) if name]  # first-appearance order
        index = {name: i for i, name in enumerate(self.categories)}
        index[""] = -1
        return [index[name] for name in names]

    def _flows(self, graph: ExecGraph) -> None:
        """Group collectives by sync_key and give every comm flow its resources (union over its members)."""
        tasks = graph.tasks
        res_index: dict[str, int] = {}
        as_indices: dict[tuple[str, ...], tuple[int, ...]] = {}  # the compiler shares resource tuples
        groups: dict[str, list[int]] = {}
        flow_resources = self.flow_resources
        for tid, task in enumerate(tasks):
            if task.sync_key:
                groups.setdefault(task.sync_key, []).append(tid)
            elif task.resources and task.kind == "comm":
                names = task.resources
                indices = as_indices.get(names)
                if indices is None:
                    indices = as_indices[names] = tuple(res_index.setdefault(r, len(res_index)) for r in names)
                flow_resources[tid] = indices
        for key, members in groups.items():
            leader = members[0]
            seen_streams: set[int] = set()
            resources: dict[int, None] = {}
            for tid in members:
                if self.stream_of[tid] in seen_streams:
                    raise ConfigError(f"task {tasks[tid].name!r}.sync_key", key,
                                      "two ranks of one collective cannot share a device's stream")
                seen_streams.add(self.stream_of[tid])
                self.leader_of[tid] = leader
                for r in tasks[tid].resources if tasks[tid].kind == "comm" else ():
                    resources[res_index.setdefault(r, len(res_index))] = None
            self.members[leader] = members
            # NB: the collective progresses as one unit, so it does the largest member's work.
            self.work[leader] = max(self.work[tid] for tid in members)
            if resources:
                flow_resources[leader] = tuple(resources)
        self.has_flow_resources = bool(res_index)
        self.resource_names = list(res_index)
        self.resource_capacity = [graph.resource_capacity.get(name, 1.0) for name in self.resource_names]
        for name, capacity in zip(self.resource_names, self.resource_capacity, strict=True):
            if not (capacity > 0.0 and math.isfinite(capacity)):
                raise ConfigError(f"resource_capacity[{name!r}]", capacity, "must be finite and > 0")

    def _runs(self) -> list[int]:
        """Per task, the task that runs right after it on its device when nothing else runs there (-1: none): its
        only successor, whose only dependency it is, on the same device, neither of them a collective rank, and
        the links of both (if any) named by flows of that device only, with a capacity of at least one link.
        The engine runs a run of such tasks that starts on an idle device as one event (engine.py: runs alone)."""
        n, device_of, leader_of, num_deps = self.num_tasks, self.device_of, self.leader_of, self.num_deps
        private = self._private_links()
        run_next = [-1] * n
        for tid, succ in enumerate(self.successors):
            if len(succ) == 1:
                nxt = succ[0]
                if (num_deps[nxt] == 1 and device_of[nxt] == device_of[tid] and leader_of[tid] < 0
                        and leader_of[nxt] < 0 and private[tid] and private[nxt]):
                    run_next[tid] = nxt
        return run_next

    def _private_links(self) -> list[bool]:
        """Per task, whether every resource of its flow is named by flows of its own device only and has a
        capacity of at least 1 (so no other device's transfer shares it, and it alone never waits on it)."""
        flow_resources = self.flow_resources
        if not self.has_flow_resources:
            return [True] * self.num_tasks
        devices_of: list[set[int]] = [set() for _ in self.resource_names]
        device_of, members = self.device_of, self.members
        for tid, resources in enumerate(flow_resources):
            if resources:
                ranks = members.get(tid, (tid,))
                for r in resources:
                    devices_of[r].update(device_of[m] for m in ranks)
        exclusive = [len(devices) <= 1 and capacity >= 1.0
                     for devices, capacity in zip(devices_of, self.resource_capacity, strict=True)]
        return [resources is None or all(exclusive[r] for r in resources) for resources in flow_resources]
