"""Strategy transformation (strategy.reshard): the collective each layout change needs, with its buffer."""

import pytest

from trainsim.errors import ConfigError
from trainsim.strategy.reshard import Placement, ReshardStep, reshard

MB = 1e6


def test_partial_sums_to_replicated_is_an_all_reduce_of_the_local_tensor() -> None:
    assert reshard(Placement(2, partial=2), Placement(2), 8 * MB) == (ReshardStep("all-reduce", 2, 8 * MB),)


def test_partial_sums_to_batch_shards_is_a_reduce_scatter() -> None:
    assert reshard(Placement(2, partial=2), Placement(2, batch=2), 8 * MB) == (
        ReshardStep("reduce-scatter", 2, 8 * MB),)


def test_batch_shards_to_feature_shards_is_an_all_to_all_of_the_local_part() -> None:
    assert reshard(Placement(4, batch=4), Placement(4, feature=4), 8 * MB) == (
        ReshardStep("all-to-all", 4, 2 * MB),)


def test_shards_to_replicated_is_an_all_gather_of_the_gathered_bytes() -> None:
    assert reshard(Placement(4, batch=4), Placement(4), 8 * MB) == (ReshardStep("all-gather", 4, 8 * MB),)


def test_mixed_change_is_all_to_all_then_all_gather() -> None:
    """batch/4 -> feature/2 (replicated twice): half the batch split trades with the feature, half is gathered."""
    assert reshard(Placement(4, batch=4), Placement(4, feature=2), 8 * MB) == (
        ReshardStep("all-to-all", 2, 2 * MB), ReshardStep("all-gather", 2, 4 * MB))


def test_a_finer_split_is_a_local_slice_and_equal_placements_move_nothing() -> None:
    assert reshard(Placement(4), Placement(4, batch=4), 8 * MB) == ()
    assert reshard(Placement(4, seq=2), Placement(4, seq=2), 8 * MB) == ()


def test_degrees_that_do_not_divide_fall_back_to_point_to_point() -> None:
    assert reshard(Placement(6, batch=2), Placement(6, batch=3), 6 * MB) == (ReshardStep("send-recv", 2, 2 * MB),)


@pytest.mark.parametrize(("kwargs", "field"), [({"group": 0}, "placement.group"), ({"group": 2, "batch": 0},
                                                                                     "placement.batch"),
                                               ({"group": 4, "batch": 3}, "placement")])
def test_bad_placements_are_refused(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Placement(**kwargs)
    assert exc.value.field == field
