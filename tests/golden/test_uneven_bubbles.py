"""The analytical engine's bubble for uneven stages (estimate.analytical.uneven_bubble_s) on hand-computed cases.

1F1B with stage k the bottleneck: k idles for the forward (and at the end the backward) of the stages before
it, sum_{i<k} t_i, and while it waits for its first (last) gradient: the round trip R = sum_{j>k} t_j through
the later stages, less the p - k - 1 forwards (backwards) it runs meanwhile. Equal stages give the textbook
(p - 1) t (Narayanan et al. 2021).
"""

import pytest

from trainsim.estimate.analytical import uneven_bubble_s

THIRD = 1.0 / 3.0  # forward = 1/3 of forward + backward


def test_equal_stages_give_p_minus_1_stage_times() -> None:
    assert uneven_bubble_s("1f1b", [3.0] * 4, [THIRD] * 4, 8) == pytest.approx(9.0, rel=1e-12)
    assert uneven_bubble_s("gpipe", [3.0] * 4, [THIRD] * 4, 8) == 9.0


def test_the_last_stage_slowest_idles_for_the_others() -> None:
    # k = 3: no later stage; it waits for 5 + 5 + 5 of the earlier ones.
    assert uneven_bubble_s("1f1b", [5.0, 5.0, 5.0, 9.0], [THIRD] * 4, 8) == pytest.approx(15.0, rel=1e-12)


def test_the_first_stage_slowest_idles_for_the_round_trip() -> None:
    # k = 0, t = 9 (f 3, b 6): R = 15; warm-up stall 15 - 3 x 3 = 6; cool-down 15 - 3 x 6 < 0. The PredTOP
    # bound sum - max = 15 would charge 9 more; the simulator agrees with 6 (test_uneven_pipelines.py).
    assert uneven_bubble_s("1f1b", [9.0, 5.0, 5.0, 5.0], [THIRD] * 4, 8) == pytest.approx(6.0, rel=1e-12)


def test_a_middle_bottleneck() -> None:
    # totals 4, 8, 4, 4 (f = 1/3), m = 4. k = 1: fill 4; R = 8; warm-up 2 forwards of 8/3: 8 - 16/3 = 8/3;
    # cool-down 2 backwards of 16/3: 8 - 32/3 < 0. k = 0: -16 + ... k = 2, 3: 4 (+ 8) + 4 (4 - 8) < 0.
    assert uneven_bubble_s("1f1b", [4.0, 8.0, 4.0, 4.0], [THIRD] * 4, 4) == pytest.approx(4.0 + 8.0 / 3.0,
                                                                                         rel=1e-12)


def test_interleaved_equal_chunks_give_p_minus_1_chunk_times() -> None:
    shares = ((0.5, 0.5),) * 4
    assert uneven_bubble_s("interleaved-1f1b", [4.0] * 4, [THIRD] * 4, 8, shares) == pytest.approx(6.0, rel=1e-12)


def test_interleaved_a_small_first_chunk_moves_work_to_the_second() -> None:
    # the first stage's chunk 0 takes 1 of its 4 (the embedding counted as a layer), its chunk 1 the other 3;
    # the rest 2 of 4 (f = 1/3). The last stage sets the bubble: one micro-batch's chunk 0 through the stages
    # before it, 1 + 2 + 2 = 5 (the even form's). It enters at its first chunk-1 forward (micro-batch 0
    # through the 7 virtual stages before it, 14/3) less its own 4 chunk-0 forwards (8/3): 2 where the even
    # form has 5/3; it leaves after its last chunk-1 backward (the last micro-batch's backward through the 7
    # after it, 28/3) less its own 4 chunk-0 backwards (16/3): 4 where the even form has 10/3; its one steady
    # round (m / p - 1) waits 2/3 on rank 0's heavy chunk 1. 5 + 1/3 + 2/3 + 2/3 = 20/3, the exact schedule's
    # (tests/golden/test_interleaved_rounds.py evaluates it).
    shares = ((0.25, 0.75), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5))
    assert uneven_bubble_s("interleaved-1f1b", [4.0] * 4, [THIRD] * 4, 8, shares) == pytest.approx(20.0 / 3.0,
                                                                                                  rel=1e-12)
