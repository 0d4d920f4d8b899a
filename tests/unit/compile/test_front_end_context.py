"""Context parallelism (--cp) on the torch front-end's captured graph (compile.front_end_context): a tiny Hugging
Face GPT-2 (2 blocks, hidden 64, 4 heads of 16, ffn 256, vocab 512) and LLaMA (GQA 4/2 heads) at micro-batch
2 x 32 tokens in bf16 on 8 A100s, against the catalog's Megatron cp (differential), plus exact collective lists
and the one-line refusals.

The keys and values of a micro-batch's whole sequence: 2 x 32 tokens x (2 x 4 heads x 16) x 2 bytes = 16384
bytes for the GPT-2, 2 x 32 x (2 x 2 kv heads x 16) x 2 = 8192 for the LLaMA.
"""

import dataclasses
from typing import Any

import pytest
from tiny_hf import GPT2, LLAMA

from conftest import a100_cluster
from trainsim.catalog.hf_config import model_from_hf_config
from trainsim.compile.front_end_context import check_context_parallel
from trainsim.compile.shape_layers import shape_layers
from trainsim.compile.splits import plan_mesh_comms
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import Comm, OpGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import predict
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

pytest.importorskip("torch")
pytest.importorskip("transformers")

# Megatron's pairs, the vocab-parallel head and lookup over tp (ln_f and the positions on the rank's sequence share
# under sp)
GPT2_TREE = [("blocks.*.*.attn.c_attn", "out", 2), ("blocks.*.*.attn.c_proj", "reduce", 2),
             ("blocks.*.*.mlp.c_fc", "out", 2), ("blocks.*.*.mlp.c_proj", "reduce", 2), ("head", "out", 2),
             ("head.transformer.ln_f", "out", 1), ("embedding.transformer.wte", "reduce", 2)]
UNDER_SP = [("head.transformer.ln_f", "seq", 2), ("embedding.transformer.wpe", "seq", 2)]
SAME_OP = {"attn.c_attn": "qkv", "attn": "attention", "attn.c_proj": "out_proj", "mlp.c_fc": "fc1",
           "mlp.c_proj": "fc2"}


def _graph(config: dict[str, Any]) -> OpGraph:
    from trainsim.frontends.torch.hf import graph_from_hf_config

    return graph_from_hf_config(config, micro_batch=2, seq_len=32, precision="bf16", fused=True)


@pytest.fixture(scope="module")
def gpt2() -> OpGraph:
    return _graph(GPT2)


def _job(config: dict[str, Any], tp: int = 1, cp: int = 2, sp: bool = False, seq_len: int = 32) -> Job:
    dp = 8 // (tp * cp)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": seq_len, "global_batch": 2 * dp, "tp": tp, "cp": cp,
                              "dp": dp, "precision": "bf16", "sp": sp})
    return make_job(model_from_hf_config(config, name=config["model_type"]), a100_cluster(8), par)


def _plan(job: Job, graph: OpGraph, splits: list[tuple[str, str, int]]) -> LoweredPlan:
    tree = StrategyTree.from_graph(graph)
    for path, dim, parts in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree.lower(job.parallel)


def _catalog(job: Job) -> tuple[LoweredPlan, dict[int, tuple[Comm, ...]]]:
    graph = build_transformer(job.model, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
    plan = shape_layers(job, StrategyTree.from_parallel(graph, job.parallel).lower(job.parallel))
    return plan, plan_mesh_comms(plan, job.model, job.parallel)


def _keys(comms: tuple[Comm, ...]) -> list[tuple[str, str, str, str, float, int, bool]]:
    return sorted((c.name, c.collective, c.axis, c.phase, c.buffer_bytes, c.ranks, bool(c.column_input))
                  for c in comms)


def _relative(path: str) -> str:
    parts = path.split(".")
    return ".".join(parts[3:]) if len(parts) > 2 and parts[2].isdigit() else path


def test_gpt2_cp2_matches_the_catalog_exactly(gpt2: OpGraph) -> None:
    """cp 2 x dp 4: each block's attention core all-gathers the keys and values of the whole sequence over cp
    (kv.ag, 16384 bytes) and reduce-scatters their gradient (kv.rs); nothing else moves over cp; every matmul and
    the core run half their FLOPs (their query rows), each layer keeps half of what it keeps at cp 1, as the
    catalog's; the two engines agree; cp_comm and dp_comm are the catalog's, and the per-rank peak memory exceeds
    the catalog's by half the capture's cp-1 surplus of activations (tolerance 0 bytes)."""
    job = _job(GPT2)
    shaped = shape_layers(job, _plan(job, gpt2, []))
    reference, comms = _catalog(job)
    block = shaped.layers[1].layer
    assert [(c.name, c.collective, c.axis, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("kv.ag", "all-gather", "cp", "fwd", 16384.0, 0), ("kv.rs", "reduce-scatter", "cp", "bwd", 16384.0, 0)]
    for mine, theirs, whole in zip(shaped.layers, reference.layers, gpt2.layers, strict=True):
        assert _keys(mine.layer.comms) == _keys(comms.get(theirs.index, ())), mine.layer.name
        assert mine.layer.saved_bytes == {mode: kept / 2 for mode, kept in whole.saved_bytes.items()}
        assert mine.layer.output_bytes == theirs.layer.output_bytes  # a pipeline send: the rank's share
    flops = {SAME_OP[_relative(op.module_path)]: op.flops for op in block.fwd
             if _relative(op.module_path) in SAME_OP and op.kind in ("matmul", "attention")}
    catalog_block = reference.layers[1].layer
    assert flops == {op.name: op.flops for op in catalog_block.fwd if op.name in flops}
    assert flops["qkv"] == 2 * 32 * 192 * 64  # its 32 of 64 tokens
    plan = _plan(job, gpt2, [])
    sim, closed, theirs_sim = (predict(job, "sim", graph=gpt2, plan=plan),
                               predict(job, "analytical", graph=gpt2, plan=plan), predict(job, "sim"))
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=1e-9)
    # without a tree (cp needs none): the analytical engine shapes the graph as the compiler does
    assert predict(job, "analytical", graph=gpt2).iteration_time_s == closed.iteration_time_s
    for key in ("cp_comm", "dp_comm"):
        assert sim.breakdown[key] == pytest.approx(theirs_sim.breakdown[key], rel=1e-12)
    whole = _job(GPT2, cp=1)
    surplus = (predict(whole, "sim", graph=gpt2).memory_breakdown["activations"]
               - predict(whole, "sim").memory_breakdown["activations"])
    assert sim.peak_memory_bytes - theirs_sim.peak_memory_bytes == surplus / 2


@pytest.mark.parametrize("sp", [False, True], ids=["tp2-cp2", "tp2-cp2-sp"])
def test_gpt2_tp2_cp2_matches_the_catalog(gpt2: OpGraph, sp: bool) -> None:
    """tp 2 x cp 2 x dp 2, Megatron's pairs, the vocab-parallel lookup and head (with sp ln_f and the positions on
    the rank's sequence share): every layer's collectives are the catalog's: over tp the hidden state of the rank's
    sequence share (4096 bytes; the lookup's partial sums embed.ar, or embed.rs under sp), the loss's statistics
    of its 32 tokens (128 bytes), over cp the keys and values of its 2 heads (8192 bytes)."""
    job = _job(GPT2, tp=2, sp=sp)
    shaped = shape_layers(job, _plan(job, gpt2, GPT2_TREE + (UNDER_SP if sp else [])))
    reference, comms = _catalog(job)
    for mine, theirs in zip(shaped.layers, reference.layers, strict=True):
        assert _keys(mine.layer.comms) == _keys(comms[theirs.index]), mine.layer.name
    block = shaped.layers[1].layer
    assert {(c.name, c.buffer_bytes) for c in block.comms if c.axis == "cp"} == {("kv.ag", 8192.0), ("kv.rs", 8192.0)}
    assert {c.buffer_bytes for c in block.comms if c.axis == "tp"} == {4096.0}
    assert [(c.name, c.phase, c.buffer_bytes) for c in shaped.layers[0].layer.comms if c.phase == "fwd"] == [
        ("embed.rs" if sp else "embed.ar", "fwd", 4096.0)]


def test_llama_gqa_cp2_matches_the_catalog() -> None:
    """A LLaMA (GQA: 2 kv heads of 4) at cp 2: the keys and values of its 2 kv heads (8192 bytes) each way, every
    layer's collectives and saved activations as the catalog's are (half of cp 1's)."""
    graph = _graph(LLAMA)
    job = _job(LLAMA)
    shaped = shape_layers(job, _plan(job, graph, []))
    reference, comms = _catalog(job)
    for mine, theirs in zip(shaped.layers, reference.layers, strict=True):
        assert _keys(mine.layer.comms) == _keys(comms.get(theirs.index, ())), mine.layer.name
    assert [(c.name, c.buffer_bytes) for c in shaped.layers[1].layer.comms] == [("kv.ag", 8192.0),
                                                                                ("kv.rs", 8192.0)]


def test_context_parallel_refusals(gpt2: OpGraph) -> None:
    """One line each: a sequence tp x cp does not divide under sp (cp alone: the job's own check); a graph
    without the model's shape (an nn.Module factory without a Hugging Face config); a tree's own split over cp
    (cp is the job's --cp); an engine that prices the graph unsplit (precision-aware)."""
    with pytest.raises(ConfigError, match="cp=2 is invalid: must divide seq_len=31"):
        _job(GPT2, seq_len=31)
    job = _job(GPT2)
    with pytest.raises(ConfigError, match=r"seq_len=34 is invalid: .* over cp=2 and tp=2 \(sp\): give a seq_len "
                                          r"divisible by 4"):
        check_context_parallel(job.model, dataclasses.replace(DeviceSlice.of(job.parallel), seq_len=34, tp=2,
                                                              sp=True), "torch")
    with pytest.raises(ConfigError, match="cp=2 is invalid: the torch front-end's graph has no model shape"):
        check_context_parallel(opaque_spec("net", "nn.Module factory"), DeviceSlice.of(job.parallel), "torch")
    with pytest.raises(ConfigError, match="cp=2 is invalid: the torch front-end's graph is one device's whole "
                                          "sequence, which the precision-aware engine does not split"):
        predict(job, "precision-aware", graph=gpt2)
    tree = StrategyTree.from_graph(gpt2).split("blocks.*.*.attn", "compute", "seq", 2, axis="cp")
    with pytest.raises(ConfigError, match="context parallelism is the job's --cp"):
        tree.lower(_job(GPT2).parallel)
