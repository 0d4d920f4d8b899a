"""What the event simulator takes as options and what it returns."""

from dataclasses import dataclass, field

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """Runtime behaviours the engine models (all off by default: the plain dependency schedule).

    overlap_slowdown: while a device runs a compute task and a comm task at once, both progress at
        1/(1 + overlap_slowdown) of their speed (the overlap factor gamma of Proteus, sec. VI-C).
    bandwidth_sharing: concurrent transfers that name the same resource share it fairly: on a resource of
        capacity c used by n transfers each progresses at min(1, c / n) (Proteus, sec. VI-C).
    launch_overhead_s: added to the duration of every compute task (kernel launch).
    memory_timeline: record the (time, bytes) timeline per device (peak and OOM are always tracked).
    """

    overlap_slowdown: float = 0.0
    bandwidth_sharing: bool = False
    launch_overhead_s: float = 0.0
    memory_timeline: bool = True

    def __post_init__(self) -> None:
        if not self.overlap_slowdown >= 0.0:
            raise ConfigError("overlap_slowdown", self.overlap_slowdown, "must be a number >= 0")
        if not self.launch_overhead_s >= 0.0:
            raise ConfigError("launch_overhead_s", self.launch_overhead_s, "must be a number >= 0 seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMemory:
    """Memory of one simulated device through the iteration.

    breakdown_at_peak: the device's static_breakdown plus "activations", every byte the tasks allocated and
    had not freed at the peak (activations, temporaries, gathered parameters).
    timeline_s / timeline_bytes: the allocated bytes after every change, one point per instant.
    """

    device: int
    capacity_bytes: float
    static_bytes: float
    peak_bytes: float
    peak_time_s: float
    breakdown_at_peak: dict[str, float]
    timeline_s: list[float] = field(repr=False)
    timeline_bytes: list[float] = field(repr=False)

    @property
    def oom(self) -> bool:
        return self.peak_bytes > self.capacity_bytes

    def timeline(self) -> list[tuple[float, float]]:
        return list(zip(self.timeline_s, self.timeline_bytes, strict=True))


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class SimOutcome:
    """Times per task (indexed by tid), memory per device, the critical path and exposed communication.

    dispatch_s: when the task took its stream; earlier than start_s only for a collective rank waiting for
        its partners (its stream is blocked meanwhile).
    ready_s: when the task's last dependency ended.
    critical_path: tids from the first task to the last-ending one; each step is the dependency, stream
        predecessor or collective partner that determined the next task's start (among dependencies ending, or
        partners arriving, at the same instant, the lowest tid).
    exposed_s: per category, the longest time over devices during which a task of that category ran on a
        device with no compute task running (the part of the category the compute does not hide);
        exposed_by_device_s has the same per device. Time a rank waits for its collective partners is not
        counted (see dispatch_s).
    events: end and dispatch events the engine processed (stale re-timed events not counted; a run of tasks
        that ran alone on a device, engine.py, is one end event).
    """

    start_s: list[float]
    end_s: list[float]
    dispatch_s: list[float]
    ready_s: list[float]
    makespan_s: float
    memory: list[DeviceMemory]
    critical_path: list[int]
    exposed_s: dict[str, float]
    exposed_by_device_s: list[dict[str, float]]
    events: int

    @property
    def oom(self) -> bool:
        return any(mem.oom for mem in self.memory)

    @property
    def peak_memory_bytes(self) -> float:
        return max((mem.peak_bytes for mem in self.memory), default=0.0)

    def __repr__(self) -> str:
        return (f"SimOutcome(tasks={len(self.start_s)}, makespan_s={self.makespan_s:.6g}, events={self.events}, "
                f"peak_memory_bytes={self.peak_memory_bytes:.6g}, oom={self.oom}, "
                f"critical_path={len(self.critical_path)} tasks)")


def busy_s_by_device(graph: ExecGraph, outcome: SimOutcome) -> list[float]:
    """Per simulated device, the seconds its tasks ran, summed over its streams (each task from its start to its
    end: stretched by the runtime behaviours, without the time a collective's rank waits for its partners).

    The makespan is a device's wall time; this is the CPU time of a CPU rank whose streams are threads of one
    process (time.process_time sums the threads: gloo's thread pays an overlapped all-reduce that the makespan
    hides), the clock of `trainsim measure`'s cpu_s_per_rank, with every task priced on that clock."""
    busy = [0.0] * len(graph.devices)
    for device, start, end in zip(graph.columns().device, outcome.start_s, outcome.end_s, strict=True):
        busy[device] += end - start
    return busy
