"""The discrete-event engine: three streams per simulated device, overlap slow-down, bandwidth sharing,
collective synchronization and memory, as Proteus's hierarchical topo-aware executor (sec. VI) describes.

Events live in one heap keyed by (time, priority, sequence); the sequence counter belongs to the engine
instance, so the same graph and options always give the same outcome. Two event kinds:

- END (priority 0): a flow (a task, or every rank of a collective) finishes. Each flow carries a version;
  re-timing a flow bumps it and pushes a new END, so the old one is skipped when popped.
- DISPATCH (priority 1): once per instant, after every END of that instant, each free stream takes its best
  ready task by (ready time, priority, tid), and flows whose rate changed are re-timed. It is never pushed:
  the loop runs it when the heap holds no more events at the current instant, which is where a priority-1
  entry would pop, without the heap traffic. A task of zero duration pushes an END at the current instant,
  which pops next and triggers another dispatch pass at the same instant.

Work model: a flow has `duration_s` of work (the largest member's for a collective) and progresses at
1 / stretch, where stretch = (1 + overlap_slowdown if overlapped) x max over its resources of
max(1, active flows / capacity). A collective is one flow: it starts when its last rank takes its stream,
progresses at its slowest rank's rate and counts once on each resource any of its ranks names.
"""

from heapq import heappop, heappush

from trainsim.errors import TrainsimError
from trainsim.ir.exec_graph import ExecGraph
from trainsim.sim.arrays import NUM_STREAMS, GraphArrays
from trainsim.sim.critical_path import critical_path
from trainsim.sim.outcome import DeviceMemory, SimOptions, SimOutcome

_END = 0  # heap priority of an END; the dispatch pass (priority 1) is implicit, see the module docstring


class DeadlockError(TrainsimError):
    """Tasks remain but none can run: a dependency cycle, or collectives entered in different orders."""

    def __init__(self, time_s: float, remaining: int, total: int, stuck: list[str]) -> None:
        self.time_s = time_s
        self.stuck = stuck
        super().__init__(
            f"simulation deadlock at t={time_s:.6g} s: {remaining} of {total} tasks cannot run; stuck: "
            + "; ".join(stuck)
            + ". Remedy: make every rank enter its collectives in the same order and remove dependency cycles.")


class Engine:
    """One simulation of one ExecGraph. Use `simulate`; an Engine runs once."""

    __slots__ = ("arrived", "cat_run", "cause", "comm_run", "comp_run", "dirty_dev", "dirty_res", "dirty_streams",
                 "dispatch", "dispatch_pending", "done", "dynamic", "end", "events", "exposed", "g", "gamma", "graph",
                 "heap", "last", "last_x", "mark", "mem", "new_flows", "peak", "peak_t", "queue", "ready", "rem",
                 "remaining_deps", "res_active", "res_flows", "run_total", "seq", "sharing", "slow", "stamp", "start",
                 "stream_dirty", "stream_prev", "stream_task", "stretch", "tl_b", "tl_t", "ver")

    def __init__(self, graph: ExecGraph, options: SimOptions) -> None:
        g = GraphArrays(graph, options.launch_overhead_s)
        self.graph = graph
        self.g = g
        n, num_devices = g.num_tasks, g.num_devices
        self.gamma = options.overlap_slowdown
        self.slow = 1.0 + options.overlap_slowdown
        self.sharing = options.bandwidth_sharing and bool(g.flow_resources)
        self.dynamic = self.gamma > 0.0 or self.sharing
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.events = 0
        self.done = 0
        self.dispatch_pending = False
        # per task
        self.start = [-1.0] * n
        self.end = [-1.0] * n
        self.ready = [-1.0] * n
        self.dispatch = [-1.0] * n
        self.remaining_deps = list(g.num_deps)
        self.cause = [-1] * n
        # per flow (at the leader's tid)
        self.ver = [0] * n
        self.rem = [0.0] * n if self.dynamic else []
        self.last = [0.0] * n if self.dynamic else []
        self.stretch = [0.0] * n if self.dynamic else []
        self.mark = [0] * n if self.dynamic else []
        self.stamp = 0
        self.new_flows: list[int] = []
        self.arrived: dict[int, int] = {}
        # per stream
        num_streams = num_devices * NUM_STREAMS
        self.stream_task = [-1] * num_streams
        self.stream_prev = [-1] * num_streams
        self.queue: list[list[tuple[float, int, int]]] = [[] for _ in range(num_streams)]
        self.stream_dirty = [False] * num_streams
        self.dirty_streams: list[int] = []
        # per device
        self.comp_run = [0] * num_devices
        self.comm_run = [0] * num_devices
        self.run_total = [0] * num_devices
        self.dirty_dev: dict[int, None] = {}
        num_categories = len(g.categories)
        self.cat_run = [[0] * num_categories for _ in range(num_devices)]
        self.exposed = [[0.0] * num_categories for _ in range(num_devices)]
        self.last_x = [0.0] * num_devices
        statics = [device.static_bytes for device in graph.devices]
        self.mem = list(statics)
        self.peak = list(statics)
        self.peak_t = [0.0] * num_devices
        self.tl_t: list[list[float]] | None = [[0.0] for _ in statics] if options.memory_timeline else None
        self.tl_b: list[list[float]] = [[s] for s in statics] if options.memory_timeline else []
        # per resource
        self.res_active = [0] * len(g.resource_names)
        self.res_flows: list[dict[int, None]] = [{} for _ in g.resource_names]
        self.dirty_res: dict[int, None] = {}

    # ---- main loop -------------------------------------------------------------------------------------
    def run(self) -> SimOutcome:
        assert self.done == 0 and not self.heap, "an Engine runs once"
        g = self.g
        ready, queue, stream_of, priority = self.ready, self.queue, g.stream_of, g.priority
        for tid, count in enumerate(g.num_deps):
            if count == 0:
                ready[tid] = 0.0
                heappush(queue[stream_of[tid]], (0.0, priority[tid], tid))
                self._mark_stream(stream_of[tid])
        heap, ver = self.heap, self.ver
        events = 0
        t = 0.0
        if g.num_tasks:
            self._dispatch(t)
            events += 1
        while heap:
            t, _, _, flow, version = heappop(heap)
            if version == ver[flow]:
                self._finish(flow, t)
                events += 1
            if self.dispatch_pending and (not heap or heap[0][0] > t):
                self._dispatch(t)  # the instant's last END is done: the priority-1 dispatch pass runs
                events += 1
        self.events = events
        if self.done < g.num_tasks:
            raise DeadlockError(t, g.num_tasks - self.done, g.num_tasks, self._stuck())
        return self._outcome()

    def _push_end(self, time: float, flow: int) -> None:
        self.seq += 1
        heappush(self.heap, (time, _END, self.seq, flow, self.ver[flow]))

    def _mark_stream(self, stream: int) -> None:
        if not self.stream_dirty[stream]:
            self.stream_dirty[stream] = True
            self.dirty_streams.append(stream)

    # ---- dispatch: free streams take ready tasks ---------------------------------------------------------
    def _dispatch(self, t: float) -> None:
        self.dispatch_pending = False
        dirty, self.dirty_streams = self.dirty_streams, []
        stream_dirty, stream_task, queue = self.stream_dirty, self.stream_task, self.queue
        for stream in dirty:
            stream_dirty[stream] = False
            if stream_task[stream] < 0 and queue[stream]:
                self._take(stream, t)
        if self.dynamic:
            self._retime(t)

    def _take(self, stream: int, t: float) -> None:
        tid = heappop(self.queue[stream])[2]
        self.stream_task[stream] = tid
        self.dispatch[tid] = t
        prev = self.stream_prev[stream]
        cause = self.cause
        if prev >= 0 and (self.end[prev] > self.ready[tid] or cause[tid] < 0):
            cause[tid] = prev  # the stream, not a dependency, held this task back
        leader = self.g.leader_of[tid]
        if leader < 0:
            self._start_flow(tid, t, None)
            return
        count = self.arrived.get(leader, 0) + 1
        self.arrived[leader] = count
        members = self.g.members[leader]
        if count == len(members):  # the last rank arrives: everyone starts now, held back by this rank
            for m in members:
                if m != tid:
                    cause[m] = tid
            self._start_flow(leader, t, members)

    def _start_flow(self, flow: int, t: float, members: list[int] | None) -> None:
        if members is None:
            self._start_task(flow, t)
        else:
            for m in members:
                self._start_task(m, t)
        if not self.dynamic:
            self._push_end(t + self.g.work[flow], flow)
            return
        if self.sharing:
            resources = self.g.flow_resources.get(flow)
            if resources:
                for r in resources:
                    self.res_active[r] += 1
                    self.res_flows[r][flow] = None
                    self.dirty_res[r] = None
        self.rem[flow] = self.g.work[flow]
        self.last[flow] = t
        self.stretch[flow] = 0.0  # not yet timed
        self.new_flows.append(flow)

    def _start_task(self, tid: int, t: float) -> None:
        g = self.g
        self.start[tid] = t
        d = g.device_of[tid]
        if t > self.last_x[d]:
            self._account(d, t)
        self.run_total[d] += 1
        if g.is_compute[tid]:
            self.comp_run[d] += 1
            if self.comp_run[d] == 1 and self.gamma:
                self.dirty_dev[d] = None
        else:
            self.comm_run[d] += 1
            if self.comm_run[d] == 1 and self.gamma:
                self.dirty_dev[d] = None
        category = g.category_of[tid]
        if category >= 0:
            self.cat_run[d][category] += 1
        alloc = g.alloc_bytes[tid]
        if alloc:
            value = self.mem[d] + alloc
            self.mem[d] = value
            if value > self.peak[d]:
                self.peak[d] = value
                self.peak_t[d] = t
            self._record(d, t, value)

    # ---- end of a flow -------------------------------------------------------------------------------------
    def _finish(self, flow: int, t: float) -> None:
        members = self.g.members.get(flow)
        if members is None:
            self._end_task(flow, t)
            self.done += 1
        else:
            for m in members:
                self._end_task(m, t)
            self.done += len(members)
        if self.sharing:
            resources = self.g.flow_resources.get(flow)
            if resources:
                for r in resources:
                    self.res_active[r] -= 1
                    del self.res_flows[r][flow]
                    self.dirty_res[r] = None
        self.dispatch_pending = True

    def _end_task(self, tid: int, t: float) -> None:
        g = self.g
        self.end[tid] = t
        stream = g.stream_of[tid]
        self.stream_task[stream] = -1
        self.stream_prev[stream] = tid
        if not self.stream_dirty[stream]:
            self.stream_dirty[stream] = True
            self.dirty_streams.append(stream)
        d = g.device_of[tid]
        if t > self.last_x[d]:
            self._account(d, t)
        self.run_total[d] -= 1
        if g.is_compute[tid]:
            self.comp_run[d] -= 1
            if self.comp_run[d] == 0 and self.gamma:
                self.dirty_dev[d] = None
        else:
            self.comm_run[d] -= 1
            if self.comm_run[d] == 0 and self.gamma:
                self.dirty_dev[d] = None
        category = g.category_of[tid]
        if category >= 0:
            self.cat_run[d][category] -= 1
        freed = g.free_bytes[tid]
        if freed:
            value = self.mem[d] - freed
            self.mem[d] = value
            self._record(d, t, value)
        remaining_deps, ready, cause, queue, stream_of, stream_task = (
            self.remaining_deps, self.ready, self.cause, self.queue, g.stream_of, self.stream_task)
        for succ in g.successors[tid]:
            remaining_deps[succ] -= 1
            if remaining_deps[succ] == 0:
                ready[succ] = t
                cause[succ] = tid  # the last dependency to end
                s = stream_of[succ]
                heappush(queue[s], (t, g.priority[succ], succ))
                if stream_task[s] < 0:
                    self._mark_stream(s)

    # ---- bookkeeping -------------------------------------------------------------------------------------
    def _account(self, d: int, t: float) -> None:
        """Add the time since the device's last change to every category running there while no compute runs."""
        if self.comp_run[d] == 0 and self.run_total[d] > 0:
            elapsed = t - self.last_x[d]
            row = self.exposed[d]
            for c, count in enumerate(self.cat_run[d]):
                if count:
                    row[c] += elapsed
        self.last_x[d] = t

    def _record(self, d: int, t: float, value: float) -> None:
        if self.tl_t is None:
            return
        times = self.tl_t[d]
        if times[-1] == t:
            self.tl_b[d][-1] = value
        else:
            times.append(t)
            self.tl_b[d].append(value)

    # ---- re-timing under overlap and bandwidth sharing -----------------------------------------------------
    def _retime(self, t: float) -> None:
        candidates, self.new_flows = self.new_flows, []
        if self.dirty_dev:
            leader_of, stream_task, start = self.g.leader_of, self.stream_task, self.start
            for d in self.dirty_dev:
                for stream in range(d * NUM_STREAMS, (d + 1) * NUM_STREAMS):
                    tid = stream_task[stream]
                    if tid >= 0 and start[tid] >= 0.0:
                        leader = leader_of[tid]
                        candidates.append(tid if leader < 0 else leader)
            self.dirty_dev.clear()
        if self.dirty_res:
            for r in self.dirty_res:
                candidates.extend(self.res_flows[r])
            self.dirty_res.clear()
        self.stamp += 1
        stamp, mark, stretch, rem, last, ver = self.stamp, self.mark, self.stretch, self.rem, self.last, self.ver
        for flow in candidates:
            if mark[flow] == stamp:
                continue
            mark[flow] = stamp
            new = self._stretch_of(flow)
            old = stretch[flow]
            if new == old:
                continue
            if old > 0.0:
                rem[flow] = max(0.0, rem[flow] - (t - last[flow]) / old)
                last[flow] = t
            stretch[flow] = new
            ver[flow] += 1
            self._push_end(t + rem[flow] * new, flow)

    def _stretch_of(self, flow: int) -> float:
        """Time per unit of work: 1 alone; (1 + gamma) when overlapped; x (users / capacity) on a busy link."""
        g = self.g
        stretch = 1.0
        if self.gamma:
            members = g.members.get(flow)
            for m in (flow,) if members is None else members:
                d = g.device_of[m]
                if (self.comm_run[d] if g.is_compute[m] else self.comp_run[d]) > 0:
                    stretch = self.slow
                    break
        if self.sharing:
            resources = g.flow_resources.get(flow)
            if resources:
                share = 1.0
                for r in resources:
                    users = self.res_active[r] / g.resource_capacity[r]
                    if users > share:
                        share = users
                stretch *= share
        return stretch

    # ---- results -----------------------------------------------------------------------------------------
    def _outcome(self) -> SimOutcome:
        g = self.g
        memory = []
        for d, device in enumerate(self.graph.devices):
            breakdown = dict(device.static_breakdown)
            breakdown["activations"] = breakdown.get("activations", 0.0) + self.peak[d] - device.static_bytes
            memory.append(DeviceMemory(
                device=d, capacity_bytes=device.capacity_bytes, static_bytes=device.static_bytes,
                peak_bytes=self.peak[d], peak_time_s=self.peak_t[d], breakdown_at_peak=breakdown,
                timeline_s=self.tl_t[d] if self.tl_t is not None else [],
                timeline_bytes=self.tl_b[d] if self.tl_b else []))
        by_device = [dict(zip(g.categories, row, strict=True)) for row in self.exposed]
        worst = {name: max((row[name] for row in by_device), default=0.0) for name in g.categories}
        return SimOutcome(
            start_s=self.start, end_s=self.end, dispatch_s=self.dispatch, ready_s=self.ready,
            makespan_s=max(self.end, default=0.0), memory=memory,
            critical_path=critical_path(self.end, self.cause), exposed_s=worst, exposed_by_device_s=by_device,
            events=self.events)

    def _stuck(self, limit: int = 3) -> list[str]:
        """A few stuck tasks of each kind: ranks waiting for partners, ready tasks whose stream is held,
        and tasks whose dependencies never ended."""
        g, names, tasks = self.g, self.g.names, self.graph.tasks
        waiting: list[str] = []
        blocked: list[str] = []
        unmet: list[str] = []
        for tid in range(g.num_tasks):
            if self.end[tid] >= 0.0:
                continue
            if self.dispatch[tid] >= 0.0 and len(waiting) < limit:
                leader = g.leader_of[tid]
                waiting.append(f"{names[tid]} (collective {tasks[tid].sync_key!r}: {self.arrived.get(leader, 0)} of "
                               f"{len(g.members[leader])} ranks arrived)")
            elif self.ready[tid] >= 0.0 and self.dispatch[tid] < 0.0 and len(blocked) < limit:
                holder = self.stream_task[g.stream_of[tid]]
                held_by = names[holder] if holder >= 0 else "nothing"
                blocked.append(f"{names[tid]} (ready; its stream is held by {held_by})")
            elif self.ready[tid] < 0.0 and len(unmet) < limit:
                pending = [names[d] for d in tasks[tid].deps if self.end[d] < 0.0][:2]
                unmet.append(f"{names[tid]} (waits for {', '.join(pending)})")
        return waiting + blocked + unmet


def simulate(graph: ExecGraph, options: SimOptions | None = None) -> SimOutcome:
    """Run the execution graph to the end of the iteration; raise DeadlockError if it cannot finish."""
    return Engine(graph, options or SimOptions()).run()
