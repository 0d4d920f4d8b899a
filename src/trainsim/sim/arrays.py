"""Flatten and check an ExecGraph into plain lists indexed by tid, the layout the engine's hot loop reads.

A *flow* is what progresses as one unit: a single task, or a collective (every task sharing a sync_key),
represented by its leader, the member with the lowest tid. Per-flow fields live at the leader's index.
"""

import math
from collections.abc import Hashable, Sequence
from functools import reduce
from itertools import chain, compress
from operator import attrgetter, iadd, itemgetter
from typing import Protocol, TypeVar

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, TaskColumns
from trainsim.ir.template_runs import (
    Part,
    by_blocks,
    first_appearances,
    holding,
    holding_resources,
    not_chained,
    ordered_runs,
    parts,
    pieces_runs,
)

STREAMS = ("compute", "feature", "gradient")
STREAM_INDEX = {name: index for index, name in enumerate(STREAMS)}
NUM_STREAMS = len(STREAMS)
_TID = attrgetter("tid")
_CATEGORY = attrgetter("category")
_K = TypeVar("_K", bound=Hashable, contravariant=True)
_V = TypeVar("_V", covariant=True)


class _Table(Protocol[_K, _V]):
    def __getitem__(self, key: _K, /) -> _V: ...


class _IsCompute(dict[str, bool]):
    """Whether a task kind (or stream) is "compute": any other is not."""

    def __missing__(self, key: str) -> bool:
        return False


IS_COMPUTE = _IsCompute(compute=True, comm=False, feature=False, gradient=False)  # NB: a miss calls __missing__


def looked_up(table: _Table[_K, _V], keys: Sequence[_K]) -> Sequence[_V]:
    """table[key] for each key, in order (a tuple, made in C: itemgetter over all keys at once is about twice as
    fast as map over table.__getitem__)."""
    if len(keys) > 1:
        return itemgetter(*keys)(table)
    return tuple(map(table.__getitem__, keys))


class GraphArrays:
    """Per-task lists (tid-indexed) and per-flow data of one ExecGraph, checked."""

    __slots__ = ("alloc_bytes", "categories", "category_of", "columns", "deps", "device_of", "flow_resources",
                 "flow_weights", "free_bytes", "has_flow_resources", "is_compute", "leader_of", "members", "num_deps",
                 "num_devices", "num_tasks", "priority", "resource_capacity", "resource_names", "shared_links",
                 "stream_of", "successors", "sync_keys", "work")

    def __init__(self, graph: ExecGraph, launch_overhead_s: float) -> None:
        columns = graph.columns()
        n = len(columns)
        self.num_tasks = n
        self.num_devices = len(graph.devices)
        for index, device in enumerate(graph.devices):
            if device.index != index:
                raise ConfigError(f"devices[{index}].index", device.index, f"must equal its position {index}")
        # NB: the graph's columns (the compiler writes them; a graph of Task objects is read into them once)
        device_of, streams, kinds, durations, deps, sync_keys, resources, alloc_bytes, free_bytes, categories, \
            priority, link_shares = (columns.device, columns.stream, columns.kind, columns.duration_s,
                                     columns.deps, columns.sync_key, columns.resources, columns.alloc_bytes,
                                     columns.free_bytes, columns.category, columns.priority, columns.link_shares)
        # NB: the columns the engine only reads are the graph's own lists, not copies
        self.columns = columns  # names from it where an error names a task
        self.sync_keys: list[str] = sync_keys
        self.device_of: list[int] = device_of
        # the compiler's template runs (ir/template_runs.py): all for the chain links, those whose columns still
        # hold their blocks' values for the lists made per block
        runs = ordered_runs(columns, n)
        pieces = parts(n, holding(runs, device_of, streams, kinds, categories)) if runs else parts(n, [])
        self.is_compute: Sequence[bool] = by_blocks(
            pieces, lambda first, end: looked_up(IS_COMPUTE, kinds[first:end]),
            lambda block, _: looked_up(IS_COMPUTE, block.kind))
        self.work: list[float] = list(durations) if launch_overhead_s == 0.0 else [
            d + launch_overhead_s if c else d for d, c in zip(durations, self.is_compute, strict=True)]
        self.priority: list[int] = priority
        self.alloc_bytes: list[float] = alloc_bytes
        self.free_bytes: list[float] = free_bytes
        self.deps: list[tuple[int, ...]] = deps
        self.num_deps: list[int] = []  # (_successors: 1 but where a task does not wait for the task before it alone)
        self.stream_of = self._streams(graph, streams, durations, pieces)
        self.successors = self._successors(graph, deps, parts(n, runs))
        self.categories: list[str] = []
        self.category_of = self._categories(categories, pieces)
        self.resource_names: list[str] = []
        self.resource_capacity: list[float] = []
        self.leader_of: list[int] = [-1] * n
        self.members: dict[int, list[int]] = {}
        self.flow_resources: list[tuple[int, ...] | None] = [None] * n
        # per flow, what it takes of each of its resources over the resource's capacity (None: all of each, the
        # engine's fast path)
        self.flow_weights: list[tuple[float, ...] | None] = [None] * n
        self.has_flow_resources = False
        # the runs whose tasks are also no collective ranks, with their blocks' resources and no link shares
        flow_pieces = parts(n, [run for run in holding_resources(pieces_runs(pieces), resources)
                                if sync_keys[run.first:run.end].count("") == run.end - run.first
                                and link_shares[run.first:run.end].count(()) == run.end - run.first])
        run_flows = self._flows(graph, sync_keys, resources, link_shares, kinds, flow_pieces)
        self.shared_links = self._shared_links(flow_pieces, run_flows)
        self._break_chains()

    def _streams(self, graph: ExecGraph, streams: Sequence[str], durations: Sequence[float],
                 pieces: list[Part]) -> list[int]:
        """Each task's stream index (device x NUM_STREAMS + stream), after checking tid, device, duration
        and stream; a graph that fails a whole-list check is checked task by task for the error to report."""
        num_devices = self.num_devices
        index = {(device, stream): device * NUM_STREAMS + i for device in range(num_devices)
                 for stream, i in STREAM_INDEX.items()}
        total_s = sum(durations)  # NB: finite only if no duration is NaN or infinite
        device_of = self.device_of
        try:
            out = by_blocks(pieces, lambda first, end: list(map(index.__getitem__, zip(
                device_of[first:end], streams[first:end], strict=True))),  # device and stream
                lambda block, run: [index[(run.device, stream)] for stream in block.stream])
        except (KeyError, TypeError):
            out = []
        # NB: a graph of Task objects names each task's tid; columns number the tasks by position
        tids_ok = graph.held_as_columns or list(map(_TID, graph.tasks)) == list(range(self.num_tasks))
        if self.num_tasks and not (tids_ok and len(out) == self.num_tasks
                         and math.isfinite(total_s) and min(durations) >= 0.0):
            self._check_tasks(graph)
        return out

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

    def _successors(self, graph: ExecGraph, deps: Sequence[tuple[int, ...]],
                    pieces: list[Part]) -> list[list[int] | None]:
        """Each task's successors in ascending tid order (the order the engine releases them in); None for a task
        whose only successor is the next tid, which waits for it alone (and is no collective rank and no flow on a
        shared link: _break_chains). NB: most tasks are such links of the
        compiler's chains: they are found in C (deps[t] == (t - 1,)), and only the other tasks' edges are walked in
        Python."""
        n = self.num_tasks
        # the tasks that do not wait for the task before them alone (task 0 among them: its dependency is no -1)
        others = not_chained(pieces, deps)
        if n and (not others or others[0] != 0):
            others.insert(0, 0)
        other_deps = list(map(deps.__getitem__, others))
        succ: list[list[int] | None] = [None] * n
        num_deps = self.num_deps = [1] * n
        for tid, task_deps in zip(others, other_deps, strict=True):
            num_deps[tid] = len(task_deps)
            succ[tid - 1] = []  # the task before it has no chain link to it (task 0: the last task's, below)
        if n:
            succ[n - 1] = []
        unordered: list[list[int]] = []
        try:  # NB: each dependency checked as its edge is walked (a dependency past the last task: IndexError)
            for tid, task_deps in zip(others, other_deps, strict=True):
                for dep in task_deps:
                    if dep < 0 or dep == tid:
                        self._check_deps(graph)
                    row = succ[dep]
                    if row is None:  # (a chain link: dep + 1 waits for dep alone)
                        row = succ[dep] = [dep + 1, tid]
                        if tid < dep:  # a task waiting for a later tid before it: the list is sorted below
                            unordered.append(row)
                    else:
                        row.append(tid)  # NB: in ascending tid order, so only a chain link's row can be out of order
        except IndexError:
            self._check_deps(graph)
            raise
        for row in unordered:
            row.sort()
        return succ

    def _check_deps(self, graph: ExecGraph) -> None:
        """Raise for the first task, in tid order, that names no other task as a dependency."""
        n = self.num_tasks
        for tid, task in enumerate(graph.tasks):
            for dep in task.deps:
                if not 0 <= dep < n or dep == tid:
                    raise ConfigError(f"task {task.name!r}.deps", dep, f"must name another task 0..{n - 1}")

    def _break_chains(self) -> None:
        """A chain link (successors None) into a collective rank or a flow on a shared link becomes the list [tid + 1],
        so None also says the next tid may run alone after this one as far as these go (engine.py: a run alone walks
        None links checking only the device)."""
        succ = self.successors
        for tid in chain(self.shared_links, *self.members.values()):
            if tid and succ[tid - 1] is None:
                succ[tid - 1] = [tid]

    def _categories(self, names: Sequence[str], pieces: list[Part]) -> Sequence[int]:
        self.categories = [name for name in first_appearances(pieces, names, _CATEGORY) if name]
        index = {name: i for i, name in enumerate(self.categories)}
        index[""] = -1
        return by_blocks(pieces, lambda first, end: looked_up(index, names[first:end]),
                         lambda block, _: looked_up(index, block.category))

    def _flows(self, graph: ExecGraph, sync_keys: Sequence[str], task_resources: Sequence[tuple[str, ...]],
               task_shares: Sequence[tuple[float, ...]], kinds: Sequence[str],
               pieces: list[Part]) -> list[list[tuple[tuple[int, ...], tuple[float, ...] | None]]]:
        """Group collectives by sync_key and give every comm flow its resources (union over its members) and what
        it takes of each (Task.link_shares, 1 where the task gives none; a collective takes the sum of its
        members' given shares, its ranks on several devices crossing the link together, else 1), as fractions of
        the resources' capacities: None where each is 1 (a flow that takes a whole resource, the engine's fast
        path)."""
        columns = self.columns
        capacity_of = graph.resource_capacity
        for name, capacity in capacity_of.items():
            if not (capacity > 0.0 and math.isfinite(capacity)):
                raise ConfigError(f"resource_capacity[{name!r}]", capacity, "must be finite and > 0")
        res_index: dict[str, int] = {}
        as_indices: dict[tuple[str, ...], tuple[int, ...]] = {}  # the compiler shares resource tuples
        groups: dict[str, list[int]] = {}
        flow_resources, flow_weights = self.flow_resources, self.flow_weights
        for tid in compress(range(self.num_tasks), sync_keys):
            groups.setdefault(sync_keys[tid], []).append(tid)
        as_flow: dict[tuple[int, int], tuple[tuple[int, ...], tuple[float, ...] | None]] = {}

        def place(names: tuple[str, ...], given: tuple[float, ...], tid: int) -> tuple[tuple[int, ...],
                                                                                         tuple[float, ...] | None]:
            key = (id(names), id(given))  # NB: the compiler shares resource and link_shares tuples
            placed = as_flow.get(key)
            if placed is None:
                indices = as_indices.get(names)
                if indices is None:
                    indices = as_indices[names] = tuple(res_index.setdefault(r, len(res_index)) for r in names)
                placed = as_flow[key] = (indices, _fractions([capacity_of.get(r, 1.0) for r in names],
                                                             _shares(names, given, columns, tid)))
            return placed

        # NB: in tid order, so resources are numbered as they first appear (a run's: its blocks', in order)
        run_flows: list[list[tuple[tuple[int, ...], tuple[float, ...] | None]]] = []  # per run, its blocks' flows
        for piece in pieces:
            first, end, run = piece.first, piece.end, piece.run
            if run is None:
                for tid in compress(range(first, end), task_resources[first:end]):
                    if not sync_keys[tid] and kinds[tid] == "comm":
                        flow_resources[tid], flow_weights[tid] = place(task_resources[tid], task_shares[tid], tid)
                continue
            # a run's tasks: its blocks' resources, no link shares, no sync keys
            by_resources: dict[int, list[tuple[int, ...] | None]] = {}
            by_weights: dict[int, list[tuple[float, ...] | None]] = {}
            flows: list[tuple[tuple[int, ...], tuple[float, ...] | None]] = []
            for key, block in piece.distinct.items():
                row_resources: list[tuple[int, ...] | None] = []
                row_weights: list[tuple[float, ...] | None] = []
                for names, kind in zip(block.resources, block.kind, strict=True):
                    if names and kind == "comm":
                        placed = place(names, (), first)
                        flows.append(placed)
                        row_resources.append(placed[0])
                        row_weights.append(placed[1])
                    else:
                        row_resources.append(None)
                        row_weights.append(None)
                by_resources[key], by_weights[key] = row_resources, row_weights
            run_flows.append(flows)
            flow_resources[first:end] = reduce(iadd, map(by_resources.__getitem__, piece.keys), [])
            flow_weights[first:end] = reduce(iadd, map(by_weights.__getitem__, piece.keys), [])
        as_collective: dict[tuple[tuple[int, int], ...], tuple[tuple[int, ...], tuple[float, ...] | None]] = {}
        for key, members in groups.items():
            leader = members[0]
            seen_streams: set[int] = set()
            for tid in members:
                if self.stream_of[tid] in seen_streams:
                    raise ConfigError(f"task {columns.name[tid]!r}.sync_key", key,
                                      "two ranks of one collective cannot share a device's stream")
                seen_streams.add(self.stream_of[tid])
                self.leader_of[tid] = leader
            self.members[leader] = members
            # NB: the collective progresses as one unit, so it does the largest member's work.
            self.work[leader] = max(self.work[tid] for tid in members)
            linked = [tid for tid in members if kinds[tid] == "comm" and task_resources[tid]]
            if not linked:
                continue
            signature = tuple([(id(task_resources[tid]), id(task_shares[tid])) for tid in linked])
            placed = as_collective.get(signature)
            if placed is None:  # NB: the compiler shares tuples, so few collectives take this path
                resources: dict[str, float] = {}
                for tid in linked:
                    given = task_shares[tid]
                    shares = _shares(task_resources[tid], given, columns, tid) if given else ()
                    for i, r in enumerate(task_resources[tid]):
                        resources[r] = resources.get(r, 0.0) + (shares[i] if shares else 0.0)
                placed = as_collective[signature] = (
                    tuple(res_index.setdefault(r, len(res_index)) for r in resources),
                    _fractions([capacity_of.get(r, 1.0) for r in resources],
                               [w if w > 0.0 else 1.0 for w in resources.values()]))
            flow_resources[leader], flow_weights[leader] = placed
        self.has_flow_resources = bool(res_index)
        self.resource_names = list(res_index)
        self.resource_capacity = [capacity_of.get(name, 1.0) for name in self.resource_names]
        return run_flows

    def _shared_links(self, pieces: list[Part],
                      run_flows: list[list[tuple[tuple[int, ...], tuple[float, ...] | None]]]) -> set[int]:
        """The flows with a resource that a flow of another device also names, or that one flow alone takes more
        of than its capacity (where another device's transfer may slow them, or one alone waits): the engine runs
        these step by step (engine.py: runs alone). pieces and run_flows: _flows' (a run's flows: its blocks')."""
        if not self.has_flow_resources:
            return set()
        flow_resources, flow_weights, device_of, members = (self.flow_resources, self.flow_weights, self.device_of,
                                                            self.members)
        users: dict[tuple[tuple[int, ...] | None, tuple[float, ...] | None, int], None] = {}
        flows_of_runs = iter(run_flows)
        for piece in pieces:
            first, end, run = piece.first, piece.end, piece.run
            if run is not None:
                users.update(dict.fromkeys((r, w, run.device) for r, w in next(flows_of_runs)))
                continue
            with_links = list(compress(range(first, end), flow_resources[first:end]))
            users.update(dict.fromkeys(zip(looked_up(flow_resources, with_links), looked_up(flow_weights, with_links),
                                           looked_up(device_of, with_links), strict=True)))
        devices_of: list[set[int]] = [set() for _ in self.resource_names]
        most = [0.0] * len(self.resource_names)  # the most one flow takes of each resource (of its capacity)
        for resources, weights, device in users:
            for i, r in enumerate(resources or ()):
                devices_of[r].add(device)
                most[r] = max(most[r], 1.0 if weights is None else weights[i])
        for leader, ranks in members.items():  # a collective's links serve all its ranks' devices
            for r in flow_resources[leader] or ():
                devices_of[r].update(device_of[m] for m in ranks)
        exclusive = [len(devices) <= 1 and weight <= 1.0 for devices, weight in zip(devices_of, most, strict=True)]
        bad = {resources for resources, _, _ in users if resources and not all(exclusive[r] for r in resources)}
        if not bad:
            return set()
        # NB: a run whose blocks' flows take no such resource has none; the others are read per task
        return set(chain.from_iterable(
            compress(range(piece.first, piece.end), map(bad.__contains__, flow_resources[piece.first:piece.end]))
            for piece in pieces if piece.run is None or not bad.isdisjoint(
                flow_resources[piece.first:piece.end])))


_ONES: dict[int, tuple[float, ...]] = {}


def _fractions(capacities: Sequence[float], shares: Sequence[float]) -> tuple[float, ...] | None:
    """Shares as fractions of the capacities; None where each is 1."""
    fractions = tuple(share / capacity for share, capacity in zip(shares, capacities, strict=True))
    return None if all(f == 1.0 for f in fractions) else fractions


def _shares(names: tuple[str, ...], given: tuple[float, ...], columns: TaskColumns, tid: int) -> tuple[float, ...]:
    """What task tid takes of each of its resources: its link_shares, checked, or 1 each. NB: its name is read only
    for the error (reading names makes them all: TaskColumns.name)."""
    if not given:
        ones = _ONES.get(len(names))
        if ones is None:
            ones = _ONES[len(names)] = (1.0,) * len(names)
        return ones
    if len(given) != len(names) or not all(s > 0.0 and math.isfinite(s) for s in given):
        raise ConfigError(f"task {columns.name[tid]!r}.link_shares", list(given),
                          f"must be {len(names)} finite numbers > 0, one per resource")
    return given
