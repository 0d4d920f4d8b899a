"""Splits over tp on the torch front-end's captured graph (compile.shape_front_end, strategy.front_end_splits):
a tiny Hugging Face GPT-2 (2 blocks, hidden 64, 4 heads of 16, ffn 256, vocab 512) at micro-batch 2 x 32 tokens
in bf16, tp 2 x dp 4 on A100s, against the catalog GPT of the same shape (differential), plus exact cases and the
one-line refusals.

A hidden state of the micro-batch: 64 tokens x 64 x 2 bytes = 8192 bytes. A block's parameters: qkv 64 x 192 +
192 = 12480, the projection 64 x 64 + 64 = 4160, fc1 64 x 256 + 256 = 16640, fc2 256 x 64 + 64 = 16448, two
LayerNorms 2 x 128: 49984.
"""

import pytest
from tiny_hf import GPT2 as CONFIG
from tiny_hf import LLAMA

from conftest import a100_cluster
from trainsim.catalog.hf_config import model_from_hf_config
from trainsim.compile.shape_layers import shape_layers
from trainsim.compile.splits import plan_mesh_comms
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import Comm, Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import predict
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan, default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

pytest.importorskip("torch")
pytest.importorskip("transformers")

HIDDEN_BYTES = 64 * 64 * 2
BLOCK_PARAMS = 49984
ATTN = [("blocks.*.*.attn.c_attn", "out"), ("blocks.*.*.attn.c_proj", "reduce")]
MLP = [("blocks.*.*.mlp.c_fc", "out"), ("blocks.*.*.mlp.c_proj", "reduce")]
CATALOG_ATTN = [("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "out"), ("blocks.*.attn.out", "reduce")]
CATALOG_MLP = [("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.act", "out"), ("blocks.*.mlp.fc2", "reduce")]
# captured module path (relative to the block) -> the catalog op of the same matmul or core
SAME_OP = {"attn.c_attn": "qkv", "attn": "attention", "attn.c_proj": "out_proj", "mlp.c_fc": "fc1",
           "mlp.c_proj": "fc2"}


@pytest.fixture(scope="module")
def captured() -> OpGraph:
    from trainsim.frontends.torch.hf import graph_from_hf_config

    return graph_from_hf_config(CONFIG, micro_batch=2, seq_len=32, precision="bf16", fused=True)


def _job(tp: int = 2, dp: int = 4) -> Job:
    spec = model_from_hf_config(CONFIG, name="gpt2-tiny")
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 2 * dp, "tp": tp, "dp": dp,
                              "precision": "bf16"})
    return make_job(spec, a100_cluster(tp * dp), par)


def _tree_plan(job: Job, graph: OpGraph, splits: list[tuple[str, str]], parts: int = 2) -> LoweredPlan:
    tree = StrategyTree.from_graph(graph)
    for path, dim in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree.lower(job.parallel)


def _catalog(job: Job, splits: list[tuple[str, str]]) -> tuple[LoweredPlan, dict[int, tuple[Comm, ...]]]:
    graph = build_transformer(job.model, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
    plan = shape_layers(job, _tree_plan(job, graph, splits))
    return plan, plan_mesh_comms(plan, job.model, job.parallel)


def _comm_keys(comms: tuple[Comm, ...]) -> list[tuple[str, str, str, float, int, bool]]:
    return sorted((c.name, c.collective, c.phase, c.buffer_bytes, c.ranks, bool(c.column_input)) for c in comms)


def _relative(layer: Layer, path: str) -> str:
    """A captured block op's module path below its block (transformer.h.<i>., model.layers.<i>.)."""
    parts = path.split(".")
    return ".".join(parts[3:]) if len(parts) > 2 and parts[2].isdigit() else path


def _bwd_matmul_flops(layer: Layer, catalog: bool, same: dict[str, str] = SAME_OP) -> dict[str, float]:
    out: dict[str, float] = {}
    for op in layer.bwd:
        if op.kind != "matmul":
            continue
        name = op.name.split(".")[0] if catalog else same.get(_relative(layer, op.module_path), "")
        out[name] = out.get(name, 0.0) + op.flops
    return out


@pytest.mark.parametrize(("traced", "catalog"), [(ATTN, CATALOG_ATTN), (ATTN + MLP, CATALOG_ATTN + CATALOG_MLP)],
                         ids=["attention", "attention+mlp"])
def test_captured_gpt2_split_matches_the_catalog_gpt(captured: OpGraph, traced: list[tuple[str, str]],
                                                     catalog: list[tuple[str, str]]) -> None:
    """The same split on both front-ends: each matmul's and the core's forward FLOPs, the backward matmuls'
    FLOPs per module, and every layer's collectives (name, kind, phase, bytes, ranks) agree exactly."""
    job = _job()
    shaped = shape_layers(job, _tree_plan(job, captured, traced))
    reference, reference_comms = _catalog(job, catalog)
    assert len(shaped.layers) == len(reference.layers) == 4
    for mine, theirs in zip(shaped.layers, reference.layers, strict=True):
        assert _comm_keys(mine.layer.comms) == _comm_keys(reference_comms.get(theirs.index, ())), mine.layer.name
        if mine.layer.kind != "block":
            continue
        ours = {SAME_OP[_relative(mine.layer, op.module_path)]: op.flops for op in mine.layer.fwd
                if _relative(mine.layer, op.module_path) in SAME_OP and op.kind in ("matmul", "attention")}
        assert ours == {op.name: op.flops for op in theirs.layer.fwd if op.name in ours}
        assert _bwd_matmul_flops(mine.layer, False) == _bwd_matmul_flops(theirs.layer, True)
    assert not shaped.mesh_splits  # the collectives travel in the shaped layers


def test_attention_split_exact_collectives_and_weights(captured: OpGraph) -> None:
    """c_attn by out, c_proj by reduce: one all-reduce of the hidden state each way per block (attn.ar), qkv's
    input gradient as the column-parallel one (its backward overlap); qkv holds half its weight and bias, the
    projection half its weight and its whole bias, the norms whole: 49984 - (6144 + 96) - 2048 = 41696 (the
    catalog counts 41536: it divides the norms and the projection's bias by tp too, 160 fewer)."""
    job = _job()
    plan = shape_layers(job, _tree_plan(job, captured, ATTN))
    block = plan.layers[1].layer
    assert [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES, 0), ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES, 0)]
    assert block.comms[1].column_input == "transformer.h.0.attn.c_attn" and not block.comms[0].column_input
    assert block.param_count == BLOCK_PARAMS - (6144 + 96) - 2048 == 41696
    assert _catalog(job, CATALOG_ATTN)[0].layers[1].layer.param_count == 41696 - 160
    qkv = next(op for op in block.fwd if op.module_path.endswith("attn.c_attn"))
    core = next(op for op in block.fwd if op.kind == "attention")
    assert (qkv.shape, qkv.flops) == ((1, 64, 96, 64), 2 * 64 * 96 * 64)
    assert core.shape == (4, 32, 32, 16)  # 2 samples x 2 of 4 heads
    mask = next(op for op in block.fwd if op.module_path.endswith("attn") and op.kind == "elementwise")
    assert mask.shape == (2, 1, 32, 32)  # off the chain (its last dim is not the features): whole


def test_matmul_split_by_tokens_holds_its_weight_and_sums_its_gradient(captured: OpGraph) -> None:
    """c_fc by seq 2: its FLOPs halve, it holds its whole weight (no parameter shed) and sums its gradient over
    the 2 tp ranks; the activation and c_proj keep the sequence split (inferred), so c_proj too holds its weight
    whole and sums its gradient over the pair: 16640 + 16448 = 33088 parameters (the catalog's token_split_params
    for fc1, act and fc2 by seq); the block hands on the whole hidden state: block.ag forward, mlp.ag of c_fc's
    input gradient backward."""
    job = _job()
    plan = shape_layers(job, _tree_plan(job, captured, [("blocks.*.*.mlp.c_fc", "seq")]))
    block = plan.layers[1].layer
    fc1 = next(op for op in block.fwd if op.module_path.endswith("mlp.c_fc"))
    fc2 = next(op for op in block.fwd if op.module_path.endswith("mlp.c_proj"))
    assert (fc1.shape, fc1.flops) == ((1, 32, 256, 64), 2 * 32 * 256 * 64)
    assert (fc2.shape, fc2.flops) == ((1, 32, 64, 256), 2 * 32 * 64 * 256)
    assert block.param_count == BLOCK_PARAMS
    assert plan.front_end_token_params == ((1, 2, 33088.0), (2, 2, 33088.0))
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms] == [
        ("block.ag", "all-gather", "fwd", HIDDEN_BYTES), ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES)]


def test_sim_and_analytical_agree_and_mfu_counts_the_model_once(captured: OpGraph) -> None:
    """Both engines price the shaped graph; MFU's model FLOPs are the captured (whole) graph's, not tp times
    them: the same as the catalog's at tp 1 over the same GPUs."""
    job = _job()
    plan = _tree_plan(job, captured, ATTN + MLP)
    sim = predict(job, "sim", graph=captured, plan=plan)
    closed = predict(job, "analytical", graph=captured, plan=plan)
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=1e-6)
    whole = captured.total_flops("fwd") + captured.total_flops("bwd")
    assert sim.model_flops_per_iteration == pytest.approx(whole * job.parallel.global_batch / 2)
    assert sim.hfu > sim.mfu  # the embedding and head run whole on both tp ranks


@pytest.mark.parametrize(("splits", "parts", "field", "words"), [
    ([("blocks.*.*.ln_1", "reduce")], 2, "ln_1 split.compute@tp", "no reduction dimension"),
    ([("blocks.*.*.attn.c_attn", "out")], 4, "c_attn split.compute@tp", "must divide tp=2"),
    # attn's out inherited by c_proj beside its own reduce: out=2 reduce=2, 4 parts on 2 ranks
    ([("blocks.*.*.attn", "out"), ("blocks.*.*.attn.c_proj", "reduce")], 2, "c_proj split.compute@tp",
     "must divide tp=2"),
])
def test_bad_configs_are_refused_in_one_line(captured: OpGraph, splits: list[tuple[str, str]], parts: int,
                                             field: str, words: str) -> None:
    job = _job()
    with pytest.raises(ConfigError) as info:
        shape_layers(job, _tree_plan(job, captured, splits, parts))
    message = str(info.value)
    assert "\n" not in message and words in message and field in message


def test_tp_without_a_tree_is_refused(captured: OpGraph) -> None:
    """No engine prices one device's whole model as a tp rank's share: the compiler without a tree, the
    analytical engine without a plan, the precision-aware engine (which takes none) at all."""
    job = _job()
    with pytest.raises(ConfigError, match="give a strategy tree that splits its ops over tp"):
        shape_layers(job, default_plan(captured, job.parallel))
    for engine in ("sim", "analytical"):
        with pytest.raises(ConfigError, match="give a strategy tree"):
            predict(job, engine, graph=captured)
    with pytest.raises(ConfigError, match="the precision-aware engine takes no tree"):
        predict(job, "precision-aware", graph=captured, plan=_tree_plan(job, captured, ATTN))


LLAMA_CATALOG = [("blocks.*.attn.qkv", "out"), ("blocks.*.attn.rope", "out"), ("blocks.*.attn.core", "out"),
                 ("blocks.*.attn.out", "reduce"), ("blocks.*.mlp.gate_up", "out"), ("blocks.*.mlp.act", "out"),
                 ("blocks.*.mlp.down", "reduce")]  # the catalog LLaMA's Megatron attention and MLP
LLAMA_SAME_OP = {"self_attn": "qkv", "self_attn.o_proj": "out_proj", "mlp": "gate_up", "mlp.down_proj": "down"}


def test_captured_llama_megatron_split_matches_the_catalog_llama() -> None:
    """A LLaMA block (GQA, RoPE, SwiGLU, RMSNorm) as torch.fuse leaves it: q, k and v one GEMM, gate and up one,
    each with the rope or SiLU under the same module (self_attn, mlp). The tree splits those modules by out and
    writes o_proj and down_proj by reduce (their inherited out set back to 1): the catalog LLaMA's Megatron
    attention and MLP, matmul and core FLOPs and collectives equal (the hidden state moves in bf16 though the
    fused RMSNorm group is labelled fp32); 64 parameters more than the catalog's (its norms' gains divided by
    tp)."""
    from trainsim.frontends.torch.hf import graph_from_hf_config

    graph = graph_from_hf_config(LLAMA, micro_batch=2, seq_len=32, precision="bf16", fused=True)
    spec = model_from_hf_config(LLAMA, name="llama-tiny")
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 8, "tp": 2, "dp": 4,
                              "precision": "bf16"})
    job = make_job(spec, a100_cluster(8), par)
    tree = StrategyTree.from_graph(graph)
    for path, dim, parts in [("blocks.*.*.self_attn", "out", 2), ("blocks.*.*.self_attn.o_proj", "out", 1),
                             ("blocks.*.*.self_attn.o_proj", "reduce", 2), ("blocks.*.*.mlp", "out", 2),
                             ("blocks.*.*.mlp.down_proj", "out", 1), ("blocks.*.*.mlp.down_proj", "reduce", 2)]:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    shaped = shape_layers(job, tree.lower(par))
    reference, reference_comms = _catalog(job, LLAMA_CATALOG)
    for mine, theirs in zip(shaped.layers, reference.layers, strict=True):
        assert _comm_keys(mine.layer.comms) == _comm_keys(reference_comms.get(theirs.index, ())), mine.layer.name
        if mine.layer.kind != "block":
            continue
        ours = {LLAMA_SAME_OP[_relative(mine.layer, op.module_path)]: op.flops for op in mine.layer.fwd
                if op.kind == "matmul"}
        ours["attention"] = next(op.flops for op in mine.layer.fwd if op.kind == "attention")
        assert ours == {op.name: op.flops for op in theirs.layer.fwd if op.name in ours}
        assert _bwd_matmul_flops(mine.layer, False, LLAMA_SAME_OP) == _bwd_matmul_flops(theirs.layer, True)
        assert mine.layer.param_count == theirs.layer.param_count + 64


def test_unfused_llama_parallel_branches_match_the_catalog_llama() -> None:
    """The LLaMA block traced without torch.fuse: q, k and v three GEMMs reading the norm's output, gate and up two,
    each rope an element-wise chain beside the others (parallel branches). Each GEMM reads the norm's output
    (Op.inputs), not the GEMM before it: with the tree of the fused test, one all-reduce pair each for the
    attention and the MLP (the three input gradients, partial alike, summed first, then all-reduced once), as the
    catalog LLaMA's Megatron split; the same matmul FLOPs in all and 64 parameters more (the norms whole). (Read as
    a chain, k_proj read q_proj's output and the block paid six collectives more.)"""
    from trainsim.frontends.torch.hf import graph_from_hf_config

    graph = graph_from_hf_config(LLAMA, micro_batch=2, seq_len=32, precision="bf16", fused=False)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 8, "tp": 2, "dp": 4,
                              "precision": "bf16"})
    job = make_job(model_from_hf_config(LLAMA, name="llama-tiny"), a100_cluster(8), par)
    q = next(op for op in graph.layers[1].fwd if op.module_path.endswith("q_proj"))
    k = next(op for op in graph.layers[1].fwd if op.module_path.endswith("k_proj"))
    assert q.inputs == k.inputs and len(q.inputs or ()) == 1
    tree = StrategyTree.from_graph(graph)
    for path, dim, parts in [("blocks.*.*.self_attn", "out", 2), ("blocks.*.*.self_attn.o_proj", "out", 1),
                             ("blocks.*.*.self_attn.o_proj", "reduce", 2), ("blocks.*.*.mlp", "out", 2),
                             ("blocks.*.*.mlp.down_proj", "out", 1), ("blocks.*.*.mlp.down_proj", "reduce", 2)]:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    block = shape_layers(job, tree.lower(par)).layers[1].layer
    reference, reference_comms = _catalog(job, LLAMA_CATALOG)
    theirs = reference.layers[1].layer
    assert _comm_keys(block.comms) == _comm_keys(reference_comms[reference.layers[1].index])
    assert [c.collective for c in block.comms] == ["all-reduce"] * 4
    assert sum(op.flops for op in block.fwd if op.kind == "matmul") == sum(
        op.flops for op in theirs.fwd if op.kind == "matmul")
    assert block.param_count == theirs.param_count + 64


def test_captured_head_split_by_vocabulary_matches_the_catalog_head() -> None:
    """An untied GPT-2's head at Megatron's vocab-parallel split: lm_head by out, the loss by its classes (the
    cast to fp32 between them inferred), ln_f written whole. As the catalog's head.proj and head.loss: the
    projection's input gradient all-reduced (logits.ar, 8192 bytes, column input) and the loss's three fp32
    statistics (64 tokens x 4 bytes each); the head holds half its 512 x 64 projection and keeps half its
    softmax."""
    from trainsim.frontends.torch.hf import graph_from_hf_config

    untied = {**CONFIG, "tie_word_embeddings": False}
    graph = graph_from_hf_config(untied, micro_batch=2, seq_len=32, precision="bf16", fused=True)
    spec = model_from_hf_config(untied, name="gpt2-untied")
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 8, "tp": 2, "dp": 4,
                              "precision": "bf16"})
    job = make_job(spec, a100_cluster(8), par)
    tree = StrategyTree.from_graph(graph).split("head", "compute", "out", 2, axis="tp")
    tree = tree.split("head.transformer.ln_f", "compute", "out", 1, axis="tp")
    head = shape_layers(job, tree.lower(par)).layers[-1].layer
    reference, reference_comms = _catalog(job, [("head.proj", "out"), ("head.loss", "out")])
    assert _comm_keys(head.comms) == _comm_keys(reference_comms[reference.layers[-1].index])
    assert [(c.name, c.buffer_bytes) for c in head.comms] == [
        ("logits.ar", HIDDEN_BYTES), ("loss.max", 256.0), ("loss.target", 256.0), ("loss.sum_exp", 256.0)]
    assert head.param_count == 128 + 512 * 64 / 2
    # the loss keeps its fp32 softmax (64 x 512 x 4 bytes) over its half of the classes, as the catalog's; the
    # capture keeps lm_head's input and ln_f's statistics beside them, whole: 8448 bytes more, as at tp 1
    kept = graph.layers[-1].saved_bytes["none"] - 64 * 512 * 4 / 2
    assert head.saved_bytes == dict.fromkeys(("none", "selective", "full"), kept)
    assert kept - reference.layers[-1].layer.saved_bytes["none"] == 8192 + 256
    logits = next(op for op in head.fwd if op.kind == "matmul")
    assert logits.flops == next(op.flops for op in reference.layers[-1].layer.fwd if op.name == "logits")


def test_residual_add_reads_its_skip_input_resharded(captured: OpGraph) -> None:
    """The block's two fused residual groups (dropout + add + ln_2, dropout + add: the block's own ops) split by
    seq, everything under ln_1, attn and mlp written whole. Each reader's layout is compared with its own
    producer's (Op.inputs). The first group reads c_proj's output (whole: a slice forward, attn.ag of its
    gradient backward) and the block's input, the skip, which ln_1 reads whole: a slice forward; backward the
    group's sequence-split gradient of it does not lie as ln_1's (whole), so it is all-gathered onto the input's
    layout on its own (block.ag; a chain of ops missed it). c_fc reads the group's output whole (mlp.ag). The
    second group reads the first's sum as it lies (nothing either way) and the MLP's output (a slice; mlp.ag
    backward); the block hands on the whole hidden state (block.ag). 8192 bytes each, by hand; the catalog GPT's
    residual1, norm2 and residual2 by seq (its _skip_reshards) give the same collectives."""
    job = _job()
    tree = StrategyTree.from_graph(captured).split("blocks.*.*", "compute", "seq", 2, axis="tp")
    for module in ("ln_1", "attn", "mlp"):
        tree = tree.split(f"blocks.*.*.{module}", "compute", "seq", 1, axis="tp")
    block = shape_layers(job, tree.lower(job.parallel)).layers[1].layer
    assert [(c.name, c.collective, c.phase, c.buffer_bytes, c.ranks) for c in block.comms] == [
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES, 0), ("block.ag", "all-gather", "fwd", HIDDEN_BYTES, 0),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES, 0), ("block.ag", "all-gather", "bwd", HIDDEN_BYTES, 0),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES, 0)]
    reference, reference_comms = _catalog(job, [("blocks.*.residual1", "seq"), ("blocks.*.norm2", "seq"),
                                                ("blocks.*.residual2", "seq")])
    assert _comm_keys(block.comms) == _comm_keys(reference_comms[reference.layers[1].index])


def test_saved_activations_and_peak_memory_follow_the_split_as_the_catalogs(captured: OpGraph) -> None:
    """Each op keeps what it saves for its backward as it reads it (Op.saved_bytes over its input's parts): a
    block's activations shrink by what the catalog's shrink for the same split, plus the capture's own tensors
    that the split divides too. The attention split: the catalog's q, k, v (24576 bytes), the core's output (8192)
    and log-sum-exp (1024 in fp32) halve (16896 bytes fewer); the capture halves also the causal mask the core
    keeps (2 x 32 x 32 bf16 = 4096 bytes; NB: whole on each rank, counted with the core's): 16896 + 2048. With
    the MLP: the catalog's fc1 and GELU outputs halve (2 x 256 x 64 x 2 bytes / 2 = 32768 fewer); the capture's
    tanh GELU keeps three intermediates more of that size, halved too (49152 more). Under full recompute a block
    keeps its whole input, as the catalog's.

    Per-rank peak memory (the simulator's), differential with a stated tolerance of 0 bytes: the captured split's
    activations exceed the catalog's by the capture's surplus at tp 1 (its unfused kernels' extra tensors) less
    what the split divides of it in the 2 blocks; its weights, gradients and optimizer states by the parameters
    per block the catalog divides by tp and the capture holds whole (half of the two norms' 256 and of the row
    parallel projections' biases, 64 each: 160 with the attention split, 192 with the MLP's too;
    test_attention_split_exact_collectives_and_weights), 16 bytes each (bf16 weight and gradient, fp32 master
    copy and two Adam moments) - nothing else."""
    job, whole = _job(), _job(1, 8)
    catalog_tp1 = build_transformer(whole.model, DeviceSlice.of(whole.parallel))  # type: ignore[arg-type]
    tp1, mine_tp1 = catalog_tp1.layers[1].saved_bytes["none"], captured.layers[1].saved_bytes["none"]
    surplus_tp1 = (predict(whole, "sim", graph=captured).memory_breakdown["activations"]
                   - predict(whole, "sim").memory_breakdown["activations"])
    ffn_tensor, mask = 64 * 256 * 2, 2 * 32 * 32 * 2
    cases = [(ATTN, CATALOG_ATTN, mask / 2, 160),
             (ATTN + MLP, CATALOG_ATTN + CATALOG_MLP, mask / 2 + 3 * ffn_tensor / 2, 192)]
    for traced, catalog, extra, whole_params in cases:
        block = shape_layers(job, _tree_plan(job, captured, traced)).layers[1].layer
        theirs = _catalog(job, catalog)[0].layers[1].layer
        assert mine_tp1 - block.saved_bytes["none"] == tp1 - theirs.saved_bytes["none"] + extra
        assert block.saved_bytes["full"] == theirs.saved_bytes["full"] == HIDDEN_BYTES
        assert block.param_count - theirs.param_count == whole_params
        graph = build_transformer(job.model, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
        mine = predict(job, "sim", graph=captured, plan=_tree_plan(job, captured, traced))
        reference = predict(job, "sim", graph=graph, plan=_tree_plan(job, graph, catalog))
        activations = mine.memory_breakdown["activations"] - reference.memory_breakdown["activations"]
        assert activations == surplus_tp1 - 2 * extra
        assert mine.peak_memory_bytes - reference.peak_memory_bytes == activations + 2 * whole_params * 16


def test_rope_splits_its_heads_dim() -> None:
    """LLaMA's fused rope group is (batch, heads, seq, head dim), HF's attention layout: split by out it runs
    half the heads (2, 2, 32, 16), not half of each head (2, 4, 32, 8); by seq half the query rows."""
    from trainsim.compile.shape_front_end import front_end_op
    from trainsim.frontends.torch.hf import graph_from_hf_config
    from trainsim.strategy.placement import OpConfig

    graph = graph_from_hf_config(LLAMA, micro_batch=2, seq_len=32, precision="bf16", fused=True)
    rope = next(op for op in graph.layers[1].fwd if op.kind == "elementwise" and op.module_path.endswith("self_attn"))
    assert rope.shape == (2, 4, 32, 16)
    by_heads, by_rows = front_end_op(rope, OpConfig(1, 1, 2, 1)), front_end_op(rope, OpConfig(1, 2, 1, 1))
    assert (by_heads.shape, by_heads.flops) == ((2, 2, 32, 16), rope.flops / 2)
    assert (by_rows.shape, by_rows.flops) == ((2, 4, 16, 16), rope.flops / 2)
