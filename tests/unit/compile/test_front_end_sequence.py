"""Sequence parallelism (--sp) on the torch front-end's captured graph (compile.front_end_sequence): a tiny Hugging
Face GPT-2 (2 blocks, hidden 64, 4 heads, ffn 256, vocab 512, tied) and LLaMA (GQA 4/2 heads, ffn 176, untied) at
micro-batch 2 x 32 tokens in bf16, tp 2 x dp 4 on A100s, with Megatron's column/row pairs in a tree, against the
catalog's Megatron tp 2 + sp (differential), plus exact collective lists and the one-line refusals.

A hidden state of the micro-batch: 64 tokens x 64 x 2 bytes = 8192 bytes; each rank's sequence share 4096.
"""

from typing import Any

import pytest
from tiny_hf import GPT2, LLAMA

from conftest import a100_cluster
from trainsim.catalog.hf_config import model_from_hf_config
from trainsim.compile.shape_layers import shape_layers
from trainsim.compile.splits import plan_mesh_comms
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import Comm, OpGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import predict
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

pytest.importorskip("torch")
pytest.importorskip("transformers")

HIDDEN_BYTES = 64 * 64 * 2
# Megatron's pairs, the head vocab parallel, its final norm on each rank's sequence share (parts 1 unsets the out
# inherited from `head`; seq 2 is Megatron's sp config of a norm, as the catalog's); the lookup vocab parallel, the
# positions looked up on each rank's sequence share (the catalog's under sp)
GPT2_PAIRS = [("blocks.*.*.attn.c_attn", "out", 2), ("blocks.*.*.attn.c_proj", "reduce", 2),
              ("blocks.*.*.mlp.c_fc", "out", 2), ("blocks.*.*.mlp.c_proj", "reduce", 2), ("head", "out", 2),
              ("head.transformer.ln_f", "out", 1), ("head.transformer.ln_f", "seq", 2)]
LOOKUP = [("embedding.transformer.wte", "reduce", 2), ("embedding.transformer.wpe", "seq", 2)]
GPT2_TREE = GPT2_PAIRS + LOOKUP
LLAMA_TREE = [("blocks.*.*.self_attn", "out", 2), ("blocks.*.*.self_attn.o_proj", "out", 1),
              ("blocks.*.*.self_attn.o_proj", "reduce", 2), ("blocks.*.*.mlp", "out", 2),
              ("blocks.*.*.mlp.down_proj", "out", 1), ("blocks.*.*.mlp.down_proj", "reduce", 2), ("head", "out", 2),
              ("head.model.norm", "out", 1), ("head.model.norm", "seq", 2)]


def _graph(config: dict[str, Any]) -> OpGraph:
    from trainsim.frontends.torch.hf import graph_from_hf_config

    return graph_from_hf_config(config, micro_batch=2, seq_len=32, precision="bf16", fused=True)


@pytest.fixture(scope="module")
def gpt2() -> OpGraph:
    return _graph(GPT2)


def _job(config: dict[str, Any], tp: int = 2, dp: int = 4, sp: bool = True, seq_len: int = 32) -> Job:
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": seq_len, "global_batch": 2 * dp, "tp": tp, "dp": dp,
                              "precision": "bf16", "sp": sp})
    return make_job(model_from_hf_config(config, name=config["model_type"]), a100_cluster(tp * dp), par)


def _plan(job: Job, graph: OpGraph, splits: list[tuple[str, str, int]]) -> LoweredPlan:
    tree = StrategyTree.from_graph(graph)
    for path, dim, parts in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree.lower(job.parallel)


def _catalog(job: Job, lookup_whole: bool = False) -> tuple[LoweredPlan, dict[int, tuple[Comm, ...]]]:
    """The catalog's Megatron tp + sp (StrategyTree.from_parallel), optionally with the lookup whole on each rank
    (as a captured lookup runs)."""
    graph = build_transformer(job.model, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
    tree = StrategyTree.from_parallel(graph, job.parallel)
    if lookup_whole:
        tree = tree.split("embedding.tokens", "compute", "reduce", 1, axis="tp", override=True)
    plan = shape_layers(job, tree.lower(job.parallel))
    return plan, plan_mesh_comms(plan, job.model, job.parallel)


def _keys(comms: tuple[Comm, ...]) -> list[tuple[str, str, str, float, int, bool]]:
    return sorted((c.name, c.collective, c.phase, c.buffer_bytes, c.ranks, bool(c.column_input)) for c in comms)


def test_gpt2_block_exact_collectives(gpt2: OpGraph) -> None:
    """By hand: the block reads its input split by sequence; ln_1 keeps it (inferred), c_attn reads whole
    features: attn.ag (its column input); c_proj's partial sums are read by the fused dropout + add + ln_2, which
    the tree leaves unconfigured: reduce-scattered by sequence (attn.rs); c_fc likewise mlp.ag, c_proj's sums
    mlp.rs into the last dropout + add, which hands on its share as it holds it (nothing). Backward the
    conjugates: the row-parallel output's gradient all-gathered, the column-parallel input's gradient
    reduce-scattered (its overlap's column input). 8192 bytes each over the whole tp pair. The embedding: the
    vocab-parallel lookup's partial sums reduce-scattered into the fused position add (embed.rs; the positions
    looked up on the rank's share need nothing), its gradient all-gathered back (embed.ag); without the lookup's
    split (a whole lookup: a slice forward) only the embed.ag. The head gathers lm_head's input (logits.ag,
    logits.rs backward) and all-reduces the loss's three fp32 statistics of 64 tokens."""
    job = _job(GPT2)
    shaped = shape_layers(job, _plan(job, gpt2, GPT2_TREE))
    block = shaped.layers[1].layer
    assert [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES, 0), ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES, 0),
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES, 0), ("mlp.rs", "reduce-scatter", "fwd", HIDDEN_BYTES, 0),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES, 0), ("mlp.rs", "reduce-scatter", "bwd", HIDDEN_BYTES, 0),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES, 0), ("attn.rs", "reduce-scatter", "bwd", HIDDEN_BYTES, 0)]
    assert [c.column_input.rpartition(".")[2] for c in block.comms] == ["c_attn", "", "c_fc", "", "", "c_fc", "",
                                                                        "c_attn"]
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in shaped.layers[0].layer.comms] == [
        ("embed.rs", "reduce-scatter", "fwd", HIDDEN_BYTES), ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    whole_lookup = shape_layers(job, _plan(job, gpt2, GPT2_PAIRS)).layers[0].layer
    assert [(c.name, c.phase) for c in whole_lookup.comms] == [("embed.ag", "bwd")]
    assert [(c.name, c.collective, c.buffer_bytes) for c in shaped.layers[-1].layer.comms] == [
        ("logits.ag", "all-gather", HIDDEN_BYTES), ("logits.rs", "reduce-scatter", HIDDEN_BYTES),
        ("loss.max", "all-reduce", 256.0), ("loss.target", "all-reduce", 256.0),
        ("loss.sum_exp", "all-reduce", 256.0)]
    ln_1 = block.fwd[0]
    assert ln_1.shape == (2, 16, 64)  # its sequence share


def test_gpt2_matches_the_catalog_megatron_sp(gpt2: OpGraph) -> None:
    """Differential: with the lookup vocab parallel and the positions on each rank's share, every layer's
    collectives (name, kind, phase, bytes, group, column input) and pipeline send are the catalog's plain tp 2 +
    sp. With the lookup whole the one difference is the catalog's embed.rs (8192 bytes forward: each rank slices
    its share of the whole lookup instead; a catalog plan with its lookup whole is refused for a tied GPT-2, the
    untied LLaMA below has it); with the lookup split but the positions whole, one all-gather more backward
    (embed.ag of the position add's gradient of the whole (1, 32, 64) positions, 4096 bytes)."""
    job = _job(GPT2)
    shaped = shape_layers(job, _plan(job, gpt2, GPT2_TREE))
    reference, comms = _catalog(job)
    for mine, theirs in zip(shaped.layers, reference.layers, strict=True):
        assert _keys(mine.layer.comms) == _keys(comms[theirs.index]), mine.layer.name
        assert mine.layer.output_bytes == theirs.layer.output_bytes
    embedding = comms[reference.layers[0].index]
    whole_lookup = shape_layers(job, _plan(job, gpt2, GPT2_PAIRS)).layers[0].layer
    assert [(c.name, c.phase) for c in embedding if c not in whole_lookup.comms] == [("embed.rs", "fwd")]
    whole_positions = shape_layers(job, _plan(job, gpt2, GPT2_PAIRS + LOOKUP[:1])).layers[0].layer
    assert [(c.name, c.phase, c.buffer_bytes) for c in whole_positions.comms if c not in embedding] == [
        ("embed.ag", "bwd", 4096.0)]


def test_llama_matches_the_catalog_megatron_sp_with_the_lookup_whole() -> None:
    """The LLaMA tree (fused q k v and gate+up GEMMs under self_attn and mlp by out, o_proj and down_proj by
    reduce, the head vocab parallel) with --sp: all four layers' collectives equal the catalog LLaMA's Megatron
    tp 2 + sp with its lookup whole; each block keeps half of what it keeps at tp 1, as the catalog's."""
    graph = _graph(LLAMA)
    job = _job(LLAMA)
    shaped = shape_layers(job, _plan(job, graph, LLAMA_TREE))
    reference, comms = _catalog(job, lookup_whole=True)
    for mine, theirs in zip(shaped.layers, reference.layers, strict=True):
        assert _keys(mine.layer.comms) == _keys(comms.get(theirs.index, ())), mine.layer.name
        assert mine.layer.output_bytes == theirs.layer.output_bytes  # a pipeline send: the sequence share
    assert [c.collective for c in shaped.layers[1].layer.comms] == ["all-gather", "reduce-scatter"] * 4
    whole = _graph(LLAMA).layers[1].saved_bytes
    assert shaped.layers[1].layer.saved_bytes == {mode: kept / 2 for mode, kept in whole.items()}


def test_activations_and_peak_memory_follow_the_catalog(gpt2: OpGraph) -> None:
    """Under Megatron's tp 2 + sp every block and the head keep half of what they keep at tp 1, on both front-ends
    (Korthikanti et al. 2022, Table 2: sbh/t (34 + 5as/h)): the capture's ln_1 (8448), c_attn's input (8192: its
    sequence share, kept as Megatron-LM keeps it), the fused dropout + add + ln_2 (16640), c_fc's input (8192),
    the last dropout + add (8192) halved as the heads' and ffn features' tensors are; under full recompute the
    block's input share (4096). The embedding's fused add and dropout on its share keeps 4096, as the catalog's.

    Per-rank peak memory (the simulator's), tolerance 0 bytes: the activations exceed the catalog's by half the
    capture's tp-1 surplus (its unfused kernels' tensors); weights, gradients and optimizer states by the
    parameters the capture holds whole, 16 bytes each (bf16 weight and gradient, fp32 master copy and two Adam
    moments): 192 per block (half of the norms' 256 and of the row-parallel biases' 128, which the catalog
    divides by tp) and half the position table's 4096 (the catalog divides it by tp; the capture holds it whole,
    each rank looking up its share's positions, its gradient summed over the pair: a lookup split by tokens)."""
    whole = _job(GPT2, 1, 8, sp=False)
    job = _job(GPT2)
    shaped = shape_layers(job, _plan(job, gpt2, GPT2_TREE))
    reference = _catalog(job)[0]
    catalog_tp1 = build_transformer(whole.model, DeviceSlice.of(whole.parallel))  # type: ignore[arg-type]
    for mine, theirs, captured_tp1, tp1 in zip(shaped.layers[1:], reference.layers[1:], gpt2.layers[1:],
                                               (catalog_tp1.layers[1], catalog_tp1.layers[1], catalog_tp1.layers[2]),
                                               strict=True):
        assert mine.layer.saved_bytes["none"] == captured_tp1.saved_bytes["none"] / 2
        assert theirs.layer.saved_bytes["none"] == tp1.saved_bytes["none"] / 2
    block = shaped.layers[1].layer
    assert gpt2.layers[1].saved_bytes["none"] - block.saved_bytes["none"] == 125696
    assert block.saved_bytes["full"] == HIDDEN_BYTES / 2
    assert shaped.layers[0].layer.saved_bytes["none"] == reference.layers[0].layer.saved_bytes["none"] == 4096
    surplus_tp1 = (predict(whole, "sim", graph=gpt2).memory_breakdown["activations"]
                   - predict(whole, "sim").memory_breakdown["activations"])
    mine = predict(job, "sim", graph=gpt2, plan=_plan(job, gpt2, GPT2_TREE))
    theirs = predict(job, "sim")
    activations = mine.memory_breakdown["activations"] - theirs.memory_breakdown["activations"]
    assert activations == surplus_tp1 / 2
    params = 2 * 192 + 2048
    assert shaped.layers[0].layer.param_count - reference.layers[0].layer.param_count == 2048
    assert (0, 2, 4096.0) in shaped.front_end_token_params  # the position table's gradient summed over the pair
    assert mine.peak_memory_bytes - theirs.peak_memory_bytes == activations + params * 16


def test_sequence_parallel_refusals(gpt2: OpGraph) -> None:
    """One line each: a sequence that tp does not divide; sp without tp (the job's own check)."""
    job = _job(GPT2, seq_len=31)
    with pytest.raises(ConfigError) as info:
        shape_layers(job, _plan(job, gpt2, GPT2_TREE))
    assert "\n" not in str(info.value) and "seq_len=31" in str(info.value) and "divisible by 2" in str(info.value)
    with pytest.raises(ValueError, match="sp=True needs tp > 1"):
        _job(GPT2, tp=1, dp=8)
