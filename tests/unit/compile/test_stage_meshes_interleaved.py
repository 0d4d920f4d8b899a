"""A stage on its own mesh under interleaved 1F1B (Proteus Sec. IV-B, a subtree on its own mesh; Megatron-LM's
virtual pipeline: chunk c of pipeline rank r is virtual stage c x pp + r). The mesh given to a pipeline rank holds
every model chunk of that rank (compile/stage_meshes.py, strategy/tree.py StrategyTree._stage_meshes)."""

import re

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.stage_meshes import job_of_mesh
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.sim import SimOptions, SimOutcome, simulate
from trainsim.strategy.lowered import LoweredPlan, StageMesh
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

FOUR_BLOCKS = parse_model({"name": "four-block-gpt", "num_layers": 4, "hidden": 1024, "ffn_hidden": 4096,
                           "num_heads": 16, "vocab": 32000, "max_seq_len": 1024})
BF16 = 2
TOKENS = 1024 * 1024  # one sample's block output: 1024 tokens x hidden 1024


def _job(num_gpus: int = 8, **strategy: object) -> Job:
    """tp 2 x dp 2 per stage, pp 2 x vpp 2 (interleaved 1F1B) on A100s: 8 micro-batches of 1 x 1024 tokens per
    replica."""
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, "tp": 2, "dp": 2, "pp": 2, "vpp": 2,
                              "schedule": "interleaved-1f1b", "global_batch": 16, **strategy})
    return make_job(FOUR_BLOCKS, a100_cluster(num_gpus), par)


def _chunks(job: Job, first: dict[str, int], second: dict[str, int]) -> StrategyTree:
    """Pipeline rank 0 (chunk 0: embedding, block 0; chunk 1: block 2) on mesh `first`, rank 1 (chunk 0: block 1;
    chunk 1: block 3, head) on `second`; each chunk's layers carry their rank's mesh."""
    return (StrategyTree.from_graph(graph_for(job)).map("", {"stage": 0, "chunk": 0, **first})
            .map("blocks.1", {"stage": 1, "chunk": 0, **second}).map("blocks.2", {"stage": 0, "chunk": 1, **first})
            .map("blocks.3", {"stage": 1, "chunk": 1, **second}).map("head", {"stage": 1, "chunk": 1, **second}))


def _plans(job: Job, mesh_job: Job) -> tuple[LoweredPlan, LoweredPlan, LoweredPlan]:
    """Rank 1 on tp 4 (the plan under test); the same chunks all on the job's mesh (plain); all on rank 1's mesh,
    as the job of that mesh (mesh)."""
    return (_chunks(job, {"tp": 2}, {"tp": 4}).lower(job.parallel),
            _chunks(job, {"tp": 2}, {"tp": 2}).lower(job.parallel),
            _chunks(mesh_job, {"tp": 4}, {"tp": 4}).lower(mesh_job.parallel))


def _stage(graph: ExecGraph, stage: int) -> list[tuple[str, str, float]]:
    """A stage's tasks, the pipeline transfers aside."""
    return [(t.name, t.stream, t.duration_s) for t in graph.tasks if t.device == stage and t.category != "pp_comm"]


def _order(graph: ExecGraph, outcome: SimOutcome, stage: int) -> list[tuple[str, int, str]]:
    """The steps a stage's compute stream runs, in the order the simulator starts them: (phase, micro-batch,
    layer), one entry per run of consecutive tasks of one step."""
    tasks = sorted((t for t in graph.tasks if t.device == stage and t.stream == "compute"),
                   key=lambda t: (outcome.start_s[t.tid], t.tid))
    out: list[tuple[str, int, str]] = []
    for t in tasks:
        step = (t.phase, t.micro_batch, t.layer)
        if not out or out[-1] != step:
            out.append(step)
    return out


def test_a_ranks_mesh_holds_both_its_chunks() -> None:
    """Rank 1 at tp 4 keeps its 4 devices (dp 1, micro-batch 2) for both its chunks."""
    job = _job()
    plan, plain, _ = _plans(job, job_of_mesh(job, StageMesh(1, 4, 1, 2)))
    assert plan.stage_meshes == (StageMesh(stage=1, tp=4, dp=1, micro_batch=2),)
    assert plain.stage_meshes == ()
    assert [(a.stage, a.chunk) for a in plan.layers] == [(0, 0), (0, 0), (1, 0), (0, 1), (1, 1), (1, 1)]


def test_interleaved_stages_compile_on_their_meshes_and_cross_meshes_as_at_vpp_1() -> None:
    """Rank 0's tasks are the plain interleaved job's, rank 1's those of the tp 4 x dp 1 interleaved job (micro-batch
    2). Every pipeline transfer, at each of the three chunk boundaries that cross the two meshes (vs0: rank 0 ->
    1, vs1: rank 1 -> rank 0's second chunk, vs2: rank 0 -> 1) and in both directions (activation and gradient),
    lasts the longer of the two sides' hops, as at vpp 1: 1 x 1024 x 1024 bf16 on the tp 2 side, 2 x 1024 x 1024 on
    the tp 4 side."""
    job = _job()
    mesh_job = job_of_mesh(job, StageMesh(1, 4, 1, 2))
    plan, plain_plan, mesh_plan = _plans(job, mesh_job)
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer, "op")
    plain = compile_job(job, plain_plan, pricer, "op")
    mesh = compile_job(mesh_job, mesh_plan, pricer, "op")
    assert _stage(graph, 0) == _stage(plain, 0)
    assert _stage(graph, 1) == _stage(mesh, 1)
    assert _stage(graph, 1) != _stage(plain, 1)
    own = pricer.pipeline_hop_s(TOKENS * BF16, job)  # the tp 2 side's price alone: shorter
    hop = pricer.pipeline_hop_s(2 * TOKENS * BF16, mesh_job)
    assert own < hop
    transfers = [t for t in graph.tasks if t.category == "pp_comm" and t.stream == "feature"]
    assert all(t.duration_s == hop for t in transfers)
    crossings = {(t.device, int(match[1])) for t in transfers if (match := re.search(r"\bvs(\d+)", t.name))}
    assert crossings == {(device, boundary) for device in (0, 1) for boundary in range(3)}
    sends = {t.name.split()[1] + t.name.split()[3] for t in transfers if t.name.startswith("send")}
    assert {"actvs0->", "gradvs0<-", "actvs1->", "gradvs1<-", "actvs2->", "gradvs2<-"} <= sends


def test_the_interleaved_order_and_each_ranks_memory_are_its_meshs() -> None:
    """Simulated: each rank runs the interleaved schedule's steps in the plain job's order (and rank 1 in the tp 4
    job's); rank 0's peak memory is the plain interleaved job's rank 0's, rank 1's the tp 4 x dp 1 interleaved
    job's rank 1's."""
    job = _job()
    mesh_job = job_of_mesh(job, StageMesh(1, 4, 1, 2))
    plan, plain_plan, mesh_plan = _plans(job, mesh_job)
    pricer = Pricer(Calibration())
    graphs = [compile_job(j, p, pricer) for j, p in ((job, plan), (job, plain_plan), (mesh_job, mesh_plan))]
    outcomes = [simulate(g, SimOptions()) for g in graphs]
    (graph, plain, mesh), (outcome, plain_out, mesh_out) = graphs, outcomes
    for stage in (0, 1):
        assert _order(graph, outcome, stage) == _order(plain, plain_out, stage)
    assert _order(graph, outcome, 1) == _order(mesh, mesh_out, 1)
    assert _order(graph, outcome, 0)[:4] == [("fwd", 0, "L0.embedding"), ("fwd", 0, "L1.block"),
                                             ("fwd", 1, "L0.embedding"), ("fwd", 1, "L1.block")]
    assert outcome.memory[0].peak_bytes == plain_out.memory[0].peak_bytes
    assert outcome.memory[1].peak_bytes == mesh_out.memory[1].peak_bytes
    assert outcome.memory[1].peak_bytes != plain_out.memory[1].peak_bytes


def test_rank_meshes_of_their_own_sizes_cross_at_the_farthest_pair_at_every_chunk_boundary() -> None:
    """16 A100s (2 nodes) at tp 1, pp 2 x vpp 2: rank 0 on ranks 0-3 (dp 4), rank 1 on ranks 4-15 (dp 12). Every
    chunk boundary, rank 1 -> rank 0's second chunk (vs1) as well, crosses the nodes over ranks 0 and 15."""
    job = _job(16, tp=1, dp=8, micro_batch=3, global_batch=96)
    plan = _chunks(job, {"dp": 4}, {"dp": 12}).lower(job.parallel)
    assert plan.stage_ranks == (4, 12)
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    hop = job.cluster.ranks_layout([0, 15])
    assert hop.num_nodes == 2
    mesh_job = job_of_mesh(job, StageMesh(0, 1, 4, 6), (0, 4))
    longer = pricer.pipeline_hop_s(6 * TOKENS * BF16, mesh_job, hop)  # rank 0's 6 samples against rank 1's 2
    transfers = [t for t in graph.tasks if t.category == "pp_comm" and t.stream == "feature"]
    assert {word[:3] for t in transfers for word in t.name.split() if word.startswith("vs")} == {"vs0", "vs1", "vs2"}
    assert all(t.duration_s == longer and any(".nic" in link for link in t.resources) for t in transfers)
    assert [d.ranks for d in graph.devices] == [4, 12]
    assert simulate(graph, SimOptions()).makespan_s > 0.0  # runs to the end on the placed links


def _by_layer(graph: ExecGraph, stage: int) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for t in graph.tasks:
        if t.device == stage and t.category != "pp_comm":
            out.setdefault(t.layer, []).append((t.name, t.duration_s))
    return out


def test_a_chunk_entered_from_another_mesh_starts_its_dp_placements_afresh() -> None:
    """Rank 1 on tp 1 x dp 4 (micro-batch 1 of the job's 2 x 2 samples) splits its chunk 0's fc1 (block 1) over
    pairs of its data-parallel ranks, which leaves each pair holding both its samples. Its chunk 1 (block 3,
    head) is entered across the cross-mesh transfer from rank 0, which hands each replica its own sample: its
    tasks are those of the same tree without the split (in rank 1's compilation the chain would otherwise carry
    the pair's gathered batch through rank 0's chunk into it)."""
    job = _job(micro_batch=2, global_batch=32)
    pricer = Pricer(Calibration())
    bare = _chunks(job, {"tp": 2}, {"tp": 1, "dp": 4})
    split = bare.split("blocks.1.mlp.fc1", "compute", "out", 2)
    graphs = [_by_layer(compile_job(job, tree.lower(job.parallel), pricer, "op"), 1) for tree in (bare, split)]
    assert graphs[0]["L2.block"] != graphs[1]["L2.block"]  # block 1, where the split is
    for layer in ("L4.block", "L5.head"):
        assert graphs[0][layer] == graphs[1][layer]


def test_two_chunks_of_one_rank_on_two_meshes_are_refused() -> None:
    """Rank 1's chunk 0 at tp 4 and its chunk 1 at the job's tp 2: one line naming both chunks."""
    job = _job()
    tree = _chunks(job, {"tp": 2}, {"tp": 4}).map("blocks.3", {"tp": 2}, override=True)
    with pytest.raises(ConfigError) as error:
        tree.lower(job.parallel)
    assert str(error.value) == (
        "map.tp=2 is invalid: blocks.3 (chunk 1) runs tp=2 dp=2 but blocks.1 (chunk 0) on the same pipeline rank 1 "
        "runs tp=4 dp=1; a stage's mesh holds every model chunk of that rank: give its chunks one mesh")
    assert "\n" not in str(error.value)
