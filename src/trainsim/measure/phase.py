"""A reference probe for this machine's speed phases: a fixed ~1.2 ms CPU workload (small matmuls, GELU, slicing
and a Python loop: the kinds of work a stage's forward and backward mix), timed in the thread's CPU time just
before and just after each timed run of a stage.

Why: the 2-vCPU KVM guest runs in slow and fast phases ~1.5x apart that switch every 1-3 s (docs/speed.md, tenth
session), and CPU time does not remove them. A stage's run and the probes around it fall in the same phase, so
the run's time over the probes' time is the same in either phase: measure.stage_db.phase_normalised_s gives each
run the time it would have taken in the fast phase (measured: docs/planning.md, thirteenth session, branch phase13q).

Imported only where torch is available.
"""

import time

import torch
import torch.nn.functional as F

PROBE_ROWS = 64  # a micro-batch slice of the CPU GPT's tokens (data/stages/models/*.yaml: hidden 96, ffn 384)
PROBE_HIDDEN = 96
PROBE_FFN = 384
PROBE_LAYERS = 8  # matmul + GELU + slice per layer: ~1.2 ms in all on this machine's fast phase (thread CPU time)
PROBE_PY_STEPS = 2000  # an interpreted loop: stages spend part of their time in Python and the dispatcher


class ReferenceProbe:
    """The fixed workload (seeded, so every probe does the same arithmetic)."""

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(PROBE_ROWS, PROBE_HIDDEN, generator=gen)
        self.w = torch.randn(PROBE_HIDDEN, PROBE_FFN, generator=gen)

    def run(self) -> torch.Tensor:
        x = self.x
        for _ in range(PROBE_LAYERS):
            y = F.gelu(x @ self.w)
            x = y[:, :PROBE_HIDDEN] * 0.5 + self.x
        total = 0
        for step in range(PROBE_PY_STEPS):
            total += step
        return x

    def time_s(self) -> float:
        """One run's thread CPU time."""
        start = time.thread_time()
        self.run()
        return time.thread_time() - start

