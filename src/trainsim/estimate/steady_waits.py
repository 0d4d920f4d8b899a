"""Every rank's longest steady wait on its neighbours in interleaved 1F1B, all ranks and both feeds at once.

In the steady state of interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2, Megatron-LM's order) rank R's
slot k runs "forward k + w_R, backward k"; its slot-s forward waits for R - 1's slot s - 2 forward (its
forward feed), R - 1's slot-k backward for R's (R's backward feed; ranks 0 and p - 1 meet over the wrap, p
slots apart). With a = f + b per slot and N the feed's neighbour, a window from R's slot k to its slot s waits

    forward feed:  sum_{k<j<s} (a_N - a_R)(j) + b_N(k) - b_N(s - 2) - a_N(s - 1),    k <= s - 3
    backward feed: sum_{k<j<s} (a_N - a_R)(j) - a_N(k + 1) + a_N(s) - b_R(k) - f_R(s),  k <= s - 2

and the feed's stall is the longest over one period of s (p v slots) and windows of up to p v slots. Written
with prefix sums c(j) = sum_{i<=j} (a_N - a_R)(i) as x(s) - y(k): a sliding minimum of y per s (from a sparse
table of pairwise minima). The slot tables are gathers from one flat table of the chunk times and their
negatives, at indices that depend on the shape only (cached), so all the feeds that can wait (uneven_feeds)
take the same few array operations; each sum is formed in the order of the per-slot form (a - b as a + (-b),
exact in IEEE arithmetic), so the waits are those of a per-rank, per-slot evaluation bit for bit.
"""

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

ChunkTimes = Sequence[Sequence[float]]  # [rank][chunk] seconds, one micro-batch

FEEDS = 2  # 0: the forward feed (rank R - 1), 1: the backward feed (rank R + 1)
# The tables each feed gathers from the flat table [f, b, -f, -b, 0, -inf] (f, b: [rank][chunk] flattened), per
# slot k = 0 .. 2n - 1: 0-3 the slot difference's terms f_N, b_N, -f_R, -b_R; then, alternating, y's 3 terms
# after its prefix sum (forward feed: -b_N(k), 0, 0; backward: f_N(k + 1), b_N(k + 1), b_R(k)) and x's 3 after
# the prefix sum at k = s - 1 (forward: -b_N(s - 2), -f_N(s - 1), -b_N(s - 1); backward: f_N(s), b_N(s),
# -f_R(s)), -inf where the wrap's data comes from the loader (rank 0's first-chunk forwards) or the rank's own
# forward (rank p - 1's last chunk), 0 outside s = n .. 2n - 1.
SLOT_TABLES = 10


def _forward_chunk(p: int, v: int, rank: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """The chunk of rank's forward in steady slot `slot`: forward slot + w_rank, w_rank = p v - p + 2 (p - 1 -
    rank) (Megatron-LM's warm-up count), chunk (k mod p v) // p (Megatron-LM's get_model_chunk_id)."""
    return ((slot + 2 * (p - 1 - rank) - p) % (p * v)) // p


def _backward_chunk(p: int, v: int, slot: np.ndarray) -> np.ndarray:
    """The chunk of any rank's backward in steady slot `slot`: v - 1 - (slot mod p v) // p."""
    return v - 1 - (slot % (p * v)) // p


def _feed_rows(p: int, v: int, feed: int) -> np.ndarray:
    """(SLOT_TABLES, p, 2n): the ten tables' flat indices for one feed of every rank."""
    n = p * v
    f_neg, zero, closed = 2 * n, 4 * n, 4 * n + 1  # -f at f_neg + i, -b at f_neg + n + i
    rank = np.arange(p)[:, None]
    wrap = rank == (0 if feed == 0 else p - 1)
    neighbour = (rank - 1) % p if feed == 0 else (rank + 1) % p
    shift = np.where(wrap, p if feed == 0 else -p, 0)

    def f_n(k: np.ndarray) -> np.ndarray:
        return neighbour * v + _forward_chunk(p, v, neighbour, k + shift)

    def b_n(k: np.ndarray) -> np.ndarray:
        return n + neighbour * v + _backward_chunk(p, v, k + shift)

    def f_r(k: np.ndarray) -> np.ndarray:
        return rank * v + _forward_chunk(p, v, rank, k)

    def b_r(k: np.ndarray) -> np.ndarray:
        return n + rank * v + _backward_chunk(p, v, k)

    slots = np.arange(2 * n)
    tables = np.full((SLOT_TABLES, p, 2 * n), zero, dtype=np.intp)
    tables[:4] = f_n(slots), b_n(slots), f_neg + f_r(slots), f_neg + b_r(slots)
    s = np.arange(n, 2 * n)  # x at k = s - 1
    if feed == 0:
        tables[4] = f_neg + b_n(slots)
        opened = ~wrap | ((s - 2) % n < n - p)
        tables[5::2, :, n - 1:2 * n - 1] = (f_neg + b_n(s - 2), f_neg + f_n(s - 1),
                                            np.where(opened, f_neg + b_n(s - 1), closed))
    else:
        tables[4::2] = f_n(slots + 1), b_n(slots + 1), b_r(slots)
        opened = ~wrap | ((s - p) % n < n - p)
        tables[5::2, :, n - 1:2 * n - 1] = f_n(s), b_n(s), np.where(opened, f_neg + f_r(s), closed)
    return tables


Feed = tuple[int, int]  # (feed, rank): 0 the forward feed (from rank - 1), 1 the backward feed (from rank + 1)


def feed_neighbour(feed: Feed, p: int) -> int:
    """The rank a feed's data comes from."""
    return (feed[1] - 1) % p if feed[0] == 0 else (feed[1] + 1) % p


def uneven_feeds(fwd: ChunkTimes, bwd: ChunkTimes) -> tuple[Feed, ...]:
    """The feeds that can wait, forward feeds first: those whose rank or neighbour has chunks that differ. Where
    both have equal chunks the wait is never counted: with equal slots every window's sum is 0 and its ends
    negative; a neighbour slower by a constant per slot makes up at most one period of it (its round exceeds the
    rank's by that period, more than the wait); a faster one leaves every window negative."""
    chunks = len(fwd[0])
    even = [f.count(f[0]) == chunks and b.count(b[0]) == chunks for f, b in zip(fwd, bwd, strict=True)]
    if all(even):
        return ()
    # rank r's forward feed comes from r - 1, its backward feed from r + 1 (both around the ring)
    from_before, from_after = even[-1:] + even[:-1], even[1:] + even[:1]
    return (*((0, rank) for rank, pair in enumerate(zip(even, from_before, strict=True)) if not all(pair)),
            *((1, rank) for rank, pair in enumerate(zip(even, from_after, strict=True)) if not all(pair)))


@lru_cache(maxsize=16)  # NB: 10 x 2p x 2pv indices each (0.6 MB at p 16 x v 7)
def _all_feeds_layout(p: int, v: int) -> np.ndarray:
    """(SLOT_TABLES, 2p, 2n): the gather indices of every feed, (feed, rank) at feed p + rank (cached: a pure
    function of the shape)."""
    return np.concatenate([_feed_rows(p, v, feed) for feed in range(FEEDS)], axis=1)


@lru_cache(maxsize=64)
def slot_layout(p: int, v: int, feeds: tuple[Feed, ...]) -> np.ndarray:
    """(SLOT_TABLES, len(feeds), 2n): the gather indices of these feeds of a pipeline of p ranks and v chunks each
    (cached: a pure function of the shape and the feeds)."""
    return _all_feeds_layout(p, v)[:, [feed * p + rank for feed, rank in feeds]]


def clear_layouts() -> None:
    """Forget the cached gather indices (benchmarks: the cost of a pipeline shape seen for the first time)."""
    _all_feeds_layout.cache_clear()
    slot_layout.cache_clear()


def flat_chunk_table(fwd: ChunkTimes, bwd: ChunkTimes) -> np.ndarray:
    """[f, b, -f, -b, 0, -inf] flattened, the table slot_layout's indices read (fwd, bwd: [rank][chunk])."""
    times = [seconds for rows in (fwd, bwd) for row in rows for seconds in row]
    return np.array([*times, *[-seconds for seconds in times], 0.0, -np.inf])


def _least_in_windows(y: np.ndarray, n: int, forward_feeds: int) -> np.ndarray:
    """(feeds, n): per feed, the minimum of y over the window of slots s - n .. s - 3 (a forward feed) or s - n ..
    s - 2 (a backward feed, after the first forward_feeds) for s = n .. 2n - 1 (y: (feeds, 2n)), from a sparse
    table: minima over 2, 4, .. 2^j slots by pairs of the level below, then each window as the minimum of the
    2^j from its first slot and the 2^j up to its last (2^j <= n - 2 < 2^(j + 1))."""
    span = 1
    while 2 * span <= n - 2:
        y = np.minimum(y[:, :-span], y[:, span:])
        span *= 2
    least = np.minimum(y[:, :n], y[:, n - 2 - span:2 * n - 2 - span])
    backward = y[forward_feeds:]
    least[forward_feeds:] = np.minimum(backward[:, :n], backward[:, n - 1 - span:2 * n - 1 - span])
    return least


def feed_stalls_s(fwd: ChunkTimes, bwd: ChunkTimes, feeds: tuple[Feed, ...]) -> list[float]:
    """Per feed, its longest steady wait (may be <= 0: none)."""
    p, v = len(fwd), len(fwd[0])
    n = p * v
    ends = slice(n - 1, 2 * n - 1)
    tables = flat_chunk_table(fwd, bwd).take(slot_layout(p, v, feeds))
    prefix = np.add.accumulate(tables[0] + tables[1] + tables[2] + tables[3], axis=-1)
    after = tables[4:].reshape(3, 2, len(feeds), 2 * n)  # [term][y, x]
    y, x = prefix + after[0] + after[1] + after[2]
    x = x[:, ends]
    forward_feeds = sum(1 for feed, _ in feeds if feed == 0)
    return (x - _least_in_windows(y, n, forward_feeds)).max(axis=-1).tolist()


def steady_stalls_s(fwd: ChunkTimes, bwd: ChunkTimes, totals: Sequence[float]) -> list[float]:
    """Per rank, its longest wait per steady round that counts (fwd, bwd: [rank][chunk] seconds of one
    micro-batch; totals: per rank, its stage time). A wait on a neighbour counts where the rank's round with it
    (p t_R + stall) is no shorter than the neighbour's own round (p t_N); otherwise the neighbour paces the rank,
    and that is already its own m t, not the rank's schedule. 0 where no wait counts."""
    p = len(fwd)
    counted = [0.0] * p
    feeds = uneven_feeds(fwd, bwd)
    if not feeds:
        return counted
    for feed, stall in zip(feeds, feed_stalls_s(fwd, bwd, feeds), strict=True):
        rank = feed[1]
        if stall > counted[rank] and p * totals[rank] + stall >= p * totals[feed_neighbour(feed, p)]:
            counted[rank] = stall
    return counted
