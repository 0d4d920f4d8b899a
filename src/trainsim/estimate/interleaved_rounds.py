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

ChunkTimes = Sequence[Sequence[float]]  # [rank][chunk] seconds, one micro-batch


def forward_chunk(p: int, v: int, rank: int, slot: int) -> int:
    """The chunk of rank's forward in steady slot `slot` (Megatron-LM's get_model_chunk_id of forward
    slot + w_rank)."""
    return ((slot + 2 * (p - 1 - rank) - p) % (p * v)) // p


def backward_chunk(p: int, v: int, slot: int) -> int:
    """The chunk of every rank's backward in steady slot `slot` (backward chunks run v - 1 down to 0)."""
    return v - 1 - (slot % (p * v)) // p


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


def _slots(fwd: ChunkTimes, bwd: ChunkTimes, rank: int) -> tuple[list[float], list[float]]:
    """Rank's forward and backward seconds in each steady slot of one period (p v slots)."""
    p, v = len(fwd), len(fwd[0])
    f_r, b_r = fwd[rank], bwd[rank]
    return ([f_r[forward_chunk(p, v, rank, k)] for k in range(p * v)],
            [b_r[backward_chunk(p, v, k)] for k in range(p * v)])


def _window_max(x: list[float], y: list[float], n: int, shortest: int) -> float:
    """max over s in [n, 2n) and k in [s - n, s - shortest] of x[s - n] - y[k] (a sliding minimum)."""
    best = float("-inf")
    window: list[int] = []  # indices of y, increasing values (a monotone queue); head at window[head]
    head = 0
    nxt = 0
    for index in range(n):
        s = n + index
        while nxt <= s - shortest:
            value = y[nxt]
            while len(window) > head and y[window[-1]] >= value:
                window.pop()
            window.append(nxt)
            nxt += 1
        while window[head] < s - n:
            head += 1
        gap = x[index] - y[window[head]]
        if gap > best:
            best = gap
    return best


def _forward_feed_stall_s(fwd: ChunkTimes, bwd: ChunkTimes, rank: int) -> float:
    """Rank's longest steady wait for its forward input: from its backward of slot k to its forward of slot
    s, the neighbour N (rank - 1; rank p - 1, p slots on, for rank 0) runs b_N(k) .. f_N(s - 2), rank itself
    slots k + 1 .. s - 1. stall = sum_{k<j<s} (a_N - a_R)(j) + b_N(k) - b_N(s - 2) - a_N(s - 1), a = f + b."""
    p, v = len(fwd), len(fwd[0])
    n = p * v
    wrap = rank == 0
    f_r, b_r = _slots(fwd, bwd, rank)
    f_n, b_n = _slots(fwd, bwd, p - 1 if wrap else rank - 1)
    shift = p if wrap else 0
    prefix = [0.0] * (2 * n + 1)
    for j in range(2 * n):
        i, m = j % n, (j + shift) % n
        prefix[j + 1] = prefix[j] + f_n[m] + b_n[m] - f_r[i] - b_r[i]
    y = [prefix[k + 1] - b_n[(k + shift) % n] for k in range(2 * n)]
    x = []
    for s in range(n, 2 * n):
        if wrap and forward_chunk(p, v, p - 1, s + p - 2) == v - 1:
            x.append(float("-inf"))  # rank 0's chunk 0 reads the data loader, not rank p - 1
            continue
        m2, m1 = (s - 2 + shift) % n, (s - 1 + shift) % n
        x.append(prefix[s] - b_n[m2] - f_n[m1] - b_n[m1])
    return _window_max(x, y, n, 3)


def _backward_feed_stall_s(fwd: ChunkTimes, bwd: ChunkTimes, rank: int) -> float:
    """Rank's longest steady wait for its backward input: from its forward of slot k to its backward of slot
    s, the neighbour N (rank + 1; rank 0, p slots back, for rank p - 1) runs slots k + 2 .. s, rank itself
    b_R(k), slots k + 1 .. s - 1 and f_R(s). stall = sum_{k<j<s} (a_N - a_R)(j) - a_N(k + 1) + a_N(s) - b_R(k)
    - f_R(s)."""
    p, v = len(fwd), len(fwd[0])
    n = p * v
    wrap = rank == p - 1
    f_r, b_r = _slots(fwd, bwd, rank)
    f_n, b_n = _slots(fwd, bwd, 0 if wrap else rank + 1)
    shift = -p if wrap else 0
    prefix = [0.0] * (2 * n + 1)
    for j in range(2 * n):
        i, m = j % n, (j + shift) % n
        prefix[j + 1] = prefix[j] + f_n[m] + b_n[m] - f_r[i] - b_r[i]
    y = []
    for k in range(2 * n):
        m = (k + 1 + shift) % n
        y.append(prefix[k + 1] + f_n[m] + b_n[m] + b_r[k % n])
    x = []
    for s in range(n, 2 * n):
        if wrap and backward_chunk(p, v, s - p) == 0:
            x.append(float("-inf"))  # the last chunk's backward follows its own forward, not rank 0
            continue
        m = (s + shift) % n
        x.append(prefix[s] + f_n[m] + b_n[m] - f_r[s % n])
    return _window_max(x, y, n, 2)


def steady_stall_s(fwd: ChunkTimes, bwd: ChunkTimes, totals: Sequence[float], rank: int) -> float:
    """Rank's longest wait per steady round on a neighbour no slower than itself (a slower neighbour paces the
    rank: that wait is the slower stage's m t, not the rank's schedule); 0 if none."""
    p = len(fwd)
    stall = 0.0
    if totals[(rank - 1) % p] <= totals[rank]:
        stall = _forward_feed_stall_s(fwd, bwd, rank)
    if totals[(rank + 1) % p] <= totals[rank]:
        stall = max(stall, _backward_feed_stall_s(fwd, bwd, rank))
    return max(stall, 0.0)


def stall_bound_s(fwd: ChunkTimes, bwd: ChunkTimes, rank: int) -> float:
    """An upper bound on steady_stall_s without the slot sums: p v slots of the largest difference between a
    neighbour's slot and the rank's, plus a neighbour's largest slot (the windows' ends)."""
    p, v = len(fwd), len(fwd[0])
    low = min(fwd[rank]) + min(bwd[rank])
    bound = 0.0
    for neighbour in ((rank - 1) % p, (rank + 1) % p):
        high = max(fwd[neighbour]) + max(bwd[neighbour])
        bound = max(bound, p * v * max(0.0, high - low) + high)
    return bound
