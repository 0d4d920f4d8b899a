"""A reference probe for this machine's speed phases: a fixed ~1.2 ms CPU workload (small matmuls, GELU, slicing
and a Python loop: the kinds of work a stage's forward and backward mix), timed in the thread's CPU time just
before and just after each timed run (a stage, a training step, an op sample).

Why: the 2-vCPU KVM guest runs in slow and fast phases ~1.5x apart that switch every 1-3 s (docs/speed.md, tenth
session), and CPU time does not remove them. A run and the probes around it fall in the same phase, so the run's
time over the probes' time is the same in either phase: phase_normalised_s gives each run the time it would have
taken in the fast phase (measured: docs/planning.md, thirteenth session, branch phase13q).

The arithmetic needs only the standard library; torch is imported when a probe is built.
"""

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

PROBE_ROWS = 64  # a micro-batch slice of the CPU GPT's tokens (data/stages/models/*.yaml: hidden 96, ffn 384)
PROBE_HIDDEN = 96
PROBE_FFN = 384
PROBE_LAYERS = 8  # matmul + GELU + slice per layer: ~1.2 ms in all on this machine's fast phase (thread CPU time)
PROBE_PY_STEPS = 2000  # an interpreted loop: stages spend part of their time in Python and the dispatcher
FAST_PHASE_QUANTILE = 0.05  # the reference probe's fast-phase time: this low quantile of its timings in a run

T = TypeVar("T")


class TimedProbe:
    """A fixed workload (run()) timed in the calling thread's CPU time."""

    def run(self) -> Any:
        raise NotImplementedError

    def time_s(self) -> float:
        """One run's thread CPU time."""
        start = time.thread_time()
        self.run()
        return time.thread_time() - start

    def around(self, fn: Callable[[], T]) -> tuple[T, float, float]:
        """fn's result with the probe's thread CPU time just before and just after it."""
        before = self.time_s()
        result = fn()
        return result, before, self.time_s()


class ReferenceProbe(TimedProbe):
    """The fixed workload (seeded, so every probe does the same arithmetic)."""

    def __init__(self, seed: int = 0) -> None:
        import torch
        import torch.nn.functional as F

        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(PROBE_ROWS, PROBE_HIDDEN, generator=gen)
        self.w = torch.randn(PROBE_HIDDEN, PROBE_FFN, generator=gen)
        self._gelu = F.gelu

    def run(self) -> Any:
        x = self.x
        for _ in range(PROBE_LAYERS):
            y = self._gelu(x @ self.w)
            x = y[:, :PROBE_HIDDEN] * 0.5 + self.x
        total = 0
        for step in range(PROBE_PY_STEPS):
            total += step
        return x


def fast_reference_s(references_s: Sequence[float]) -> float:
    """The reference probe's fast-phase time: the FAST_PHASE_QUANTILE quantile of its timings (nearest rank)."""
    if not references_s:
        raise ValueError("no reference timings")
    ordered = sorted(references_s)
    return ordered[min(len(ordered) - 1, int(FAST_PHASE_QUANTILE * len(ordered)))]


def phase_scaled_s(samples_s: Sequence[float], references_s: Sequence[float], fast_s: float) -> list[float]:
    """Each run's time x (fast-phase reference / the probe's time around that run): as it would have taken in
    the fast phase."""
    if len(samples_s) != len(references_s) or not samples_s:
        raise ValueError(f"{len(samples_s)} runs and {len(references_s)} reference timings: one per run")
    if fast_s <= 0 or any(r <= 0 for r in references_s):
        raise ValueError("reference timings must be positive")
    return [s * fast_s / r for s, r in zip(samples_s, references_s, strict=True)]


def phase_normalised_s(samples_s: Sequence[float], references_s: Sequence[float], fast_s: float) -> float:
    """The median over a stage's runs of phase_scaled_s."""
    return statistics.median(phase_scaled_s(samples_s, references_s, fast_s))


class ProbeLog:
    """The probe timed just before and just after each timed step of a loop (before(), after()), and the process
    and thread CPU the probing took, which the loop's own CPU figures leave out."""

    def __init__(self, probe: ReferenceProbe) -> None:
        self.probe = probe
        self.pairs_s: list[tuple[float, float]] = []  # (before, after) per timed step
        self.process_cpu_s = 0.0
        self.thread_cpu_s = 0.0
        self._before_s: float | None = None

    def _timed(self) -> float:
        process, thread = time.process_time(), time.thread_time()
        probe_s = self.probe.time_s()
        self.process_cpu_s += time.process_time() - process
        self.thread_cpu_s += time.thread_time() - thread
        return probe_s

    def before(self) -> None:
        self._before_s = self._timed()

    def after(self) -> None:
        assert self._before_s is not None, "after() without before()"
        self.pairs_s.append((self._before_s, self._timed()))
        self._before_s = None


PROBE_REFERENCES = ("mean", "before")


def pair_means_s(pairs_s: Sequence[Sequence[float]], reference: str = "mean") -> list[float]:
    """A step's reference: the mean of the probe just before it and the one just after ("mean"), or the one
    just before alone ("before": in a gloo run the probe right after a step and its barrier is slower than the
    one before the next step, which op samples do not show; docs/strategy-tree.md, fourteenth session)."""
    if reference not in PROBE_REFERENCES:
        raise ValueError(f"reference {reference!r}: one of {', '.join(PROBE_REFERENCES)}")
    return [sum(pair) / len(pair) if reference == "mean" else pair[0] for pair in pairs_s]


def slowest_rank_references_s(pairs_s_per_rank: Sequence[Sequence[Sequence[float]]],
                              reference: str = "mean") -> list[float]:
    """Per step, the slowest rank's reference (pair_means_s of its probe pair around that step): the reference of
    a step whose time is the slowest rank's."""
    return [max(column) for column in zip(*(pair_means_s(pairs, reference) for pairs in pairs_s_per_rank),
                                          strict=True)]


def busiest_phase_normalised_s(steps_s_per_rank: Sequence[Sequence[float]],
                               pairs_s_per_rank: Sequence[Sequence[Sequence[float]]], fast_s: float,
                               kept_s_per_rank: Sequence[Sequence[float]] | None = None,
                               reference: str = "mean") -> float:
    """The busiest rank's mean step time, each step of each rank scaled by its own rank's probes around it
    (phase_scaled_s): the figure a run's per-rank CPU seconds per step become in the fast phase. kept: the part
    of each step that does not follow the phases, left as measured (only the rest is scaled); reference: which
    probes of a pair stand for the step (pair_means_s)."""
    kept_per_rank = kept_s_per_rank or [[0.0] * len(steps) for steps in steps_s_per_rank]
    means = []
    for steps, pairs, kept in zip(steps_s_per_rank, pairs_s_per_rank, kept_per_rank, strict=True):
        scaled = phase_scaled_s([s - k for s, k in zip(steps, kept, strict=True)], pair_means_s(pairs, reference),
                                fast_s)
        means.append(statistics.fmean(s + k for s, k in zip(scaled, kept, strict=True)))
    return max(means)
