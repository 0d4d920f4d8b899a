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
    # 14 units, every range on the 1- and 2-device meshes (one intra plan each: tp stays in a 1-GPU node)
    assert out["stage_evaluations"] == 14 * 15 // 2 * 2
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
