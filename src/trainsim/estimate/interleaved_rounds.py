"""What an interleaved 1F1B pipeline whose model chunks differ in cost waits for beyond the even-chunk bubble.

Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2, in Megatron-LM's order: compile.schedules) runs on rank r,
after its warm-up of w_r = 2 (p - r - 1) + (v - 1) p forwards, the steady pairs "forward k + w_r, backward k"
(slot k). Micro-batches go through the chunks in groups of p, so a rank's slots change chunk every p slots:
the last rank runs p slots of its last chunk (the LM head), then p of its first, and so on. Two effects follow
that equal chunks do not have (f_rc, b_rc: rank r's forward and backward of chunk c, one micro-batch):

- Entry and exit. Rank R's first op need not be where the pipeline's longest path enters it: that path may
  reach R's first forward of a later chunk c through a heavier stage (all p micro-batches through one stage,
  a flow shop's staircase, Huang et al. 2019, then on to the same rank's next chunk), and leave R after its
  last backward of some chunk c' towards a heavier drain. R's entry is the longest warm-up path to its
  chunk-c forward of micro-batch 0 less its own p forwards of each chunk below c; its exit the mirror over
  the last group's backwards (fill_drain_extra_s: the excess over the even form's one micro-batch of chunk
  0 through the ranks before R). O(p v) by one pass over the virtual stages.
- Steady stalls. In the steady state rank R's slot-s forward waits for rank R - 1's slot s - 2 forward, and
  R - 1's slot-k backward for R's slot-k one (rank 0 and rank p - 1 meet over the wrap, p slots apart).
  While R runs light slots (a chunk cheaper than its neighbour's), the neighbour's chain from the data R last
  sent to the data R needs next is longer than R's own slots between them: R idles. Per round of p
  micro-batches R takes p t_R plus its longest such wait (steady_waits.steady_stalls_s: the maximum over windows
  of the neighbour's chain less R's slots, a sliding minimum over one period of p v slots, every rank's feeds
  at once in numpy). max_R (p t_R + R's
  longest wait on either neighbour) was the exact schedule's steady period on all of 60 random cases (p 2-5,
  v 2-3, chunk times 0.2-3 apart), to 1e-14. Each round after the first
  adds one stall to R's idle time (the first round's is in its entry). A neighbour slower than R paces it
  (that wait is already the slower stage's m t) and is left out.

The stalls and the bubble are checked against the exact schedule of per-chunk times
(tests/golden/test_interleaved_rounds.py) and against the simulator (tests/validation/test_uneven_pipelines.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainsim.estimate.steady_waits import ChunkTimes


def _longest_entries_s(times: list[float], p: int) -> list[float]:
    """Per rank, its longest entry: over its chunks c, the longest path of the warm-up (each rank runs p
    micro-batches of chunk c, then of chunk c + 1) from the pipeline's first forward to the start of
    micro-batch 0's forward at virtual stage u = c p + rank, less the rank's own p forwards of each chunk below
    c. A path runs one micro-batch down the stages, or all p of them through one stage (a flow shop's
    staircase, Huang et al. 2019) and from its last on to the same rank's next chunk (u + p). times: per
    virtual stage u, one micro-batch's seconds."""
    first_s, last_s = 0.0, float("-inf")  # the ends of micro-batches 0 and p - 1 at u - 1 (none before u = 0)
    last_by_rank = [float("-inf")] * p  # the end of micro-batch p - 1 at u - p (none before u = p)
    own = [0.0] * p  # the rank's p micro-batches of each chunk so far
    best = [float("-inf")] * p
    for chunk_start in range(0, len(times), p):
        for rank, seconds in enumerate(times[chunk_start:chunk_start + p]):
            before = last_by_rank[rank]
            first_s = (before if before > first_s else first_s) + seconds
            through = first_s + (p - 1) * seconds
            last_s += seconds
            last_s = last_by_rank[rank] = last_s if last_s > through else through
            start = first_s - seconds - own[rank]
            if start > best[rank]:
                best[rank] = start
            own[rank] += p * seconds
    return best


def fill_drain_extra_s(fwd: ChunkTimes, bwd: ChunkTimes) -> list[float]:
    """Per rank R, how much longer than sum_{i<R} (f_i0 + b_i0) (one micro-batch's chunk 0 through the earlier
    ranks, the even form's fill and drain) the pipeline takes before R's first forward of some chunk c plus
    after its last backward of some chunk c', less R's own forwards (backwards) of the first (last) group's
    chunks below c (c'): the longest entry and exit over the chunks. The drain is the fill's mirror (the last
    group's backwards run chunk v - 1 down to 0 per rank, the data from stage u to u - 1)."""
    p, chunks = len(fwd), range(len(fwd[0]))
    entries = _longest_entries_s([row[chunk] for chunk in chunks for row in fwd], p)
    exits = _longest_entries_s([row[chunk] for chunk in chunks for row in bwd], p)
    extra = [0.0] * p
    one = 0.0  # sum_{i<R} (f_i0 + b_i0)
    for rank, (entry, exit_, f_r, b_r) in enumerate(zip(entries, exits, fwd, bwd, strict=True)):
        extra[rank] = entry + exit_ - one
        one += f_r[0] + b_r[0]
    return extra


def chunk_times_s(totals: Sequence[float], forward: Sequence[float], chunk_shares: tuple[tuple[float, ...], ...],
                  sends: Sequence[float]) -> tuple[list[list[float]], list[list[float]]]:
    """Per stage and model chunk, one micro-batch's forward and backward seconds: the stage's time less its
    pipeline sends x the chunk's share x the stage's forward (backward) fraction, plus one send (each chunk
    sends once forward and once backward, whatever its compute). sends: per stage, () for none."""
    fwd: list[list[float]] = []
    bwd: list[list[float]] = []
    for stage, (total, fraction, shares) in enumerate(zip(totals, forward, chunk_shares, strict=True)):
        send = sends[stage] / (2 * len(shares)) if sends else 0.0
        work = total - 2 * len(shares) * send
        fwd.append([work * fraction * share + send for share in shares])
        bwd.append([work * (1.0 - fraction) * share + send for share in shares])
    return fwd, bwd


@lru_cache(maxsize=4096)
def interleaved_terms_s(totals: tuple[float, ...], forward: tuple[float, ...],
                        chunk_shares: tuple[tuple[float, ...], ...],
                        sends: tuple[float, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage of an interleaved pipeline, what its chunks add to its idle time that does not depend on the
    micro-batch count: the entry and exit beyond the even form (fill_drain_extra_s), and its counted wait per
    steady round (steady_waits.steady_stalls_s). Cached: a pure function of the stage times, which a search or
    a calibration prices again for other batch sizes and data-parallel degrees."""
    from trainsim.estimate.steady_waits import steady_stalls_s  # numpy: ~0.1 s a process only these need

    fwd, bwd = chunk_times_s(totals, forward, chunk_shares, sends)
    return tuple(fill_drain_extra_s(fwd, bwd)), tuple(steady_stalls_s(fwd, bwd, totals))
