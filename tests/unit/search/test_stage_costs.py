"""Stage costs from the pricing service: the whole chain on one device is the analytical engine's pp=1 stage."""

import pytest

from trainsim.catalog import load_cluster
from trainsim.cost.pricing import Pricer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.search.stage_costs import PricedStageCosts, StageJob, same_dag_median_costs
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec, intra_plans, submeshes
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


def test_same_dag_median_costs_takes_the_median_of_equal_unit_kinds():
    one, two = Mesh(1, 1), Mesh(1, 2)
    # blocks 1..4 of MODEL; single blocks timed 10, 11, 30 (an outlier), 12 ms on one mesh, 5 ms on the other
    single = {1: 10.0, 2: 11.0, 3: 30.0, 4: 12.0}
    measured = {StageSpec(u, u + 1, one, IntraPlan()): StageEstimate(single[u], 7.0, 3.0) for u in single}
    measured[StageSpec(1, 3, one, IntraPlan())] = StageEstimate(21.0, 1.0, 1.0)
    measured[StageSpec(0, 1, one, IntraPlan())] = StageEstimate(2.0, 1.0, 1.0)  # the embedding: its own DAG
    measured[StageSpec(2, 3, two, IntraPlan(dp=2))] = StageEstimate(5.0, 1.0, 1.0)
    table = same_dag_median_costs(_Dict(measured), MODEL, list(measured))
    got = table.estimate(StageSpec(3, 4, one, IntraPlan()))
    assert got == StageEstimate(11.5, 7.0, 3.0)  # median of 10, 11, 30, 12; memory as measured
    assert table.estimate(StageSpec(1, 3, one, IntraPlan())) == StageEstimate(21.0, 1.0, 1.0)  # alone in its group
    assert table.estimate(StageSpec(0, 1, one, IntraPlan())) == StageEstimate(2.0, 1.0, 1.0)
    assert table.estimate(StageSpec(2, 3, two, IntraPlan(dp=2))) == StageEstimate(5.0, 1.0, 1.0)  # per mesh
    assert table.estimate(StageSpec(2, 4, one, IntraPlan())) is None  # not in the stages given


class _Dict:
    def __init__(self, table: dict[StageSpec, StageEstimate]) -> None:
        self.table = table

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        return self.table.get(stage)
