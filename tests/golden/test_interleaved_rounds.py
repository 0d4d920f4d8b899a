"""Interleaved 1F1B with model chunks that differ in cost (estimate.interleaved_rounds, and the analytical
engine's uneven_bubble_s that uses it) against the exact schedule: a hand-computed case, and the longest path
of Megatron-LM's order (compile.schedules) with per-chunk forward and backward times, evaluated step by step
below (every step starts when its rank's previous step and its input are done; no communication).
"""

import pytest

from trainsim.compile.schedules import interleaved_one_f_one_b
from trainsim.estimate.analytical import uneven_bubble_s
from trainsim.estimate.interleaved_rounds import fill_drain_extra_s
from trainsim.estimate.steady_waits import steady_stalls_s

THIRD = 1.0 / 3.0


def _makespan(fwd: list[list[float]], bwd: list[list[float]], m: int) -> float:
    """The exact iteration time of the interleaved schedule of per-(rank, chunk) step times."""
    p, v = len(fwd), len(fwd[0])
    orders = interleaved_one_f_one_b(p, v, m)
    end: dict[tuple[str, int, int], float] = {}
    position, clock = [0] * p, [0.0] * p
    remaining = sum(len(order) for order in orders)
    while remaining:
        for rank, order in enumerate(orders):
            while position[rank] < len(order):
                step = order[position[rank]]
                stage = step.chunk * p + rank
                if step.phase == "F":
                    needs = ("F", step.micro_batch, stage - 1) if stage else None
                    seconds = fwd[rank][step.chunk]
                else:
                    needs = ("B", step.micro_batch, stage + 1) if stage < p * v - 1 else ("F", step.micro_batch, stage)
                    seconds = bwd[rank][step.chunk]
                if needs is not None and needs not in end:
                    break
                clock[rank] = max(clock[rank], end[needs] if needs else 0.0) + seconds
                end[(step.phase, step.micro_batch, stage)] = clock[rank]
                position[rank] += 1
                remaining -= 1
    return max(clock)


def _bubble(fwd: list[list[float]], bwd: list[list[float]], m: int) -> float:
    totals = [sum(f) + sum(b) for f, b in zip(fwd, bwd, strict=True)]
    shares = tuple(tuple((f + b) / total for f, b in zip(fs, bs, strict=True))
                   for fs, bs, total in zip(fwd, bwd, totals, strict=True))
    forward = [sum(f) / total for f, total in zip(fwd, totals, strict=True)]
    return uneven_bubble_s("interleaved-1f1b", totals, forward, m, shares)


# Two ranks, two chunks; forward = 1/3 of each chunk. Rank 0: chunks of 3 (f 1, b 2); rank 1: a light first
# chunk of 0.75 (f 0.25, b 0.5) and a heavy last one of 12 (f 4, b 8, the LM head): t = 6 and 12.75.
HEAD_FWD = [[1.0, 1.0], [0.25, 4.0]]
HEAD_BWD = [[2.0, 2.0], [0.5, 8.0]]


def test_a_heavy_last_chunk_by_hand() -> None:
    # m = 4; rank 1, the slowest, is busy m t = 51. It enters at its first chunk-1 forward (at 3: rank 0's two
    # chunk-0 forwards and its chunk-1 forward of micro-batch 0), less its own two chunk-0 forwards (0.5): 2.5
    # where the even form has f_00 = 1 (+1.5). It leaves after its last chunk-1 backward: rank 0's chunk-1
    # backward (2) and its two chunk-0 backwards (4), less rank 1's own two chunk-0 backwards (1): 5 where
    # the even form has b_00 = 2 (+3). Between its two heavy rounds it runs light slots (F2.0 B0.0 F3.0 B1.0:
    # 1.5) while its next heavy forward waits for rank 0's B1.1 and F2.1 (3): a stall of 1.5, once
    # (m / p - 1 rounds). Iteration 51 + 3 + 1.5 + 3 + 1.5 = 60.
    assert fill_drain_extra_s(HEAD_FWD, HEAD_BWD) == pytest.approx([0.0, 4.5], abs=1e-12)
    assert steady_stalls_s(HEAD_FWD, HEAD_BWD, [6.0, 12.75])[1] == pytest.approx(
        1.5, rel=1e-12)
    assert _bubble(HEAD_FWD, HEAD_BWD, 4) == pytest.approx(9.0, rel=1e-12)
    assert _makespan(HEAD_FWD, HEAD_BWD, 4) == pytest.approx(60.0, rel=1e-12)


@pytest.mark.parametrize("m", [2, 4, 6, 8])
def test_the_heavy_last_chunk_is_exact_for_every_micro_batch_count(m: int) -> None:
    # one stall per round after the first: 7.5 + 1.5 (m / 2 - 1)
    assert m * 12.75 + _bubble(HEAD_FWD, HEAD_BWD, m) == pytest.approx(_makespan(HEAD_FWD, HEAD_BWD, m), rel=1e-12)


def _chunks(totals: list[list[float]]) -> tuple[list[list[float]], list[list[float]]]:
    return [[THIRD * t for t in row] for row in totals], [[2.0 * THIRD * t for t in row] for row in totals]


# (chunk totals per rank, micro-batches): an LM head on the last chunk, a light first chunk there (few layers
# and the head), light first and last stages (first/last stage layers), a light embedding chunk
EXACT_CASES = [
    ([[1.0, 1.0]] * 3 + [[0.2, 3.8]], 8),
    ([[1.0, 1.0]] * 3 + [[0.2, 3.8]], 16),
    ([[1.0, 1.0, 1.0]] * 3 + [[0.5, 1.0, 4.0]], 12),
    ([[0.5, 0.5]] + [[1.0, 1.0]] * 2 + [[0.5, 3.0]], 8),
    ([[0.5, 0.5]] + [[1.0, 1.0]] * 6 + [[0.5, 3.0]], 32),
    ([[0.3, 1.0]] + [[1.0, 1.0]] * 2 + [[1.0, 2.5]], 8),
    ([[1.0, 1.0, 1.0, 1.0]] * 7 + [[1.0, 1.0, 1.0, 2.0]], 16),
    # light end stages beside a middle as slow as the head's stage (t 3.0 and 3.0), or a little slower (2.0
    # and 1.95: the last rank's waits on its slower neighbour count, its round with them outlasting the
    # neighbour's own)
    ([[0.4] * 3] + [[1.0] * 3] * 2 + [[0.4, 0.4, 2.2]], 8),
    ([[0.4] * 3] + [[1.0] * 3] * 2 + [[0.4, 0.4, 2.2]], 16),
    ([[0.5, 0.5]] + [[1.0, 1.0]] * 2 + [[0.5, 1.45]], 8),
]


@pytest.mark.parametrize(("totals", "m"), EXACT_CASES)
def test_uneven_chunks_against_the_schedule(totals: list[list[float]], m: int) -> None:
    fwd, bwd = _chunks(totals)
    slowest = max(sum(row) for row in totals)
    assert m * slowest + _bubble(fwd, bwd, m) == pytest.approx(_makespan(fwd, bwd, m), rel=1e-9)


def test_equal_chunks_keep_the_textbook_bubble() -> None:
    fwd, bwd = _chunks([[2.0, 2.0]] * 4)
    assert _bubble(fwd, bwd, 8) == pytest.approx(6.0, rel=1e-12)
    assert _makespan(fwd, bwd, 8) == pytest.approx(8 * 4.0 + 6.0, rel=1e-12)
