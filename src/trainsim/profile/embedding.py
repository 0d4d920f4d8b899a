"""EmbeddingBag microbenchmarks on this machine: the training data of the reuse-factor lookup model (Lin et al.
Sec. III-E).

Each benchmark draws a table (E, D, mean L, Zipf skew) and a batch size from a seeded generator, half of them
heavy (L >= 20), samples one batch of lookup indices from the table's distribution (embedding.indices), and
times torch.nn.EmbeddingBag(mode="sum", sparse=True) forward, and backward with the sparse SGD update (the
update FBGEMM fuses into its backward), the fastest of `repeats` after `warmup` (NB: the minimum, because
on a shared host other processes only ever add time; the median of a loaded 2-core host varied by 30%). The
batch's reuse factors are stored with its times, as the paper does (the RF of each batch, not of the whole
table).

Timings run in this process with torch's thread count set by the caller (one thread per rank matches
`trainsim measure`'s DLRM runs on the CPU). On the CPU with one thread they are read on the thread's CPU clock
(profile.ops.clock_for: the work of the lookup without the time other processes held the core, the quantity the
DLRM runs' per-span thread CPU times are compared with); with more threads on the wall clock. On a GPU (device
"cuda": torch's CUDA EmbeddingBag kernels, not FBGEMM's) the forward and the backward are timed as the sum of
their kernels' durations (the CUDA profiler; or CUDA events around the host's launches, the older way), and the
space sampled is larger (the kernels take microseconds at the CPU's sizes).
"""

import csv
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trainsim.embedding.indices import RF_BINS, reuse_factors, sample_batch
from trainsim.embedding.tables import HEAVY_POOLING, Table
from trainsim.errors import ConfigError, InputFileError, TrainsimError
from trainsim.profile.ops import cache_flusher, clock_for

CSV_FIELDS = ("rows", "dim", "pooling", "batch", "zipf_alpha", "lookups", *(f"rf{i}" for i in range(RF_BINS)),
              "fwd_s", "bwd_s")
# The space sampled (our choice, sized for a CPU): E log-uniform in [10^3, 10^6]; D in 16..128; heavy L
# log-uniform in [20, 200], normal L in [0.1, 20); batch 128..4096; Zipf alpha in [0, 1.2]; lookups x D capped so
# a benchmark stays well under a second on one core.
_DIMS = (16, 32, 64, 128)


@dataclass(frozen=True, slots=True)
class SampleSpace:
    """The (E, batch, size) space benchmarks are drawn from: log10 of the rows' range, the batch sizes, and the
    cap on batch x L x D."""

    log10_rows: tuple[float, float]
    batches: tuple[int, ...]
    max_elements: float


SPACES = {"cpu": SampleSpace((3.0, 6.0), (128, 256, 512, 1024, 2048, 4096), 1e7),
          "cuda": SampleSpace((3.0, 7.0), (512, 1024, 2048, 4096, 8192, 16384), 2e8)}


@dataclass(frozen=True, slots=True)
class LookupBench:
    table: Table
    batch: int
    lookups: int
    rf: tuple[float, ...]
    fwd_s: float
    bwd_s: float

    def row(self) -> dict[str, Any]:
        t = self.table
        out: dict[str, Any] = {"rows": t.rows, "dim": t.dim, "pooling": t.pooling, "batch": self.batch,
                               "zipf_alpha": t.zipf_alpha, "lookups": self.lookups}
        out.update({f"rf{i}": v for i, v in enumerate(self.rf)})
        out.update({"fwd_s": self.fwd_s, "bwd_s": self.bwd_s})
        return out


def sample_configs(count: int, seed: int, space: SampleSpace = SPACES["cpu"]) -> Iterator[tuple[Table, int]]:
    """`count` (table, batch) pairs, alternately heavy and normal."""
    rng = np.random.default_rng(seed)
    made = 0
    while made < count:
        heavy = made % 2 == 0
        pooling = float(np.exp(rng.uniform(np.log(HEAVY_POOLING), np.log(200.0)))) if heavy else \
            float(rng.uniform(0.1, HEAVY_POOLING - 1e-3))
        dim, batch = int(rng.choice(_DIMS)), int(rng.choice(space.batches))
        if batch * pooling * dim > space.max_elements:
            continue
        rows = round(float(10 ** rng.uniform(*space.log10_rows)))
        yield Table(made, rows, dim, round(pooling, 3), round(float(rng.uniform(0.0, 1.2)), 3)), batch
        made += 1


def bench_lookup(table: Table, batch: int, rng: np.random.Generator, *, warmup: int, repeats: int,
                 device: str = "cpu", flush: Callable[[], None] | None = None,
                 clock: "PhaseClock | None" = None) -> LookupBench:
    """flush (untimed, before every pass): evicts the caches, so each pass starts as a lookup inside a training
    step does, its rows cold (the other tables' lookups and the MLPs ran since); without it the same batch's rows
    come back from the cache on every repeat. clock: how a phase is timed (default: clock_for_device)."""
    import torch

    lengths, indices = sample_batch(table, batch, rng)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    bag = torch.nn.EmbeddingBag(table.rows, table.dim, mode="sum", sparse=True, device=device)
    idx, off = torch.from_numpy(indices).to(device), torch.from_numpy(offsets).to(device)
    grad = torch.ones(batch, table.dim, device=device)
    clock = clock or clock_for_device(device)

    def backward_and_update(out: Any) -> None:
        out.backward(grad)
        with torch.no_grad():
            weight_grad = bag.weight.grad
            assert weight_grad is not None
            bag.weight.add_(weight_grad, alpha=-0.01)
        bag.weight.grad = None

    fwd, bwd = [], []
    for step in range(warmup + repeats):
        if flush is not None:
            flush()
        out, forward_s = clock.time_s(lambda: bag(idx, off))
        _, backward_s = clock.time_s(functools.partial(backward_and_update, out))
        if step >= warmup:
            fwd.append(forward_s)
            bwd.append(backward_s)
    rf = tuple(float(v) for v in reuse_factors(indices))
    return LookupBench(table, batch, int(indices.size), rf, float(np.min(fwd)), float(np.min(bwd)))


class PhaseClock(Protocol):
    def time_s(self, phase: Callable[[], Any]) -> tuple[Any, float]:
        """Runs `phase`, returns what it returned and how long it took (seconds)."""
        ...


CUDA_TIMINGS = ("kernel", "events")


def clock_for_device(device: str, cuda_timing: str = "kernel") -> PhaseClock:
    """The CPU: the thread's CPU clock (one thread) or the wall clock (profile.ops.clock_for). A GPU: "kernel",
    the sum of the phase's kernel (and memset/memcpy) durations as the CUDA profiler reads them, the GPU's own
    time without the host's launches, as the paper's kernel models are (Lin et al. Sec. III-E, FBGEMM's kernels);
    or "events", CUDA events around the phase, which bracket the host's launches too (small lookups then sit at
    the launch floor)."""
    if device != "cuda":
        return _HostClock(clock_for("cpu")[0])
    if cuda_timing not in CUDA_TIMINGS:
        raise ConfigError("timing", cuda_timing, f"one of {', '.join(CUDA_TIMINGS)}")
    return _CudaKernelClock() if cuda_timing == "kernel" else _CudaEventClock()


class _HostClock:
    """A host clock: the wall clock, or the thread's CPU clock (time.thread_time)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock

    def time_s(self, phase: Callable[[], Any]) -> tuple[Any, float]:
        start = self.clock()
        result = phase()
        return result, self.clock() - start


class _CudaEventClock:
    """CUDA events recorded on the current stream before and after the phase; waits for the second."""

    def time_s(self, phase: Callable[[], Any]) -> tuple[Any, float]:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = phase()
        end.record()
        end.synchronize()
        return result, start.elapsed_time(end) / 1e3


class _CudaKernelClock:
    """The phase's device activities (kernels, memsets, copies) summed, from torch.profiler's CUDA activity."""

    def time_s(self, phase: Callable[[], Any]) -> tuple[Any, float]:
        import torch
        from torch._C._autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            result = phase()
            torch.cuda.synchronize()
        device_us = [event.time_range.elapsed_us() for event in prof.events() or ()
                     if event.device_type == DeviceType.CUDA]
        if not device_us:
            raise TrainsimError("the CUDA profiler recorded no kernel for an EmbeddingBag phase (CUPTI "
                                   "unavailable?); use --timing events")
        return result, float(sum(device_us)) / 1e6


def profile_lookups(count: int, seed: int, *, warmup: int = 1, repeats: int = 7,
                    progress: Callable[[LookupBench], None] | None = None,
                    device: str = "cpu", cold: bool = True, cuda_timing: str = "kernel") -> list[LookupBench]:
    """cold: flush the caches before every pass (profile.ops.cache_flusher), as a lookup inside a DLRM iteration
    finds them; warm (False): the same batch repeated from the cache (how the benchmarks before 2026-11-26's
    third session were taken). cuda_timing: see clock_for_device."""
    if count < 1 or repeats < 1 or warmup < 0:
        raise ConfigError("count/repeats/warmup", (count, repeats, warmup), "need count, repeats >= 1, warmup >= 0")
    if device not in SPACES:
        raise ConfigError("device", device, f"one of {', '.join(SPACES)}")
    rng = np.random.default_rng(seed + 1)
    flush = cache_flusher(device) if cold else None
    clock = clock_for_device(device, cuda_timing)
    out = []
    for table, batch in sample_configs(count, seed, SPACES[device]):
        bench = bench_lookup(table, batch, rng, warmup=warmup, repeats=repeats, device=device, flush=flush,
                             clock=clock)
        out.append(bench)
        if progress is not None:
            progress(bench)
    return out


def write_csv(benches: list[LookupBench], path: Path) -> None:
    with CsvRows(path) as rows:
        for bench in benches:
            rows.add(bench)


class CsvRows:
    """Writes benchmark rows as they come to `<path>.partial` (flushed per row, so a run cut short keeps what it
    measured) and renames it to `path` when the block ends without an error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")

    def __enter__(self) -> "CsvRows":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.partial.open("w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=CSV_FIELDS)
        self.writer.writeheader()
        return self

    def add(self, bench: LookupBench) -> None:
        self.writer.writerow(bench.row())
        self.file.flush()

    def __exit__(self, kind: object, *_: object) -> None:
        self.file.close()
        if kind is None:
            self.partial.replace(self.path)


def read_csv(path: Path) -> list[LookupBench]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    out = []
    for i, row in enumerate(rows):
        try:
            table = Table(i, int(row["rows"]), int(row["dim"]), float(row["pooling"]), float(row["zipf_alpha"]))
            rf = tuple(float(row[f"rf{b}"]) for b in range(RF_BINS))
            out.append(LookupBench(table, int(row["batch"]), int(row["lookups"]), rf, float(row["fwd_s"]),
                                   float(row["bwd_s"])))
        except (KeyError, ValueError) as exc:
            raise InputFileError(f"{path} row {i + 2}: {exc}") from None
    return out
