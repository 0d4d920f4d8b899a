"""`trainsim profile`: measure a job's ops (and local collectives) into the profile database.

Parse (flags -> model, device slice, device), compute (trainsim.profile: op and collective microbenchmarks, each
committed as it is taken), render (a progress bar while measuring, then a summary or one JSON object).
Rerunning the same command measures only what the database does not hold yet.
"""

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainsim.catalog import load_cluster, load_model
from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError, TrainsimError
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, make_job
from trainsim.jobfile import check_choice
from trainsim.measure.capacity import check_fits
from trainsim.pipeline import predict
from trainsim.profile.collectives import (
    CLOCKS,
    COLLECTIVES,
    DEFAULT_SIZES,
    MAX_CALLS_PER_SAMPLE,
    CollectiveSummary,
    check_gap,
    profile_collectives,
)
from trainsim.profile.database import STOP_AFTER_ENV, OpSignature, ProfileDB, default_db_path
from trainsim.profile.job import profile_job
from trainsim.profile.ops import OpProfileSummary
from trainsim.report.profile import LOCAL_CPU_DEVICE, profile_summary, render_profile_summary
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import PRECISIONS, Precision, policy_for
from trainsim.units import parse_bytes


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    model: ModelSpec
    shape: DeviceSlice
    device: str  # "cpu" | "cuda"
    device_name: str
    db_path: Path
    threads: int | None
    warmup: int
    repeats: int
    ops: bool
    optimizer: bool
    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    world_size: int
    timeout_s: float
    stop_after: int | None
    collective_clock: str = "wall"  # profile.collectives.CLOCKS
    calls_per_sample: int = 1
    collective_gap_s: float = 0.0  # compute on the calling thread before each call (profile.collectives)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TrainsimError("trainsim profile needs PyTorch: pip install torch") from None
    return torch


def _device(requested: str, torch: Any) -> str:
    check_choice("device", requested, ("auto", "cpu", "cuda"))
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", requested, "torch sees no CUDA device here; use --device cpu")
    return requested


def _default_device_name(device: str, torch: Any) -> str:
    """cpu-local on CPUs; on GPUs a slug of the name torch reports (pass --device-name to use a catalog GPU)."""
    if device == "cpu":
        return LOCAL_CPU_DEVICE
    return "-".join(torch.cuda.get_device_name().lower().replace("nvidia", "").split())


def _stop_after() -> int | None:
    value = os.environ.get(STOP_AFTER_ENV)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(STOP_AFTER_ENV, value, "must be a positive integer")
    return int(value)


# Bounds of the loop settings: what a profile of hours would use, many times over.
MAX_REPEATS = 100_000
MAX_WORLD_SIZE = 256
MAX_THREADS = 4096
MAX_TIMEOUT_S = 7 * 86400.0
MAX_MESSAGE_BYTES = 2**34  # 16 GiB, a collective message larger than any GPU's memory


def _check_loop(threads: int | None, warmup: int, repeats: int, world_size: int, timeout_s: float) -> None:
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError("threads", threads, f"must be 1 to {MAX_THREADS} (leave it out for torch's default)")
    if not 0 <= warmup <= MAX_REPEATS or repeats > MAX_REPEATS:
        raise ConfigError("warmup" if repeats <= MAX_REPEATS else "repeats", max(warmup, repeats),
                          f"must be at most {MAX_REPEATS}")
    if not 2 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError("world_size", world_size, f"must be 2 to {MAX_WORLD_SIZE}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # NB: also refuses NaN
        raise ConfigError("timeout_s", timeout_s, f"must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}")


def _parse_sizes(text: str | None) -> tuple[int, ...]:
    if not text:
        return DEFAULT_SIZES
    sizes = tuple(int(parse_bytes(part.strip(), "sizes")) for part in text.split(",")[:1000] if part.strip())
    if not sizes or min(sizes) <= 0 or max(sizes) > MAX_MESSAGE_BYTES:
        raise ConfigError("sizes", text, "a comma-separated list of positive sizes of at most 16GiB such as "
                          "1KiB,1MiB")
    return sizes


def _check_shape(model: ModelSpec, shape: DeviceSlice) -> Job:
    """The same checks `trainsim predict` makes (tp divides the heads, seq_len fits learned positions ...)."""
    cluster = load_cluster("local-cpu").with_num_gpus(shape.tp)
    job = make_job(model, cluster, ParallelSpec(tp=shape.tp, sp=shape.sp, dp=1, micro_batch=shape.micro_batch,
                                                seq_len=shape.seq_len, precision=shape.precision.name))
    return job


def _progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[last]}"), console=console)


def run_profile(request: ProfileRequest, console: Console) -> dict[str, Any]:
    """Measure what the request asks for and the database lacks; return the summary as plain data."""
    torch = _torch()
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    from trainsim.profile.ops import local_environment

    env = local_environment(request.device_name, request.device)
    ops: OpProfileSummary | None = None
    comms: CollectiveSummary | None = None
    with ProfileDB.open(request.db_path, stop_after=request.stop_after) as db, _progress_bar(console) as bar:
        if request.ops:
            task = bar.add_task("ops", total=None, last="")

            def op_done(sig: OpSignature, how: str) -> None:
                bar.update(task, advance=1, last=f"{how}: {sig.describe()}")

            ops = profile_job(db, env, request.model, request.shape, request.device, warmup=request.warmup,
                              repeats=request.repeats, optimizer=request.optimizer, progress=op_done,
                              plan=lambda n: bar.update(task, total=n))
        if request.collectives:
            ctask = bar.add_task(f"collectives ({request.world_size} x gloo)", total=None, last="")

            def comm_done(collective: str, size: int, how: str) -> None:
                bar.update(ctask, advance=1, last=f"{how}: {collective} {size} B")

            comms = profile_collectives(db, env, collectives=request.collectives, sizes=request.sizes,
                                        world_size=request.world_size, warmup=max(1, request.warmup // 2),
                                        repeats=request.repeats, timeout_s=request.timeout_s, progress=comm_done,
                                        plan=lambda n: bar.update(ctask, total=n),
                                        clock=request.collective_clock, calls_per_sample=request.calls_per_sample,
                                        gap_s=request.collective_gap_s)
        rows = db.count("op_times")
        collective_rows = db.count("collective_times")
    return profile_summary(request.db_path, env, request.model.name, request.shape, ops, comms, rows,
                           collective_rows)


@handles_errors
def profile(
    model: Annotated[str, typer.Option(help="catalog name, model YAML, or HF config.json")] = "gpt3-125m",
    precision: Annotated[str, typer.Option(help=" ".join(PRECISIONS))] = "bf16",
    micro_batch: Annotated[int, typer.Option(help="sequences per micro-batch")] = 1,
    seq_len: Annotated[int, typer.Option(help="tokens per sequence")] = 2048,
    tp: Annotated[int, typer.Option(help="tensor-parallel degree: profile the sharded shapes")] = 1,
    sp: Annotated[bool, typer.Option("--sp/--no-sp", help="sequence parallelism (with tp > 1)")] = False,
    zero: Annotated[int, typer.Option(help="2 or 3: also FSDP2's per-layer overhead (ZeRO-2/3)")] = 0,
    db: Annotated[Path | None, typer.Option(help="profile database (default: the user's cache)")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    device_name: Annotated[str | None, typer.Option(help="trainsim device name to file the times under")] = None,
    threads: Annotated[int | None, typer.Option(help="torch intra-op threads (default: torch's)")] = None,
    warmup: Annotated[int, typer.Option(help="untimed calls before measuring")] = 3,
    repeats: Annotated[int, typer.Option(help="timed samples per op (median, p10, p90)")] = 10,
    ops: Annotated[bool, typer.Option("--ops/--no-ops", help="op microbenchmarks")] = True,
    optimizer: Annotated[bool, typer.Option("--optimizer/--no-optimizer", help="time the Adam step")] = True,
    collectives: Annotated[bool, typer.Option("--collectives/--no-collectives",
                                              help="gloo collective microbenchmarks")] = True,
    sizes: Annotated[str | None, typer.Option(help="collective message sizes, e.g. 1KiB,1MiB")] = None,
    world_size: Annotated[int, typer.Option(help="local processes for the collectives")] = 2,
    timeout_s: Annotated[float, typer.Option(help="deadline of the collective run, seconds")] = 300.0,
    collective_clock: Annotated[str, typer.Option(help="wall | cpu: collectives on the wall clock, or on the "
                                                  "busiest rank's process CPU seconds (what a CPU rank's CPU "
                                                  "time per iteration pays; keep it in its own --db)")] = "wall",
    calls_per_sample: Annotated[int, typer.Option(help="collective calls back to back per sample (their "
                                                  "mean; gloo's CPU cost per call is bimodal)")] = 1,
    collective_gap_ms: Annotated[float, typer.Option(help="with --collective-clock cpu: compute this long on "
                                                     "the calling thread before each call, as an executor "
                                                     "runs ops between its collectives (0: back to back)")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    overlap: Annotated[bool, typer.Option("--overlap", help="measure the overlap factor gamma instead: the "
                                          "backward pass with and without overlapping gradient all-reduces on "
                                          "--world-size gloo ranks; stored per device and model family")] = False,
    overlap_file: Annotated[Path | None, typer.Option(help="where --overlap stores gamma (default: the "
                                                      "catalog's calibration/overlap.yaml)")] = None,
    runtime_memory: Annotated[bool, typer.Option("--runtime-memory", help="measure a CPU rank's resident "
                                                 "runtime instead: a negligible model through `trainsim "
                                                 "measure` on --world-size gloo ranks; stored per device")] = False,
    runtime_memory_file: Annotated[Path | None, typer.Option(help="where --runtime-memory stores it (default: "
                                                             "the catalog's calibration/runtime_memory.yaml)")] = None,
    executor_overhead: Annotated[bool, typer.Option("--executor-overhead", help="measure trainsim measure's split "
                                                    "executor's cost per op instead: a negligible model of "
                                                    "--model's family on --world-size gloo ranks for --repeats steps; "
                                                    "stored in the profile database")] = False,
    reshard_overhead: Annotated[bool, typer.Option("--reshard-overhead", help="measure the host cost per reshard "
                                                   "collective instead: the split executor's autograd collectives "
                                                   "(which trainsim measure's tp splits run too) beyond the bare "
                                                   "collective, on --world-size gloo ranks; stored in the profile "
                                                   "database")] = False,
) -> None:
    """Measure the forward and backward time of every op of a job on this machine, and local collectives."""
    import time

    if runtime_memory:
        _profile_runtime_memory(world_size, timeout_s, device_name, runtime_memory_file, as_json)
        return
    if executor_overhead:
        _profile_executor_overhead(model, world_size, repeats, timeout_s, device_name, db, as_json)
        return
    if reshard_overhead:
        _profile_reshard_overhead(world_size, timeout_s, device_name, db, as_json)
        return
    if overlap:
        _profile_overlap(model, micro_batch, seq_len, world_size, warmup, repeats, threads, timeout_s,
                         device_name, overlap_file, as_json)
        return

    check_choice("precision", precision, PRECISIONS)
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len), ("tp", tp), ("repeats", repeats)):
        if value < 1:
            raise ConfigError(name, value, "must be a positive integer")
    _check_loop(threads, warmup, repeats, world_size, timeout_s)
    check_choice("collective_clock", collective_clock, CLOCKS)
    if not 1 <= calls_per_sample <= MAX_CALLS_PER_SAMPLE:
        raise ConfigError("calls_per_sample", calls_per_sample, f"must be 1 to {MAX_CALLS_PER_SAMPLE}")
    check_gap(collective_gap_ms, collective_clock, "collective_gap_ms", 1e-3, "ms")
    spec = load_model(model)
    if zero not in (0, 1, 2, 3):
        raise ConfigError("zero", zero, "0, 1, 2 or 3")
    if db is not None and db.exists() and not db.is_file():
        raise ConfigError("db", str(db), "must be a database file (or a path where one can be created)")
    shape = DeviceSlice(micro_batch, seq_len, policy_for(cast(Precision, precision)), tp, sp, zero=zero)
    job = _check_shape(spec, shape)
    torch = _torch()
    dev = _device(device, torch)
    check_fits(predict(job).peak_memory_bytes, 1, dev)  # the ops of one device's job, before any is built
    request = ProfileRequest(spec, shape, dev, device_name or _default_device_name(dev, torch),
                             db or default_db_path(), threads, max(0, warmup), repeats, ops, optimizer,
                             COLLECTIVES if collectives else (), _parse_sizes(sizes), world_size, timeout_s,
                             _stop_after(), collective_clock, calls_per_sample, collective_gap_ms / 1e3)
    started = time.perf_counter()
    summary = run_profile(request, Console(stderr=True))
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
    else:
        typer.echo(render_profile_summary(summary, time.perf_counter() - started))


def _profile_overlap(model: str, micro_batch: int, seq_len: int, world_size: int, warmup: int, repeats: int,
                     threads: int | None, timeout_s: float, device_name: str | None, path: Path | None,
                     as_json: bool) -> None:
    """`trainsim profile --overlap`: gamma of this machine (CPU ranks over gloo) for the model's family."""
    from trainsim.catalog.overlap import OVERLAP_PATH, model_family, store_overlap_factor
    from trainsim.profile.overlap import measure_overlap

    _torch()
    spec = load_model(model)
    result = measure_overlap(spec, micro_batch=micro_batch, seq_len=seq_len, world_size=world_size,
                             warmup=warmup, repeats=repeats, threads=threads or 1, timeout_s=timeout_s)
    entry = {"device": device_name or LOCAL_CPU_DEVICE, "family": model_family(spec),
             "gamma": round(result.gamma, 4), "plain_backward_s": round(result.plain_backward_s, 6),
             "overlapped_backward_s": round(result.overlapped_backward_s, 6), "world_size": world_size,
             "repeats": repeats, "backend": "gloo", "model": spec.name, "micro_batch": micro_batch,
             "seq_len": seq_len}
    store_overlap_factor(entry, path or OVERLAP_PATH)
    _show_entry(entry, as_json, f"gamma {entry['gamma']:.4f} for {entry['family']} on {entry['device']}: backward "
                f"{result.plain_backward_s:.4f} s plain, {result.overlapped_backward_s:.4f} s overlapped "
                f"(median of {repeats}, slowest of {world_size} ranks); stored in {path or OVERLAP_PATH}")


def _show_entry(entry: dict[str, object], as_json: bool, text: str) -> None:
    """A stored measurement as JSON, or its one line of text."""
    typer.echo(json.dumps(entry, indent=1) if as_json else text)


def _profile_runtime_memory(world_size: int, timeout_s: float, device_name: str | None, path: Path | None,
                            as_json: bool) -> None:
    """`trainsim profile --runtime-memory`: a CPU rank's resident runtime (catalog/runtime_memory.py)."""
    from trainsim.catalog.runtime_memory import RUNTIME_MEMORY_PATH, store_runtime_memory
    from trainsim.profile.runtime_memory import measure_runtime_memory

    _torch()
    _check_probe_timeout(timeout_s)
    result = measure_runtime_memory(world_size=world_size, timeout_s=timeout_s)
    entry = {"device": device_name or LOCAL_CPU_DEVICE, "baseline_bytes": result.baseline_bytes,
             "runtime_bytes": result.runtime_bytes, "model_bytes": result.model_bytes,
             "world_size": result.world_size, "iterations": result.iterations, "backend": "gloo",
             "harness": "trainsim measure --tree (split executor), memory cap sampling"}
    store_runtime_memory(entry, path or RUNTIME_MEMORY_PATH)
    _show_entry(entry, as_json, f"{entry['device']}: {result.baseline_bytes / 2**20:.0f} MiB resident after torch "
                f"and gloo, {result.runtime_bytes / 2**20:.0f} MiB more while a negligible model trains (largest "
                f"of {world_size} ranks); stored in {path or RUNTIME_MEMORY_PATH}")


def _profile_executor_overhead(model: str, world_size: int, iterations: int, timeout_s: float,
                               device_name: str | None, db: Path | None, as_json: bool) -> None:
    """`trainsim profile --executor-overhead`: the split executor's cost per op of each phase for the model's
    family, into the profile database (profile/executor_overhead.py)."""
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.executor_overhead import FAMILIES, measure_executor_overhead, store_executor_overhead
    from trainsim.profile.ops import local_environment

    _torch()
    _check_probe_timeout(timeout_s)
    family = load_model(model).kind
    if family not in FAMILIES:
        raise ConfigError("model", model, f"must be a {', '.join(FAMILIES)} model (the split executor's)")
    result = measure_executor_overhead(family, world_size=world_size, iterations=iterations, timeout_s=timeout_s)
    path = db or default_db_path()
    env = local_environment(device_name or LOCAL_CPU_DEVICE, "cpu")
    with ProfileDB.open(path) as database:
        store_executor_overhead(database, env, result)
    entry = {"device": env.device, "family": family, "world_size": world_size, "iterations": result.iterations,
             "per_op_s": result.per_op_s, "ops": result.ops, "kernel_s": result.kernel_s,
             "autograd_per_op_s": result.autograd_per_op_s, "db": str(path)}
    _show_entry(entry, as_json, f"{family} on {env.device}: "
                + ", ".join(f"{phase} {sorted(v)[len(v) // 2] * 1e6:.1f} us per op" for phase, v in
                            result.per_op_s.items()) + f" beyond kernels and autograd; stored in {path}")


def _profile_reshard_overhead(world_size: int, timeout_s: float, device_name: str | None, db: Path | None,
                              as_json: bool) -> None:
    """`trainsim profile --reshard-overhead`: the host cost per reshard collective and phase beyond the bare
    collective (profile/reshard_overhead.py), into the profile database, in the one-thread environment the ranks
    run (and the op profiles of `--threads 1` are stored in)."""
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.ops import local_environment
    from trainsim.profile.reshard_overhead import measure_reshard_overhead, store_reshard_overhead

    torch = _torch()
    _check_probe_timeout(timeout_s)
    result = measure_reshard_overhead(world_size=world_size, timeout_s=timeout_s)
    torch.set_num_threads(1)  # the environment recorded: the probe's ranks run one thread, as the measured ranks
    path = db or default_db_path()
    env = local_environment(device_name or LOCAL_CPU_DEVICE, "cpu")
    with ProfileDB.open(path) as database:
        store_reshard_overhead(database, env, result)
    per_step = {f"{collective} {phase}": statistics.median(v)
                for (collective, phase), v in result.per_step_s.items()}
    entry = {"device": env.device, "world_size": world_size, "elements": result.elements, "calls": result.calls,
             "rounds": result.rounds, "per_step_s": per_step, "db": str(path)}
    _show_entry(entry, as_json, f"{env.device}: " + ", ".join(f"{key} {seconds * 1e6:.1f} us" for key, seconds in
                                                               per_step.items())
                + f" per reshard collective beyond the bare call; stored in {path}")


def _check_probe_timeout(timeout_s: float) -> None:
    """A probe's timeout: a positive number of seconds, at most an hour."""
    if not 0 < timeout_s <= 3600:  # NB: also refuses NaN
        raise ConfigError("timeout_s", timeout_s, "must be a positive number of seconds, at most 3600")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
