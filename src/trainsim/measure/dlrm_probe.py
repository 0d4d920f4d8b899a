"""The probes a measured DLRM rank times around each of its iterations (measure.dlrm_rank), for the phase
normalisation of measure.dlrm_phase: measure.phase's reference probe (small matmuls, GELU, a Python loop: a
stage's mix) and a gather probe closer to a DLRM's own work, one EmbeddingBag's forward, sparse backward and SGD
update (a memory-bound gather and scatter over a table larger than a core's L2 cache), so that a probe that does
the lookups' kind of work can be checked against the reference (docs/recommendation.md, fourteenth session).

Imported only where torch is available (a rank's process).
"""

import torch

from trainsim.measure.dlrm_phase import check_probes
from trainsim.measure.phase import ReferenceProbe, TimedProbe

# NB: our choice, sized to take about as long as the reference probe (~1-2 ms of thread CPU time on this
# machine's 2-vCPU EPYC guest: 1 MiB L2 per core, 32 MiB L3): a 100,000 x 64 fp32 table (25.6 MB, beyond L2),
# 256 bags of 20 lookups (a heavy table's pooling, Lin et al. Sec. III-A: heavy = L >= 20), indices drawn from a
# power law over the rows (skewed like the tasks' Zipf ids, measure.dlrm_rank's batches).
GATHER_ROWS = 100_000
GATHER_DIM = 64
GATHER_BAGS = 256
GATHER_POOLING = 20
GATHER_SKEW = 1.05  # exponent of the rows' power law (embedding/synthetic.py's zipf_alpha range is [0, 1.1])
GATHER_LR = 1e-6  # a tiny step: the update's work without drifting the table


class GatherProbe(TimedProbe):
    """A fixed EmbeddingBag step (seeded, so every probe gathers and scatters the same rows)."""

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.bag = torch.nn.EmbeddingBag(GATHER_ROWS, GATHER_DIM, mode="sum", sparse=True)
        uniform = torch.rand(GATHER_BAGS * GATHER_POOLING, generator=gen)
        # inverse CDF of a power law over the ranks 1..ROWS (continuous approximation), then a fixed row shuffle
        ranks = (GATHER_ROWS ** (1.0 - GATHER_SKEW) * uniform + (1.0 - uniform)) ** (1.0 / (1.0 - GATHER_SKEW))
        shuffle = torch.randperm(GATHER_ROWS, generator=gen)
        self.indices = shuffle[(ranks.long() - 1).clamp(0, GATHER_ROWS - 1)]
        self.offsets = torch.arange(0, GATHER_BAGS * GATHER_POOLING, GATHER_POOLING)
        self.grad = torch.ones(GATHER_BAGS, GATHER_DIM)

    def run(self) -> None:
        out = self.bag(self.indices, self.offsets)
        out.backward(self.grad)
        grad = self.bag.weight.grad
        assert grad is not None  # backward just set it
        with torch.no_grad():
            self.bag.weight.add_(grad, alpha=-GATHER_LR)
        self.bag.weight.grad = None


def make_probes(names: tuple[str, ...]) -> dict[str, TimedProbe]:
    """The named probes (measure.dlrm_phase.PROBES), each built and run once (its first run pays the
    allocations)."""
    made: dict[str, TimedProbe] = {}
    for name in check_probes(names):
        made[name] = ReferenceProbe() if name == "reference" else GatherProbe()
        made[name].time_s()
    return made
