"""The per-rank training loop of a measured run: `python -m trainsim.measure.worker`.

Started by `trainsim measure` (one process per rank) or by torchrun on any number of nodes: it reads RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the environment (env:// rendezvous), joins one process
group (NCCL on GPUs, gloo on CPUs), builds the job's model with its strategy, runs `warmup` untimed and
`iterations` timed steps, and rank 0 writes the result file. Two ways to say what to run:

    python -m trainsim.measure.worker --spec FILE                 (written by `trainsim measure`)
    python -m trainsim.measure.worker --job JOB.yaml --out DIR [--iterations N --warmup W --profile ...]

Timing: each iteration is bracketed by barriers and timed on rank 0's wall clock, so it is the slowest rank's
step (forward, backward, gradient reductions, optimizer step). Peak memory: CUDA max allocated, or on a CPU
the process's RSS high-water mark (getrusage ru_maxrss: interpreter, torch and the job's tensors).
Profiling and execution traces run after the timed iterations, on extra iterations, so they do not perturb
the timings.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from trainsim.measure.launch import FAULT_ENV, PARENT_ENV, STORE_FD_ENV, MeasureSpec, error_path, make_spec
from trainsim.measure.results import MeasuredRun, job_from_dict, machine, save_run, versions

PROFILED_ITERATIONS = 3


def log(message: str) -> None:
    rank = os.environ.get("RANK", "?")
    print(f"[rank {rank} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _watch_parent() -> None:
    """Exit when the launcher that started this rank is gone (its session would otherwise outlive it)."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent:
        return

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def inject_fault(rank: int) -> None:
    """Test only: TRAINSIM_MEASURE_FAULT=crash:R makes rank R raise, hang:R makes it sleep for ever."""
    fault = os.environ.get(FAULT_ENV, "")
    if not fault:
        return
    kind, _, target = fault.partition(":")
    if target and int(target) != rank:
        return
    if kind == "crash":
        raise RuntimeError(f"injected crash on rank {rank} ({FAULT_ENV}={fault})")
    if kind == "hang":
        log(f"injected hang ({FAULT_ENV}={fault})")
        while True:
            time.sleep(3600)


def _local_store(rank: int, world_size: int, timeout_s: float) -> Any:
    """The rendezvous store of a run `trainsim measure` launched: rank 0 serves it on the loopback socket the
    launcher bound and passed down (STORE_FD_ENV). None under torchrun, which brings its own (env://)."""
    if PARENT_ENV not in os.environ:
        return None
    import torch.distributed as dist

    listen_fd = os.environ.get(STORE_FD_ENV) if rank == 0 else None
    store_type = dist.TCPStore  # pyright: ignore[reportPrivateImportUsage]  # NB: public, torch 2.x docs
    return store_type(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]),
                      world_size=world_size, is_master=rank == 0, timeout=timedelta(seconds=timeout_s),
                      master_listen_fd=int(listen_fd) if listen_fd else None)


def run_worker(spec: MeasureSpec) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    job = job_from_dict(spec.job)
    if job.num_gpus != world_size:
        raise RuntimeError(f"the job needs {job.num_gpus} ranks (tp x pp x dp); WORLD_SIZE={world_size}")
    backend = "nccl" if spec.device == "cuda" else "gloo"
    log(f"joining {backend} group of {world_size} ({os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')})")
    store = _local_store(rank, world_size, spec.timeout_s)
    dist.init_process_group(backend, timeout=timedelta(seconds=spec.timeout_s),
                            device_id=device if spec.device == "cuda" else None,
                            **({"store": store, "rank": rank, "world_size": world_size} if store else {}))
    try:
        _measure(spec, job, device, rank, world_size)
    finally:
        dist.destroy_process_group()


def _measure(spec: MeasureSpec, job: Any, device: Any, rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.measure.parallelize import Trainer, make_topology

    started = datetime.now(UTC).isoformat(timespec="seconds")
    torch.manual_seed(spec.seed)
    baseline = _resident_bytes() if device.type == "cpu" else 0
    if spec.frontend == "torch":  # the torch front-end's model, its modules split by the tree's styles
        from trainsim.measure.front_end_model import FrontEndTrainer

        trainer: Any = FrontEndTrainer(job, make_topology(job, device.type), device, spec.seed,
                                       spec.front_end_styles or {})
    elif spec.tree_yaml and spec.tp_degrees is None:
        trainer = _split_trainer(spec, job, rank, world_size)
    else:  # a tree's per-op tp configs run in the job's own tp Trainer
        trainer = Trainer(job, make_topology(job, device.type), device, spec.seed, tp_degrees=spec.tp_degrees,
                          tp_dims=spec.tp_dims)
    log(f"built {job.describe()}; stages {trainer.stage_indices}")
    cap = _MemoryCap(spec.memory_cap_bytes, baseline, device)
    inject_fault(rank)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    warm_times: list[float] = []
    for i in range(spec.warmup):
        begun = time.perf_counter()
        trainer.step()
        warm_times.append(time.perf_counter() - begun)
        log(f"warm-up {i + 1}/{spec.warmup}")
        if cap.exceeded():
            break
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: list[float] = []
    loss = float("nan")
    if hasattr(trainer, "reset_phases"):
        trainer.reset_phases()  # the timed steps' phases only
    probes = _probe_log(spec)
    load_before, cpu_before, thread_before = os.getloadavg()[0], time.process_time(), time.thread_time()
    barrier_cpu_s = 0.0  # the process CPU of the harness' own barriers, which cpu_s includes and no training has
    step_cpu_s: list[float] = []  # each timed step's process CPU, barriers and probes left out
    step_thread_cpu_s: list[float] = []  # and its training thread's alone (no gloo threads)
    for _ in range(spec.iterations if not cap.over else 0):
        if probes is not None:
            probes.before()
        barrier_cpu_s -= time.process_time()
        dist.barrier()
        step_began, thread_began = time.process_time(), time.thread_time()
        barrier_cpu_s += step_began
        start = time.perf_counter()
        loss = trainer.step()
        sync()
        ended = time.process_time()
        step_thread_cpu_s.append(time.thread_time() - thread_began)
        step_cpu_s.append(ended - step_began)
        dist.barrier()
        barrier_cpu_s += time.process_time() - ended
        times.append(time.perf_counter() - start)
        if probes is not None:
            probes.after()
        if cap.exceeded():
            break
    # the probes are the harness', not the training's: left out of both CPU figures
    cpu_s = time.process_time() - cpu_before - (probes.process_cpu_s if probes else 0.0)
    # the training thread alone: no gloo or sampler threads
    thread_cpu_s = time.thread_time() - thread_before - (probes.thread_cpu_s if probes else 0.0)
    if times:
        log(f"timed {len(times)} iterations: median {sorted(times)[len(times) // 2]:.4f} s")
    peak = _peak_memory_bytes(device)
    traces = _traces(spec, trainer, rank)
    timed_loss = loss if trainer.computes_loss and loss == loss else None  # nan: no timed step (oom)
    info = {"rank": rank, "peak": peak, "baseline": baseline, "loss": timed_loss,
            "threads": torch.get_num_threads(), "traces": traces, "host": machine()["host_sha256"],
            "cpu_s": cpu_s, "thread_cpu_s": thread_cpu_s, "barrier_cpu_s": barrier_cpu_s,
            "load": [load_before, os.getloadavg()[0]], "oom": cap.over,
            "phase_cpu_s": dict(getattr(trainer, "phase_cpu_s", {})), "step_cpu_s": step_cpu_s,
            "step_thread_cpu_s": step_thread_cpu_s,
            "probe_pairs_s": probes.pairs_s if probes else None,
            "probe_cpu_s": probes.process_cpu_s if probes else None,
            "capped_peak": cap.used() if cap.cap > 0 else None}
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, info)
    if rank == 0:
        _write_result(spec, job, times or warm_times[-1:], gathered, started, device)  # oom: the last step
    dist.barrier()  # no rank tears down its connections while another still uses them


def _probe_log(spec: MeasureSpec) -> Any:
    """A log of measure.phase's reference probe around every timed step (None without --phase-normalise)."""
    if not spec.phase_probe:
        return None
    from trainsim.measure.phase import ProbeLog, ReferenceProbe

    return ProbeLog(ReferenceProbe())


def _split_trainer(spec: MeasureSpec, job: Any, rank: int, world_size: int) -> Any:
    """The split executor's trainer for a strategy tree (measure/split_model.py)."""
    import tempfile

    from trainsim.frontends.catalog.build import build_graph
    from trainsim.measure.split_model import Ranks, SplitTrainer
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.placement import OpConfig
    from trainsim.strategy.tree_yaml import load_tree_yaml

    graph = build_graph(job.model, DeviceSlice.of(job.parallel))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(spec.tree_yaml)
    try:
        plan = load_tree_yaml(Path(handle.name), graph).lower(job.parallel)
    finally:
        Path(handle.name).unlink(missing_ok=True)
    configs = {key: OpConfig(*value) for key, value in (spec.op_configs or {}).items()}
    return SplitTrainer(job, plan, configs, Ranks(world_size, rank), spec.seed, spec.dataflow)


class _MemoryCap:
    """A per-rank memory cap the harness enforces. On a CPU a thread samples the rank's resident memory every few
    milliseconds while the steps run (the high-water mark of getrusage would keep the model's construction, whose
    full weights are sliced and freed); on a GPU, CUDA max allocated. After each step every rank compares its peak
    above its baseline with the cap, and all stop together (one max-reduction) when any rank is over it: the run
    records outcome "oom"."""

    SAMPLE_S = 0.002

    def __init__(self, cap_bytes: int, baseline: int, device: Any) -> None:
        self.cap, self.baseline, self.device, self.over = cap_bytes, baseline, device, False
        self.peak = 0
        if cap_bytes > 0 and device.type == "cpu":
            threading.Thread(target=self._sample, daemon=True, name="rss-sampler").start()

    def _sample(self) -> None:
        while not self.over:
            self.peak = max(self.peak, _resident_bytes())
            time.sleep(self.SAMPLE_S)

    def used(self) -> int:
        if self.device.type == "cpu":
            return max(self.peak, _resident_bytes()) - self.baseline
        return _peak_memory_bytes(self.device)

    def exceeded(self) -> bool:
        if self.cap <= 0:
            return False
        import torch
        import torch.distributed as dist

        used = self.used()
        flag = torch.tensor([1.0 if used > self.cap else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.over = bool(flag.item() > 0)
        if self.over:
            log(f"memory cap {self.cap} B exceeded (this rank {used} B): outcome oom")
        return self.over


def _resident_bytes() -> int:
    """The process's resident memory now (Linux /proc; 0 where it cannot be read)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _peak_memory_bytes(device: Any) -> int:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def _traces(spec: MeasureSpec, trainer: Any, rank: int) -> list[str]:
    """torch.profiler Chrome traces and PyTorch execution traces of extra iterations, one file per rank."""
    import torch.distributed as dist

    out = Path(spec.out_dir) / "traces"
    written: list[str] = []
    if spec.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if spec.device == "cuda" else [])
        out.mkdir(parents=True, exist_ok=True)
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(PROFILED_ITERATIONS):
                trainer.step()
                dist.barrier()
        path = out / f"{spec.run_id}.rank{rank}.trace.json"
        prof.export_chrome_trace(str(path))
        written.append(str(path.relative_to(spec.out_dir)))
    if spec.execution_trace:
        from torch.profiler import ExecutionTraceObserver

        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{spec.run_id}.rank{rank}.et.json"
        observer = ExecutionTraceObserver().register_callback(str(path))
        observer.start()
        trainer.step()
        observer.stop()
        observer.unregister_callback()
        dist.barrier()
        written.append(str(path.relative_to(spec.out_dir)))
    return written


def _write_result(spec: MeasureSpec, job: Any, times: list[float], ranks: list[Any], started: str,
                  device: Any) -> None:
    import torch

    hosts = {r["host"] for r in ranks}
    settings = {"iterations": spec.iterations, "warmup": spec.warmup, "device": spec.device,
                "backend": "nccl" if spec.device == "cuda" else "gloo", "world_size": len(ranks),
                "nodes": len(hosts), "threads_per_rank": [r["threads"] for r in ranks],
                "timing": "rank 0 wall clock between barriers; optimizer step included",
                "seed": spec.seed,
                # a busy machine shows here: rank 0's 1-minute load average before and after the timed loop,
                # and each rank's CPU time over it (well below the timed wall time: starved or waiting)
                "load_average_1m": ranks[0]["load"], "cpu_s_per_rank": [round(r["cpu_s"], 4) for r in ranks],
                "thread_cpu_s_per_rank": [round(r["thread_cpu_s"], 4) for r in ranks],
                # of cpu_s, the harness' two barriers per timed step (gloo's CPU: ~0.6-1.3 ms each on this machine)
                "barrier_cpu_s_per_rank": [round(r["barrier_cpu_s"], 4) for r in ranks],
                # the split executor's training thread per phase (measure/split_model.PHASES), over the timed steps
                **({"phase_thread_cpu_s_per_rank": [{k: round(v, 4) for k, v in r["phase_cpu_s"].items()}
                                                    for r in ranks]} if ranks[0].get("phase_cpu_s") else {}),
                "timed_wall_s": round(sum(times), 4),
                "outcome": "oom" if any(r.get("oom") for r in ranks) else "ok",
                "memory_cap_bytes": spec.memory_cap_bytes,
                "capped_peak_bytes": [r.get("capped_peak") for r in ranks]}
    if spec.phase_probe and all(r["probe_pairs_s"] for r in ranks):  # none when the cap stopped the warm-up
        settings.update(_phase_settings([r["step_cpu_s"] for r in ranks], [r["step_thread_cpu_s"] for r in ranks],
                                        [r["probe_pairs_s"] for r in ranks], [r["probe_cpu_s"] for r in ranks], times))
    if spec.tree_yaml:
        settings["tree"] = spec.tree_yaml
    if spec.device == "cuda":
        settings["gpu_name"] = torch.cuda.get_device_name(device)
    losses = [r["loss"] for r in ranks if r["loss"] is not None]  # one per data-parallel rank
    run = MeasuredRun(
        run_id=spec.run_id, job=spec.job, iteration_times_s=times,
        peak_memory_bytes=[int(r["peak"]) for r in ranks], baseline_memory_bytes=[int(r["baseline"]) for r in ranks],
        peak_memory_kind="cuda-max-allocated" if spec.device == "cuda" else "rss-high-water-mark",
        tokens_per_iteration=job.tokens_per_iteration, settings=settings, versions=versions(),
        machine=machine(), started_at=started, final_loss=sum(losses) / len(losses) if losses else None,
        labels=spec.labels, traces=[t for r in ranks for t in r["traces"]])
    path = save_run(run, Path(spec.out_dir))
    log(f"wrote {path}")


def _phase_settings(steps_s: list[list[float]], threads_s: list[list[float]], pairs_s: list[list[list[float]]],
                    probe_cpu_s: list[float], times: list[float]) -> dict[str, Any]:
    """What a probed run records: per rank each timed step's process CPU (barriers and probes left out), its
    training thread's part, and the probe's thread CPU time just before and after it; the run's fast-phase probe
    (the low quantile of all its probe timings) and its busiest rank's CPU seconds per step and median iteration,
    raw and phase-normalised (measure.phase; the iteration against the slower rank's probes). The CPU per step is
    normalised two ways: whole, and with only the training thread scaled (gloo's threads' CPU, which does not
    follow the probe, kept as measured: docs/strategy-tree.md, fourteenth session)."""
    from trainsim.measure.phase import (
        busiest_phase_normalised_s,
        fast_reference_s,
        phase_scaled_s,
        slowest_rank_references_s,
    )

    fast_s = fast_reference_s([t for pairs in pairs_s for pair in pairs for t in pair])
    slowest_s = slowest_rank_references_s(pairs_s)
    raw_cpu_s = max(sum(steps) / len(steps) for steps in steps_s)
    kept_s = [[s - t for s, t in zip(steps, threads, strict=True)] for steps, threads in zip(steps_s, threads_s,
                                                                                               strict=True)]
    return {"step_cpu_s_per_rank": [[round(t, 6) for t in steps] for steps in steps_s],
            "step_thread_cpu_s_per_rank": [[round(t, 6) for t in threads] for threads in threads_s],
            "phase_probe_s_per_rank": [[[round(t, 7) for t in pair] for pair in pairs] for pairs in pairs_s],
            "probe_cpu_s_per_rank": [round(c, 4) for c in probe_cpu_s],
            "phase_normalised": {
                "fast_probe_s": fast_s, "busiest_step_cpu_s": raw_cpu_s,
                "busiest_step_cpu_normalised_s": busiest_phase_normalised_s(steps_s, pairs_s, fast_s),
                "busiest_step_cpu_thread_normalised_s": busiest_phase_normalised_s(steps_s, pairs_s, fast_s, kept_s),
                "median_iteration_s": statistics.median(times),
                "median_iteration_normalised_s": statistics.median(phase_scaled_s(times, slowest_s, fast_s))}}


def _record_error(spec: MeasureSpec, exc: BaseException) -> None:
    rank = int(os.environ.get("RANK", "0"))
    path = error_path(Path(spec.out_dir), spec.run_id, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"time": time.time(), "error": f"{type(exc).__name__}: {exc}"[:500]}))
    except OSError:
        pass


def _spec_from_args(args: argparse.Namespace) -> MeasureSpec:
    if args.spec:
        return MeasureSpec.from_json(Path(args.spec).read_text())
    if not (args.job and args.out):
        raise SystemExit("worker: give --spec FILE, or --job JOB.yaml and --out DIR")
    from trainsim.jobfile import job_from_settings, read_job_file

    job = job_from_settings(read_job_file(Path(args.job)))
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return make_spec(job, Path(args.out), run_id=args.run_id, iterations=args.iterations, warmup=args.warmup,
                     timeout_s=args.timeout_s, threads=args.threads, device=device, profile=args.profile,
                     execution_trace=args.execution_trace)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainsim.measure.worker",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--spec", help="spec file written by `trainsim measure`")
    parser.add_argument("--job", help="job file (model, cluster, num_gpus, strategy keys), for torchrun")
    parser.add_argument("--out", help="folder for the result (rank 0 writes RUN_ID.json)")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="collective timeout")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (0: torch's default)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--execution-trace", action="store_true")
    args = parser.parse_args(argv)
    spec = _spec_from_args(args)
    _watch_parent()
    try:
        run_worker(spec)
    except BaseException as exc:
        if not isinstance(exc, SystemExit | KeyboardInterrupt):
            _record_error(spec, exc)
        raise
    # NB: skip the interpreter's teardown. With gloo, torch's static destructors sometimes abort a finished
    # rank ("terminate called without an active exception") after its work is done and its files are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
