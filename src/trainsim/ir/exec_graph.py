"""ExecGraph: what the event simulator runs. Tasks per simulated device and stream, with dependencies,
collective synchronization, the physical links a transfer uses, and memory allocated and released.

Identical ranks (data-parallel replicas, tensor-parallel peers) are simulated once: a simulated device stands
for every rank with the same pipeline stage. A collective's uncontended duration is computed over the real
topology (the full group), so the cost of a simulation does not grow with the dp or tp degree.
"""

from dataclasses import dataclass, field
from typing import Literal

Stream = Literal["compute", "feature", "gradient"]
TaskKind = Literal["compute", "comm"]
Phase = Literal["fwd", "bwd", "recompute", "optimizer", "comm"]


@dataclass(slots=True)
class Task:
    """One unit of work on one simulated device's stream.

    duration_s: the time it takes alone on an idle device with idle links (the engine stretches it under
    overlap slow-down and bandwidth sharing).
    sync_key: tasks with the same non-empty key are one collective seen from several simulated devices; they
    start together when all are ready and end at the same moment.
    resources: names of the physical links a transfer crosses ("node0.nvlink", "node0.nic", ...); concurrent
    transfers on a resource share its bandwidth in proportion to what each takes of it.
    link_shares: per resource, what the transfer takes of it, in the units of its capacity (empty: 1 each); a
    shared link's shares are GPUs (hardware/links.py: a transfer of a simulated device takes one per rank of it
    behind the link).
    alloc_bytes is allocated on the device when the task starts; free_bytes is released when it ends.
    """

    tid: int
    name: str
    device: int
    stream: Stream
    kind: TaskKind
    duration_s: float
    deps: tuple[int, ...] = ()
    sync_key: str = ""
    resources: tuple[str, ...] = ()
    alloc_bytes: float = 0.0
    free_bytes: float = 0.0
    phase: Phase = "fwd"
    layer: str = ""
    micro_batch: int = -1
    stage: int = -1
    category: str = ""  # breakdown bucket: a key of estimate.result.BREAKDOWN_KEYS
    priority: int = 0  # lower runs first among tasks ready at the same time on one stream
    link_shares: tuple[float, ...] = ()


@dataclass(slots=True)
class SimDevice:
    """A simulated device: the ranks it stands for and its memory."""

    index: int
    stage: int
    ranks: int  # how many real ranks this device stands for
    capacity_bytes: float
    static_bytes: float  # resident for the whole iteration (weights, gradients, optimizer states, runtime)
    static_breakdown: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class ExecGraph:
    devices: list[SimDevice]
    tasks: list[Task]
    resource_capacity: dict[str, float] = field(default_factory=dict)  # relative capacity (1.0 = one link)

    def add(self, **fields: object) -> Task:
        task = Task(tid=len(self.tasks), **fields)  # type: ignore[arg-type]
        self.tasks.append(task)
        return task
