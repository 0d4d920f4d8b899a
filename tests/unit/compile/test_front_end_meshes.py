"""Pipeline stages on their own meshes over the torch front-end's captured graph (compile.front_end_meshes,
compile.stage_meshes.with_captures): a tiny Hugging Face GPT-2 (2 blocks, hidden 64, 4 heads, ffn 256, vocab 512,
32 tokens, bf16) on 4 A100s of one node, tp 2 x pp 2 at micro-batch 2, 4 micro-batches. Stage 0 (the embedding,
block 0) runs on its 2 devices as tp 1 x dp 2 (each replica 1 sample: the model captured again at micro-batch 1),
stage 1 (block 1, the head) on the job's tp 2 with Megatron's splits written on the captured ops.

Hand figures: the hidden state of a micro-batch of m samples is m x 32 x 64 x 2 bytes (4096 at m = 1, 8192 at 2);
the head's vocab-parallel loss all-reduces three fp32 statistics of 64 tokens (256 bytes each).
"""

from collections import Counter
from typing import Any

import pytest
from tiny_hf import GPT2, LLAMA

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.hf_config import model_from_hf_config
from trainsim.compile.build import compile_job
from trainsim.compile.stage_meshes import job_of_mesh, with_captures
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for, predict
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.lowered import LoweredPlan, StageMesh, default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

pytest.importorskip("torch")
pytest.importorskip("transformers")

BF16 = 2
TOKENS = 32 * 64  # a sample's hidden state, in elements
# Megatron's splits on block 1 and the head of the captured GPT-2 (the head vocab parallel, ln_f whole)
GPT2_STAGE1 = [("blocks.1.*.attn.c_attn", "out", 2), ("blocks.1.*.attn.c_proj", "reduce", 2),
               ("blocks.1.*.mlp.c_fc", "out", 2), ("blocks.1.*.mlp.c_proj", "reduce", 2), ("head", "out", 2),
               ("head.transformer.ln_f", "out", 1)]
LLAMA_STAGE1 = [("blocks.1.*.self_attn", "out", 2), ("blocks.1.*.self_attn.o_proj", "out", 1),
                ("blocks.1.*.self_attn.o_proj", "reduce", 2), ("blocks.1.*.mlp", "out", 2),
                ("blocks.1.*.mlp.down_proj", "out", 1), ("blocks.1.*.mlp.down_proj", "reduce", 2),
                ("head", "out", 2), ("head.model.norm", "out", 1)]


def _capture(config: dict[str, Any]) -> Any:
    """job -> the model captured at the job's micro-batch (as the torch front-end traces it)."""
    from trainsim.frontends.torch.hf import graph_from_hf_config

    cache: dict[int, OpGraph] = {}

    def capture(job: Job) -> OpGraph:
        micro_batch = job.parallel.micro_batch
        if micro_batch not in cache:
            cache[micro_batch] = graph_from_hf_config(config, micro_batch=micro_batch, seq_len=32, precision="bf16",
                                                      fused=True)
        return cache[micro_batch]

    return capture


@pytest.fixture(scope="module")
def gpt2() -> Any:
    return _capture(GPT2)


def _job(config: dict[str, Any] = GPT2, num_gpus: int = 4, **strategy: object) -> Job:
    spec = model_from_hf_config(config, name=f"{config['model_type']}-tiny")
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 8, "tp": 2, "pp": 2,
                              "precision": "bf16", **strategy})
    return make_job(spec, a100_cluster(num_gpus), par)


def _meshes(graph: OpGraph, splits: list[tuple[str, str, int]] = GPT2_STAGE1) -> StrategyTree:
    """Stage 0 (embedding, block 0) on tp 1 (set on the root), stage 1 (block 1, head) on tp 2, with `splits`."""
    tree = (StrategyTree.from_graph(graph).map("", {"stage": 0, "tp": 1}).map("blocks.1", {"stage": 1, "tp": 2})
            .map("head", {"stage": 1, "tp": 2}))
    for path, dim, parts in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree


def _one_mesh(graph: OpGraph) -> StrategyTree:
    """The job's one mesh (tp 2) on both stages, the default placement, stage 1's splits on both blocks."""
    tree = (StrategyTree.from_graph(graph).map("", {"stage": 0}).map("blocks.1", {"stage": 1})
            .map("head", {"stage": 1}))
    for path, dim, parts in GPT2_STAGE1:
        tree = tree.split(path.replace("blocks.1", "blocks.*"), "compute", dim, parts, axis="tp")
    return tree


def _plan(job: Job, capture: Any, splits: list[tuple[str, str, int]] = GPT2_STAGE1) -> LoweredPlan:
    return with_captures(job, _meshes(capture(job), splits).lower(job.parallel), capture)


def _stage(graph: ExecGraph, stage: int, *, pp: bool = True) -> list[tuple[str, str, float]]:
    return [(t.name, t.stream, t.duration_s) for t in graph.tasks
            if t.device == stage and (pp or t.category != "pp_comm")]


def _comms(graph: ExecGraph, stage: int, category: str) -> list[tuple[str, float]]:
    """A stage's communication tasks of `category`: (name without its layer, duration)."""
    return [(t.name.rpartition(" L")[0] or t.name, t.duration_s) for t in graph.tasks
            if t.device == stage and t.category == category]


def test_a_stage_of_its_own_micro_batch_is_captured_again(gpt2: Any) -> None:
    """Stage 0 at tp 1 keeps its 2 devices as 2 replicas of 1 sample each; the plan carries the model captured at
    1 sample (every op's batch halved) beside the job's capture at 2."""
    job = _job()
    plan = _plan(job, gpt2)
    assert plan.stage_meshes == (StageMesh(stage=0, tp=1, dp=2, micro_batch=1),)
    assert [a.stage for a in plan.layers] == [0, 0, 1, 1]
    assert [mb for mb, _ in plan.captured] == [1, 2]
    one, two = (dict(plan.captured)[mb][1] for mb in (1, 2))
    assert next(op.shape for op in one.fwd if op.kind == "matmul") == (1, 32, 192, 64)  # qkv of 32 tokens
    assert next(op.shape for op in two.fwd if op.kind == "matmul") == (1, 64, 192, 64)
    assert all(op.flops * 2 == theirs.flops for op, theirs in zip(one.fwd, two.fwd, strict=True))


def test_each_stage_compiles_as_the_captured_job_of_its_mesh(gpt2: Any) -> None:
    """Stage 0's tasks are those of the captured tp 1 x dp 2 job at micro-batch 1 (no tp collective, its gradients
    synced over its 2 replicas); stage 1's those of the captured tp 2 job split by the same tree (its attention's
    and MLP's all-reduces of the 8192-byte hidden state over the tp pair, the head's logits.ar and three 256-byte
    loss statistics; dp 1: no gradient sync). Every pipeline transfer is the longer of the two sides' hops: the
    4096-byte sample of a tp 1 replica, the 8192-byte micro-batch on the tp 2 side."""
    job = _job()
    pricer = Pricer(Calibration())
    graph = compile_job(job, _plan(job, gpt2), pricer, "op")
    mesh_job = job_of_mesh(job, StageMesh(0, 1, 2, 1))
    alone = compile_job(mesh_job, default_plan(gpt2(mesh_job), mesh_job.parallel), pricer, "op")
    split = compile_job(job, _one_mesh(gpt2(job)).lower(job.parallel), pricer, "op")
    assert _stage(graph, 0, pp=False) == _stage(alone, 0, pp=False) != []  # != []: a stage's tasks were compared
    assert _stage(graph, 1, pp=False) == _stage(split, 1, pp=False) != []
    pair = job.cluster.group_layout(2, 1)
    hidden = pricer.collective_s("all-reduce", 2 * TOKENS * BF16, pair, job)
    statistic = pricer.collective_s("all-reduce", 64 * 4, pair, job)
    forward = [(f"{name} all-reduce mb0", seconds) for name, seconds in (
        ("attn.ar", hidden), ("mlp.ar", hidden), ("loss.max", statistic), ("loss.target", statistic),
        ("loss.sum_exp", statistic), ("logits.ar", hidden))]
    assert _comms(graph, 1, "tp_comm")[:6] == forward
    assert len(_comms(graph, 1, "tp_comm")) == 4 * 8  # per micro-batch: 6 forward, 2 backward (attn.ar, mlp.ar)
    assert _comms(graph, 0, "tp_comm") == []
    assert _comms(graph, 0, "dp_comm") and not _comms(graph, 1, "dp_comm")
    hop = max(pricer.pipeline_hop_s(TOKENS * BF16, mesh_job), pricer.pipeline_hop_s(2 * TOKENS * BF16, job))
    sends = [t for t in graph.tasks if t.category == "pp_comm" and t.stream == "feature"]
    assert hop == pricer.pipeline_hop_s(2 * TOKENS * BF16, job) and sends
    assert all(t.duration_s == hop for t in sends)
    assert simulate(graph, SimOptions()).makespan_s > 0.0  # runs to the end (no dangling dependency)


def _kinds(graph: OpGraph) -> dict[str, str]:
    """Op name (a catalog backward op's without its .dgrad/.wgrad/.bwd) -> its kind."""
    return {op.name: op.kind for layer in graph.layers for op in (*layer.fwd, *layer.bwd)}


def _compute(graph: ExecGraph, stage: int, kinds: dict[str, str], heavy: bool) -> Counter[float]:
    """A stage's compute tasks' durations, of matmuls and attention cores (heavy) or of the other ops."""
    out: Counter[float] = Counter()
    for t in graph.tasks:
        if t.device == stage and t.category == "compute" and t.micro_batch >= 0:
            kind = kinds.get(t.name.rpartition(" ")[2].split(".")[0], "")
            if (kind in ("matmul", "attention")) == heavy:
                out[t.duration_s] += 1
    return out


def test_the_catalog_path_on_the_same_meshes_pays_the_same_communication(gpt2: Any) -> None:
    """Differential, against the catalog GPT of the same shape on the same stage meshes (Megatron's splits over
    each stage's tp): every tp collective, pipeline transfer and gradient sync lasts the same (the names differ
    only by the captured layer's, L2.block.1 against L2.block), and every matmul and attention core too.
    Residuals, exact: the other ops (the capture's unfused dropouts, its mask, the head's fp32 copies against the
    catalog's analytic norms, adds and loss) cost per stage what they cost on the plain job of that stage's
    mesh, on either front-end; stage 1 holds 192 parameters more (the captured block keeps its two norms and
    fc2's and c_proj's biases whole; the catalog divides them by tp), so its optimizer step is longer."""
    job = _job()
    pricer = Pricer(Calibration())
    mine = compile_job(job, _plan(job, gpt2), pricer, "op")
    catalog_graph = graph_for(job)
    theirs = compile_job(job, _meshes(catalog_graph, []).lower(job.parallel), pricer, "op")
    for stage in (0, 1):
        for category in ("tp_comm", "pp_comm", "dp_comm"):
            assert _comms(mine, stage, category) == _comms(theirs, stage, category), (stage, category)
    torch_kinds, catalog_kinds = _kinds(gpt2(job)), _kinds(catalog_graph)
    mesh_job = job_of_mesh(job, StageMesh(0, 1, 2, 1))
    plain = {  # the plain jobs of each stage's mesh on either front-end: stage 0 on tp 1 x dp 2, stage 1 on tp 2
        "torch": (compile_job(mesh_job, default_plan(gpt2(mesh_job), mesh_job.parallel), pricer, "op"),
                  compile_job(job, _one_mesh(gpt2(job)).lower(job.parallel), pricer, "op")),
        "catalog": (compile_job(mesh_job, default_plan(graph_for(mesh_job), mesh_job.parallel), pricer, "op"),
                    compile_job(job, default_plan(catalog_graph, job.parallel), pricer, "op"))}
    for stage in (0, 1):
        assert _compute(mine, stage, torch_kinds, True) == _compute(theirs, stage, catalog_kinds, True)
        residual = (sum(_compute(mine, stage, torch_kinds, False).elements())
                    - sum(_compute(theirs, stage, catalog_kinds, False).elements()))
        plain_residual = (sum(_compute(plain["torch"][stage], stage, torch_kinds, False).elements())
                          - sum(_compute(plain["catalog"][stage], stage, catalog_kinds, False).elements()))
        assert residual == pytest.approx(plain_residual, rel=1e-12) and residual > 0.0
    assert mine.devices[0].static_breakdown == theirs.devices[0].static_breakdown
    extra = {key: mine.devices[1].static_breakdown[key] - theirs.devices[1].static_breakdown[key]
             for key in ("weights", "gradients")}
    assert extra == {"weights": 192 * BF16, "gradients": 192 * BF16}


def test_every_stage_on_one_other_mesh_predicts_as_the_captured_job_on_it(gpt2: Any) -> None:
    """A tree mapping the whole captured model to tp 1 on the tp 2 job predicts the captured tp 1 x dp 2 job
    exactly: iteration time and HFU (what the ranks run). MFU counts the model's FLOPs as the job's capture at
    2 samples has them, the tp 1 job's as its capture at 1 sample: the ratio of the two captures' FLOPs per sample
    (the embedding's table and position gradients, and its position add, do not grow with the batch)."""
    job = _job()
    tree = (StrategyTree.from_graph(gpt2(job)).map("", {"tp": 1}).map("embedding", {"stage": 0})
            .map("blocks.1", {"stage": 1}))
    plan = with_captures(job, tree.lower(job.parallel), gpt2)
    assert [(m.stage, m.tp, m.dp, m.micro_batch) for m in plan.stage_meshes] == [(0, 1, 2, 1), (1, 1, 2, 1)]
    mesh_job = job_of_mesh(job, plan.stage_meshes[0])
    ours = predict(job, "sim", graph=gpt2(job), plan=plan)
    alone = predict(mesh_job, "sim", graph=gpt2(mesh_job))
    assert ours.iteration_time_s == alone.iteration_time_s
    assert ours.hfu == pytest.approx(alone.hfu, rel=1e-12)
    per_sample = {mb: (graph.total_flops("fwd") + graph.total_flops("bwd")) / mb
                  for mb, graph in ((2, gpt2(job)), (1, gpt2(mesh_job)))}
    assert per_sample[2] < per_sample[1]
    assert ours.mfu / alone.mfu == pytest.approx(per_sample[2] / per_sample[1], rel=1e-12)


def test_stages_of_their_own_device_counts_compile_as_the_captured_jobs_of_their_meshes(gpt2: Any) -> None:
    """tp 1, dp 2, pp 2 at micro-batch 3 (6 samples per micro-batch) on 4 A100s: stage 0 on 1 device (dp 1,
    captured at 6 samples), stage 1 on 3 (dp 3, captured at 2). Each stage's tasks are those of the plain captured
    pp 2 job of its mesh; each device stands for its own ranks."""
    job = _job(tp=1, dp=2, micro_batch=3, global_batch=24)
    tree = (StrategyTree.from_graph(gpt2(job)).map("", {"stage": 0, "dp": 1})
            .map("blocks.1", {"stage": 1, "dp": 3}).map("head", {"stage": 1, "dp": 3}))
    plan = with_captures(job, tree.lower(job.parallel), gpt2)
    assert plan.stage_ranks == (1, 3)
    assert [mb for mb, _ in plan.captured] == [2, 3, 6]
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    assert [d.ranks for d in graph.devices] == [1, 3]
    for stage, dp in ((0, 1), (1, 3)):
        par = job.parallel.replaced(dp=dp, micro_batch=6 // dp)
        plain = make_job(job.model, a100_cluster(2 * dp), par)
        reference = compile_job(plain, default_plan(gpt2(plain), par), pricer)
        assert _stage(graph, stage, pp=False) == _stage(reference, stage, pp=False) != []
    assert simulate(graph, SimOptions()).makespan_s > 0.0


def test_a_captured_llama_stage_on_its_own_mesh_pays_the_catalog_llamas_collectives() -> None:
    """A LLaMA (GQA 4/2 heads, RoPE, SwiGLU) captured by torch.fuse: stage 1 at tp 2 split as Megatron's
    (self_attn and mlp by out, o_proj and down_proj by reduce, the head vocab parallel), stage 0 at tp 1 x dp 2
    captured at 1 sample. Its tp collectives, pipeline transfers and gradient syncs last what the catalog LLaMA's
    on the same stage meshes do."""
    capture = _capture(LLAMA)
    job = _job(LLAMA)
    pricer = Pricer(Calibration())
    mine = compile_job(job, _plan(job, capture, LLAMA_STAGE1), pricer, "op")
    theirs = compile_job(job, _meshes(graph_for(job), []).lower(job.parallel), pricer, "op")
    for stage in (0, 1):
        for category in ("tp_comm", "pp_comm", "dp_comm"):
            assert _comms(mine, stage, category) == _comms(theirs, stage, category), (stage, category)
    assert len(_comms(mine, 1, "tp_comm")) == 4 * 8


# --- refusals: one line naming the field, the value and what is allowed ---


def test_a_tp_split_reaching_a_stage_at_tp_1_is_refused(gpt2: Any) -> None:
    job = _job()
    tree = _meshes(gpt2(job), [("blocks.*.*.attn.c_attn", "out", 2)])
    with pytest.raises(ConfigError, match=r"^blocks\.0\.0\.attn\.c_attn split\.compute@tp='out=2' is invalid: "
                                          r"the parts' product must divide tp=1 \(the layer's stage runs its own "
                                          r"mesh: tp=1 dp=2\)$"):
        tree.lower(job.parallel)


def test_a_stage_at_tp_2_without_configs_is_refused(gpt2: Any) -> None:
    """The captured graph is one device's whole model: a stage over a tp pair takes configs from the tree."""
    job = _job()
    with pytest.raises(ConfigError, match=r"^map\.tp=2 is invalid: stage 1 runs tp=2 on the torch front-end's "
                                          r"graph, one device's whole model: split its ops over tp in the tree .* "
                                          r"or map the stage to tp=1$"):
        compile_job(job, _plan(job, gpt2, []), Pricer(Calibration()))


def test_a_stage_micro_batch_not_captured_is_refused(gpt2: Any) -> None:
    job = _job()
    plan = _meshes(gpt2(job)).lower(job.parallel)  # not through with_captures
    with pytest.raises(ConfigError, match=r"^map\.dp=2 is invalid: stage 0's replicas take micro-batches of 1, at "
                                          r"which the torch front-end's graph was not captured"):
        compile_job(job, plan, Pricer(Calibration()))


def test_a_capture_of_other_layers_is_refused(gpt2: Any) -> None:
    job = _job()
    plan = _meshes(gpt2(job)).lower(job.parallel)
    three = _capture({**GPT2, "n_layer": 3})
    with pytest.raises(ConfigError, match=r"^micro_batch=1 is invalid: the graph captured at micro-batch 1 has 5 "
                                          r"layer instances, the plan 4; "):
        with_captures(job, plan, three)


def test_the_analytical_engine_refuses_stage_meshes_as_on_the_catalog(gpt2: Any) -> None:
    job = _job()
    words = r"^engine='analytical' is invalid: places layers, schedules, recomputes and splits over dp"
    with pytest.raises(ConfigError, match=words):
        predict(job, "analytical", graph=gpt2(job), plan=_plan(job, gpt2))
    with pytest.raises(ConfigError, match=words):
        predict(job, "analytical", graph=graph_for(job), plan=_meshes(graph_for(job), []).lower(job.parallel))


def test_interleaved_chunks_of_a_captured_graph_compile_on_their_ranks_meshes() -> None:
    """A 4-block captured GPT-2 under interleaved 1F1B (pp 2 x vpp 2, 8 micro-batches): rank 0 (chunk 0: the
    embedding, block 0; chunk 1: block 2) on tp 1 x dp 2, captured again at 1 sample; rank 1 (chunk 0: block 1;
    chunk 1: block 3, the head) on tp 2 with Megatron's splits. Rank 0's tasks are the captured tp 1 x dp 2
    interleaved job's, rank 1's those of the captured tp 2 interleaved job split alike on every block; every
    transfer, at each of the three chunk boundaries, lasts the tp 2 side's hop of 8192 bytes."""
    capture = _capture({**GPT2, "n_layer": 4})
    job = _job(dict(GPT2, n_layer=4), vpp=2, schedule="interleaved-1f1b", global_batch=16)
    rank1 = GPT2_STAGE1 + [(path.replace("blocks.1", "blocks.3"), dim, parts) for path, dim, parts in GPT2_STAGE1
                           if path.startswith("blocks.1")]

    def chunks(graph: OpGraph, first: int, second: int, splits: list[tuple[str, str, int]]) -> StrategyTree:
        tree = (StrategyTree.from_graph(graph).map("", {"stage": 0, "chunk": 0, "tp": first})
                .map("blocks.1", {"stage": 1, "chunk": 0, "tp": second})
                .map("blocks.2", {"stage": 0, "chunk": 1, "tp": first})
                .map("blocks.3", {"stage": 1, "chunk": 1, "tp": second})
                .map("head", {"stage": 1, "chunk": 1, "tp": second}))
        for path, dim, parts in splits:
            tree = tree.split(path, "compute", dim, parts, axis="tp")
        return tree

    plan = with_captures(job, chunks(capture(job), 1, 2, rank1).lower(job.parallel), capture)
    assert plan.stage_meshes == (StageMesh(stage=0, tp=1, dp=2, micro_batch=1),)
    assert [(a.stage, a.chunk) for a in plan.layers] == [(0, 0), (0, 0), (1, 0), (0, 1), (1, 1), (1, 1)]
    pricer = Pricer(Calibration())
    graph = compile_job(job, plan, pricer)
    mesh_job = job_of_mesh(job, plan.stage_meshes[0])
    rank0 = compile_job(mesh_job, chunks(capture(mesh_job), 1, 1, []).lower(mesh_job.parallel), pricer)
    every = [(path.replace("blocks.1", "blocks.*"), dim, parts) for path, dim, parts in GPT2_STAGE1]
    one_mesh = compile_job(job, chunks(capture(job), 2, 2, every).lower(job.parallel), pricer)
    assert _stage(graph, 0, pp=False) == _stage(rank0, 0, pp=False) != []
    assert _stage(graph, 1, pp=False) == _stage(one_mesh, 1, pp=False) != []
    assert _stage(graph, 0, pp=False) != _stage(one_mesh, 0, pp=False)
    hop = pricer.pipeline_hop_s(2 * TOKENS * BF16, job)
    assert hop > pricer.pipeline_hop_s(TOKENS * BF16, mesh_job)
    sends = [t for t in graph.tasks if t.category == "pp_comm" and t.stream == "feature"]
    assert {f"vs{b}" for b in range(3)} <= {word for t in sends for word in t.name.replace("->", " ").split()}
    assert sends and all(t.duration_s == hop for t in sends)
    assert simulate(graph, SimOptions()).makespan_s > 0.0
