"""Stage costs from the pricing service: the whole chain on one device is the analytical engine's pp=1 stage."""

import pytest

from trainsim.catalog import load_cluster
from trainsim.cost.pricing import Pricer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.search.stage_costs import PricedStageCosts, StageJob
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec, intra_plans, submeshes
from trainsim.strategy.stages import partition_stages

MODEL = TransformerSpec(name="tiny", arch="gpt", num_layers=4, hidden=64, ffn_hidden=256, num_heads=4, vocab=512,
                        max_seq_len=64)


def stage_job(gpus: int = 4) -> StageJob:
    return StageJob(model=MODEL, cluster=load_cluster("local-cpu").with_num_gpus(gpus).on_one_node(),
                    micro_batch=4, num_micro_batches=2, seq_len=64)


def test_whole_chain_is_the_analytical_stage():
    costs = PricedStageCosts(stage_job(1))
    got = costs.estimate(StageSpec(0, 6, Mesh(1, 1), IntraPlan()))
    job = make_job(MODEL, load_cluster("local-cpu"), ParallelSpec(micro_batch=4, global_batch=4, seq_len=64,
                                                                  precision="fp32"))
    want = Pricer().stage_cost(partition_stages(graph_for(job), 1)[0], job).total_s
    assert got is not None and got.latency_s == pytest.approx(want)


def test_chain_sums_blocks():
    costs = PricedStageCosts(stage_job(1))
    one = costs.estimate(StageSpec(1, 2, Mesh(1, 1), IntraPlan()))
    two = costs.estimate(StageSpec(1, 3, Mesh(1, 1), IntraPlan()))
    assert one is not None and two is not None
    assert two.state_bytes == pytest.approx(2 * one.state_bytes)
    assert two.activation_bytes == pytest.approx(2 * one.activation_bytes)


def test_dp_not_dividing_the_micro_batch_is_no_stage():
    job = StageJob(model=MODEL, cluster=load_cluster("local-cpu").with_num_gpus(2).on_one_node(), micro_batch=3,
                   num_micro_batches=2, seq_len=64)
    assert PricedStageCosts(job).estimate(StageSpec(0, 6, Mesh(1, 2), IntraPlan(1, 2))) is None


def test_submeshes_and_intra_plans():
    cluster = load_cluster("local-cpu").with_num_gpus(4).on_one_node()
    assert submeshes(cluster) == [Mesh(1, 1), Mesh(1, 2), Mesh(1, 4)]
    assert intra_plans(MODEL, Mesh(1, 4)) == [IntraPlan(1, 4), IntraPlan(2, 2), IntraPlan(4, 1)]
