"""The host copies of a reshard (strategy.reshard_copies), byte for byte as the split executor makes them."""

import pytest

from trainsim.strategy.placement import Placement
from trainsim.strategy.reshard_copies import ReshardCopies, reduce_gradients_copy_bytes, reshard_copies

MIB = 2**20
FULL = 8 * MIB  # the whole tensor over the group


@pytest.mark.parametrize(("src", "dst", "fwd_bytes", "bwd_bytes"), [
    # all-gather of features: the two 4 MiB parts concatenated into 8 MiB; backward (reduce-scatter of the 8 MiB
    # gradient): cut along the features (strided parts: 8 MiB copied) and concatenated flat (8 MiB)
    (Placement(2, feature=2), Placement(2), FULL, 2 * FULL),
    # the same gathered along the batch: its parts are contiguous views, only the flat concatenation copies
    (Placement(2, batch=2), Placement(2), FULL, FULL),
    # partial sums reduce-scattered onto the features: cut (8 MiB) and concatenated (8 MiB); backward: the
    # all-gathered gradient's parts concatenated (8 MiB)
    (Placement(2, partial=2), Placement(2, feature=2), 2 * FULL, FULL),
    # partial sums reduce-scattered onto the batch: no cut copy
    (Placement(2, partial=2), Placement(2, batch=2), FULL, FULL),
    # partial sums all-reduced: the 8 MiB partial cloned; backward: nothing
    (Placement(2, partial=2), Placement(2), FULL, 0.0),
    # all-to-all from batch to features of the 4 MiB a device holds: cut along the features (4) and the received
    # parts concatenated along the batch (4); backward: cut along the batch (a view) and concatenated (4)
    (Placement(2, batch=2), Placement(2, feature=2), FULL, FULL / 2),
    # a local slice of the features: the kept 4 MiB made contiguous; backward: the gathered gradient (8 MiB)
    (Placement(2), Placement(2, feature=2), FULL / 2, FULL),
    # a local slice of the batch: a view; backward as above
    (Placement(2), Placement(2, batch=2), 0.0, FULL),
    # nothing to do; degrees that do not divide (point-to-point): no layout copy
    (Placement(2, feature=2), Placement(2, feature=2), 0.0, 0.0),
    (Placement(6, feature=2), Placement(6, feature=3), 0.0, 0.0),
])
def test_each_reshard_step_copies_the_bytes_the_executor_copies(src: Placement, dst: Placement, fwd_bytes: float,
                                                                bwd_bytes: float) -> None:
    assert reshard_copies(src, dst, FULL) == ReshardCopies(fwd_bytes, bwd_bytes)


def test_steps_add_up() -> None:
    """Partial sums over 2 of 4 devices to features split 4 ways: reduce-scatter onto the features (the 8 MiB
    partial: cut 8 + flat 8; backward 8), then a local slice of the 4 MiB part in two (2 MiB contiguous; backward:
    the 4 MiB gathered)."""
    copies = reshard_copies(Placement(4, partial=2), Placement(4, feature=4), FULL)
    assert copies == ReshardCopies(2 * FULL + FULL / 4, FULL + FULL / 2)


def test_an_output_split_ops_input_gradient_is_cloned_for_its_all_reduce() -> None:
    assert reduce_gradients_copy_bytes(Placement(4, batch=2), FULL) == FULL / 2
