"""What the scale-agreement tests share: the ladder of GPU counts and the walk up it."""

from collections.abc import Callable

import pytest

from trainsim.catalog import load_cluster, load_model
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

LADDER = (1, 8, 64, 1024, 16384, 131072, 2**20)
LadderGaps = Callable[[AnalyticalEstimator, SimEstimator, str, dict[str, object], int, int], list[tuple[int, float]]]


def _ladder_gaps(analytical: AnalyticalEstimator, sim: SimEstimator, model: str, axes: dict[str, object],
                 seq_len: int, micro_batches: int) -> list[tuple[int, float]]:
    """(GPUs, sim / analytical - 1) up the ladder, on H100 nodes, data-parallel over what tp x pp leaves."""
    spec = load_model(model)
    model_parallel = int(axes.get("tp", 1)) * int(axes.get("pp", 1))  # type: ignore[call-overload]
    checked = []
    for gpus in LADDER:
        if gpus < model_parallel:
            continue
        dp = gpus // model_parallel
        par = ParallelSpec.parse({**axes, "micro_batch": 1, "global_batch": dp * micro_batches, "seq_len": seq_len})
        job = make_job(spec, load_cluster("dgx-h100-80gb").with_num_gpus(gpus), par)
        graph = graph_for(job)
        expected = analytical.estimate(job, graph).iteration_time_s
        got = sim.estimate(job, graph).iteration_time_s
        checked.append((gpus, round(got / expected - 1.0, 4)))
    return checked


@pytest.fixture
def ladder_gaps() -> LadderGaps:
    return _ladder_gaps
