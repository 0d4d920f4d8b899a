"""Which ranks of a job differ (ClusterSpec.rank_devices: a rank is another device; ClusterSpec.compute_slowdown:
a straggler), grouped as the engines price them: *device classes* (Proteus Sec. VI: the executor simulates each
device, identical ones once).

Synchronous data, tensor and pipeline parallel training waits at every collective for its slowest member:

- a data-parallel replica is as slow as the slowest rank of its tensor- and context-parallel group (they meet at
  every TP/CP collective), and it receives from the same replica of the previous stage, so a class is a column
  of the pipeline: the replicas with the same kinds of ranks in every stage (identical replicas are one class);
- a collective across replicas (the data-parallel gradient buckets, ZeRO's gathers, expert all-to-alls) starts
  when the slowest class arrives.

The simulator (compile/device_classes.py) gives each class a timeline of its own; the analytical engine prices
each class's pipeline with its stages' slowest kind of rank (Pricer.class_stage_costs). Both read the classes
from here.
"""

import dataclasses

from trainsim.hardware.device import DeviceSpec
from trainsim.job import Job

RankKind = tuple[str, float]  # (device name, compute slow-down)
StageKey = tuple[int, tuple[RankKind, ...], bool]  # (stage, kinds other than the default, a default rank left)
ColumnKey = tuple[StageKey, ...]  # the replica's kinds in every stage that has any


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceClass:
    """Data-parallel replicas priced together: their dp indices and, per stage, the kinds of their ranks."""

    replicas: tuple[int, ...]
    key: ColumnKey

    def kinds(self, stage: int, default: RankKind) -> tuple[RankKind, ...]:
        for s, kinds, has_default in self.key:
            if s == stage:
                return (*kinds, default) if has_default else kinds
        return (default,)


def default_kind(job: Job) -> RankKind:
    return (job.cluster.device.name, 1.0)


def ranks_differ(job: Job) -> bool:
    """Whether the cluster names any rank override at all (cheap: the engines' fast path reads it first)."""
    cluster = job.cluster
    return bool(cluster.rank_devices or cluster.compute_slowdown)


def device_classes(job: Job) -> list[DeviceClass]:
    """The classes of the job's ranks: one (every replica, default kinds) when nothing distinguishes them."""
    par, cluster = job.parallel, job.cluster
    group = par.tp * par.cp
    per_stage = group * par.dp
    default = default_kind(job)
    kinds: dict[tuple[int, int], set[RankKind]] = {}
    counts: dict[tuple[int, int], int] = {}
    for rank in sorted(set(cluster.rank_devices) | set(cluster.compute_slowdown)):
        if rank >= job.num_gpus:
            continue
        kind = (cluster.rank_devices[rank].name if rank in cluster.rank_devices else default[0],
                cluster.compute_slowdown.get(rank, 1.0))
        if kind == default:
            continue
        place = (rank // per_stage, rank % per_stage // group)
        kinds.setdefault(place, set()).add(kind)
        counts[place] = counts.get(place, 0) + 1
    columns: dict[int, list[StageKey]] = {}
    for (stage, replica), found in sorted(kinds.items()):
        columns.setdefault(replica, []).append((stage, tuple(sorted(found)), counts[(stage, replica)] < group))
    by_key: dict[ColumnKey, list[int]] = {}
    for replica in range(par.dp):
        by_key.setdefault(tuple(columns.get(replica, ())), []).append(replica)
    return [DeviceClass(tuple(replicas), key) for key, replicas in by_key.items()]


def uniform(classes: list[DeviceClass]) -> bool:
    """Every rank alike: one class of default kinds."""
    return len(classes) == 1 and not classes[0].key


def rank_device(job: Job, name: str) -> DeviceSpec:
    if name == job.cluster.device.name:
        return job.cluster.device
    return next(d for d in job.cluster.rank_devices.values() if d.name == name)


def job_on_device(job: Job, device: DeviceSpec) -> Job:
    """The same job with its cluster's device replaced: a heterogeneous rank's prices."""
    if device is job.cluster.device:
        return job
    return dataclasses.replace(job, cluster=job.cluster.model_copy(update={"device": device}))


def stage_capacities(job: Job, classes: list[DeviceClass]) -> tuple[float, ...]:
    """Per pipeline stage, the memory of its smallest rank (the simulator's capacity of a class's device: the
    smallest of the cluster's device and its ranks')."""
    default = default_kind(job)
    return tuple(min(job.cluster.device.hbm_bytes, *(rank_device(job, name).hbm_bytes for cls in classes
                                                     for name, _ in cls.kinds(stage, default)))
                 for stage in range(job.parallel.pp))
