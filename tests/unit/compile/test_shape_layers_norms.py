"""A dense block's norms and residual adds, and the embedding's lookup, at configs over tp other than Megatron's
(compile.shape_layers, strategy.megatron replicable_module "tokens" and "embed"): the norms split by sequence
without sp (per-op sequence parallelism), or whole under sp; the lookup by tokens (each rank its own tokens from
the whole table). Each shaped at its config, the collectives resharding inserts around them (the layer's hand-on
included), the weights held whole and their gradient summed over the tp ranks that split their tokens.

The tiny GPT (tests/conftest.py: hidden 32, 4 heads of 8, ffn 128, vocab 256, tied embeddings, biases,
LayerNorm) at micro-batch 2 x 32 tokens in bf16 on 8 A100s, tp 2 x dp 4: a hidden state of the micro-batch is
64 tokens x 32 x 2 bytes = 4096 bytes; a LayerNorm holds a gain and a bias of 32 each (64 parameters); Megatron's
block holds 6352 parameters per tp rank (its two norms counted divided by tp, as the builder always has); the
embedding a table of 256 x 32 = 8192 and positions of 32 x 32 = 1024 parameters.
"""

import pytest
import yaml

from conftest import TINY_GPT_MODEL_YAML, a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.shape_layers import shape_layers
from trainsim.compile.splits import plan_mesh_comms, plan_tp_token_params
from trainsim.cost.pricing import Pricer, axis_layout
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import Layer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import StrategyTree

HIDDEN_BYTES = 64 * 32 * 2
NORM_PARAMS = 2 * 32
MEGATRON_BLOCK_PARAMS = 6352
TOKEN_OPS = ("blocks.*.norm1", "blocks.*.residual1", "blocks.*.norm2", "blocks.*.residual2")


def _job(sp: bool, tied: bool = True) -> Job:
    text = TINY_GPT_MODEL_YAML.replace("tied_embeddings: true", f"tied_embeddings: {str(tied).lower()}")
    spec = parse_model(yaml.safe_load(text))
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 16, "tp": 2, "dp": 4, "sp": sp})
    return make_job(spec, a100_cluster(8), par)


def _spec(job: Job) -> TransformerSpec:
    assert isinstance(job.model, TransformerSpec)
    return job.model


def _plan(job: Job, seq_parts: dict[str, int], whole: tuple[tuple[str, str], ...] = ()) -> LoweredPlan:
    """Megatron's splits, the ops in seq_parts split that many ways by sequence over tp instead (the (path, dim)
    in `whole` not split along dim)."""
    tree = StrategyTree.from_parallel(build_transformer(_spec(job), DeviceSlice.of(job.parallel)), job.parallel)
    for path, dim in whole:
        tree = tree.split(path, "compute", dim, 1, axis="tp", override=True)
    for path, parts in seq_parts.items():
        tree = tree.split(path, "compute", "seq", parts, axis="tp", override=True)
    return shape_layers(job, tree.lower(job.parallel))


def _comms(layer: Layer) -> list[tuple[str, str, str, float]]:
    return [(c.name, c.collective, c.phase, c.buffer_bytes) for c in layer.comms]


def test_norms_and_residual_adds_split_by_sequence_without_sp_reshard_around_them() -> None:
    """tp 2 without sp, the norms and residual adds on half the tokens each: forward, norm1 slices its tokens of
    the whole hidden state (no collective), qkv all-gathers them (attn.ag), the projection's partial sums are
    reduce-scattered onto residual1's tokens (attn.rs, not Megatron's all-reduce), the same around the MLP, and
    the block hands on the whole hidden state: residual2's halves all-gathered (block.ag). Backward, the
    conjugates: each module's input gradient, partial over the pair, reduce-scattered onto its norm's tokens,
    and the block's input gradient all-gathered. Every collective moves a hidden state (4096 bytes); at op level
    the hand-on's task takes the collective model's time."""
    job = _job(sp=False)
    plan = _plan(job, dict.fromkeys(TOKEN_OPS, 2))
    block = plan.layers[1].layer
    assert _comms(block) == [
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES), ("mlp.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("block.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "bwd", HIDDEN_BYTES),
        ("block.ag", "all-gather", "bwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES), ("mlp.rs", "reduce-scatter", "bwd", HIDDEN_BYTES)]
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms
    shapes = {op.name: op.shape for op in block.fwd}
    assert shapes["norm1"] == shapes["residual1"] == shapes["norm2"] == shapes["residual2"] == (32 * 32,)
    megatron = _plan(job, {}).layers[1].layer
    assert {op.name: op.shape for op in megatron.fwd}["norm1"] == (64 * 32,)
    # the two norms' inputs kept at half the tokens: 2 x 32 x 32 x 2 bytes fewer
    assert megatron.saved_bytes["none"] - block.saved_bytes["none"] == 2 * 32 * 32 * 2 == 4096
    pricer = Pricer(Calibration())
    tasks = {t.name.split(" mb")[0]: t.duration_s for t in compile_job(job, plan, pricer, "op").tasks
             if t.category == "tp_comm" and t.micro_batch == 0 and t.layer == "L1.block"}
    layout = axis_layout("tp", job.parallel, job.cluster)
    assert tasks["block.ag all-gather"] == pricer.collective_s("all-gather", HIDDEN_BYTES, layout, job)


def test_a_norm_split_by_tokens_holds_its_weights_whole_and_sums_their_gradient_over_its_tp_ranks() -> None:
    """Each tp rank holds the two norms whole (64 parameters each, not 32) and makes their gradient from its
    own tokens: 2 x 64 parameters per block are summed over the 2 tp ranks as well as the 4 dp ranks (Megatron
    sums its sequence-parallel norms' gradients over tp: finalize_model_grads, megatron-core 0.9). The
    gradient sync holds a bucket of the two blocks' 2 x 128 norm parameters over 8 ranks, the rest over the dp
    group's 4. The residual adds hold no weights."""
    job = _job(sp=False)
    plan = _plan(job, dict.fromkeys(TOKEN_OPS, 2))
    block_params = MEGATRON_BLOCK_PARAMS + 2 * (NORM_PARAMS - NORM_PARAMS // 2)
    assert [a.layer.param_count for a in plan.layers] == [4608, block_params, block_params, 64] == [
        4608, 6416, 6416, 64]
    assert plan_tp_token_params(plan, job.model, job.parallel) == {1: {2: 128.0}, 2: {2: 128.0}}
    pricer = Pricer(Calibration())
    compiled = compile_job(job, plan, pricer, "layer")
    held = 4608 + 2 * block_params + 64
    assert compiled.devices[0].static_breakdown["weights"] == held * policy_for("bf16").weight_bytes
    grad = policy_for("bf16").grad_bytes
    synced = [(t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm"]
    assert synced == [
        ("dp all-reduce bucket0 L2.block..L1.block",
         pricer.collective_s("all-reduce", 2 * 128 * grad, job.cluster.group_layout(8, 1), job)),
        ("dp all-reduce bucket1 L3.head..L0.embedding",
         pricer.collective_s("all-reduce", (held - 2 * 128) * grad, pricer.layout("grad", job), job))]


def test_a_norm_whole_under_sp_gathers_its_input_and_all_reduces_its_gradient() -> None:
    """tp 2 with sp, norm1 whole on both ranks: the block's input (split by sequence) is all-gathered before it
    (block.ag), qkv reads its whole output (Megatron's all-gather gone); backward, qkv's partial input gradient is
    all-reduced onto the whole norm (not reduce-scattered) and the block's input gradient sliced. norm1 runs all
    64 tokens and is held whole; no gradient is summed over tp (both ranks ran the same tokens)."""
    job = _job(sp=True)
    plan = _plan(job, {"blocks.*.norm1": 1})
    block = plan.layers[1].layer
    assert _comms(block) == [
        ("block.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES), ("mlp.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES), ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES), ("mlp.rs", "reduce-scatter", "bwd", HIDDEN_BYTES)]
    assert next(op for op in block.fwd if op.name == "norm1").shape == (64 * 32,)
    assert block.param_count == MEGATRON_BLOCK_PARAMS + NORM_PARAMS // 2
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


def test_megatron_s_own_norm_splits_compile_to_the_plain_plan() -> None:
    """A tree writing the norms' Megatron configs (sequence split under sp) rebuilds nothing: the plain plan's
    layers, no gradient summed over tp."""
    job = _job(sp=True)
    plan = _plan(job, dict.fromkeys(TOKEN_OPS, 2))
    plain = _plan(job, {})
    assert [a.layer for a in plan.layers] == [a.layer for a in plain.layers]
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


@pytest.mark.parametrize(("path", "dim", "message"), [
    ("blocks.*.residual1", "reduce", r"residual1 split.compute@tp='reduce=2' is invalid: .*or any split of its "
                                     r"batch, seq, out whose parts divide 2, or none \(the residual1 whole on each "
                                     r"tp rank\)"),
    ("embedding.positions", "reduce", r"pos_add splits nothing over tp; give that, or no tp splits; or any split "
                                      r"of its batch, seq, out whose parts divide 2, or none"),
    ("head.norm", "reduce", r"final_norm splits nothing over tp; give that, or no tp splits; or any split of its "
                            r"batch, seq, out whose parts divide 2, or none"),
    ("embedding.tokens", "seq", r"lookup splits reduce=2 over tp; give that, or no tp splits; or that split over "
                                r"fewer ranks dividing 2, a batch or seq split whose parts divide 2 \(each rank its "
                                r"own tokens from the whole table\), or none"),
])
def test_the_splits_still_refused_name_what_the_op_can_take(path: str, dim: str, message: str) -> None:
    """A residual add, the positions or a norm split by a reduction dimension they have not, and the lookup split
    both by tokens and by rows stay refused, in one line (a norm, a residual add or the positions split by
    features, the head's norm and the positions by tokens are taken: test_shape_layers_norm_features.py,
    test_shape_layers_add_features.py)."""
    job = _job(sp=False)
    tree = StrategyTree.from_parallel(build_transformer(_spec(job), DeviceSlice.of(job.parallel)), job.parallel)
    with pytest.raises(ConfigError, match=message) as info:
        tree.split(path, "compute", dim, 2, axis="tp", override=True).lower(job.parallel)
    assert "\n" not in str(info.value)


def test_the_lookup_by_tokens_holds_the_whole_table_and_sums_its_gradient_over_its_tp_ranks() -> None:
    """An untied GPT without sp, the lookup by sequence over the tp pair: each rank looks up its 32 of the 64
    tokens in the whole table (no partial sums: Megatron's reduce-scatter or all-reduce gone), and the positions'
    add, whole, reads the lookup's halves all-gathered (embed.ag, 4096 bytes). A rank holds the whole table
    (8192 + 1024 parameters, not half the table) and its gradient, made from its own tokens, is summed over the 2
    tp ranks with the 4 dp ranks: a bucket of 8192 parameters over 8 ranks. The head keeps Megatron's split."""
    job = _job(sp=False, tied=False)
    plan = _plan(job, {"embedding.tokens": 2}, whole=(("embedding.tokens", "reduce"),))
    embedding = plan.layers[0].layer
    assert _comms(embedding) == [("embed.ag", "all-gather", "fwd", HIDDEN_BYTES)]
    assert [op.shape for op in embedding.fwd] == [(32 * 32,), (64 * 32,)]
    assert embedding.param_count == 8192 + 1024
    assert _plan(job, {}).layers[0].layer.param_count == (8192 + 1024) / 2
    assert plan_tp_token_params(plan, job.model, job.parallel) == {0: {2: 8192.0}}
    pricer = Pricer(Calibration())
    compiled = compile_job(job, plan, pricer, "layer")
    grad = policy_for("bf16").grad_bytes
    synced = dict((t.name, t.duration_s) for t in compiled.tasks if t.category == "dp_comm")
    assert synced["dp all-reduce bucket1 L0.embedding..L0.embedding"] == pricer.collective_s(
        "all-reduce", 8192 * grad, job.cluster.group_layout(8, 1), job)


def test_the_lookup_by_tokens_under_sp_hands_on_its_sequence_share_without_a_collective() -> None:
    """With sp the lookup's sequence halves are what the positions' add and the first block read: no collective
    at all (Megatron's vocab-parallel lookup reduce-scatters its partial sums)."""
    job = _job(sp=True, tied=False)
    assert _comms(_plan(job, {}).layers[0].layer) == [
        ("embed.rs", "reduce-scatter", "fwd", HIDDEN_BYTES), ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert _comms(_plan(job, {"embedding.tokens": 2}, whole=(("embedding.tokens", "reduce"),)).layers[0].layer) == []


def test_a_tied_table_split_by_tokens_needs_a_whole_projection() -> None:
    """The tiny GPT ties its table to the head: the lookup by tokens holds the table whole, so the projection
    must too (out 1); with Megatron's vocab-parallel projection the tree is refused in one line."""
    job = _job(sp=False)
    with pytest.raises(ConfigError, match=r"ties its embedding table to the head's projection") as info:
        _plan(job, {"embedding.tokens": 2}, whole=(("embedding.tokens", "reduce"),))
    assert "\n" not in str(info.value)
    plan = _plan(job, {"embedding.tokens": 2}, whole=(("embedding.tokens", "reduce"), ("head.proj", "out")))
    assert plan.layers[0].layer.param_count == 8192 + 1024
    assert plan_tp_token_params(plan, job.model, job.parallel) == {0: {2: 8192.0}}

