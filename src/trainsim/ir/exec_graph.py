"""ExecGraph: what the event simulator runs. Tasks per simulated device and stream, with dependencies,
collective synchronization, the physical links a transfer uses, and memory allocated and released.

Identical ranks (data-parallel replicas, tensor-parallel peers) are simulated once: a simulated device stands
for every rank with the same pipeline stage. A collective's uncontended duration is computed over the real
topology (the full group), so the cost of a simulation does not grow with the dp or tp degree.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce
from itertools import chain, repeat
from operator import attrgetter, iadd
from typing import Generic, Literal, Protocol, TypeVar

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


class ColumnBlock(Protocol):
    """Consecutive tasks' fields, one value per task in order (the compiler's step templates: compile/context.py
    SpecBlock)."""

    @property
    def stream(self) -> tuple[Stream, ...]: ...

    @property
    def kind(self) -> tuple[TaskKind, ...]: ...

    @property
    def category(self) -> tuple[str, ...]: ...

    @property
    def phase(self) -> tuple[Phase, ...]: ...

    @property
    def layer(self) -> tuple[str, ...]: ...

    @property
    def resources(self) -> tuple[tuple[str, ...], ...]: ...


@dataclass(frozen=True, slots=True)
class TemplateRun:
    """Tasks written from blocks (TaskColumns.note_template_run): tids first, first + 1, ... on one device, each
    block's tasks after the one before, every task but the first waiting for the task before it alone, by the
    dependency tuples in `links` (tids first + 1 on; a reader finds the ones replaced since by identity). What the
    columns hold there may have been changed since: a reader compares before it relies on the blocks."""

    first: int
    device: int
    blocks: tuple[ColumnBlock, ...]
    links: list[tuple[int, ...]]
    # what the writer wrote of some fields (joined from the blocks), kept so a reader compares without joining again
    written: dict[str, list[object]] = field(default_factory=dict, repr=False, compare=False)
    keys: list[int] = field(init=False, repr=False, compare=False)  # id of each block, in order
    distinct: dict[int, ColumnBlock] = field(init=False, repr=False, compare=False)  # each block once, by id

    def __post_init__(self) -> None:
        keys = list(map(id, self.blocks))
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "distinct", dict(zip(keys, self.blocks, strict=True)))

    @property
    def end(self) -> int:
        """The tid after the last task."""
        return self.first + len(self.links) + 1


TASK_FIELDS = ("name", "device", "stream", "kind", "duration_s", "deps", "sync_key", "resources", "alloc_bytes",
               "free_bytes", "phase", "layer", "micro_batch", "stage", "category", "priority", "link_shares")
_READ_FIELDS = attrgetter(*TASK_FIELDS)
_LATER = ("phase", "layer", "micro_batch")  # what blocks_later holds until one of them is read
_PHASE, _LAYER = attrgetter("phase"), attrgetter("layer")
T = TypeVar("T")


class _WrittenLater(Generic[T]):
    """A TaskColumns list that blocks_later may still owe: the pending blocks are written before it is read or
    replaced."""

    def __init__(self, slot: str) -> None:
        self.slot = slot

    def __get__(self, columns: "TaskColumns", owner: object = None) -> list[T]:
        if columns._blocks_later:
            columns._write_blocks()
        return getattr(columns, self.slot)

    def __set__(self, columns: "TaskColumns", values: list[T]) -> None:
        columns._write_blocks()
        setattr(columns, self.slot, values)


class TaskColumns:
    """An ExecGraph's tasks as one list per Task field (all indexed by tid; a task's tid is its position): the layout
    the compiler writes and the simulator reads, without a Python object per task. Names given as a prefix and a
    suffix around a micro-batch (name_later) are made when `name` is first read (the simulator reads them only to
    report an error). A block's phases, layers and micro-batches (blocks_later) are written when one of them is
    first read (the simulator reads none)."""

    __slots__ = (*(field for field in TASK_FIELDS if field != "name" and field not in _LATER), "_name", "_named_later",
                 "template_runs", "_phase", "_layer", "_micro_batch", "_blocks_later")
    device: list[int]
    stream: list[Stream]
    kind: list[TaskKind]
    duration_s: list[float]
    deps: list[tuple[int, ...]]
    sync_key: list[str]
    resources: list[tuple[str, ...]]
    alloc_bytes: list[float]
    free_bytes: list[float]
    stage: list[int]
    category: list[str]
    priority: list[int]
    link_shares: list[tuple[float, ...]]

    def __init__(self) -> None:
        self._blocks_later: list[tuple[int, tuple[ColumnBlock, ...], list[int], list[int]]] = []
        for name in TASK_FIELDS:
            if name not in _LATER:
                setattr(self, name, [])
        self._phase: list[Phase] = []
        self._layer: list[str] = []
        self._micro_batch: list[int] = []
        self._named_later: list[tuple[int, tuple[tuple[str, str], ...], int]] = []
        # where tasks were written from blocks, in tid order (a shortcut for readers: sim/arrays.py)
        self.template_runs: list[TemplateRun] = []

    def __len__(self) -> int:
        return len(self._name)

    @property
    def name(self) -> list[str]:
        if self._named_later:
            names = self._name
            for first, affixes, micro_batch in self._named_later:
                names[first:first + len(affixes)] = [f"{prefix}{micro_batch}{suffix}" for prefix, suffix in affixes]
            self._named_later = []
        return self._name

    @name.setter
    def name(self, names: list[str]) -> None:
        self._name, self._named_later = names, []

    def _write_blocks(self) -> None:
        """Write the phases, layers and micro-batches that blocks_later holds."""
        for first, blocks, micro_batches, sizes in self._blocks_later:
            end = first + sum(sizes)
            self._phase[first:end] = reduce(iadd, map(_PHASE, blocks), [])
            self._layer[first:end] = reduce(iadd, map(_LAYER, blocks), [])
            self._micro_batch[first:end] = chain.from_iterable(map(repeat, micro_batches, sizes))
        self._blocks_later = []

    phase: "_WrittenLater[Phase]" = _WrittenLater("_phase")
    layer: "_WrittenLater[str]" = _WrittenLater("_layer")
    micro_batch: "_WrittenLater[int]" = _WrittenLater("_micro_batch")

    def blocks_later(self, blocks: tuple[ColumnBlock, ...], micro_batches: list[int], sizes: list[int]) -> None:
        """The phases, layers and micro-batches of the next tasks, block after block (sizes[i] tasks of blocks[i],
        of micro-batch micro_batches[i]), written when one of them is first read (placeholders until then)."""
        total = sum(sizes)
        self._blocks_later.append((len(self._phase), blocks, micro_batches, sizes))
        placeholder: list[Phase] = ["fwd"]
        self._phase += placeholder * total
        self._layer += [""] * total
        self._micro_batch += [-1] * total

    def name_later(self, affixes: tuple[tuple[str, str], ...], blanks: tuple[str, ...], micro_batch: int) -> None:
        """Name the next len(affixes) tasks f"{prefix}{micro_batch}{suffix}" when `name` is read (blanks: as many
        empty strings, held until then)."""
        self._named_later.append((len(self._name), affixes, micro_batch))
        self._name += blanks

    def name_blocks_later(self, firsts: list[int], affixes: list[tuple[tuple[str, str], ...]],
                          micro_batches: list[int], total: int) -> None:
        """name_later for consecutive blocks at once: block i's tasks start at tid firsts[i] (ascending, the first
        one the next tid) and are named from affixes[i] and micro_batches[i]; total: their tasks together."""
        self._named_later += zip(firsts, affixes, micro_batches, strict=True)
        self._name += [""] * total

    def note_template_run(self, run: TemplateRun) -> None:
        """Record that the tasks run.first .. run.end - 1, the last ones written, were written from run's blocks."""
        if run.end != len(self._name) or (self.template_runs and run.first < self.template_runs[-1].end):
            raise ValueError(f"a template run of tids {run.first}..{run.end - 1} must be the last tasks written")
        self.template_runs.append(run)

    @classmethod
    def of_tasks(cls, tasks: list[Task]) -> "TaskColumns":
        """The columns of these tasks (their tids must be their positions)."""
        columns = cls()
        if tasks:
            for name, values in zip(TASK_FIELDS, zip(*map(_READ_FIELDS, tasks), strict=True), strict=True):
                setattr(columns, name, list(values))
        return columns

    def to_tasks(self) -> list[Task]:
        """One Task per row (map over the columns runs in C)."""
        values = [getattr(self, name) for name in TASK_FIELDS]
        for name, column in zip(TASK_FIELDS, values, strict=True):
            if len(column) != len(self._name):
                raise ValueError(f"TaskColumns.{name} holds {len(column)} values for {len(self._name)} tasks")
        return list(map(Task, range(len(self._name)), *values))

    def extend_rows(self, rows: list[tuple[object, ...]], fields: tuple[str, ...] = TASK_FIELDS,
                    constants: Mapping[str, object] | None = None) -> None:
        """Add tasks given as rows of the fields' values, in that order, the other fields of TASK_FIELDS the same for
        all (constants); tids follow on."""
        constants = constants or {}
        if sorted((*fields, *constants)) != sorted(TASK_FIELDS):
            raise ValueError(f"rows of {fields} and constants of {sorted(constants)} must give each task field once")
        if rows:
            # NB: names, phases, layers and micro-batches written later stay so
            for name, values in (*zip(fields, zip(*rows, strict=True), strict=True),
                                 *((name, [value] * len(rows)) for name, value in constants.items())):
                getattr(self, f"_{name}" if name == "name" or name in _LATER else name).extend(values)

    def names_later(self, named: list[tuple[int, tuple[tuple[str, str], ...], int]]) -> None:
        """Name tasks already added when `name` is read: each (tid, affixes, micro-batch) names tasks tid, tid + 1, ...
        f"{prefix}{micro_batch}{suffix}" from its affixes."""
        self._named_later += named

    def append(self, name: str, device: int, stream: Stream, kind: TaskKind, duration_s: float,
               deps: tuple[int, ...] = (), sync_key: str = "", resources: tuple[str, ...] = (),
               alloc_bytes: float = 0.0, free_bytes: float = 0.0, phase: Phase = "fwd", layer: str = "",
               micro_batch: int = -1, stage: int = -1, category: str = "", priority: int = 0,
               link_shares: tuple[float, ...] = ()) -> int:
        """Add one task (Task's fields in its order, stage defaulting to the device); returns its tid."""
        tid = len(self._name)
        self._name.append(name)
        self.device.append(device)
        self.stream.append(stream)
        self.kind.append(kind)
        self.duration_s.append(duration_s)
        self.deps.append(deps)
        self.sync_key.append(sync_key)
        self.resources.append(resources)
        self.alloc_bytes.append(alloc_bytes)
        self.free_bytes.append(free_bytes)
        self._phase.append(phase)  # NB: (what blocks_later holds stays so)
        self._layer.append(layer)
        self._micro_batch.append(micro_batch)
        self.stage.append(device if stage < 0 else stage)
        self.category.append(category)
        self.priority.append(priority)
        self.link_shares.append(link_shares)
        return tid


class ExecGraph:
    """The simulated devices, their tasks and the links' relative capacities (1.0 = one link).

    The tasks are held either as Task objects (`tasks`, what hand-built graphs and the trace front-end use) or as
    columns (`TaskColumns`, what the compiler writes: ~150,000 tasks for GPT-3 175B on 16 stages). Reading `tasks`
    from a graph held as columns makes the Task objects once, and from then on the graph holds those (changes to
    them are the graph's); `columns()` reads the columns without making Task objects."""

    __slots__ = ("_columns", "_tasks", "devices", "resource_capacity")

    def __init__(self, devices: list[SimDevice], tasks: list[Task] | None = None,
                 resource_capacity: dict[str, float] | None = None, *, columns: TaskColumns | None = None) -> None:
        if tasks is not None and columns is not None:
            raise ValueError("an ExecGraph holds its tasks as Task objects or as columns, not both")
        self.devices = devices
        self.resource_capacity = {} if resource_capacity is None else resource_capacity
        self._tasks = tasks if columns is None else None
        self._columns = columns
        if tasks is None and columns is None:
            self._tasks = []

    @property
    def tasks(self) -> list[Task]:
        if self._tasks is None:
            assert self._columns is not None
            self._tasks, self._columns = self._columns.to_tasks(), None
        return self._tasks

    @tasks.setter
    def tasks(self, tasks: list[Task]) -> None:
        self._tasks, self._columns = tasks, None

    @property
    def held_as_columns(self) -> bool:
        return self._columns is not None

    @property
    def num_tasks(self) -> int:
        return len(self._columns) if self._columns is not None else len(self.tasks)

    def columns(self) -> TaskColumns:
        """The tasks as columns: the graph's own where it holds them so (a reader must not change them), else read
        from its Task objects (a copy: changing it does not change the graph)."""
        if self._columns is not None:
            return self._columns
        return TaskColumns.of_tasks(self.tasks)

    def writable_columns(self) -> TaskColumns:
        """The columns to add tasks to or change tasks in (the compiler's passes): a graph holding Task objects
        holds their columns from now on (those objects are no longer the graph's)."""
        if self._columns is None:
            self._columns, self._tasks = TaskColumns.of_tasks(self.tasks), None
        return self._columns

    def add(self, **fields: object) -> Task:
        task = Task(tid=len(self.tasks), **fields)  # type: ignore[arg-type]
        self.tasks.append(task)
        return task

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExecGraph):
            return NotImplemented
        return (self.devices == other.devices and self.resource_capacity == other.resource_capacity
                and self.tasks == other.tasks)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ExecGraph({len(self.devices)} devices, {self.num_tasks} tasks)"
