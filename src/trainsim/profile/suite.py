"""Profiling the local ground-truth suite: the ops of every suite job's shapes and the gloo collectives its
multi-rank jobs run, on this CPU with one thread per process (as every measured rank runs)."""

from collections.abc import Callable
from pathlib import Path

from trainsim.catalog import load_cluster
from trainsim.errors import TrainsimError
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.suite import LOCAL_CLUSTER, suite_jobs
from trainsim.profile.collectives import profile_collectives
from trainsim.profile.database import ProfileDB
from trainsim.profile.job import profile_job
from trainsim.profile.ops import local_environment
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for

SUITE_COLLECTIVE_SIZES = tuple(1024 * 4**i for i in range(9))  # 1 KiB ... 64 MiB: the largest gradient buffers
ProfileProgress = Callable[[str], None]  # a line on what is being profiled


def suite_shapes(name: str) -> list[tuple[TransformerSpec, DeviceSlice]]:
    """The distinct (model, per-device shape) pairs of a suite's jobs: what its op profile must hold."""
    shapes: dict[tuple[str, DeviceSlice, int], TransformerSpec] = {}  # zero: not in a slice's ==
    for job in suite_jobs(name):
        built = job.job()
        assert isinstance(built.model, TransformerSpec)
        par = built.parallel
        # NB: cp, ep and attention at their defaults, as the suite's profile databases were built; the ZeRO stage
        # only where there is a data-parallel group to shard over
        shape = DeviceSlice(par.micro_batch, par.seq_len, policy_for(par.precision), par.tp, par.sp,
                            zero=par.zero if par.dp * par.cp > 1 else 0)
        shapes.setdefault((built.model.name, shape, shape.zero), built.model)
    return [(model, shape) for (_, shape, _), model in shapes.items()]


def profile_suite(name: str, db_path: Path, *, repeats: int = 10, progress: ProfileProgress | None = None) -> None:
    """Profile, on this CPU with one thread (as every measured rank runs), the ops of every suite job's shapes
    and the gloo collectives among as many processes as its multi-rank jobs have, into `db_path`; what the
    database holds already is kept (resumable)."""
    import torch

    torch.set_num_threads(1)
    env = local_environment(load_cluster(LOCAL_CLUSTER).device.name, "cpu")
    with ProfileDB.open(db_path) as db:
        for model, shape in suite_shapes(name):
            if progress:
                progress(f"ops of {model.name} {shape.precision.name} tp={shape.tp}{' sp' if shape.sp else ''}")
            profile_job(db, env, model, shape, "cpu", repeats=repeats)
        for world in sorted({job.num_gpus for job in suite_jobs(name) if job.num_gpus > 1}):
            if progress:
                progress(f"gloo collectives among {world} processes")
            summary = profile_collectives(db, env, sizes=SUITE_COLLECTIVE_SIZES, world_size=world,
                                          repeats=repeats)
            if summary.failure:
                raise TrainsimError(f"profiling the collectives of {world} processes failed: {summary.failure} "
                                    "(rerun to resume)")
