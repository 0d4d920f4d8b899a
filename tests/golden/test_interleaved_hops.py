"""The hop latency an interleaved pipeline waits for when its stack overlaps the sends (Pricer.pipeline_chain_s).

Overlapping a send hides it from the sender, not from the stage waiting for its data. In the interleaved schedule
(Narayanan et al. 2021, sec. 2.2.2) a stage runs chunk c of p micro-batches, then chunk c + 1 of the first one,
whose input has meanwhile gone round the p stages: each of the v - 1 rounds of the warm-up and of the cool-down
waits p (hop - exposed hop), the fill and drain of the last round p - 1 each: 2 (v p - 1) (hop - exposed hop).
"""

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration, RuntimeParams
from trainsim.catalog.model_files import parse_model
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import make_stack

MODEL = parse_model({"name": "tiny-gpt", "num_layers": 32, "hidden": 2048, "ffn_hidden": 8192,
                     "num_heads": 16, "vocab": 128, "max_seq_len": 2048})


def _job(vpp: int, overlap: bool, pp: int = 4) -> Job:
    par = ParallelSpec(pp=pp, vpp=vpp, schedule="interleaved-1f1b" if vpp > 1 else "1f1b", micro_batch=1,
                       global_batch=8, seq_len=2048)
    return make_job(MODEL, a100_cluster(pp), par, make_stack({"preset": "megatron-core",
                                                                   "pp_comm_overlap": overlap}))


def test_the_chain_of_hand_numbers() -> None:
    """v = 4, p = 4, a 1 ms hop overlapped with 1 ms of compute (8 ms over 2 v sends) at gamma 0.1: the sender
    sees 0.1 ms of it, the waiting stage the other 0.9 ms, 2 (4 x 4 - 1) = 30 times."""
    pricer = Pricer(Calibration(runtime=RuntimeParams(overlap_slowdown=0.1)))
    job = _job(4, overlap=True)
    assert pricer.pipeline_chain_from_s(1e-3, 8e-3, job) == pytest.approx(30 * 0.9e-3, rel=1e-12)
    # a window longer than the hop hides all but gamma's share from the sender: the same 0.9 ms waited for
    assert pricer.pipeline_chain_from_s(1e-3, 80e-3, job) == pytest.approx(30 * 0.9e-3, rel=1e-12)
    # a hop longer than the window: the sender is held for the excess, the waiting stage only for the rest
    exposed = (2e-3 - 1e-3) + 0.1 * 1e-3
    assert pricer.pipeline_chain_from_s(2e-3, 8e-3, job) == pytest.approx(30 * (2e-3 - exposed), rel=1e-12)


@pytest.mark.parametrize("vpp", [1, 2, 4])
def test_only_overlapped_interleaved_sends_add_a_chain(vpp: int) -> None:
    """A blocking send is in the stage's own time (the bubble already holds it): no chain; v = 1 neither."""
    estimator = AnalyticalEstimator()
    for overlap in (False, True):
        job = _job(vpp, overlap)
        stages = estimator.pricer.plan_partition(graph_for(job), job.parallel).stages
        chain = [estimator.pricer.stage_cost(stage, job).pp_chain_s for stage in stages]
        if overlap and vpp > 1:
            assert all(seconds > 0.0 for seconds in chain)
        else:
            assert chain == [0.0] * len(stages)


def test_the_bubble_adds_the_chain_of_the_bottleneck() -> None:
    estimator = AnalyticalEstimator()
    job = _job(4, overlap=True)
    graph = graph_for(job)
    stages = estimator.pricer.plan_partition(graph, job.parallel).stages
    costs = [estimator.pricer.stage_cost(stage, job) for stage in stages]
    slow = max(costs, key=lambda cost: cost.total_s)
    bubble = estimator.estimate(job, graph).breakdown["bubble"]
    assert slow.pp_chain_s > 0.0
    assert bubble == pytest.approx((sum(cost.total_s for cost in costs) - slow.total_s) / 4 + slow.pp_chain_s,
                                   rel=1e-12)
