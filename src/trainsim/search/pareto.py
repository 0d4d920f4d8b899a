"""The Pareto front of a search: the plans no other plan beats on both throughput and peak memory."""

from collections.abc import Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> set[int]:
    """Indices of the points (tokens_per_s, peak_memory_bytes) that no other point dominates: none has at least
    their throughput with at most their memory and is better in one. Of equal points, the first is kept.

    >>> sorted(pareto_front([(10.0, 5.0), (12.0, 6.0), (9.0, 6.0), (12.0, 6.0)]))
    [0, 1]
    """
    # Sweep by memory (ascending), then throughput (descending): a point is on the front when it is faster than
    # every point that uses no more memory.
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0], i))
    front: set[int] = set()
    best = float("-inf")
    for index in order:
        if points[index][0] > best:
            front.add(index)
            best = points[index][0]
    return front
