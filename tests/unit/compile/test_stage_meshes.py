"""A subtree mapped to its own mesh (Proteus Sec. IV-B): a pipeline stage with its own tp and dp, compiled with
compile_job and simulated (compile/stage_meshes.py, strategy/tree.py StrategyTree._stage_meshes)."""

from pathlib import Path

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_model
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.stage_meshes import job_of_mesh, stage_repeated_flops
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, Task
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.lowered import StageMesh, default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig
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


def test_the_shipped_tree_file_puts_stage_1_on_tp_4() -> None:
    """data/strategies/megatron/gpt3-1.3b-stage1-tp4.yaml on its command's job (16 A100s, tp 2, pp 2, dp 4)."""
    path = Path(__file__).resolve().parents[3] / "data" / "strategies" / "megatron" / "gpt3-1.3b-stage1-tp4.yaml"
    par = ParallelSpec.parse({"tp": 2, "pp": 2, "micro_batch": 1, "global_batch": 64, "seq_len": 2048})
    job = make_job(load_model("gpt3-1.3b"), a100_cluster(16), par)
    plan = load_tree_yaml(path, graph_for(job)).lower(job.parallel)
    assert plan.stage_meshes == (StageMesh(stage=1, tp=4, dp=2, micro_batch=2),)
    assert [a.stage for a in plan.layers] == [0] * 13 + [1] * 13


# --- per-op configs on a stage's own mesh: over its tp (each op Megatron's split, over fewer ranks, or none) and
# over its dp (computation configs carved from its data-parallel ranks) ---

ATTN = [("attn.qkv", "out"), ("attn.core", "out"), ("attn.out", "reduce")]
MLP = [("mlp.fc1", "out"), ("mlp.act", "out"), ("mlp.fc2", "reduce")]


def _tp_splits(tree: StrategyTree, blocks: str, splits: list[tuple[str, str]], parts: int) -> StrategyTree:
    for op, dim in splits:
        tree = tree.split(f"blocks.{blocks}.{op}", "compute", dim, parts, axis="tp")
    return tree


def _stage_configs(tree: StrategyTree, stage0_tp: int, stage1_tp: int, stage1_mlp: int) -> StrategyTree:
    """Megatron's splits over stage 0's tp on its embedding and blocks 0-1; over stage 1's tp on its attention
    and head, its MLP over `stage1_mlp` ranks."""
    tree = tree.split("embedding.tokens", "compute", "reduce", stage0_tp, axis="tp")
    tree = _tp_splits(_tp_splits(tree, "0-1", ATTN + MLP, stage0_tp), "2-3", ATTN, stage1_tp)
    tree = _tp_splits(tree, "2-3", MLP, stage1_mlp)
    return tree.split("head.proj", "compute", "out", stage1_tp, axis="tp").split("head.loss", "compute", "out",
                                                                                 stage1_tp, axis="tp")


def test_a_stage_on_tp_4_runs_its_mlp_over_pairs_beside_a_stage_on_tp_2() -> None:
    """Stage 0 on the job's tp 2 x dp 2 with Megatron's splits; stage 1 on tp 4 x dp 1 (micro-batch 2) with its
    attention and head at tp 4 and its MLP over pairs of tp ranks. Each op's config is checked against its own
    stage's tp (fc1's out=2 is Megatron's on stage 0, a pair split on stage 1). Stage 0's tasks are the plain
    job's; stage 1's are those of the tp 4 x dp 1 job compiled with the same configs (its MLP all-reduces of the
    2 x 1024 x 1024 bf16 block output over 2 ranks, its attention's over 4)."""
    job = _job()
    tree = _stage_configs(_second_stage_on(job, tp=4), 2, 4, 2)
    plan = tree.lower(job.parallel)
    fc1 = {s.layer: s.config for s in plan.mesh_splits if s.module_path.endswith("mlp.fc1")}
    assert fc1 == {1: OpConfig(1, 1, 2, 1), 2: OpConfig(1, 1, 2, 1), 3: OpConfig(1, 1, 2, 1),
                   4: OpConfig(1, 1, 2, 1)}
    qkv = {s.layer: s.config.out for s in plan.mesh_splits if s.module_path.endswith("attn.qkv")}
    assert qkv == {1: 2, 2: 2, 3: 4, 4: 4}
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer, "op")
    plain = compile_job(job, default_plan(graph_for(job), job.parallel), pricer, "op")
    mesh_job = job_of_mesh(job, StageMesh(1, 4, 1, 2))
    alone_tree = _stage_configs(StrategyTree.from_graph(graph_for(mesh_job)).map("", {"stage": 0})
                                .map("blocks.2-3", {"stage": 1}).map("head", {"stage": 1}), 4, 4, 2)
    alone = compile_job(mesh_job, alone_tree.lower(mesh_job.parallel), pricer, "op")
    assert _stage(graph, 0, pp=False) == _stage(plain, 0, pp=False)
    assert _stage(graph, 1, pp=False) == _stage(alone, 1, pp=False)
    out_bytes = 2 * 1024 * 1024 * BF16
    pair, four = (pricer.collective_s("all-reduce", out_bytes, job.cluster.group_layout(n, 1), mesh_job)
                  for n in (2, 4))
    block = [(t.name, t.duration_s) for t in graph.tasks if t.device == 1 and t.category == "tp_comm"
             and t.micro_batch == 0 and t.layer == "L3.block"]
    assert block == [("attn.ar all-reduce mb0 L3.block", four), ("mlp.ar all-reduce mb0 L3.block", pair),
                     ("mlp.ar all-reduce mb0 L3.block", pair), ("attn.ar all-reduce mb0 L3.block", four)]
    simulate(graph, SimOptions())


def test_a_stage_on_tp_4_with_its_attention_whole() -> None:
    """Stage 1 (tp 4) runs its attention whole on each tp rank (no attention splits written for blocks 2-3):
    its blocks hold the whole attention and pay only the MLP's all-reduce pair; the HFU counts the repeated
    attention (stage_repeated_flops: stage 1's repeated FLOPs, scaled to the job's tp 2 and micro-batch 1)."""
    job = _job()
    tree = _second_stage_on(job, tp=4).split("embedding.tokens", "compute", "reduce", 2, axis="tp")
    tree = _tp_splits(_tp_splits(tree, "0-1", ATTN + MLP, 2), "2-3", MLP, 4)
    tree = tree.split("head.proj", "compute", "out", 4, axis="tp").split("head.loss", "compute", "out", 4, axis="tp")
    plan = tree.lower(job.parallel)
    assert {s.config for s in plan.mesh_splits if s.layer in (3, 4) and ".attn." in s.module_path} == {
        OpConfig(1, 1, 1, 1)}
    graph = compile_job(job, plan, Pricer(Calibration()), "op")
    names = [t.name for t in graph.tasks if t.device == 1 and t.category == "tp_comm" and t.micro_batch == 0
             and t.layer == "L3.block"]
    assert names == ["mlp.ar all-reduce mb0 L3.block", "mlp.ar all-reduce mb0 L3.block"]
    mesh_job = job_of_mesh(job, StageMesh(1, 4, 1, 2))
    whole = next(layer for layer in graph_for(job_of_mesh(job, StageMesh(1, 1, 4, 1))).layers
                 if layer.kind == "block")  # (the tp 1 block at micro-batch 1, the whole attention)
    quarter = next(layer for layer in graph_for(mesh_job).layers if layer.kind == "block")
    attn = [op for op in whole.fwd + whole.bwd if ".attn." in op.module_path]
    split = [op for op in quarter.fwd + quarter.bwd if ".attn." in op.module_path]
    per_device = sum(op.flops for op in attn) * 2 - sum(op.flops for op in split)  # micro-batch 2, tp 4
    # two blocks on stage 1, 4 tp ranks of micro-batch 2 against the job's 2 of micro-batch 1
    assert stage_repeated_flops(job, plan) == pytest.approx(2 * per_device * 4 * 1 / (2 * 2), rel=1e-12)
    assert stage_repeated_flops(job, _second_stage_on(job, tp=4).lower(job.parallel)) == 0.0


def test_a_config_is_checked_against_its_own_stages_tp() -> None:
    """out=4 on a stage-0 op (tp 2) and out=3 on a stage-1 op (tp 4) are refused, naming the stage's tp; a tp
    split on a stage of tp 1 splits nothing."""
    job = _job()
    base = _stage_configs(_second_stage_on(job, tp=4), 2, 4, 2)
    with pytest.raises(ConfigError, match=r"over tp=2: fc1 splits out=2") as error:
        base.split("blocks.0.mlp.fc1", "compute", "out", 4, axis="tp", override=True).lower(job.parallel)
    assert "tp=4" not in str(error.value)
    with pytest.raises(ConfigError, match=r"over tp=4: fc1 splits out=4 .* own mesh: tp=4 dp=1"):
        base.split("blocks.2.mlp.fc1", "compute", "out", 3, axis="tp", override=True).lower(job.parallel)
    two = _job(micro_batch=2, global_batch=32)
    on_tp1 = _tp_splits(_second_stage_on(two, tp=1), "2", [("mlp.fc1", "out")], 2)
    with pytest.raises(ConfigError, match=r"tp does not split this layer \(tp=1 .*own mesh: tp=1 dp=4"):
        on_tp1.lower(two.parallel)


def _dp_split_tree(job: Job, **mesh: int) -> StrategyTree:
    return _second_stage_on(job, **mesh).split("blocks.2.mlp.fc1", "compute", "out", 4)


def test_a_computation_config_over_a_stages_own_dp() -> None:
    """Stage 1 on tp 1 x dp 4 (micro-batch 1) splits blocks.2's fc1 4 ways over its 4 data-parallel ranks: its
    tasks are those of the tp 1 x dp 4 job with that split (the all-gather before fc1, fc1 at a quarter of its
    outputs, ...); stage 0 keeps the plain job's. The same split on a stage of dp 2 is refused against 2 ranks."""
    job = _job(micro_batch=2, global_batch=32)
    plan = _dp_split_tree(job, tp=1, dp=4).lower(job.parallel)
    assert [(s.layer, s.out) for s in plan.op_splits] == [(3, 4)]
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer, "op")
    plain = compile_job(job, default_plan(graph_for(job), job.parallel), pricer, "op")
    mesh_job = job_of_mesh(job, StageMesh(1, 1, 4, 1))
    alone_tree = (StrategyTree.from_graph(graph_for(mesh_job)).map("", {"stage": 0})
                  .map("blocks.2-3", {"stage": 1}).map("head", {"stage": 1})
                  .split("blocks.2.mlp.fc1", "compute", "out", 4))
    alone = compile_job(mesh_job, alone_tree.lower(mesh_job.parallel), pricer, "op")
    assert _stage(graph, 0, pp=False) == _stage(plain, 0, pp=False)
    assert _stage(graph, 1, pp=False) == _stage(alone, 1, pp=False)
    assert any(t.device == 1 and "x4" in t.name and "fc1" in t.name for t in graph.tasks)
    simulate(graph, SimOptions())
    with pytest.raises(ConfigError, match="divide the data-parallel group of 2 ranks"):
        compile_job(job, _second_stage_on(job, tp=4).split("blocks.0.mlp.fc1", "compute", "out", 4)
                    .lower(job.parallel), pricer, "op")


# --- stages of their own device counts (Alpa's submeshes: a stage's devices are a contiguous block of ranks) ---


def _sized_job(num_gpus: int, **strategy: object) -> Job:
    """tp 1, pp 2 on `num_gpus` A100s (8 per node): micro-batch 3 per replica, 4 micro-batches."""
    par = ParallelSpec.parse({"micro_batch": 3, "seq_len": 1024, "tp": 1, "pp": 2, **strategy})
    return make_job(FOUR_BLOCKS, a100_cluster(num_gpus), par)


def _sized_stages(job: Job, first: dict[str, int], second: dict[str, int]) -> StrategyTree:
    """Stage 0 (embedding, blocks 0-1) on mesh `first` (set on the root), stage 1 (blocks 2-3, head) on `second`."""
    return (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0, **first})
            .map("blocks.2-3", {"stage": 1, **second}).map("head", {"stage": 1, **second}))


def _plain_stage(job: Job, stage: int, pricer: Pricer, **mesh: int) -> list[tuple[str, str, float]]:
    """The tasks of `stage` (pipeline transfers aside) in the plain job of that mesh at pp 2 (its own cluster of
    tp x dp x 2 GPUs on one node), 4 micro-batches of the same 6 samples."""
    par = job.parallel.replaced(**mesh, micro_batch=6 // mesh["dp"])
    plain = make_job(FOUR_BLOCKS, a100_cluster(2 * par.tp * par.dp), par)
    return _stage(compile_job(plain, default_plan(graph_for(plain), plain.parallel), pricer), stage, pp=False)


def test_stages_of_one_and_three_devices_compile_as_the_jobs_of_their_meshes() -> None:
    """4 A100s, pp 2 (the job's 2 GPUs per stage, dp 2 x micro-batch 3 = 6 samples per micro-batch): stage 0 on 1
    device (dp 1, micro-batch 6), stage 1 on 3 (dp 3, micro-batch 2), ranks 0 and 1-3. Each stage's tasks are
    those of the plain pp 2 job of its mesh; stage 1 syncs its gradients over its 3 replicas, stage 0 not at all;
    each device stands for its own ranks; the transfer is priced on both sides' volumes (the longer)."""
    job = _sized_job(4, global_batch=24)
    plan = _sized_stages(job, {"dp": 1}, {"dp": 3}).lower(job.parallel)
    assert plan.stage_meshes == (StageMesh(0, 1, 1, 6), StageMesh(1, 1, 3, 2))
    assert plan.stage_ranks == (1, 3)
    assert (plan.stage_block(0), plan.stage_block(1)) == ((0, 1), (1, 3))
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    assert [d.ranks for d in graph.devices] == [1, 3]
    assert _stage(graph, 0, pp=False) == _plain_stage(job, 0, pricer, dp=1)
    assert _stage(graph, 1, pp=False) == _plain_stage(job, 1, pricer, dp=3)
    assert not any(t.device == 0 and t.category == "dp_comm" for t in graph.tasks)
    assert any(t.device == 1 and t.category == "dp_comm" for t in graph.tasks)
    # the boundary: 6 x 1024 x 1024 bf16 on stage 0's side, 2 x 1024 x 1024 on stage 1's; ranks 0 and 3 of one node
    pair = job.cluster.ranks_layout([0, 3])
    assert (pair.num_nodes, pair.size) == (1, 2)
    one = {mb: pricer.pipeline_hop_s(mb * 1024 * 1024 * BF16, job_of_mesh(job, StageMesh(0, 1, 1, mb), (0, 1)),
                                     pair) for mb in (6, 2)}
    sends = [t for t in graph.tasks if t.category == "pp_comm" and t.stream == "feature"]
    assert sends and all(t.duration_s == max(one.values()) == one[6] for t in sends)
    assert simulate(graph, SimOptions()).makespan_s > 0.0


def test_a_stage_on_the_jobs_mesh_at_another_block_of_ranks() -> None:
    """6 A100s at pp 3 (2 GPUs per stage): stages of 1, 2 and 3 devices. Stage 1 keeps the job's mesh (dp 2) at
    ranks 1-2 instead of 2-3 (set on it: the root's dp 1 is stage 0's): its tasks are those of the same layers on
    the plain job's stage 1 (one node: the same layouts)."""
    par = ParallelSpec.parse({"micro_batch": 3, "seq_len": 1024, "tp": 1, "pp": 3, "global_batch": 24})
    job = make_job(FOUR_BLOCKS, a100_cluster(6), par)
    tree = (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0, "dp": 1})
            .map("blocks.1-2", {"stage": 1, "dp": 2}).map("blocks.3", {"stage": 2, "dp": 3})
            .map("head", {"stage": 2, "dp": 3}))
    plan = tree.lower(job.parallel)
    assert plan.stage_ranks == (1, 2, 3)
    assert [m.stage for m in plan.stage_meshes] == [0, 2]
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    same_layers = (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0}).map("blocks.1-2", {"stage": 1})
                   .map("blocks.3", {"stage": 2}).map("head", {"stage": 2}))  # the job's mesh on every stage
    plain = compile_job(job, same_layers.lower(job.parallel), pricer)
    assert [d.ranks for d in graph.devices] == [1, 2, 3]
    assert _stage(graph, 1, pp=False) == _stage(plain, 1, pp=False)
    assert simulate(graph, SimOptions()).makespan_s > 0.0


def test_a_stage_across_a_node_boundary_pays_the_inter_node_link() -> None:
    """16 A100s on 2 nodes, pp 2: stage 0 on ranks 0-3 (dp 4), stage 1 on ranks 4-15 (dp 12: 4 on node 0, 8 on node
    1). Stage 1's gradient all-reduce runs over 12 ranks on 2 nodes at the narrower node's 4 (its NICs);
    stage 0's inside node 0; the transfer between them (ranks 0 and 15) crosses the nodes."""
    job = _sized_job(16, global_batch=96)
    plan = _sized_stages(job, {"dp": 4}, {"dp": 12}).lower(job.parallel)
    assert plan.stage_ranks == (4, 12)
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    cluster = job.cluster
    across = cluster.ranks_layout(range(4, 16))
    assert (across.size, across.num_nodes, across.ranks_per_node) == (12, 2, 4)
    inside = cluster.ranks_layout(range(4))
    # the two stages' buckets: one each here (the whole gradient of their layers), all-reduced
    stage_params = {s: sum(a.layer.param_count for a in plan.layers if a.stage == s) for s in (0, 1)}
    grads = {t.device: t for t in graph.tasks if t.category == "dp_comm"}
    assert len([t for t in graph.tasks if t.category == "dp_comm"]) == 2
    for stage, layout in ((0, inside), (1, across)):
        sync = grads[stage]
        assert sync.name.startswith("dp all-reduce")
        assert sync.duration_s == pricer.collective_s("all-reduce", stage_params[stage] * BF16, layout, job)
    assert any(".nic" in link for link in grads[1].resources)
    assert not any(".nic" in link for link in grads[0].resources)
    hop = cluster.ranks_layout([0, 15])
    assert (hop.num_nodes, hop.ranks_per_node) == (2, 1)
    send = _by_name(graph, 0)["send act mb0 vs0->"]
    mesh_job = job_of_mesh(job, StageMesh(0, 1, 4, 6), (0, 4))
    assert send.duration_s == pricer.pipeline_hop_s(6 * 1024 * 1024 * BF16, mesh_job, hop)
    assert any(".nic" in link for link in send.resources)


def test_the_same_stages_on_equal_blocks_compile_as_today() -> None:
    """Stage meshes that keep the job's devices per stage carry no stage_ranks: the plan and its graph are as
    before this change (the tests above this section hold them)."""
    job = _sized_job(4, global_batch=24)
    plan = _sized_stages(job, {"dp": 2}, {"dp": 2}).lower(job.parallel)
    assert (plan.stage_meshes, plan.stage_ranks) == ((), ())


def test_the_memory_of_each_stage_is_its_own_meshs() -> None:
    """Peak memory per stage device: stage 0 on 1 device at micro-batch 6 holds what the plain dp 1 job's stage 0
    holds, stage 1 what the dp 3 job's stage 1 holds; the OOM verdict is per device."""
    job = _sized_job(4, global_batch=24)
    pricer = Pricer(Calibration())
    outcome = simulate(compile_job(job, _sized_stages(job, {"dp": 1}, {"dp": 3}).lower(job.parallel), pricer),
                       SimOptions())
    for stage, dp in ((0, 1), (1, 3)):
        par = job.parallel.replaced(dp=dp, micro_batch=6 // dp)
        plain = make_job(FOUR_BLOCKS, a100_cluster(2 * dp), par)
        alone = simulate(compile_job(plain, default_plan(graph_for(plain), plain.parallel), pricer), SimOptions())
        assert outcome.memory[stage].peak_bytes == alone.memory[stage].peak_bytes
        assert outcome.memory[stage].oom == alone.memory[stage].oom is False


@pytest.mark.parametrize(("first", "second", "micro_batch", "says"), [
    ({"dp": 1}, {"dp": 2}, 3, "map.dp=1 is invalid: embedding: stage 0 on tp x dp x cp = 1 x 1 x 1 = 1 devices, and "
     "the stages' devices 1 + 2 = 3 must sum to the job's 4 GPUs"),
    ({"dp": 2}, {"dp": 4}, 3, "map.dp=4 is invalid: blocks.2: stage 1 on tp x dp x cp = 1 x 4 x 1 = 4 devices, and "
     "the stages' devices 2 + 4 = 6 must sum to the job's 4 GPUs"),
    ({"dp": 1}, {"dp": 3}, 2, "map.dp=3 is invalid: blocks.2: the job's micro-batch x dp = 2 x 2 samples must "
     "split evenly over dp=3 replicas"),
    ({"dp": 1}, {"tp": 3}, 3, "map.tp=3 is invalid: blocks.2: tp x cp = 3 x 1 must divide the job's 2 devices"),
])
def test_stage_sizes_that_do_not_fill_the_job_are_refused(first: dict[str, int], second: dict[str, int],
                                                         micro_batch: int, says: str) -> None:
    """The stages' devices must sum to the job's GPUs (a stage not mapped, or mapped by tp alone, holds the job's
    per stage); the job's samples per micro-batch must split over each stage's replicas."""
    job = _sized_job(4, micro_batch=micro_batch, global_batch=24)
    with pytest.raises(ConfigError) as error:
        _sized_stages(job, first, second).lower(job.parallel)
    assert str(error.value).startswith(says)


def test_a_stages_tp_from_another_stage_does_not_resize_it() -> None:
    """The root's dp 1 sizes stage 0 although stage 1's tp 1 reaches stage 0's layers along data dependencies."""
    job = _sized_job(4, global_batch=24)
    assert _sized_stages(job, {"dp": 1}, {"dp": 3, "tp": 1}).lower(job.parallel).stage_ranks == (1, 3)


def test_a_stage_of_its_own_size_keeps_its_dp_off_the_stages_before_it() -> None:
    """Stage 1's dp 3 does not reach stage 0 along data dependencies (stage 0 takes the job's mesh)."""
    job = _sized_job(6, pp=3, global_batch=24)
    tree = (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0})
            .map("blocks.1-2", {"stage": 1, "dp": 1}).map("blocks.3", {"stage": 2, "dp": 3})
            .map("head", {"stage": 2}))
    plan = tree.lower(job.parallel)
    assert plan.stage_ranks == (2, 1, 3)


def test_a_stage_of_three_devices_at_tp_3() -> None:
    """A 12-head GPT (hidden 768, vocabulary 32,004 = 3 x 10,668) on 4 A100s, pp 2 at dp 2 x micro-batch 1: stage 0
    on rank 0 (tp 1, dp 1: micro-batch 2), stage 1 on ranks 1-3 at tp 3 (dp 1, micro-batch 2). Stage 1's tasks are
    those of the plain tp 3 x pp 2 job's stage 1; its attention and MLP all-reduces move 2 x 1024 x 768 bf16 over
    the 3 GPUs of one node."""
    model = parse_model({"name": "twelve-head-gpt", "num_layers": 4, "hidden": 768, "ffn_hidden": 3072,
                         "num_heads": 12, "vocab": 32004, "max_seq_len": 1024})
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, "tp": 1, "pp": 2, "global_batch": 8})
    job = make_job(model, a100_cluster(4), par)
    tree = (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0, "tp": 1, "dp": 1})
            .map("blocks.2-3", {"stage": 1, "tp": 3, "dp": 1}).map("head", {"stage": 1, "tp": 3, "dp": 1}))
    plan = tree.lower(job.parallel)
    assert (plan.stage_meshes, plan.stage_ranks) == ((StageMesh(0, 1, 1, 2), StageMesh(1, 3, 1, 2)), (1, 3))
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer, "op")
    plain = make_job(model, a100_cluster(6), par.replaced(tp=3, dp=1, micro_batch=2))
    alone = compile_job(plain, default_plan(graph_for(plain), plain.parallel), pricer, "op")
    assert _stage(graph, 1, pp=False) == _stage(alone, 1, pp=False)
    mesh_job = job_of_mesh(job, plan.stage_meshes[1], (1, 3))
    all_reduce = pricer.collective_s("all-reduce", 2 * 1024 * 768 * BF16, job.cluster.ranks_layout([1, 2, 3]),
                                     mesh_job)
    block = [(t.name, t.duration_s) for t in graph.tasks if t.device == 1 and t.category == "tp_comm"
             and t.micro_batch == 0 and t.layer == "L3.block"]
    assert block == [(f"{site}.ar all-reduce mb0 L3.block", all_reduce) for site in ("attn", "mlp", "mlp", "attn")]
