"""hardware.device.core_share: a CPU rank's share of a core when a host's ranks outnumber its cores, and
validate.measured.compute_share_of on a run file's machine record (both one formula)."""

import pytest

from trainsim.hardware.device import core_share


@pytest.mark.parametrize(("cores", "ranks", "threads", "share"), [
    (2, 4, 1, 0.5),     # 4 ranks on 2 cores: each has half a core
    (2, 2, 1, 1.0),     # as many ranks as cores
    (16, 4, 1, 1.0),    # more cores than ranks: never above 1
    (16, 4, 8, 0.5),    # 4 ranks x 8 threads on 16 cores
    (2, 3, 1, 2 / 3),
    (0, 4, 1, 1.0),     # cores unknown: no stretch
])
def test_core_share_is_cores_over_ranks_times_threads_at_most_one(cores: int, ranks: int, threads: int,
                                                                  share: float) -> None:
    assert core_share(cores, ranks, threads) == pytest.approx(share)
