"""A measured run: what ran (the job, settings, versions, machine) and what happened (per-iteration times, peak
memory per rank). One JSON file per run, written atomically; `trainsim validate DIR` reads a folder of them.

No torch import here: reading results needs only the standard library, numpy and the specs.
"""

import hashlib
import json
import math
import os
import platform
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from trainsim.catalog.files import parse_text, read_text, shown_path, write_atomic
from trainsim.catalog.model_files import parse_model
from trainsim.errors import InputFileError, TrainsimError, check_name, short_repr
from trainsim.hardware.cluster import ClusterSpec
from trainsim.job import Job, make_job
from trainsim.specbase import MAX_INT_FIELD, config_error_from
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec, load_stack

SCHEMA = "trainsim.measured-run/1"
RESULT_SUFFIX = ".json"
_OPTIONAL = ("final_loss", "labels", "traces", "baseline_memory_bytes")
# A run's file holds a few hundred numbers per rank; 16 MiB is thousands of ranks.
MAX_RUN_FILE_BYTES = 16 * 2**20


def job_to_dict(job: Job) -> dict[str, Any]:
    """The job as data: the full model, cluster and strategy specs (a run is reproducible from its file)."""
    return {"model": job.model.model_dump(mode="json"), "cluster": job.cluster.model_dump(mode="json"),
            "parallel": job.parallel.model_dump(mode="json")}


def measured_stack(par: ParallelSpec) -> StackSpec:
    """The stack `trainsim measure` runs a strategy with (measure/parallelize.py): FSDP2 fully_shard for ZeRO 2-3;
    else DistributedDataParallel (ZeroRedundancyOptimizer for ZeRO 1, whose parameters are broadcast after the
    step), except with pp > 1, where the gradients are all-reduced after the pipeline flush (all_reduce_grads)."""
    if par.zero >= 2:
        return load_stack("fsdp2")
    ddp = load_stack("ddp")
    if par.pp > 1 and par.dp > 1:
        return ddp.model_copy(update={"grad_reduce_overlap": False})
    return ddp


def job_from_dict(data: dict[str, Any], where: str = "job") -> Job:
    try:
        model = parse_model(data["model"], f"{where}.model")
        try:
            cluster = ClusterSpec.model_validate(data["cluster"])
        except ValidationError as exc:
            raise config_error_from(exc, f"{where}.cluster") from None
        parallel = ParallelSpec.parse(data["parallel"], f"{where}.parallel")
    except KeyError as exc:
        raise InputFileError(f"{where} lacks the key {exc.args[0]!r} (model, cluster, parallel)") from None
    job = make_job(model, cluster, parallel)
    return make_job(model, cluster, parallel, measured_stack(job.parallel))


@dataclass(frozen=True, slots=True)
class IterationStats:
    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    min_s: float
    max_s: float

    @classmethod
    def of(cls, times_s: list[float]) -> "IterationStats":
        if not times_s:
            raise TrainsimError("a measured run needs at least one timed iteration")
        a = np.asarray(times_s, dtype=float)
        p10, median, p90 = (float(v) for v in np.percentile(a, [10, 50, 90]))
        return cls(median, p10, p90, float(a.mean()), float(a.min()), float(a.max()))


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One measured run. Times in seconds (rank 0's wall clock between barriers, optimizer step included);
    peak memory in bytes per rank (CUDA max allocated, or the process's RSS high-water mark on a CPU);
    baseline memory per rank: on a CPU the RSS before the job's model is built (interpreter, torch, the process
    group), which the job's own memory (job_peak_memory_bytes) leaves out, as CUDA's allocator counts leave out
    the CUDA context."""

    run_id: str
    job: dict[str, Any]
    iteration_times_s: list[float]
    peak_memory_bytes: list[int]
    peak_memory_kind: str
    tokens_per_iteration: int
    settings: dict[str, Any]
    versions: dict[str, str]
    machine: dict[str, Any]
    started_at: str
    final_loss: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    traces: list[str] = field(default_factory=list)  # relative to the result's folder
    baseline_memory_bytes: list[int] = field(default_factory=list)

    @property
    def stats(self) -> IterationStats:
        return IterationStats.of(self.iteration_times_s)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_iteration / self.stats.median_s

    @property
    def world_size(self) -> int:
        return len(self.peak_memory_bytes)

    @property
    def nodes(self) -> int:
        """Hosts the ranks ran on."""
        return max(1, int(self.settings.get("nodes", 1)))

    @property
    def max_peak_memory_bytes(self) -> int:
        return max(self.peak_memory_bytes)

    @property
    def job_peak_memory_bytes(self) -> int:
        """The largest rank's peak above its baseline (the peak itself where no baseline was recorded)."""
        base = self.baseline_memory_bytes or [0] * len(self.peak_memory_bytes)
        return max(peak - b for peak, b in zip(self.peak_memory_bytes, base, strict=True))

    def make_job(self) -> Job:
        return job_from_dict(self.job, f"run {self.run_id}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        stats = self.stats
        data = {"schema": SCHEMA, **data, "iteration_time_s": asdict(stats), "tokens_per_s": self.tokens_per_s}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "run") -> "MeasuredRun":
        if data.get("schema") != SCHEMA:
            raise InputFileError(f"{where} is not a measured run (schema {data.get('schema')!r}, "
                                 f"expected {SCHEMA!r})")
        names = list(cls.__dataclass_fields__)
        missing = [n for n in names if n not in data and n not in _OPTIONAL]
        if missing:
            raise InputFileError(f"{where} lacks {', '.join(missing)}")
        _check_run_fields(data, where)
        return cls(**{n: data[n] for n in names if n in data})


def _numbers(value: object, positive: bool) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
        for v in value)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_INT_FIELD


def _check_run_fields(data: dict[str, Any], where: str) -> None:
    """The types and ranges of a measured run's fields (a file edited or broken by hand is one line, not a
    TypeError later)."""
    settings, machine = data.get("settings"), data.get("machine")
    problems = {
        "run_id": isinstance(data["run_id"], str) and check_name("run_id", data["run_id"]) is None,
        "job": isinstance(data["job"], dict) and all(isinstance(data["job"].get(k), dict)
                                                     for k in ("model", "cluster", "parallel")),
        "iteration_times_s": _numbers(data["iteration_times_s"], positive=True),
        "peak_memory_bytes": _numbers(data["peak_memory_bytes"], positive=True),
        "baseline_memory_bytes": data.get("baseline_memory_bytes") in (None, []) or (
            _numbers(data["baseline_memory_bytes"], positive=False) and _numbers(data["peak_memory_bytes"], False)
            and len(data["baseline_memory_bytes"]) == len(data["peak_memory_bytes"])),
        "tokens_per_iteration": _positive_int(data["tokens_per_iteration"]),
        "peak_memory_kind": isinstance(data["peak_memory_kind"], str),
        "started_at": isinstance(data["started_at"], str),
        "settings": isinstance(settings, dict) and _positive_int(settings.get("nodes", 1)) and (
            settings.get("threads_per_rank") in (None, []) or (_numbers(settings["threads_per_rank"], positive=True))),
        "versions": isinstance(data["versions"], dict),
        "machine": isinstance(machine, dict) and all(
            machine.get(key) in (None, 0) or _positive_int(machine[key]) for key in ("cpus_allowed", "cpu_count")),
        "final_loss": data.get("final_loss") is None or (
            isinstance(data["final_loss"], int | float) and math.isfinite(data["final_loss"])),
        "labels": isinstance(data.get("labels", {}), dict),
        "traces": isinstance(data.get("traces", []), list) and all(isinstance(t, str) for t in data.get("traces", [])),
    }
    for key, fine in problems.items():
        if not fine:
            raise InputFileError(f"{where}: {key}={short_repr(data.get(key))} is not what a measured run holds")


def result_path(out_dir: Path, run_id: str) -> Path:
    return out_dir / f"{run_id}{RESULT_SUFFIX}"


def save_run(run: MeasuredRun, out_dir: Path) -> Path:
    """Write run_id.json atomically (a temporary file in the same folder, then rename): a reader or a resumed
    suite never sees half a file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = result_path(out_dir, run.run_id)
    write_atomic(path, json.dumps(run.to_dict(), indent=1) + "\n")
    return path


def load_run(path: Path) -> MeasuredRun:
    name = shown_path(path)
    data = parse_text(read_text(path, MAX_RUN_FILE_BYTES), is_json=True, name=name)
    if not isinstance(data, dict):
        raise InputFileError(f"{name} is not a measured run (not a JSON object)")
    return MeasuredRun.from_dict(data, name)


def load_runs(out_dir: Path) -> list[MeasuredRun]:
    """Every run_id.json of a folder (not its subfolders: traces and logs live there), sorted by name."""
    if not out_dir.is_dir():
        raise InputFileError(f"{out_dir} is not a folder of measured runs")
    return [load_run(p) for p in sorted(out_dir.glob(f"*{RESULT_SUFFIX}"))]


# --- what ran where ---


def versions() -> dict[str, str]:
    import sys

    from trainsim.version import __version__ as trainsim_version

    found = {"python": sys.version.split()[0], "trainsim": trainsim_version}
    try:
        import torch

        found["torch"] = str(torch.__version__)
        if torch.version.cuda:
            found["cuda"] = str(torch.version.cuda)
    except ImportError:
        pass
    return found


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the host's count where the OS has no affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def machine() -> dict[str, Any]:
    """A machine description without identifying it: the hostname only as a short hash."""
    return {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count() or 0,
            "cpus_allowed": usable_cores(),
            "system": f"{platform.system()} {platform.release()}", "machine": platform.machine(),
            "host_sha256": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
