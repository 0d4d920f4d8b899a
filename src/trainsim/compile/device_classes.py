"""Per-device timelines where the devices of a stage differ (Proteus Sec. VI: the executor simulates each device;
identical ones once).

The compiler simulates one device per pipeline stage, standing for its dp x cp x tp ranks. That holds while those
ranks are alike. A cluster may say otherwise (ClusterSpec.rank_devices: a rank is another device;
ClusterSpec.compute_slowdown: a straggler), and then the ranks of a stage form *device classes*
(cost/rank_classes.py, which the analytical engine reads too), each simulated on a timeline of its own:

- A class is a set of data-parallel replicas (the dp index of a rank) that are alike in every stage: a replica is
  as slow as the slowest rank of its tensor- and context-parallel group (they meet at every TP/CP collective), and
  it receives from the same replica of the previous stage, so a class is a column of the pipeline. Replicas with
  the same kinds of ranks in every stage are one class: identical ranks are still simulated once.
- Each class runs a copy of the stage's tasks on its own device. A compute task lasts what the class's slowest
  kind of rank takes: the job compiled for that rank's device (compile_job on a job whose cluster device is it),
  times its slow-down.
- Collectives inside a replica (tp_comm, cp_comm) and the pipeline's transfers (pp_comm) stay inside the class.
  Every other collective (data-parallel gradient buckets, ZeRO gathers and reduce-scatters, expert all-to-alls,
  reshards, the optimizer barrier) spans the classes: its copies are one collective (a shared sync_key) that
  starts when the last class arrives, so the fast classes wait for the slow one there, as their real ranks do.
- Its memory is the stage's, its capacity the smallest of its ranks'. The links its ranks cross are the
  cluster's: where classes share a node's NIC, their transfers share it (compile/place_links.py).

With every rank alike the graph is returned as it was: the same tasks and the same numbers.
"""

import dataclasses
import re
from collections.abc import Callable, Sequence
from itertools import accumulate

from trainsim.cost.rank_classes import DeviceClass, RankKind, default_kind, device_classes, rank_device, uniform
from trainsim.errors import ConfigError
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.exec_graph import ExecGraph, SimDevice, TaskColumns
from trainsim.job import Job

__all__ = ["device_classes", "device_rank_blocks", "split_device_classes"]

IN_CLASS_CATEGORIES = ("tp_comm", "cp_comm", "pp_comm")  # collectives among the ranks of one replica column
_STAGE_LINK = re.compile(r"^stage(\d+)\.")


def split_device_classes(job: Job, graph: ExecGraph, compile_on: Callable[[DeviceSpec], ExecGraph]) -> ExecGraph:
    """`graph` (one device per stage) with a device per stage and class where the job's ranks differ.
    compile_on(device): the same job compiled with its cluster's device replaced (a heterogeneous rank's prices)."""
    classes = device_classes(job)
    default = default_kind(job)
    if uniform(classes):
        return graph
    durations = _durations_by_kind(job, graph, classes, default, compile_on)
    num_stages, count = len(graph.devices), len(classes)
    per_replica = job.parallel.tp * job.parallel.cp

    def device_index(stage: int, c: int) -> int:
        return _device_index(stage, c, num_stages, count)

    devices: list[SimDevice | None] = [None] * (num_stages * count)
    for device in graph.devices:
        for c, cls in enumerate(classes):
            kinds = cls.kinds(device.stage, default)
            capacity = min(rank_device(job, name).hbm_bytes for name, _ in kinds)
            devices[device_index(device.stage, c)] = dataclasses.replace(
                device, index=device_index(device.stage, c), ranks=len(cls.replicas) * per_replica,
                capacity_bytes=min(device.capacity_bytes, capacity), static_breakdown=dict(device.static_breakdown))
    columns = graph.columns()
    n = len(columns)
    rows: list[tuple[object, ...]] = []
    capacity_of = dict(graph.resource_capacity)
    stage_of = [d.stage for d in graph.devices]
    for c, cls in enumerate(classes):
        # per stage, the durations of the class's kinds of rank (one list when a single kind: no max per task)
        stage_seconds = [[durations[kind] for kind in cls.kinds(stage, default)] for stage in stage_of]
        links: dict[tuple[str, ...], tuple[str, ...]] = {}
        offset = c * n
        for tid, (name, device, stream, kind, seconds, deps, sync_key, resources, alloc, free, phase, layer, mb,
                  stage_field, category, priority) in enumerate(zip(
                      columns.name, columns.device, columns.stream, columns.kind, columns.duration_s, columns.deps,
                      columns.sync_key, columns.resources, columns.alloc_bytes, columns.free_bytes, columns.phase,
                      columns.layer, columns.micro_batch, columns.stage, columns.category, columns.priority,
                      strict=True)):
            stage = stage_of[device]
            if kind == "compute":
                lists = stage_seconds[stage]
                seconds = lists[0][tid] if len(lists) == 1 else max(x[tid] for x in lists)
            if c and resources:
                renamed = links.get(resources)
                if renamed is None:
                    renamed = links[resources] = tuple(_class_link(r, c, device_index) for r in resources)
                    for old, new in zip(resources, renamed, strict=True):
                        if old in graph.resource_capacity:
                            capacity_of[new] = graph.resource_capacity[old]
                resources = renamed
            # a clone per task and class, a row in TASK_FIELDS' order (its link shares: place_links's, later)
            rows.append((name, device_index(stage, c), stream, kind, seconds,
                         tuple(offset + d for d in deps) if offset else deps,
                         _sync_key(kind, category, sync_key, tid, c), resources, alloc, free, phase, layer, mb,
                         stage_field, category, priority, ()))
    out = TaskColumns()
    out.extend_rows(rows)
    return ExecGraph(devices=[d for d in devices if d is not None], resource_capacity=capacity_of, columns=out)


def _device_index(stage: int, c: int, num_stages: int, count: int) -> int:
    """Class c of `stage`'s simulated device: the stage's own for the first class, then the others, stage-major."""
    return stage if c == 0 else num_stages + stage * (count - 1) + c - 1


def device_rank_blocks(job: Job, num_stages: int, stage_ranks: Sequence[int] = ()) -> list[tuple[tuple[int, int], ...]]:
    """Per simulated device (split_device_classes' numbering), the ranks it stands for as (first rank, count) runs
    (ranks numbered tp fastest, then cp, dp and pp). stage_ranks: each stage's ranks where the ranks are alike
    (the stages' blocks follow one another; default: the job's tp x dp x cp each)."""
    par = job.parallel
    group = par.tp * par.cp
    per_stage = group * par.dp
    classes = device_classes(job)
    if uniform(classes):
        sizes = list(stage_ranks) or [per_stage] * num_stages
        return [((first, size),) for first, size in zip(accumulate(sizes, initial=0), sizes, strict=False)]
    out: list[tuple[tuple[int, int], ...]] = [()] * (num_stages * len(classes))
    for stage in range(num_stages):
        for c, cls in enumerate(classes):
            runs: list[list[int]] = []
            for replica in cls.replicas:
                first = stage * per_stage + replica * group
                if runs and runs[-1][0] + runs[-1][1] == first:
                    runs[-1][1] += group
                else:
                    runs.append([first, group])
            out[_device_index(stage, c, num_stages, len(classes))] = tuple((a, b) for a, b in runs)
    return out


def _class_link(name: str, c: int, device_index: Callable[[int, int], int]) -> str:
    """A stage's link resource ("stage3.nic.tx") as class c's ranks use it (their own links)."""
    match = _STAGE_LINK.match(name)
    return name if match is None else f"stage{device_index(int(match[1]), c)}.{name[match.end():]}"


def _sync_key(kind: str, category: str, sync_key: str, tid: int, c: int) -> str:
    """Collectives among the classes share one key; those inside a replica column get one per class."""
    if kind != "comm":
        return sync_key
    if category in IN_CLASS_CATEGORIES:
        return f"{sync_key}#class{c}" if sync_key and c else sync_key
    return sync_key or f"classes.{tid}"


def _durations_by_kind(job: Job, graph: ExecGraph, classes: list[DeviceClass], default: RankKind,
                       compile_on: Callable[[DeviceSpec], ExecGraph]) -> dict[RankKind, list[float]]:
    """Per kind of rank present, every task's duration on it: the graph compiled for its device, times its
    slow-down (compute tasks are the ones read)."""
    kinds = {kind for cls in classes for stage in range(len(graph.devices)) for kind in cls.kinds(stage, default)}
    columns = graph.columns()
    base = list(columns.duration_s)
    per_device: dict[str, list[float]] = {default[0]: base}
    out: dict[RankKind, list[float]] = {}
    for name, slowdown in sorted(kinds):
        seconds = per_device.get(name)
        if seconds is None:
            other = compile_on(rank_device(job, name))
            other_columns = other.columns()
            if other_columns.name != columns.name:
                raise ConfigError("rank_devices", name, f"the plan compiles to other tasks on {name} than on "
                                  f"{default[0]}; ranks of one job must run the same program")
            seconds = per_device[name] = list(other_columns.duration_s)
        out[(name, slowdown)] = [s * slowdown for s in seconds]
    return out
