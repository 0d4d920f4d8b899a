"""A stage plan whose stages differ in mesh as a strategy tree of stages on their own submeshes, re-checked by the
simulator (search/stage_tree.py, search/stage_search.py sim_recheck)."""

import json

from typer.testing import CliRunner

from conftest import a100_cluster
from trainsim.catalog.loader import load_model
from trainsim.cli.main import app
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.model_spec import TransformerSpec
from trainsim.pipeline import graph_for, predict
from trainsim.search.stage_search import StageSearchSettings, sim_recheck
from trainsim.search.stage_tree import stage_plan_job, stage_plan_lowered
from trainsim.strategy.lowered import StageMesh
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StagePlan, StageSpec
from trainsim.strategy.tree import StrategyTree

ESTIMATE = StageEstimate(latency_s=1.0, state_bytes=0.0, activation_bytes=0.0)
SETTINGS = StageSearchSettings(global_batch=8, num_micro_batches=4, seq_len=128)


def _model() -> TransformerSpec:
    model = load_model("gpt3-125m")  # 12 blocks: units 0 (embedding) .. 12, 13 (head)
    assert isinstance(model, TransformerSpec)
    return model


def _one_one_two() -> StagePlan:
    """Alpa-style: 3 stages on 1, 1 and 2 GPUs of 4 (the last at dp 2)."""
    return StagePlan(stages=(StageSpec(0, 4, Mesh(1, 1), IntraPlan()), StageSpec(4, 8, Mesh(1, 1), IntraPlan()),
                             StageSpec(8, 14, Mesh(1, 2), IntraPlan(dp=2))),
                     estimates=(ESTIMATE,) * 3, num_micro_batches=4)


def test_a_plan_on_1_1_and_2_gpus_lowers_to_stages_of_their_own_sizes() -> None:
    """The job is stage 0's mesh (tp 1 x dp 1, micro-batch 2) at pp 3 on 4 GPUs; the last stage's 2 replicas take
    1 sample each; the simulated devices stand for 1, 1 and 2 ranks."""
    model, plan = _model(), _one_one_two()
    job = stage_plan_job(plan, model, a100_cluster(8), global_batch=8, seq_len=128, precision="fp32")
    assert (job.num_gpus, job.parallel.pp, job.parallel.dp, job.parallel.micro_batch) == (4, 3, 1, 2)
    lowered = stage_plan_lowered(plan, job, graph_for(job))
    assert lowered.stage_ranks == (1, 1, 2)
    assert lowered.stage_meshes == (StageMesh(2, 1, 2, 1),)
    assert [a.stage for a in lowered.layers] == [0] * 4 + [1] * 4 + [2] * 6
    run = SimEstimator().run(job, graph_for(job), lowered)
    assert [d.ranks for d in run.graph.devices] == [1, 1, 2]


def test_the_simulator_rechecks_a_plan_whose_stages_differ() -> None:
    """sim_recheck gives the simulation of the tree written out by hand (block ranges per stage)."""
    model, plan = _model(), _one_one_two()
    cluster = a100_cluster(8)
    sim_s, note = sim_recheck(plan, model, cluster, SETTINGS)
    job = stage_plan_job(plan, model, cluster, global_batch=8, seq_len=128, precision="fp32")
    graph = graph_for(job)
    tree = (StrategyTree.from_graph(graph).map("", {"stage": 0, "tp": 1, "dp": 1})
            .map("blocks.3-6", {"stage": 1, "tp": 1, "dp": 1})
            .map("blocks.7-11", {"stage": 2, "tp": 1, "dp": 2}).map("head", {"stage": 2, "tp": 1, "dp": 2}))
    expected = predict(job, "sim", graph=graph, plan=tree.lower(job.parallel, num_gpus=4)).iteration_time_s
    assert sim_s == expected
    assert "stages on their own submeshes: 1 (tp1-dp1) + 1 (tp1-dp1) + 2 (tp1-dp2) devices" in note


def test_a_stage_whose_replicas_do_not_split_the_micro_batch_is_not_rechecked() -> None:
    """2 samples per micro-batch over a stage of dp 4: reported, not simulated."""
    plan = StagePlan(stages=(StageSpec(0, 4, Mesh(1, 1), IntraPlan()), StageSpec(4, 14, Mesh(1, 4), IntraPlan(dp=4))),
                     estimates=(ESTIMATE,) * 2, num_micro_batches=4)
    sim_s, note = sim_recheck(plan, _model(), a100_cluster(8), SETTINGS)
    assert sim_s is None
    assert note == ("not re-checked: plan.dp=4 is invalid: stage 1: the micro-batch of 2 samples must split evenly "
                    "over its dp=4 replicas")


def test_search_re_checks_the_stage_planners_plan_on_its_own_submeshes() -> None:
    """gpt3-350m on 8 A100s: the stage planner puts 6 stages on 1 GPU and the head's on 2; the simulator re-checks
    that plan (within 5% of eq. 4's pipeline time here: the same prices, plus the optimizer step)."""
    result = CliRunner().invoke(app, ["search", "--model", "gpt3-350m", "--num-gpus", "8", "--global-batch", "32",
                                      "--seq-len", "1024", "--num-micro-batches", "8", "--planner", "stage",
                                      "--stage-costs", "analytical", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    sizes = [int(s["mesh"].split("x")[0]) * int(s["mesh"].split("x")[1]) for s in out["plan"]["stages"]]
    assert len(set(sizes)) > 1 and sum(sizes) == 8
    assert out["sim_iteration_s"] is not None
    assert abs(out["sim_iteration_s"] / out["plan"]["iteration_s"] - 1.0) < 0.05
