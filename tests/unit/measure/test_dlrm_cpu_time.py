"""The thread CPU time of every span of a measured DLRM iteration (measure.dlrm_rank._Clock) and its median over
iterations per rank (measure.dlrm._summarize), with the host's load average carried along."""

import itertools
from typing import Any

import pytest

from trainsim.measure import dlrm, dlrm_rank


def test_clock_records_each_spans_thread_cpu_time_and_page_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    walls = iter([10.0, 10.5, 11.5])  # origin, then the end of each span
    cpus = iter([2.0, 2.25, 2.75])  # at the clock's creation, then at each span's end
    faults = iter([100, 100, 3300])
    monkeypatch.setattr(dlrm_rank.time, "perf_counter", lambda: next(walls))
    monkeypatch.setattr(dlrm_rank.time, "thread_time", lambda: next(cpus))
    monkeypatch.setattr(dlrm_rank, "_thread_faults", lambda: next(faults))
    clock = dlrm_rank._Clock()
    t = clock.span("bottom_mlp fwd", 10.0)
    clock.span("embeddings fwd", t)
    assert clock.events == [("bottom_mlp fwd", 0.0, 0.5), ("embeddings fwd", 0.5, 1.5)]
    assert clock.cpu_s == [0.25, 0.5]  # 0.25 s and 0.5 s of CPU in 0.5 s and 1.0 s of wall time
    assert clock.faults == [0, 3200]


def test_a_fresh_buffer_faults_its_pages_in_on_the_thread() -> None:
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    page_bytes = 2 * 1024 * 1024 if thp.exists() and "[always]" in thp.read_text() else 4096
    before = dlrm_rank._thread_faults()
    buffer = b"\x01" * (64 * 1024 * 1024)  # 64 MiB written: above malloc's mmap threshold, fresh pages
    assert dlrm_rank._thread_faults() - before >= 64 * 1024 * 1024 // page_bytes
    del buffer


def _record(iteration_s: float, cpu_s: list[float]) -> dict[str, Any]:
    return {"iteration_s": iteration_s, "events": [("a", 0.0, iteration_s / 2), ("b", iteration_s / 2, iteration_s)],
            "cpu_s": cpu_s, "faults": [round(c * 10) for c in cpu_s]}


def test_summary_takes_median_cpu_per_span_and_keeps_the_load() -> None:
    by_rank = {0: {"records": [_record(1.0, [0.1, 0.2]), _record(3.0, [0.3, 0.6]), _record(2.0, [0.2, 0.4])]},
               1: {"records": [_record(2.0, [0.5, 0.1]), _record(1.0, [0.7, 0.1]), _record(4.0, [0.6, 0.9])]}}
    config: Any = None
    m = dlrm._summarize(config, by_rank, 2, (0.5, 1.25))
    assert m.iterations_s == (2.0, 3.0, 4.0)  # the slowest rank per iteration
    assert m.iteration_s == 3.0
    assert m.rank_events[0] == (("a", 0.0, 1.5), ("b", 1.5, 3.0))  # the median iteration's spans
    assert m.rank_cpu_s == ((0.2, 0.4), (0.6, 0.1))
    assert m.rank_faults == ((2.0, 4.0), (6.0, 1.0))
    assert m.load_avg == (0.5, 1.25)


def test_host_clock_reads_the_clock_it_is_given() -> None:
    from trainsim.profile.embedding import _HostClock

    ticks = itertools.count(step=2.0)
    clock = _HostClock(lambda: next(ticks))
    assert clock.time_s(lambda: "out") == ("out", 2.0)
    assert clock.time_s(lambda: None) == (None, 2.0)


def test_cold_lookup_benchmark_flushes_before_every_pass() -> None:
    import numpy as np

    from trainsim.embedding.tables import Table
    from trainsim.profile.embedding import bench_lookup

    flushes: list[int] = []
    bench = bench_lookup(Table(0, 50, 4, 3.0), 8, np.random.default_rng(0), warmup=2, repeats=3,
                         flush=lambda: flushes.append(1))
    assert len(flushes) == 5  # 2 warm-up passes + 3 timed, each forward + backward
    assert bench.fwd_s >= 0.0 and bench.bwd_s >= 0.0 and bench.lookups > 0
