"""The discrete-event engine: three streams per simulated device, overlap slow-down, bandwidth sharing,
collective synchronization and memory, as Proteus's hierarchical topo-aware executor (sec. VI) describes.

Events happen in (time, priority, sequence) order; the sequence counter belongs to the engine instance, so
the same graph and options always give the same outcome. Two event kinds:

- END (priority 0): a flow (a task, or every rank of a collective) finishes. Each flow carries a version;
  re-timing a flow bumps it and pushes a new END, so the old one is skipped when popped. ENDs are the only
  entries of the heap, keyed by (time, sequence).
- DISPATCH (priority 1): once per instant, after every END of that instant, each free stream takes its best
  ready task by (ready time, priority, tid), and flows whose rate changed are re-timed. It is never pushed:
  the loop runs it when the heap holds no more events at the current instant, which is where a priority-1
  entry would pop, without the heap traffic. A task of zero duration pushes an END at the current instant,
  which pops next and triggers another dispatch pass at the same instant.

Runs alone: most of a pipeline stage's tasks form a chain (each the only successor of the one before, and
waiting for it only). When such a chain's next task becomes ready on a device where nothing else runs, holds a
stream or waits in a queue, the chain from there (as long as each task is the only successor of the one
before, waits for nothing else, is no collective rank and names no link another device's flow names) runs as
one END event: alone on the device nothing stretches it, so each task ends at its start + its work, summed in
order as the step-by-step loop would. The run's tasks are written out as the chain is walked, at its start (times,
memory and its timeline, exposed time), with what that changed on the device kept. Anything that becomes ready on
that device before the run's end cuts the run at that instant: the device's state is restored, the tasks ended by
then are written out again, and the one running becomes an ordinary flow (or, starting at that instant, a ready
task for the dispatch pass). Either way every start, end, ready and
dispatch time, the memory timeline and the exposed time are the step-by-step loop's, bit for bit
(tests/unit/sim/test_engine.py compares the two on synthetic pipelines, random graphs and compiled jobs); only
the event count drops (GPT-3 175B on 16 stages: 278,317 -> 62,273). What held a task back (the critical path)
does not depend on the order an instant's events are processed in: among dependencies ending, or collective
ranks arriving, at one instant, the lowest tid.

Work model: a flow has `duration_s` of work (the largest member's for a collective) and progresses at
1 / stretch, where stretch = (1 + overlap_slowdown if overlapped) x max over its resources of
max(1, what the active flows take of it / its capacity); a flow takes its task's share of a resource
(Task.link_shares: the shares its ranks behind a shared link take, hardware/links.py; 1 where it gives none).
A collective is one flow: it starts when its last rank takes its stream, progresses at its slowest rank's rate
and takes, of each resource any of its ranks names, the sum of its members' given shares (else 1). The engine
holds each flow's shares as fractions of the capacities (GraphArrays.flow_weights).
"""

from collections.abc import Container, Sequence
from heapq import heappop, heappush

from trainsim.errors import TrainsimError
from trainsim.ir.exec_graph import ExecGraph
from trainsim.sim.arrays import NUM_STREAMS, GraphArrays
from trainsim.sim.critical_path import critical_path
from trainsim.sim.outcome import DeviceMemory, SimOptions, SimOutcome

assert NUM_STREAMS == 3, "the engine's idle-device test names the three streams"


class _Every:
    """Contains every task: none may run alone (Engine(runs_alone=False))."""

    def __contains__(self, item: object) -> bool:
        return True


_EVERY_TASK = _Every()


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

    __slots__ = ("alone_id", "alone_run", "alone_saved", "alone_t0", "arrived", "cat_run", "cause", "comm_run",
                 "comp_run", "dirty_dev", "dirty_res", "dirty_streams", "dispatch", "done", "dynamic", "end", "events",
                 "exposed", "g", "gamma", "graph", "heap", "last", "last_x", "makespan", "mark", "mem", "new_flows",
                 "peak",
                 "peak_t", "queue", "ready", "rem", "remaining_deps", "res_active", "res_flows", "run_total", "seq",
                 "shared", "sharing", "slow", "stamp", "start", "stream_dirty", "stream_prev", "stream_task", "stretch",
                 "tl_b", "tl_t", "ver")

    def __init__(self, graph: ExecGraph, options: SimOptions, *, runs_alone: bool = True) -> None:
        """runs_alone=False: every task takes its own events (the step-by-step reference that the tests hold
        runs alone equal to)."""
        g = GraphArrays(graph, options.launch_overhead_s)
        self.graph = graph
        self.g = g
        n, num_devices = g.num_tasks, g.num_devices
        self.gamma = options.overlap_slowdown
        self.slow = 1.0 + options.overlap_slowdown
        self.sharing = options.bandwidth_sharing and g.has_flow_resources
        self.dynamic = self.gamma > 0.0 or self.sharing
        self.heap: list[tuple[float, int, int, int]] = []  # (time, sequence, flow, version) of ENDs
        self.seq = 0
        self.events = 0
        self.makespan = 0.0  # the last task's end (the last END's time)
        self.done = 0
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
        self.res_active: list[float] = [0] * len(g.resource_names)  # what the flows on it take of its capacity
        self.res_flows: list[dict[int, None]] = [{} for _ in g.resource_names]
        self.dirty_res: dict[int, None] = {}
        # per device: the run of tasks running alone there as one event (None / 0: none), when it started, its id
        self.alone_run: list[Sequence[int] | None] = [None] * num_devices
        self.alone_t0 = [0.0] * num_devices
        self.alone_id = [0] * num_devices
        # per device running a run alone, what the run's write-out changed there, as it was before: memory, peak
        # and its time, exposed times, the streams' last tasks, the last exposure instant, the memory timeline's
        # length and last value
        self.alone_saved: list[tuple[float, float, float, list[float], int, int, int, float, int, float] | None] = \
            [None] * num_devices
        self.shared: Container[int] = g.shared_links if runs_alone else _EVERY_TASK

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
        t = self._loop()
        if self.done < g.num_tasks:
            raise DeadlockError(t, g.num_tasks - self.done, g.num_tasks, self._stuck())
        return self._outcome()

    def _mark_stream(self, stream: int) -> None:
        if not self.stream_dirty[stream]:
            self.stream_dirty[stream] = True
            self.dirty_streams.append(stream)

    def _loop(self) -> float:
        """Pop ENDs and run the dispatch passes until the heap is empty; returns the last event's time.

        NB: the event loop is the simulator's hot path (hundreds of thousands of events for a 175B pipeline),
        so the steps a task goes through (taken by its stream, started, re-timed, ended) are written out here
        over local names: each call and attribute load saved is paid per task.
        The order of every heap push is the order of the step-by-step version, so outcomes are identical.        """
        g = self.g
        heap, ver, queue, cause, arrived = self.heap, self.ver, self.queue, self.cause, self.arrived
        start, end, ready, dispatch_s = self.start, self.end, self.ready, self.dispatch
        remaining_deps = self.remaining_deps
        stream_task, stream_prev, stream_dirty = self.stream_task, self.stream_prev, self.stream_dirty
        comp_run, comm_run, run_total, cat_run = self.comp_run, self.comm_run, self.run_total, self.cat_run
        last_x, mem, peak, peak_t, exposed = self.last_x, self.mem, self.peak, self.peak_t, self.exposed
        rem, last, stretch, mark = self.rem, self.last, self.stretch, self.mark
        res_active, res_flows, dirty_dev, dirty_res = self.res_active, self.res_flows, self.dirty_dev, self.dirty_res
        leader_of, members, device_of, is_compute = g.leader_of, g.members, g.device_of, g.is_compute
        category_of, alloc_bytes, free_bytes, work = g.category_of, g.alloc_bytes, g.free_bytes, g.work
        stream_of, priority, successors = g.stream_of, g.priority, g.successors
        flow_resources, flow_weights = g.flow_resources, g.flow_weights  # weights: of capacity (None: 1 each)
        gamma, slow, sharing, dynamic = self.gamma, self.slow, self.sharing, self.dynamic
        tl_t, tl_b = self.tl_t, self.tl_b
        dirty_streams, new_flows = self.dirty_streams, self.new_flows
        seq, stamp, done, events = self.seq, self.stamp, self.done, 0
        alone_run, alone_t0, alone_id, shared, num_deps = self.alone_run, self.alone_t0, self.alone_id, \
            self.shared, g.num_deps
        alone_saved = self.alone_saved
        deps = g.deps
        runs = 0
        last_end = 0.0
        pending = bool(g.num_tasks)  # the first dispatch pass runs at t = 0
        t = 0.0
        while True:
            if pending and (not heap or heap[0][0] > t):
                # ---- dispatch (priority 1): free streams take their best ready task -------------------------
                pending = False
                events += 1
                dirty, dirty_streams = dirty_streams, []
                for stream in dirty:
                    stream_dirty[stream] = False
                    if stream_task[stream] >= 0 or not queue[stream]:
                        continue
                    tid = heappop(queue[stream])[2]
                    stream_task[stream] = tid
                    dispatch_s[tid] = t
                    prev = stream_prev[stream]
                    if prev >= 0 and (end[prev] > ready[tid] or cause[tid] < 0):
                        cause[tid] = prev  # the stream, not a dependency, held this task back
                    flow = leader_of[tid]
                    if flow < 0:
                        flow, ranks = tid, (tid,)
                    else:
                        count = arrived.get(flow, 0) + 1
                        arrived[flow] = count
                        ranks = members[flow]
                        if count < len(ranks):
                            continue
                        # the last rank arrives: everyone starts now, held back by it (among ranks arriving at
                        # this instant, the lowest tid: the same whatever order the streams are served in)
                        held = min([m for m in ranks if dispatch_s[m] == t])
                        for m in ranks:
                            if m != held:
                                cause[m] = held
                    for m in ranks:  # start each task of the flow
                        start[m] = t
                        d = device_of[m]
                        if t > last_x[d]:
                            if comp_run[d] == 0 and run_total[d] > 0:
                                row, elapsed = exposed[d], t - last_x[d]
                                for c, count in enumerate(cat_run[d]):
                                    if count:
                                        row[c] += elapsed
                            last_x[d] = t
                        run_total[d] += 1
                        # NB: a device starting or stopping compute changes the rate of its running comm flows only
                        # (and vice versa): the device is re-timed only if a flow of the other kind runs there
                        if is_compute[m]:
                            comp_run[d] += 1
                            if comp_run[d] == 1 and gamma and comm_run[d]:
                                dirty_dev[d] = None
                        else:
                            comm_run[d] += 1
                            if comm_run[d] == 1 and gamma and comp_run[d]:
                                dirty_dev[d] = None
                        category = category_of[m]
                        if category >= 0:
                            cat_run[d][category] += 1
                        alloc = alloc_bytes[m]
                        if alloc:
                            value = mem[d] + alloc
                            mem[d] = value
                            if value > peak[d]:
                                peak[d] = value
                                peak_t[d] = t
                            if tl_t is not None:  # the memory timeline: one point per instant
                                times = tl_t[d]
                                if times[-1] == t:
                                    tl_b[d][-1] = value
                                else:
                                    times.append(t)
                                    tl_b[d].append(value)
                    if not dynamic:
                        seq += 1
                        heappush(heap, (t + work[flow], seq, flow, ver[flow]))
                        continue
                    if sharing:
                        resources = flow_resources[flow]
                        if resources:
                            # NB: the other flows on a resource slow down only once it is over capacity
                            # (written out twice: most flows take the whole of each resource, weights None)
                            weights = flow_weights[flow]
                            if weights is None:
                                for r in resources:
                                    users = res_active[r] + 1
                                    res_active[r] = users
                                    res_flows[r][flow] = None
                                    if users > 1:
                                        dirty_res[r] = None
                            else:
                                for r, weight in zip(resources, weights, strict=True):
                                    users = res_active[r] + weight
                                    res_active[r] = users
                                    res_flows[r][flow] = None
                                    if users > 1:
                                        dirty_res[r] = None
                    rem[flow] = work[flow]
                    last[flow] = t
                    stretch[flow] = 0.0  # not yet timed
                    new_flows.append(flow)
                if dynamic:
                    # ---- re-time the flows whose rate may have changed ------------------------------------
                    candidates, new_flows = new_flows, []
                    if dirty_dev:
                        for d in dirty_dev:
                            for stream in range(d * NUM_STREAMS, (d + 1) * NUM_STREAMS):
                                tid = stream_task[stream]
                                if tid >= 0 and start[tid] >= 0.0:
                                    leader = leader_of[tid]
                                    candidates.append(tid if leader < 0 else leader)
                        dirty_dev.clear()
                    if dirty_res:
                        for r in dirty_res:
                            candidates.extend(res_flows[r])
                        dirty_res.clear()
                    stamp += 1
                    for flow in candidates:
                        if mark[flow] == stamp:
                            continue
                        mark[flow] = stamp
                        # time per unit of work: 1 alone; (1 + gamma) when overlapped; x (users / capacity)
                        # on a busy link
                        new = 1.0
                        if gamma:
                            for m in (flow,) if leader_of[flow] < 0 else members[flow]:
                                d = device_of[m]
                                if (comm_run[d] if is_compute[m] else comp_run[d]) > 0:
                                    new = slow
                                    break
                        if sharing:
                            resources = flow_resources[flow]
                            if resources:
                                share = 1.0
                                for r in resources:
                                    users = res_active[r]
                                    if users > share:
                                        share = users
                                new *= share
                        old = stretch[flow]
                        if new == old:
                            continue
                        if old > 0.0:
                            rem[flow] = max(0.0, rem[flow] - (t - last[flow]) / old)
                            last[flow] = t
                        stretch[flow] = new
                        version = ver[flow] + 1
                        ver[flow] = version
                        seq += 1
                        heappush(heap, (t + rem[flow] * new, seq, flow, version))
            if not heap:
                break
            # ---- END (priority 0): a flow finishes --------------------------------------------------------
            t, _, flow, version = heappop(heap)
            if version != ver[flow]:
                if version >= 0 or alone_id[device_of[flow]] != -version:
                    continue  # re-timed since, or a run alone that was cut short
                # the end of a run alone: its tasks were written out at its start; the last one's successors are
                # released here
                d = device_of[flow]
                run = alone_run[d]
                assert run is not None
                alone_run[d], alone_id[d] = None, 0
                done += len(run) - 1
                alone = True
            else:
                alone = False
            events += 1
            pending = True
            last_end = t  # NB: ENDs pop in time order: the last one ends the iteration (max of end, without a scan)
            if leader_of[flow] < 0:
                ranks = (flow,)
                done += 1
            else:
                ranks = members[flow]
                done += len(ranks)
            for tid in ranks:
                if not alone:  # (a run alone's last task was written out with the run)
                    end[tid] = t
                    stream = stream_of[tid]
                    stream_task[stream] = -1
                    stream_prev[stream] = tid
                    if not stream_dirty[stream]:
                        stream_dirty[stream] = True
                        dirty_streams.append(stream)
                    d = device_of[tid]
                    if t > last_x[d]:
                        if comp_run[d] == 0 and run_total[d] > 0:
                            row, elapsed = exposed[d], t - last_x[d]
                            if run_total[d] == 1:  # tid alone runs there: its category's count alone is 1
                                category = category_of[tid]
                                if category >= 0:
                                    row[category] += elapsed
                            else:
                                for c, count in enumerate(cat_run[d]):
                                    if count:
                                        row[c] += elapsed
                        last_x[d] = t
                    run_total[d] -= 1
                    if is_compute[tid]:
                        comp_run[d] -= 1
                        if comp_run[d] == 0 and gamma and comm_run[d]:
                            dirty_dev[d] = None
                    else:
                        comm_run[d] -= 1
                        if comm_run[d] == 0 and gamma and comp_run[d]:
                            dirty_dev[d] = None
                    category = category_of[tid]
                    if category >= 0:
                        cat_run[d][category] -= 1
                    freed = free_bytes[tid]
                    if freed:
                        value = mem[d] - freed
                        mem[d] = value
                        if tl_t is not None:
                            times = tl_t[d]
                            if times[-1] == t:
                                tl_b[d][-1] = value
                            else:
                                times.append(t)
                                tl_b[d].append(value)
                following = successors[tid]  # (None: the next tid alone)
                for succ in (tid + 1,) if following is None else following:
                    remaining_deps[succ] -= 1
                    if remaining_deps[succ] == 0:
                        ready[succ] = t
                        # the last dependency to end; among those ending at this instant the lowest tid (the same
                        # whatever order the instant's ends are processed in)
                        if num_deps[succ] == 1:
                            cause[succ] = tid
                        else:  # NB: a loop, not min over a comprehension (a function call in CPython 3.11)
                            held = tid
                            for dep in deps[succ]:
                                if dep < held and end[dep] == t:
                                    held = dep
                            cause[succ] = held
                        ds = device_of[succ]
                        if alone_run[ds] is not None:  # a task of a device running a run alone: cut it here
                            seq, finished = self._alone_cut(ds, t, seq, dirty_streams)
                            done += finished
                        elif run_total[ds] == 0 and leader_of[succ] < 0 and (
                                (nexts := successors[succ]) is None or len(nexts) == 1):
                            base = ds * NUM_STREAMS
                            if (stream_task[base] < 0 and stream_task[base + 1] < 0 and stream_task[base + 2] < 0
                                    and not queue[base] and not queue[base + 1] and not queue[base + 2]
                                    and succ not in shared):
                                # an idle device: the chain from here (each task the only successor of the one
                                # before and waiting for it alone, on this device, no collective, no link another
                                # device names) runs alone until something else arrives there, as one event at its
                                # end (each task's end = its start + its work)
                                x = succ + 1 if nexts is None else nexts[0]
                                if not (num_deps[x] != 1 or device_of[x] != ds or leader_of[x] >= 0
                                        or x in shared):
                                    # its tasks are written out now, as each would end alone (its start + its
                                    # work, summed in order); what they change on the device is kept to be
                                    # restored where something arrives there before the run's end (_alone_cut)
                                    row = exposed[ds]
                                    times = tl_t[ds] if tl_t is not None else None
                                    alone_saved[ds] = (mem[ds], peak[ds], peak_t[ds], row[:], stream_prev[base],
                                                       stream_prev[base + 1], stream_prev[base + 2], last_x[ds],
                                                       len(times) if times is not None else 0,
                                                       tl_b[ds][-1] if times is not None else 0.0)
                                    if t > last_x[ds]:
                                        last_x[ds] = t  # the device was idle before: nothing exposed
                                    x, prev, s, memory, jumps = succ, -1, t, mem[ds], None
                                    # NB: the run's tids, consecutive but for the jumps recorded; a task's ready
                                    # time and cause are written as the walk reaches it (the first one's were
                                    # written above, as it became ready)
                                    while True:
                                        e = s + work[x]
                                        start[x] = dispatch_s[x] = s
                                        end[x] = e
                                        alloc = alloc_bytes[x]
                                        if alloc:
                                            memory += alloc
                                            if memory > peak[ds]:
                                                peak[ds], peak_t[ds] = memory, s
                                            if times is not None:
                                                if times[-1] == s:
                                                    tl_b[ds][-1] = memory
                                                else:
                                                    times.append(s)
                                                    tl_b[ds].append(memory)
                                        if not is_compute[x] and e > s:
                                            category = category_of[x]
                                            if category >= 0:
                                                row[category] += e - s
                                        freed = free_bytes[x]
                                        if freed:
                                            memory -= freed
                                            if times is not None:
                                                if times[-1] == e:
                                                    tl_b[ds][-1] = memory
                                                else:
                                                    times.append(e)
                                                    tl_b[ds].append(memory)
                                        stream_prev[stream_of[x]] = x
                                        prev, s = x, e
                                        nexts = successors[x]
                                        if nexts is None:  # the next tid, waiting for x alone, no collective rank,
                                            x += 1  # no flow on a shared link (GraphArrays._break_chains)
                                            if device_of[x] != ds:
                                                break
                                        elif len(nexts) != 1:
                                            break
                                        else:
                                            y = nexts[0]
                                            if (num_deps[y] != 1 or device_of[y] != ds or leader_of[y] >= 0
                                                    or y in shared):
                                                break
                                            if jumps is None:
                                                jumps = []
                                            jumps.append((x, y))
                                            x = y
                                        ready[x], cause[x] = s, prev
                                    mem[ds] = memory
                                    if s > last_x[ds]:
                                        last_x[ds] = s
                                    run = range(succ, prev + 1) if jumps is None else _run_tids(succ, jumps, prev)
                                    runs += 1
                                    alone_run[ds], alone_t0[ds], alone_id[ds] = run, t, runs
                                    seq += 1
                                    heappush(heap, (s, seq, prev, -runs))
                                    continue
                        s = stream_of[succ]
                        heappush(queue[s], (t, priority[succ], succ))
                        if stream_task[s] < 0 and not stream_dirty[s]:
                            stream_dirty[s] = True
                            dirty_streams.append(s)
            if sharing and not alone:
                resources = flow_resources[flow]
                if resources:
                    # NB: the others speed up only if it was over capacity
                    weights = flow_weights[flow]
                    if weights is None:
                        for r in resources:
                            if res_active[r] > 1:
                                dirty_res[r] = None
                            res_active[r] -= 1
                            del res_flows[r][flow]
                    else:
                        for r, weight in zip(resources, weights, strict=True):
                            if res_active[r] > 1:
                                dirty_res[r] = None
                            res_active[r] -= weight
                            del res_flows[r][flow]
        self.dirty_streams, self.new_flows = dirty_streams, new_flows
        self.seq, self.stamp, self.done, self.events = seq, stamp, done, events
        self.makespan = last_end
        return t

    def _alone_cut(self, d: int, t: float, seq: int, dirty_streams: list[int]) -> tuple[int, int]:
        """Something arrives on device d at t before its run alone ends: the run's write-out (made at its start, as
        if it ended) is undone, then each task of the run that ended by t is written out as the step-by-step loop
        would have (it ran alone: its end is its start + its work; the device's exposed time, memory and timeline
        change at its start and end). The task running at t becomes a running flow, or, where it starts exactly at
        t, a ready task in its stream's queue for the dispatch pass. Returns the sequence counter and how many tasks
        ended."""
        g = self.g
        work, is_compute, category_of = g.work, g.is_compute, g.category_of
        alloc_bytes, free_bytes, stream_of = g.alloc_bytes, g.free_bytes, g.stream_of
        start, end, ready, dispatch, cause = self.start, self.end, self.ready, self.dispatch, self.cause
        mem, peak, peak_t, last_x, row = self.mem, self.peak, self.peak_t, self.last_x, self.exposed[d]
        tl_t, tl_b = self.tl_t, self.tl_b
        run, s, saved = self.alone_run[d], self.alone_t0[d], self.alone_saved[d]
        assert run is not None and saved is not None
        self.alone_run[d], self.alone_id[d], self.alone_saved[d] = None, 0, None
        base = d * NUM_STREAMS
        mem[d], peak[d], peak_t[d], row[:], self.stream_prev[base], self.stream_prev[base + 1], \
            self.stream_prev[base + 2], last_x[d], length, last_value = saved
        if tl_t is not None:
            del tl_t[d][length:]
            del tl_b[d][length:]
            tl_b[d][-1] = last_value
        for tid in run:
            start[tid] = end[tid] = dispatch[tid] = -1.0
        for tid in run[1:]:
            ready[tid], cause[tid] = -1.0, -1
        stream_prev, memory = self.stream_prev, mem[d]
        if s > last_x[d]:
            last_x[d] = s  # the device was idle before: nothing exposed
        prev, finished, last, tid = -1, 0, run[-1], run[0]
        for tid in run:  # stops at the task running at t, at the last task at the latest
            e = s + work[tid]
            if e > t or tid == last:
                break
            # tid ran alone from s to e: as its dispatch, start and end would have written it (the device's last
            # event was at s, so communication alone is exposed from s to e)
            if prev >= 0:
                ready[tid], cause[tid] = s, prev
            start[tid] = dispatch[tid] = s
            end[tid] = e
            alloc = alloc_bytes[tid]
            if alloc:
                memory += alloc
                if memory > peak[d]:
                    peak[d], peak_t[d] = memory, s
                if tl_t is not None:
                    _timeline_point(tl_t[d], tl_b[d], s, memory)
            if e > s and not is_compute[tid] and category_of[tid] >= 0:
                row[category_of[tid]] += e - s
            freed = free_bytes[tid]
            if freed:
                memory -= freed
                if tl_t is not None:
                    _timeline_point(tl_t[d], tl_b[d], e, memory)
            stream_prev[stream_of[tid]] = tid
            finished += 1
            prev, s = tid, e
        mem[d] = memory
        if s > last_x[d]:
            last_x[d] = s
        if prev >= 0:
            ready[tid], cause[tid] = s, prev
        stream = stream_of[tid]
        if s == t:  # it becomes ready now: the dispatch pass decides, as it would have
            heappush(self.queue[stream], (s, self.g.priority[tid], tid))
            if not self.stream_dirty[stream]:
                self.stream_dirty[stream] = True
                dirty_streams.append(stream)
            return seq, finished
        # tid started at s alone and runs on: as its dispatch and start would have written it
        start[tid] = dispatch[tid] = s
        self.stream_task[stream] = tid
        if s > last_x[d]:
            last_x[d] = s
        self.run_total[d] += 1
        if is_compute[tid]:
            self.comp_run[d] += 1
        else:
            self.comm_run[d] += 1
        category = category_of[tid]
        if category >= 0:
            self.cat_run[d][category] += 1
        alloc = alloc_bytes[tid]
        if alloc:
            value = mem[d] + alloc
            mem[d] = value
            if value > peak[d]:
                peak[d], peak_t[d] = value, s
            if tl_t is not None:
                _timeline_point(tl_t[d], tl_b[d], s, value)
        if self.sharing:
            resources = g.flow_resources[tid]
            if resources:
                weights = g.flow_weights[tid]
                for i, r in enumerate(resources):
                    users = self.res_active[r] + (1 if weights is None else weights[i])
                    self.res_active[r] = users
                    self.res_flows[r][tid] = None
                    if users > 1:
                        self.dirty_res[r] = None
        # its end as the loop would have timed it alone (stretch 1); re-timed if others start
        if self.dynamic:
            self.rem[tid], self.last[tid], self.stretch[tid] = work[tid], s, 1.0
        version = self.ver[tid] + 1
        self.ver[tid] = version
        seq += 1
        heappush(self.heap, (s + work[tid], seq, tid, version))
        return seq, finished

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
            makespan_s=self.makespan, memory=memory, critical_path=critical_path(self.end, self.cause, self.makespan),
            exposed_s=worst, exposed_by_device_s=by_device, events=self.events)

    def _stuck(self, limit: int = 3) -> list[str]:
        """A few stuck tasks of each kind: ranks waiting for partners, ready tasks whose stream is held,
        and tasks whose dependencies never ended."""
        g, names = self.g, self.g.columns.name
        waiting: list[str] = []
        blocked: list[str] = []
        unmet: list[str] = []
        for tid in range(g.num_tasks):
            if self.end[tid] >= 0.0:
                continue
            if self.dispatch[tid] >= 0.0 and len(waiting) < limit:
                leader = g.leader_of[tid]
                waiting.append(f"{names[tid]} (collective {g.sync_keys[tid]!r}: {self.arrived.get(leader, 0)} of "
                               f"{len(g.members[leader])} ranks arrived)")
            elif self.ready[tid] >= 0.0 and self.dispatch[tid] < 0.0 and len(blocked) < limit:
                holder = self.stream_task[g.stream_of[tid]]
                held_by = names[holder] if holder >= 0 else "nothing"
                blocked.append(f"{names[tid]} (ready; its stream is held by {held_by})")
            elif self.ready[tid] < 0.0 and len(unmet) < limit:
                pending = [names[d] for d in g.deps[tid] if self.end[d] < 0.0][:2]
                unmet.append(f"{names[tid]} (waits for {', '.join(pending)})")
        return waiting + blocked + unmet


def _run_tids(first: int, jumps: list[tuple[int, int]], last: int) -> list[int]:
    """The tids of a run alone from first to last, consecutive but for the jumps (from, to)."""
    tids: list[int] = []
    for end, following in jumps:
        tids += range(first, end + 1)
        first = following
    tids += range(first, last + 1)
    return tids


def _timeline_point(times: list[float], values: list[float], t: float, value: float) -> None:
    """The memory timeline: one point per instant, the last value of the instant."""
    if times[-1] == t:
        values[-1] = value
    else:
        times.append(t)
        values.append(value)


def simulate(graph: ExecGraph, options: SimOptions | None = None) -> SimOutcome:
    """Run the execution graph to the end of the iteration; raise DeadlockError if it cannot finish."""
    return Engine(graph, options or SimOptions()).run()
