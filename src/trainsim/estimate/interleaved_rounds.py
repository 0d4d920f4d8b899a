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
  micro-batches R takes p t_R plus its longest such wait (steady_stall_s: the maximum over windows of the
  neighbour's chain less R's slots, a sliding minimum over one period of p v slots). max_R (p t_R + R's
  longest wait on either neighbour) was the exact schedule's steady period on all of 60 random cases (p 2-5,
  v 2-3, chunk times 0.2-3 apart), to 1e-14. Each round after the first
  adds one stall to R's idle time (the first round's is in its entry). A neighbour slower than R paces it
  (that wait is already the slower stage's m t) and is left out.

The stalls and the bubble are checked against the exact schedule of per-chunk times
(tests/golden/test_interleaved_rounds.py) and against the simulator (tests/validation/test_uneven_pipelines.py).
"""

from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate
from operator import sub

ChunkTimes = Sequence[Sequence[float]]  # [rank][chunk] seconds, one micro-batch


def _forward_slots(f_r: Sequence[float], p: int, rank: int, start: int, length: int) -> list[float]:
    """Rank's forward seconds in steady slots start .. start + length - 1 (length <= 2 p v). Slot k runs the
    forward k + w_rank, of chunk ((k + w_rank) mod p v) // p (Megatron-LM's get_model_chunk_id); w_rank = p v
    - p + 2 (p - 1 - rank) = 2 (p - 1 - rank) - p (mod p v)."""
    n = p * len(f_r)
    blocks: list[float] = []
    for seconds in f_r:
        blocks += [seconds] * p
    blocks *= 3
    first = (start + 2 * (p - 1 - rank) - p) % n
    return blocks[first:first + length]


def _backward_slots(b_r: Sequence[float], p: int, start: int, length: int) -> list[float]:
    """Rank's backward seconds in steady slots start .. start + length - 1 (length <= 2 p v): slot k runs
    backward k, of chunk v - 1 - (k mod p v) // p (the same on every rank)."""
    n = p * len(b_r)
    blocks: list[float] = []
    for seconds in reversed(b_r):
        blocks += [seconds] * p
    blocks *= 3
    first = start % n
    return blocks[first:first + length]


def _longest_to_first(times: list[float], p: int) -> list[float]:
    """Per virtual stage u, the longest path of the warm-up (each rank runs p micro-batches of chunk c, then of
    chunk c + 1) from the pipeline's first forward to micro-batch 0's forward at u, both included: one
    micro-batch down the stages, or all p of them through one stage (a flow shop's staircase, Huang et al.
    2019) and from its last on to the same rank's next chunk (u + p). times: per virtual stage u = c p + r."""
    first = [0.0] * len(times)  # micro-batch 0 at u
    last = [0.0] * len(times)  # micro-batch p - 1 at u
    for u, seconds in enumerate(times):
        before = first[u - 1] if u else 0.0
        if u >= p and last[u - p] > before:
            before = last[u - p]
        first[u] = before + seconds
        through = first[u] + (p - 1) * seconds
        if u and last[u - 1] + seconds > through:
            through = last[u - 1] + seconds
        last[u] = through
    return first


def fill_drain_extra_s(fwd: ChunkTimes, bwd: ChunkTimes) -> list[float]:
    """Per rank R, how much longer than sum_{i<R} (f_i0 + b_i0) (one micro-batch's chunk 0 through the earlier
    ranks, the even form's fill and drain) the pipeline takes before R's first forward of some chunk c plus
    after its last backward of some chunk c', less R's own forwards (backwards) of the first (last) group's
    chunks below c (c'): the longest entry and exit over the chunks. The drain is the fill's mirror (the last
    group's backwards run chunk v - 1 down to 0 per rank, the data from stage u to u - 1)."""
    p, v = len(fwd), len(fwd[0])
    entry = _longest_to_first([fwd[u % p][u // p] for u in range(p * v)], p)
    exit_ = _longest_to_first([bwd[u % p][u // p] for u in range(p * v)], p)
    extra = [0.0] * p
    one = 0.0  # sum_{i<R} (f_i0 + b_i0)
    for rank in range(p):
        f_r, b_r = fwd[rank], bwd[rank]
        best_in = best_out = float("-inf")
        before_f = before_b = 0.0  # R's own chunks below c, p micro-batches each
        for chunk in range(v):
            u = chunk * p + rank
            start = entry[u] - f_r[chunk] - before_f
            if start > best_in:
                best_in = start
            end = exit_[u] - b_r[chunk] - before_b
            if end > best_out:
                best_out = end
            before_f += p * f_r[chunk]
            before_b += p * b_r[chunk]
        extra[rank] = best_in + best_out - one
        one += f_r[0] + b_r[0]
    return extra


def _window_max(x: list[float], y: list[float], n: int, shortest: int) -> float:
    """max over s in [n, 2n) and k in [s - n, s - shortest] of x[s - n] - y[k] (y: 2n values). The minimum of y
    over the window of s = n + i is that of the suffix of y's first n from i and the prefix of its last n up
    to i - shortest (for i >= shortest; the first windows lie in y's first n)."""
    low = y[:n]
    suffix = list(accumulate(reversed(low), min))[::-1]
    prefix = list(accumulate(y[n:], min))
    least = [min(low[i:i + n - shortest + 1]) for i in range(shortest)]
    least += map(min, suffix[shortest:], prefix[:n - shortest])
    return max(map(sub, x, least))


def forward_feed_stall_s(fwd: ChunkTimes, bwd: ChunkTimes, rank: int) -> float:
    """Rank's longest steady wait for its forward input: from its backward of slot k to its forward of slot
    s, the neighbour N (rank - 1; rank p - 1, p slots on, for rank 0) runs b_N(k) .. f_N(s - 2), rank itself
    slots k + 1 .. s - 1. stall = sum_{k<j<s} (a_N - a_R)(j) + b_N(k) - b_N(s - 2) - a_N(s - 1), a = f + b;
    over one period of s and windows of up to p v slots."""
    p, v = len(fwd), len(fwd[0])
    n = p * v
    wrap = rank == 0
    neighbour, shift = (p - 1, p) if wrap else (rank - 1, 0)
    f_r, b_r = _forward_slots(fwd[rank], p, rank, 0, 2 * n), _backward_slots(bwd[rank], p, 0, 2 * n)
    f_n, b_n = _forward_slots(fwd[neighbour], p, neighbour, shift, 2 * n), _backward_slots(bwd[neighbour], p, shift,
                                                                                            2 * n)
    prefix = [0.0, *accumulate([fn + bn - fr - br for fn, bn, fr, br in zip(f_n, b_n, f_r, b_r, strict=True)])]
    y = [total - bn for total, bn in zip(prefix[1:], b_n, strict=True)]
    # NB: over the wrap, rank 0's first-chunk forwards read the data loader, not rank p - 1 ((s - 2) mod n in
    # rank p - 1's last chunk)
    x = [prefix[s] - b_n[s - 2] - f_n[s - 1] - b_n[s - 1] if not wrap or (s - 2) % n < n - p else float("-inf")
         for s in range(n, 2 * n)]
    return _window_max(x, y, n, 3)


def backward_feed_stall_s(fwd: ChunkTimes, bwd: ChunkTimes, rank: int) -> float:
    """Rank's longest steady wait for its backward input: from its forward of slot k to its backward of slot
    s, the neighbour N (rank + 1; rank 0, p slots back, for rank p - 1) runs slots k + 2 .. s, rank itself
    b_R(k), slots k + 1 .. s - 1 and f_R(s). stall = sum_{k<j<s} (a_N - a_R)(j) - a_N(k + 1) + a_N(s) - b_R(k)
    - f_R(s)."""
    p, v = len(fwd), len(fwd[0])
    n = p * v
    wrap = rank == p - 1
    neighbour, shift = (0, -p) if wrap else (rank + 1, 0)
    f_r, b_r = _forward_slots(fwd[rank], p, rank, 0, 2 * n), _backward_slots(bwd[rank], p, 0, 2 * n)
    f_n = _forward_slots(fwd[neighbour], p, neighbour, shift, 2 * n + 1)
    b_n = _backward_slots(bwd[neighbour], p, shift, 2 * n + 1)
    prefix = [0.0, *accumulate([fn + bn - fr - br for fn, bn, fr, br in zip(f_n, b_n, f_r, b_r, strict=False)])]
    y = [total + fn + bn + br for total, fn, bn, br in zip(prefix[1:], f_n[1:], b_n[1:], b_r, strict=True)]
    # NB: over the wrap, the last chunk's backward follows rank p - 1's own forward, not rank 0 (slot s - p's
    # backward chunk 0: (s - p) mod n in the last p slots of a period)
    x = [prefix[s] + f_n[s] + b_n[s] - f_r[s] if not wrap or (s - p) % n < n - p else float("-inf")
         for s in range(n, 2 * n)]
    return _window_max(x, y, n, 2)


def counted_stall_s(stall: float, totals: Sequence[float], rank: int, neighbour: int) -> float:
    """A wait on `neighbour` as steady_stall_s counts it: 0 where the neighbour's own round (p t_N) outlasts the
    rank's round with the wait (p t_R + stall): the neighbour then paces the rank, and that is already its own
    m t, not the rank's schedule."""
    p = len(totals)
    return stall if stall > 0.0 and p * totals[rank] + stall >= p * totals[neighbour] else 0.0


def steady_stall_s(fwd: ChunkTimes, bwd: ChunkTimes, totals: Sequence[float], rank: int) -> float:
    """Rank's longest counted wait per steady round on either neighbour (counted_stall_s); 0 if none."""
    p = len(fwd)
    ahead = counted_stall_s(forward_feed_stall_s(fwd, bwd, rank), totals, rank, (rank - 1) % p)
    return max(ahead, counted_stall_s(backward_feed_stall_s(fwd, bwd, rank), totals, rank, (rank + 1) % p))


def _feed_bound_s(f_r: Sequence[float], b_r: Sequence[float], f_n: Sequence[float], b_n: Sequence[float],
                  p: int, lead: int, forward_feed: bool) -> float:
    """An upper bound on one feed's stall: the positive slot differences over a period (a window's sum is at
    most theirs) plus the largest window ends. lead: +1 where the neighbour's forward chunk turns 2 slots
    before the rank's (its forward feed), -1 where 2 slots after (its backward feed), 0 over the wrap (chunks
    aligned anyhow: every pair bounded by the largest difference)."""
    v = len(f_r)
    low_f, low_b = min(f_n), min(b_n)
    if lead:
        positive = sum((p - 2) * max(0.0, f_n[c] - f_r[c]) + 2 * max(0.0, f_n[(c + lead) % v] - f_r[c])
                       + p * max(0.0, b_n[c] - b_r[c]) for c in range(v))
    else:
        positive = p * v * max(0.0, max(f_n) + max(b_n) - min(f_r) - min(b_r))
    if forward_feed:  # b_N(k) - b_N(s - 2) - a_N(s - 1)
        ends = max(b_n) - 2 * low_b - low_f
    else:  # a_N(s) - a_N(k + 1) - b_R(k) - f_R(s)
        ends = max(f_n) + max(b_n) - low_f - low_b - min(b_r) - min(f_r)
    return positive + ends


def feed_bounds_s(fwd: ChunkTimes, bwd: ChunkTimes, totals: Sequence[float]) -> list[tuple[float, float]]:
    """Per rank, upper bounds in O(v) on its counted waits (counted_stall_s) on its forward and backward feeds:
    0 where the rank's chunks and the neighbour's are each equal (every slot the neighbour's is no longer: each
    window's sum <= 0 and its ends < 0; or the neighbour is slower by a constant per slot, and at most one
    period of it leaves the rank's round short of the neighbour's), or where even the bound could not make up
    a slower neighbour's round."""
    p = len(fwd)
    even = [max(f) == min(f) and max(b) == min(b) for f, b in zip(fwd, bwd, strict=True)]
    bounds: list[tuple[float, float]] = []
    for rank in range(p):
        f_r, b_r = fwd[rank], bwd[rank]
        pair: list[float] = []
        for neighbour, lead, forward_feed in (((rank - 1) % p, 0 if rank == 0 else 1, True),
                                              ((rank + 1) % p, 0 if rank == p - 1 else -1, False)):
            bound = 0.0
            if not (even[rank] and even[neighbour]):
                bound = _feed_bound_s(f_r, b_r, fwd[neighbour], bwd[neighbour], p, lead, forward_feed)
                if bound < p * (totals[neighbour] - totals[rank]):
                    bound = 0.0
            pair.append(bound)
        bounds.append((pair[0], pair[1]))
    return bounds


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
    steady round (steady_stall_s; not computed where feed_bounds_s shows it is 0). Cached: a pure function of
    the stage times, which a search or a calibration prices again for other batch sizes and data-parallel
    degrees."""
    fwd, bwd = chunk_times_s(totals, forward, chunk_shares, sends)
    p = len(totals)
    stalls = [0.0] * p
    for rank, (ahead, behind) in enumerate(feed_bounds_s(fwd, bwd, totals)):
        if ahead > 0.0:
            stalls[rank] = counted_stall_s(forward_feed_stall_s(fwd, bwd, rank), totals, rank, (rank - 1) % p)
        if behind > 0.0:
            stalls[rank] = max(stalls[rank], counted_stall_s(backward_feed_stall_s(fwd, bwd, rank), totals, rank,
                                                             (rank + 1) % p))
    return tuple(fill_drain_extra_s(fwd, bwd)), tuple(stalls)
