"""Collective microbenchmarks: torch.distributed (gloo) between processes on this machine.

profile_collectives() spawns `world_size` processes that join one gloo group over loopback TCP, time each
(collective, message size) the database lacks, and send the results to the parent, which commits each one as it
arrives. A deadline bounds the whole run: on expiry (or if a worker dies) the workers are terminated, what was
stored stays stored and the summary says what failed; it never hangs.

Message sizes follow trainsim's Comm.buffer_bytes convention: all-reduce and all-to-all the buffer each rank
contributes, all-gather and reduce-scatter the full (gathered) buffer, send-recv the message.

Two clocks (CLOCKS): "wall", the time until the collective's last rank is done; "cpu", the CPU seconds a rank's
process spends on it (time.process_time: the calling thread's dispatch and wait plus the work of gloo's worker
and transport threads, user and kernel), the slowest rank's. A rank's CPU time leaves out the time it waits for
its peers and the slices other processes take from the cores: it is what a CPU rank's process CPU seconds per
iteration (trainsim measure's cpu_s_per_rank) pay for the collective, where the wall time is what its iteration
waits for it. A database holds one clock's times (the ops' clock: profile.ops.clock_for).

On the CPU clock one call's cost is bimodal on this machine: ~0.2-0.5 ms for a small message, but in about one
call in five gloo's transport thread (gloo_tcp_loop, per-thread schedstat) takes 1.5-4 ms more. An iteration pays
the mean over its many collectives, so a sample there times `calls_per_sample` calls back to back and divides
(the median of such samples is near the mean of one call, as profile.ops.time_callable's inner loop does for
short ops).

Back to back is not how an executor issues them: between two blocking collectives its training thread runs ops
(the split executor's reshards, measure/split_model.py; a data-parallel bucket launched from a gradient hook).
`gap_s` > 0 times that pattern on the CPU clock: every call is preceded by `gap_s` of compute on the calling
thread (GAP_MATRIX_SIZE matrix products until its thread CPU time has advanced by gap_s), and a sample is the
process CPU over the calls and their gaps less the calling thread's CPU in the gaps (interleaved_call_cost_s):
what gloo's threads do while the caller computes stays the collective's. NB, why it costs more here: the rank
then has three runnable threads (the caller, gloo's worker, its transport loop) on a machine with fewer cores
than runnable threads, and gloo's transport thread, which handles a socket event only if it can take the pair's
lock (tcp::Pair::handleEvents, try_lock), spins on epoll_wait while a preempted thread holds it (perf: its time
in ep_send_events, tcp_poll, epoll_wait and pthread_mutex_trylock); back to back, the caller sleeps in the call
and the two gloo threads rarely wait for a core.
"""

import contextlib
import multiprocessing
import os
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from trainsim.errors import ConfigError, TrainsimError
from trainsim.measure.launch import free_port
from trainsim.profile.database import Environment, ProfileDB, TimingStats

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
DEFAULT_SIZES = tuple(1024 * 4**i for i in range(8))  # 1 KiB ... 16 MiB
BACKEND = "gloo"
CLOCKS = ("wall", "cpu")
MAX_CALLS_PER_SAMPLE = 10_000
MAX_GAP_S = 1.0
GAP_MATRIX_SIZE = 64  # the gap's compute: fp32 products of 64 x 64 matrices (the busy thread is the point)


@dataclass(frozen=True, slots=True)
class CollectiveSummary:
    planned: int  # (collective, size) pairs asked for
    measured: int
    already_stored: int
    failure: str = ""  # why the run stopped early ("" when it finished)


CollectiveProgress = Callable[[str, int, str], None]  # (collective, message bytes, "measured" | "stored")


def start_ranks(worker: Callable[..., None], world_size: int, *args: Any) -> tuple[Any, list[Any]]:
    """Start a probe's `world_size` rank processes (spawned daemons), each running worker(rank, world_size, port,
    results, *args): port a free loopback one for their rendezvous, results the queue they report on; returns
    the queue and the processes."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, daemon=True, args=(rank, world_size, port, results, *args))
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    return results, procs


def next_rank_message(results: Any, procs: list[Any], deadline: float, timeout_s: float, what: str) -> tuple[Any, ...]:
    """The next result a probe's rank processes put on `results` (a tuple; ("error", rank, text) from a rank that
    failed); `what` (the probe) names it in the errors: past the deadline, a rank that died, a rank's error."""
    while True:
        try:
            message = results.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TrainsimError(f"{what} did not finish in {timeout_s:.0f} s") from None
            if any(p.exitcode not in (None, 0) for p in procs):
                raise TrainsimError(f"{what}: a rank died") from None
            continue
        if message[0] == "error":
            raise TrainsimError(f"{what} failed on rank {message[1]}: {message[2]}")
        return message


def join_ranks(procs: list[Any]) -> None:
    """Wait for a probe's rank processes (10 s each), then stop any still running."""
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()


def _collective_fn(collective: str, message_bytes: int, rank: int, world_size: int) -> Callable[[], object]:
    import torch
    import torch.distributed as dist

    elements = max(world_size, message_bytes // 4 // world_size * world_size)  # fp32, divisible by the ranks
    if collective == "all-reduce":
        buf = torch.randn(elements)
        return lambda: dist.all_reduce(buf)
    if collective == "all-gather":
        shard, full = torch.randn(elements // world_size), torch.empty(elements)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, shard)
    if collective == "reduce-scatter":
        full, shard = torch.randn(elements), torch.empty(elements // world_size)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(shard, full)
    if collective == "all-to-all":
        send, recv = torch.randn(elements), torch.empty(elements)
        return lambda: dist.all_to_all_single(recv, send)
    if collective == "send-recv":
        buf = torch.randn(elements)
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        if peer >= world_size:  # an odd world: the last rank idles
            return lambda: None
        return (lambda: dist.send(buf, peer)) if rank % 2 == 0 else (lambda: dist.recv(buf, peer))
    raise AssertionError(f"unknown collective {collective}")


def interleaved_call_cost_s(process_s: float, gap_thread_s: float, calls: int) -> float:
    """One call's CPU seconds in a sample of `calls` calls each preceded by compute on the calling thread: the
    process CPU over the sample less the calling thread's CPU in the gaps (gloo's threads' work during a gap
    stays the collective's)."""
    return (process_s - gap_thread_s) / calls


def _compute_for(thread_s: float, a: Any, b: Any) -> float:
    """Run matrix products on the calling thread until its CPU time has advanced by `thread_s`; return it."""
    import torch

    begun = time.thread_time()
    while time.thread_time() - begun < thread_s:
        torch.mm(a, b)
    return time.thread_time() - begun


def _worker(rank: int, world_size: int, port: int, results: Any, todo: list[tuple[str, int]], warmup: int,
            repeats: int, threads: int, timeout_s: float, parent_pid: int, clock: str = "wall",
            calls_per_sample: int = 1, gap_s: float = 0.0) -> None:
    """One rank: time each pending (collective, size) on `clock` (CLOCKS), a sample being the mean of
    `calls_per_sample` calls, back to back or (gap_s > 0) each after gap_s of compute; rank 0 reports."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    read = time.process_time if clock == "cpu" else time.perf_counter
    a, b = torch.randn(GAP_MATRIX_SIZE, GAP_MATRIX_SIZE), torch.randn(GAP_MATRIX_SIZE, GAP_MATRIX_SIZE)
    try:
        dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # reported to the parent, which decides
        results.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        return
    try:
        for collective, size in todo:
            if os.getppid() != parent_pid:  # the parent is gone (killed): stop, do not linger
                return
            fn = _collective_fn(collective, size, rank, world_size)
            samples = []
            for index in range(warmup + repeats):
                dist.barrier()
                start, gaps = read(), 0.0
                for _ in range(calls_per_sample):
                    if gap_s > 0.0:
                        gaps += _compute_for(gap_s, a, b)
                    fn()
                elapsed = interleaved_call_cost_s(read() - start, gaps, calls_per_sample)
                if index >= warmup:
                    samples.append(elapsed)
            reported = _reported_samples(torch.tensor(samples, dtype=torch.float64), clock, world_size)
            if rank == 0:
                results.put(("result", collective, size, reported))
        if rank == 0:
            results.put(("done",))
    except Exception as exc:
        results.put(("error", rank, f"{type(exc).__name__}: {exc}"))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _reported_samples(samples: Any, clock: str, world_size: int) -> list[float]:
    """What rank 0 reports of every rank's samples (a collective over all ranks). Wall clock: each repeat's
    slowest rank (a collective ends when its last rank does). CPU clock: the samples of the rank whose median is
    the highest, the busiest rank over many calls (a per-repeat maximum would add the largest of the ranks' noises
    to every sample: with gloo's bimodal cost that is ~30% more on 4 ranks)."""
    import torch
    import torch.distributed as dist

    if clock == "wall":
        dist.all_reduce(samples, op=dist.ReduceOp.MAX)
        return [float(x) for x in samples.tolist()]
    every = [torch.empty_like(samples) for _ in range(world_size)]
    dist.all_gather(every, samples)
    return [float(x) for x in busiest_rank_samples([s.tolist() for s in every])]


def pooled_stats(sweeps: list[TimingStats]) -> TimingStats:
    """One (collective, size)'s times over several sweeps taken at different moments: the median of their medians
    (and of their deciles), their samples counted together. On the CPU clock the machine's load moves a sweep's
    small-message costs by up to 2x within minutes (gloo's transport thread spins while a preempted thread holds
    its pair's lock), which the median over sweeps resists."""
    if not sweeps:
        raise ConfigError("sweeps", 0, "at least one sweep to pool")
    return TimingStats(statistics.median(s.median_s for s in sweeps), statistics.median(s.p10_s for s in sweeps),
                       statistics.median(s.p90_s for s in sweeps), sum(s.repeats for s in sweeps))


def busiest_rank_samples(per_rank: list[list[float]]) -> list[float]:
    """Of each rank's samples, those of the rank with the highest median (the first such rank)."""
    return max(per_rank, key=statistics.median)


def profile_collectives(db: ProfileDB, env: Environment, *, collectives: tuple[str, ...] = COLLECTIVES,
                        sizes: tuple[int, ...] = DEFAULT_SIZES, world_size: int = 2, warmup: int = 2,
                        repeats: int = 10, timeout_s: float = 300.0, progress: CollectiveProgress | None = None,
                        plan: Callable[[int], None] | None = None, clock: str = "wall",
                        calls_per_sample: int = 1, gap_s: float = 0.0) -> CollectiveSummary:
    """Time the (collective, size) pairs `db` lacks for `env` with `world_size` local gloo processes, on `clock`
    (CLOCKS; the database's clock: a database holds one), each sample the mean of `calls_per_sample` calls, each
    call after `gap_s` of compute on the calling thread (CPU clock only; 0: back to back)."""
    if clock not in CLOCKS:
        raise ConfigError("clock", clock, " or ".join(CLOCKS))
    if not 1 <= calls_per_sample <= MAX_CALLS_PER_SAMPLE:
        raise ConfigError("calls_per_sample", calls_per_sample, f"must be 1 to {MAX_CALLS_PER_SAMPLE}")
    check_gap(gap_s, clock)
    pairs = [(c, int(s)) for c in collectives for s in sizes]
    if plan is not None:
        plan(len(pairs))
    todo: list[tuple[str, int]] = []
    for collective, size in pairs:
        if db.has_collective(env, BACKEND, collective, world_size, size):
            if progress is not None:
                progress(collective, size, "stored")
        else:
            todo.append((collective, size))
    stored = len(pairs) - len(todo)
    if not todo:
        return CollectiveSummary(len(pairs), 0, stored)
    results, procs = start_ranks(_worker, world_size, todo, warmup, repeats, env.threads, timeout_s, os.getpid(),
                                 clock, calls_per_sample, gap_s)
    measured, failure = 0, ""
    deadline = time.monotonic() + timeout_s
    try:
        while measured < len(todo):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                failure = f"timed out after {timeout_s:.0f} s"
                break
            try:
                message = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    failure = f"worker exited with code {dead[0].exitcode}"
                    break
                continue
            if message[0] == "result":
                _, collective, size, samples = message
                db.put_collective(env, BACKEND, collective, world_size, size, TimingStats.of(samples))
                measured += 1
                if progress is not None:
                    progress(collective, size, "measured")
            elif message[0] == "error":
                failure = f"rank {message[1]}: {message[2]}"
                break
            else:
                break
    finally:
        _stop(procs)
    return CollectiveSummary(len(pairs), measured, stored, failure)


def check_gap(gap: float, clock: str, field: str = "gap_s", unit_s: float = 1.0, unit: str = "s") -> None:
    """A gap is 0 to MAX_GAP_S seconds, and only on the CPU clock (on the wall clock the gap's own time would be
    the caller's, not the collective's). `gap` is in `unit` (`unit_s` seconds each), as the field named states it."""
    if not 0.0 <= gap * unit_s <= MAX_GAP_S:
        raise ConfigError(field, gap, f"must be 0 to {MAX_GAP_S / unit_s:g} {unit}")
    if gap > 0.0 and clock != "cpu":
        raise ConfigError(field, gap, f"needs the cpu clock (clock is {clock}); 0 on the wall clock")


def _stop(procs: list[Any]) -> None:
    """Join the workers; terminate (then kill) the ones still running. Only processes this run started."""
    for proc in procs:
        proc.join(timeout=5.0)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)
