"""`trainsim search --planner stage|uniform --stage-costs ...` end to end through the CLI (analytical costs)."""

import json

from typer.testing import CliRunner

from trainsim.cli.main import app

RUNNER = CliRunner()
ARGS = ["search", "--model", "gpt3-125m", "--cluster", "local-cpu", "--num-gpus", "2", "--global-batch", "8",
        "--seq-len", "128", "--num-micro-batches", "4", "--json"]


def test_stage_planner_json_fields() -> None:
    result = RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-costs", "analytical"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"plan", "stage_evaluations", "profiled_configurations", "search_time_s"} <= out.keys()
    assert out["profiled_configurations"] == 0
    # 14 units on 2 devices (one intra plan per mesh: tp stays in a 1-GPU node): the ranges some plan holds, on
    # 1 device the 13 from unit 0 and the 13 to the head, on 2 devices the whole chain
    assert out["stage_evaluations"] == 13 + 13 + 1
    stages = out["plan"]["stages"]
    assert stages[0]["units"][0] == 0 and stages[-1]["units"][1] == 14
    assert sum(int(s["mesh"].split("x")[0]) * int(s["mesh"].split("x")[1]) for s in stages) == 2


def test_stage_plan_never_worse_than_uniform_under_the_same_costs() -> None:
    stage = json.loads(RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-costs", "analytical"]).stdout)
    uniform = json.loads(RUNNER.invoke(app, [*ARGS, "--planner", "uniform", "--stage-costs", "analytical"]).stdout)
    assert stage["plan"]["iteration_s"] <= uniform["plan"]["iteration_s"]
    # the uniform plan is an even split: the simulator re-checks it
    assert uniform["sim_iteration_s"] is not None and uniform["sim_iteration_s"] > 0


def test_bad_inputs_exit_2() -> None:
    bad = RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-costs", "oracle"])
    assert bad.exit_code == 2 and "stage_costs" in bad.output
    odd = RUNNER.invoke(app, [*ARGS[:-3], "--num-micro-batches", "3", "--planner", "stage"])
    assert odd.exit_code == 2 and "num_micro_batches" in odd.output
    planner = RUNNER.invoke(app, [*ARGS, "--planner", "greedy"])
    assert planner.exit_code == 2 and "planner" in planner.output


def test_an_uneven_plan_on_equal_meshes_is_rechecked_by_the_simulator_with_its_stage_layers() -> None:
    from trainsim.catalog.loader import load_cluster, load_model
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.job import make_job
    from trainsim.pipeline import GraphCache, predict
    from trainsim.search.stage_search import StageSearchSettings, plan_parallel, sim_recheck
    from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StagePlan, StageSpec

    model = load_model("gpt3-125m")  # 12 blocks: units 0 (embedding) .. 12, 13 (head)
    assert isinstance(model, TransformerSpec)
    mesh, intra = Mesh(1, 1), IntraPlan()
    estimate = StageEstimate(latency_s=1.0, state_bytes=0.0, activation_bytes=0.0)
    plan = StagePlan(stages=(StageSpec(0, 9, mesh, intra), StageSpec(9, 14, mesh, intra)),
                     estimates=(estimate, estimate), num_micro_batches=4)
    settings = StageSearchSettings(global_batch=8, num_micro_batches=4, seq_len=128)
    parallel = plan_parallel(plan, settings)
    assert parallel is not None and parallel.stage_layers == (8, 4) and parallel.pp == 2
    sim_s, note = sim_recheck(plan, model, load_cluster("local-cpu"), settings)
    expected = predict(make_job(model, load_cluster("local-cpu").with_num_gpus(2), parallel), "sim",
                       graphs=GraphCache()).iteration_time_s
    assert sim_s == expected and "stage_layers=8,4" in note.replace(" ", "")
    # an even split stays a plain ParallelSpec
    even = StagePlan(stages=(StageSpec(0, 7, mesh, intra), StageSpec(7, 14, mesh, intra)),
                     estimates=(estimate, estimate), num_micro_batches=4)
    even_parallel = plan_parallel(even, settings)
    assert even_parallel is not None and even_parallel.stage_layers == ()
    # stages on different meshes are not one ParallelSpec
    mixed = StagePlan(stages=(StageSpec(0, 7, Mesh(1, 2), IntraPlan(dp=2)), StageSpec(7, 14, mesh, intra)),
                      estimates=(estimate, estimate), num_micro_batches=4)
    assert plan_parallel(mixed, settings) is None


def test_equal_meshes_plan_is_one_parallel_spec_between_the_free_and_the_uniform_plan() -> None:
    equal = json.loads(RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-costs", "analytical",
                                           "--equal-meshes", "--stage-tp", "1"]).stdout)
    free = json.loads(RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-costs", "analytical"]).stdout)
    uniform = json.loads(RUNNER.invoke(app, [*ARGS, "--planner", "uniform", "--stage-costs", "analytical"]).stdout)
    stages = equal["plan"]["stages"]
    assert len({(s["mesh"], s["tp"], s["dp"]) for s in stages}) == 1
    assert free["plan"]["iteration_s"] <= equal["plan"]["iteration_s"] <= uniform["plan"]["iteration_s"]
    parallel = equal["parallel"]
    assert parallel["pp"] == len(stages) and parallel["tp"] == 1 and parallel["dp"] == stages[0]["dp"]
    assert parallel["micro_batch"] * parallel["dp"] * 4 == parallel["global_batch"] == 8
    blocks = [len(s["blocks"]) for s in stages]
    assert parallel["stage_layers"] == ([] if len(set(blocks)) == 1 else blocks)
    assert sum(blocks) == 12  # gpt3-125m
    assert equal["sim_iteration_s"] is not None  # one ParallelSpec: the simulator re-checks it


def test_stage_tp_keeps_the_intra_plans_of_one_degree() -> None:
    from trainsim.catalog.loader import load_cluster, load_model
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.search.stage_search import StageSearchSettings, search_space
    from trainsim.strategy.stage_plan import IntraPlan, Mesh

    model, cluster = load_model("gpt3-125m"), load_cluster("local-cpu").with_num_gpus(4).on_one_node()
    assert isinstance(model, TransformerSpec)
    settings = StageSearchSettings(global_batch=8, num_micro_batches=4, seq_len=128, stage_tp=2)
    meshes, plans = search_space(model, cluster, settings)
    assert meshes == [Mesh(1, 2), Mesh(1, 4)]  # the 1-device mesh has no tp = 2 plan
    assert plans == {Mesh(1, 2): [IntraPlan(2, 1)], Mesh(1, 4): [IntraPlan(2, 2)]}


def test_equal_meshes_and_stage_tp_bad_inputs_exit_2() -> None:
    grid = RUNNER.invoke(app, [*ARGS, "--equal-meshes"])  # the uniform grid has no stages to restrict
    assert grid.exit_code == 2 and "equal_meshes" in grid.output
    grid_tp = RUNNER.invoke(app, [*ARGS, "--stage-tp", "1"])
    assert grid_tp.exit_code == 2 and "stage_tp" in grid_tp.output
    zero = RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-tp", "0"])
    assert zero.exit_code == 2 and "stage_tp" in zero.output
    none = RUNNER.invoke(app, [*ARGS, "--planner", "stage", "--stage-tp", "8"])  # no mesh of 2 has tp = 8
    assert none.exit_code == 2 and "stage_tp" in none.output


def test_predtop_layers_and_sampler_bad_inputs_exit_2() -> None:
    base = [*ARGS, "--planner", "stage", "--stage-costs", "predtop"]
    layers = RUNNER.invoke(app, [*base, "--predtop-layers", "blocks"])
    assert layers.exit_code == 2 and "predtop_layers" in layers.output and "alpa" in layers.output
    sampler = RUNNER.invoke(app, [*base, "--predtop-sampler", "every"])
    assert sampler.exit_code == 2 and "predtop_sampler" in sampler.output and "sized" in sampler.output
