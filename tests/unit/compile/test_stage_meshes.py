"""A subtree mapped to its own mesh (Proteus Sec. IV-B): a pipeline stage with its own tp and dp, compiled with
compile_job and simulated (compile/stage_meshes.py, strategy/tree.py StrategyTree._stage_meshes)."""

from pathlib import Path

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_model
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.stage_meshes import job_of_mesh
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, Task
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.lowered import StageMesh, default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree
from trainsim.strategy.tree_yaml import load_tree_yaml

FOUR_BLOCKS = parse_model({"name": "four-block-gpt", "num_layers": 4, "hidden": 1024, "ffn_hidden": 4096,
                           "num_heads": 16, "vocab": 32000, "max_seq_len": 1024})
BF16 = 2


def _job(**strategy: object) -> Job:
    """tp 2 x dp 2 per stage, pp 2: 8 A100s on one NVSwitch node; 8 micro-batches of 1 x 1024 tokens per
    replica."""
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, "tp": 2, "dp": 2, "pp": 2, "global_batch": 16,
                              **strategy})
    return make_job(FOUR_BLOCKS, a100_cluster(8), par)


def _second_stage_on(job: Job, **mesh: int) -> StrategyTree:
    """Stage 0 (embedding, blocks 0-1) on the job's mesh, stage 1 (blocks 2-3, head) on `mesh`."""
    return (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0, "tp": job.parallel.tp})
            .map("blocks.2-3", {"stage": 1, **mesh}).map("head", {"stage": 1, **mesh}))


def _stage(graph: ExecGraph, stage: int, *, pp: bool = True) -> list[tuple[str, str, float]]:
    return [(t.name, t.stream, t.duration_s) for t in graph.tasks
            if t.device == stage and (pp or t.category != "pp_comm")]


def _by_name(graph: ExecGraph, stage: int) -> dict[str, Task]:
    return {t.name: t for t in graph.tasks if t.device == stage}


def test_a_stage_with_its_own_tp_lowers_to_a_stage_mesh() -> None:
    """Stage 1 at tp 4 keeps its 4 devices: dp 1, whose one replica takes both replicas' samples (micro-batch 2)."""
    job = _job()
    plan = _second_stage_on(job, tp=4).lower(job.parallel)
    assert plan.stage_meshes == (StageMesh(stage=1, tp=4, dp=1, micro_batch=2),)
    assert [a.stage for a in plan.layers] == [0, 0, 0, 1, 1, 1]
    same = _second_stage_on(job, tp=2).lower(job.parallel)  # the job's own mesh: no stage mesh
    assert same.stage_meshes == ()


def test_the_stage_compiles_on_its_own_mesh_and_the_other_on_the_jobs() -> None:
    """Stage 0's tasks are the plain job's; stage 1's are those of the job on tp 4 x dp 1 with micro-batch 2 (its
    tp all-reduces of the 2 x 1024 x 1024 bf16 block output over 4 GPUs, no data-parallel gradient sync); the
    pipeline transfers between the two meshes last the longer of the two sides' prices."""
    job = _job()
    pricer = Pricer(Calibration())
    graph = compile_job(job, _second_stage_on(job, tp=4).lower(job.parallel), pricer, "op")
    plain = compile_job(job, default_plan(graph_for(job), job.parallel), pricer, "op")
    mesh_job = job_of_mesh(job, StageMesh(1, 4, 1, 2))
    assert (mesh_job.parallel.tp, mesh_job.parallel.dp, mesh_job.parallel.micro_batch) == (4, 1, 2)
    mesh = compile_job(mesh_job, default_plan(graph_for(mesh_job), mesh_job.parallel), pricer, "op")
    assert _stage(graph, 0, pp=False) == _stage(plain, 0, pp=False)
    assert _stage(graph, 1, pp=False) == _stage(mesh, 1, pp=False)
    assert _stage(graph, 1) != _stage(plain, 1)
    # stage 1's tensor-parallel all-reduces: 2 per block and micro-batch forward (attention, MLP) and their 2
    # conjugates backward, over 4 ranks of one node
    all_reduce = pricer.collective_s("all-reduce", 2 * 1024 * 1024 * BF16, job.cluster.group_layout(4, 1), mesh_job)
    block = [(t.name, t.duration_s) for t in graph.tasks if t.device == 1 and t.category == "tp_comm"
             and t.micro_batch == 0 and t.layer == "L3.block"]
    assert block == [(f"{site}.ar all-reduce mb0 L3.block", all_reduce) for site in ("attn", "mlp", "mlp", "attn")]
    assert not any(t.device == 1 and t.category == "dp_comm" for t in graph.tasks)  # dp 1: nothing to sync
    assert any(t.device == 0 and t.category == "dp_comm" for t in graph.tasks)
    # the boundary: the block's output of one replica's micro-batch, 1 x 1024 x 1024 (tp 2) and 2 x 1024 x 1024
    # (tp 4) bf16, each side's hop priced on its own mesh; the transfer takes the longer
    hop = max(pricer.pipeline_hop_s(1024 * 1024 * BF16, job), pricer.pipeline_hop_s(2 * 1024 * 1024 * BF16, mesh_job))
    sends = [t for t in graph.tasks if t.category == "pp_comm" and t.stream == "feature"]
    assert sends and all(t.duration_s == hop for t in sends)
    # the stages still meet at the transfers: stage 1's first forward waits for stage 0's send of micro-batch 0
    send = _by_name(graph, 0)["send act mb0 vs0->"]
    assert any(send.tid in t.deps for t in graph.tasks if t.device == 1)
    simulate(graph, SimOptions())  # runs to the end (no dangling dependency or collective)


def test_every_stage_on_one_other_mesh_simulates_as_the_job_on_that_mesh() -> None:
    """A tree that maps the whole model to tp 4 (dp 1) on a tp 2 x dp 2 job gives the tp 4 job's tasks and
    iteration time exactly."""
    job = _job()
    tree = (StrategyTree.from_graph(graph_for(job)).map("", {"tp": 4})
            .map("embedding", {"stage": 0}).map("blocks.2", {"stage": 1}))
    plan = tree.lower(job.parallel)
    assert [m.stage for m in plan.stage_meshes] == [0, 1]
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    mesh_job = job_of_mesh(job, plan.stage_meshes[0])
    alone = compile_job(mesh_job, default_plan(graph_for(mesh_job), mesh_job.parallel), pricer)
    for stage in (0, 1):
        assert _stage(graph, stage) == _stage(alone, stage)
    options = SimOptions(overlap_slowdown=0.2)
    assert simulate(graph, options).makespan_s == simulate(alone, options).makespan_s


def test_stage_meshes_with_dp_set_and_a_smaller_tp() -> None:
    """dp may be given with tp (it must fill the stage's devices); a smaller tp gives more replicas of a smaller
    micro-batch."""
    job = _job(micro_batch=2, global_batch=32)
    plan = _second_stage_on(job, tp=1, dp=4).lower(job.parallel)
    assert plan.stage_meshes == (StageMesh(stage=1, tp=1, dp=4, micro_batch=1),)
    graph = compile_job(job, plan, Pricer(Calibration()))
    assert not any(t.device == 1 and t.category == "tp_comm" for t in graph.tasks)
    assert any(t.device == 0 and t.category == "tp_comm" for t in graph.tasks)


@pytest.mark.parametrize(("mesh", "strategy", "field", "says"), [
    ({"tp": 4, "dp": 2}, {}, "map.dp", "must be the job's 4 devices per stage"),
    ({"tp": 3}, {}, "map.tp", "must divide the job's 4 devices per stage"),
    ({"tp": 1}, {}, "map.dp", "must split evenly over dp=4 replicas"),
    ({"cp": 2}, {}, "map.cp", "changes tp and dp only"),
])
def test_a_mesh_the_stage_cannot_hold_is_refused(mesh: dict[str, int], strategy: dict[str, object], field: str,
                                                 says: str) -> None:
    job = _job(**strategy)
    with pytest.raises(ConfigError, match=field) as error:
        _second_stage_on(job, **mesh).lower(job.parallel)
    assert says in str(error.value)


def test_layers_of_one_stage_on_two_meshes_are_refused() -> None:
    job = _job()
    tree = (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0, "tp": 2})
            .map("blocks.2-3", {"stage": 1, "tp": 4}).map("head", {"stage": 1}))
    with pytest.raises(ConfigError, match="the layers of a stage share its mesh"):
        tree.lower(job.parallel)


def test_stage_meshes_refuse_dp_computation_configs_and_interleaving() -> None:
    job = _job()
    tree = _second_stage_on(job, tp=4).split("blocks.0.mlp.fc1", "compute", "out", 2)
    with pytest.raises(ConfigError, match="not combined with stages of their own mesh"):
        tree.lower(job.parallel)
    interleaved = _job(vpp=2, schedule="interleaved-1f1b", global_batch=16)
    tree = (StrategyTree.from_graph(graph_for(interleaved)).map("", {"tp": 2})
            .map("embedding", {"stage": 0, "chunk": 0}).map("blocks.1", {"stage": 1, "chunk": 0, "tp": 4})
            .map("blocks.2", {"stage": 0, "chunk": 1}).map("blocks.3", {"stage": 1, "chunk": 1, "tp": 4})
            .map("head", {"stage": 1, "chunk": 1, "tp": 4}))
    with pytest.raises(ConfigError, match="needs one model chunk per stage"):
        tree.lower(interleaved.parallel)


def test_the_shipped_tree_file_puts_stage_1_on_tp_4() -> None:
    """data/strategies/megatron/gpt3-1.3b-stage1-tp4.yaml on its command's job (16 A100s, tp 2, pp 2, dp 4)."""
    path = Path(__file__).resolve().parents[3] / "data" / "strategies" / "megatron" / "gpt3-1.3b-stage1-tp4.yaml"
    par = ParallelSpec.parse({"tp": 2, "pp": 2, "micro_batch": 1, "global_batch": 64, "seq_len": 2048})
    job = make_job(load_model("gpt3-1.3b"), a100_cluster(16), par)
    plan = load_tree_yaml(path, graph_for(job)).lower(job.parallel)
    assert plan.stage_meshes == (StageMesh(stage=1, tp=4, dp=2, micro_batch=2),)
    assert [a.stage for a in plan.layers] == [0] * 13 + [1] * 13
