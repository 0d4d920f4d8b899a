"""The split executor's host cost per reshard step beyond its collective, measured (the companion of
profile/executor_overhead.py's cost per op).

trainsim measure's split executor runs each reshard step (strategy.reshard) as an autograd function around a
torch.distributed call (measure/split_model.py: AllGather, ReduceScatter, AllToAll, AllReduce, and
ReduceGradients, whose backward runs the conjugate collective): the function's Python, the autograd node it
records and runs, the receive buffers it allocates, the list-of-tensors form of the call. The collective
microbenchmark (profile/collectives.py) times one flat-buffer call, and the copies of the parts are priced by
their bytes (strategy.reshard_copies). This measures the rest, on `world_size` local gloo ranks: per collective
and phase (the forward of the function that runs it, or the backward of the one whose conjugate it is), the
training thread's CPU seconds of the executor's call on a tensor of `elements` fp32 values (small: the copies are
negligible there), less those of the microbenchmark's call of the same collective and bytes (gloo's own threads
run the collective for both and are priced by the collective's curve; on the process clock they accrue CPU while
they poll, which drowns the difference), in rounds that alternate the two, each the mean of `calls` calls; a
backward call less the start of the autograd engine (one per training step, not per reshard).
"""

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from trainsim.errors import ConfigError
from trainsim.profile.collectives import BACKEND, _collective_fn, join_ranks, next_rank_message, start_ranks
from trainsim.profile.database import Environment, ProfileDB
from trainsim.profile.ops import OVERHEAD_SIGNATURE_KIND, OpSignature

RESHARD_IMPL = "split-executor-reshard"
RESHARD_COLLECTIVES = ("all-gather", "reduce-scatter", "all-to-all", "all-reduce")
PHASES = ("fwd", "bwd")
_ROWS = 4  # the probe tensor's leading (batch) dimension; parts are cut along dimension 1, as features are


def reshard_signature(collective: str, phase: str) -> OpSignature:
    """The split executor's cost per reshard step running `collective` in `phase`, beyond the collective's
    microbenchmark and the step's copies."""
    return OpSignature(OVERHEAD_SIGNATURE_KIND, f"{RESHARD_IMPL}-{collective}", phase, "fp32", (1,))


@dataclass(frozen=True, slots=True)
class ReshardOverhead:
    per_step_s: dict[tuple[str, str], list[float]]  # (collective, phase) -> one figure per rank (seconds)
    # (collective, phase) -> per rank, the median seconds per call of the executor's, the bare collective's and
    # the autograd engine's start (a backward's)
    calls_s: dict[tuple[str, str], list[tuple[float, float, float]]]
    world_size: int
    elements: int
    calls: int
    rounds: int
    # with the reference probe (measure.phase) around every round: per rank, the mean of its timings, against
    # which a phase-normalised copy scales per_step_s (proteus_table4.py --phase-normalise)
    probe_s: list[float] | None = None


def excess_s(executor_s: list[float], bare_s: list[float], start_s: list[float] | None = None) -> float:
    """The executor's call less the bare collective's and, for a backward call, less the autograd engine's start
    (start_s): each the median over its rounds (one round's garbage collection or descheduling does not move
    it); at least 0."""
    if not executor_s or len(executor_s) != len(bare_s) or (start_s is not None and len(start_s) != len(bare_s)):
        raise ConfigError("rounds", len(executor_s), "needs one executor, bare (and start) sample per round")
    start = statistics.median(start_s) if start_s else 0.0
    return max(0.0, statistics.median(executor_s) - statistics.median(bare_s) - start)


def _backward_start() -> Callable[[], float]:
    """The backward call of one elementwise op, timed alone as a reshard's backward is: the autograd engine's
    start, which a training step's one backward pass pays once; returns its thread CPU seconds."""
    import torch

    return _timed_backward(lambda t: t * 1.0, torch.randn(_ROWS, 8, requires_grad=True))


def _timed_backward(run: Callable[[Any], Any], x: Any) -> Callable[[], float]:
    """A call that runs `run` on x untimed, then its backward (with a gradient of ones); returns the backward's
    thread CPU seconds."""
    import torch

    def timed() -> float:
        y = run(x)
        grad = torch.ones_like(y)
        begun = time.thread_time()
        y.backward(grad)
        return time.thread_time() - begun
    return timed


def _executor_call(collective: str, phase: str, group: Any, world: int, elements: int) -> Callable[[], float]:
    """One executor call that runs `collective` in `phase`; returns its thread CPU seconds (a backward's forward
    runs untimed before it)."""
    import torch

    from trainsim.measure.split_model import AllGather, AllReduce, AllToAll, ReduceGradients, ReduceScatter

    width = max(world, elements // _ROWS // world * world)
    forward: dict[str, Callable[[Any], Any]] = {
        "all-gather": lambda x: AllGather.apply(x, 1, group, world),
        "reduce-scatter": lambda x: ReduceScatter.apply(x, 1, group, world),
        "all-to-all": lambda x: AllToAll.apply(x, 1, 0, group, world),
        "all-reduce": lambda x: AllReduce.apply(x, group),
    }
    conjugate = {"all-gather": "reduce-scatter", "reduce-scatter": "all-gather", "all-to-all": "all-to-all"}
    if phase == "fwd":
        x = torch.randn(_ROWS, width // world if collective == "all-gather" else width)
        fn = forward[collective]

        def timed_forward() -> float:
            begun = time.thread_time()
            fn(x)
            return time.thread_time() - begun
        return timed_forward
    source = conjugate.get(collective)
    x = torch.randn(_ROWS, width // world if source == "all-gather" else width, requires_grad=True)
    run = forward[source] if source is not None else (lambda t: ReduceGradients.apply(t, group))
    return _timed_backward(run, x)


def _worker(rank: int, world: int, port: int, results: Any, elements: int, calls: int, rounds: int,
            timeout_s: float, probed: bool = False) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.measure.phase import ProbeLog, ReferenceProbe, pair_means_s

    torch.set_num_threads(1)
    probe = ProbeLog(ReferenceProbe()) if probed else None
    try:
        dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        group = dist.group.WORLD
        start = _backward_start()
        out: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        for collective in RESHARD_COLLECTIVES:
            for phase in PHASES:
                executor = _executor_call(collective, phase, group, world, elements)
                bare = _collective_fn(collective, elements * 4, rank, world)
                for warm_up in (executor, bare, start):
                    warm_up()
                executor_s, bare_s, start_s = [], [], []
                for _ in range(rounds):
                    if probe is not None:
                        probe.before()
                    dist.barrier()
                    executor_s.append(sum(executor() for _ in range(calls)) / calls)
                    dist.barrier()
                    begun = time.thread_time()
                    for _ in range(calls):
                        bare()
                    bare_s.append((time.thread_time() - begun) / calls)
                    start_s.append(sum(start() for _ in range(calls)) / calls)
                    if probe is not None:
                        probe.after()
                out[(collective, phase)] = (excess_s(executor_s, bare_s, start_s if phase == "bwd" else None),
                                            statistics.median(executor_s), statistics.median(bare_s),
                                            statistics.median(start_s))
        results.put(("result", rank, (out, statistics.fmean(pair_means_s(probe.pairs_s)) if probe else None)))
    except Exception as exc:  # reported to the parent, which decides
        results.put(("error", rank, f"{type(exc).__name__}: {exc}"))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def measure_reshard_overhead(world_size: int = 2, elements: int = 1024, calls: int = 100, rounds: int = 7,
                             timeout_s: float = 300.0, probed: bool = False) -> ReshardOverhead:
    """Run the probe on `world_size` local gloo ranks (one thread each, as the measured ranks); probed: time the
    reference probe (measure.phase) around every round (ReshardOverhead.probe_s)."""
    for name, value in (("world_size", world_size - 1), ("elements", elements), ("calls", calls),
                        ("rounds", rounds)):
        if value < 1:
            raise ConfigError(name, value + (1 if name == "world_size" else 0), "must be at least "
                              f"{2 if name == 'world_size' else 1}")
    results, procs = start_ranks(_worker, world_size, elements, calls, rounds, timeout_s, probed)
    deadline = time.monotonic() + timeout_s
    per_rank: dict[int, dict[tuple[str, str], tuple[float, float, float, float]]] = {}
    probes: dict[int, float | None] = {}
    try:
        while len(per_rank) < world_size:
            _, rank, (figures, probe) = next_rank_message(results, procs, deadline, timeout_s,
                                                          "reshard overhead probe")
            per_rank[rank], probes[rank] = figures, probe
    finally:
        join_ranks(procs)
    keys = [(c, p) for c in RESHARD_COLLECTIVES for p in PHASES]
    ranks = sorted(per_rank)
    return ReshardOverhead({key: [per_rank[r][key][0] for r in ranks] for key in keys},
                           {key: [per_rank[r][key][1:] for r in ranks] for key in keys}, world_size, elements,
                           calls, rounds, [p for r in ranks if (p := probes[r]) is not None] if probed else None)


def store_reshard_overhead(db: ProfileDB, env: Environment, result: ReshardOverhead) -> None:
    """One sample per rank per collective and phase (the lookup takes their median)."""
    for (collective, phase), samples in result.per_step_s.items():
        db.add_op_samples(env, reshard_signature(collective, phase), samples,
                          f"split executor per {collective} reshard step ({phase}) beyond the flat-buffer "
                          f"collective, {result.elements} fp32 values, {result.rounds} rounds x {result.calls} calls "
                          f"on {result.world_size} gloo ranks; thread CPU time")
