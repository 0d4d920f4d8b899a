"""A block's residual adds, the embedding's learned positions and BERT's token types and embedding norm split by
their hidden features over tp (compile.shape_layers, strategy.megatron replicable_module "tokens", _skip_reshards):
each rank adds (or normalises) its h / out slice of every token's features; an add needs no statistics, a norm its
all-reduced sums (_norm_statistics); the resharding around them comes out of layer_comms' walk: the add's inputs
(the producer's output and the skip input the block's norm reads) and its output's reader (the next op, or the
block's hand-on).

The tiny GPT (tests/conftest.py: hidden 32, 4 heads of 8, ffn 128, vocab 256, max_seq_len 32, tied embeddings,
biases, LayerNorm) at micro-batch 2 x 32 tokens in bf16 on 8 A100s, tp 2 x dp 4: a hidden state of the
micro-batch is 64 tokens x 32 x 2 bytes = 4096 bytes; the position table 32 x 32 = 1024 parameters, the token
table 256 x 32 = 8192; Megatron's block holds 6352 parameters per tp rank. The tiny BERT is the same model with
BERT's embedding (2 token types of 32, a LayerNorm of 64 parameters).
"""

import pytest

from conftest import comm_rows, forward_op, tiny_tp_job, tp_split_plan
from trainsim.catalog.calibration import Calibration
from trainsim.compile.build import compile_job
from trainsim.compile.splits import plan_mesh_comms, plan_tp_token_params
from trainsim.cost.pricing import Pricer, axis_layout
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import StrategyTree

HIDDEN_BYTES = 64 * 32 * 2
STATISTIC_BYTES = 64 * 4
POSITION_PARAMS = 32 * 32
TABLE_PARAMS = 256 * 32
MEGATRON_BLOCK_PARAMS = 6352


def test_the_last_residual_add_split_by_features_reduce_scatters_fc2_and_gathers_what_the_block_hands_on() -> None:
    """tp 2 without sp, residual2 adding its half of each token's features: fc2's partial sums are
    reduce-scattered onto those features (mlp.rs, not Megatron's all-reduce), its skip input (residual1's whole
    output) sliced, and the block hands on the whole hidden state: the halves all-gathered (block.ag). Backward,
    the handed gradient is sliced; fc2's output gradient is all-gathered from the add's halves (mlp.ag), and so
    is the skip's gradient before it is summed with norm2's whole input gradient (block.ag). residual2 runs
    64 x 16 elements; no weights, no gradient summed over tp."""
    job = tiny_tp_job(sp=False)
    plan = tp_split_plan(job, [("blocks.*.residual2", "out", 2)])
    block = plan.layers[1].layer
    assert comm_rows(block) == [
        ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES), ("mlp.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("block.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES), ("block.ag", "all-gather", "bwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES), ("mlp.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    assert all(c.ranks == 0 for c in block.comms)  # over the whole tp pair
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms
    assert forward_op(block, "residual2").shape == (64 * 16,)
    assert forward_op(block, "residual1").shape == (64 * 32,)
    assert block.param_count == MEGATRON_BLOCK_PARAMS
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}
    graph = compile_job(job, plan, Pricer(Calibration()), "op")
    gather = next(t for t in graph.tasks if t.category == "tp_comm" and t.micro_batch == 0 and t.layer == "L1.block"
                  and t.name.split(" mb")[0] == "block.ag all-gather")
    assert gather.duration_s == Pricer(Calibration()).collective_s(
        "all-gather", HIDDEN_BYTES, axis_layout("tp", job.parallel, job.cluster), job)


def test_the_first_residual_add_split_by_features_gathers_for_norm2_and_the_skip_gradient() -> None:
    """tp 2 without sp, residual1 by features: the projection's partial sums reduce-scattered onto its halves
    (attn.rs), norm2 reads the sum whole: all-gathered (block.ag); residual2's skip input is then read whole as
    norm2 reads it (no collective). Backward: the projection's output gradient all-gathered from the add's halves
    (attn.ag), the skip's half gradient all-gathered before the sum with norm1's whole input gradient
    (block.ag)."""
    job = tiny_tp_job(sp=False)
    block = tp_split_plan(job, [("blocks.*.residual1", "out", 2)]).layers[1].layer
    assert comm_rows(block) == [
        ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES), ("block.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("mlp.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES), ("attn.ar", "all-reduce", "bwd", HIDDEN_BYTES),
        ("block.ag", "all-gather", "bwd", HIDDEN_BYTES), ("mlp.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    assert forward_op(block, "residual1").shape == (64 * 16,)


def test_a_residual_add_split_by_features_under_sp_exchanges_its_skip_input_by_all_to_all() -> None:
    """With sp, residual2 by features (sequence whole): fc2's partial sums reduce-scattered onto its features
    (mlp.rs), its skip input (residual1's output, split by sequence) exchanged by all-to-all (block.a2a: a rank's
    2048 bytes), and the block hands on the sequence split by all-to-all again; backward the same two exchanges
    back, fc2's output gradient all-gathered from the halves (mlp.ag, as Megatron's sp)."""
    job = tiny_tp_job(sp=True)
    block = tp_split_plan(job, [("blocks.*.residual2", "seq", 1), ("blocks.*.residual2", "out", 2)]).layers[1].layer
    assert comm_rows(block) == [
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
        ("mlp.ag", "all-gather", "fwd", HIDDEN_BYTES), ("block.a2a", "all-to-all", "fwd", HIDDEN_BYTES / 2),
        ("mlp.rs", "reduce-scatter", "fwd", HIDDEN_BYTES), ("block.a2a", "all-to-all", "fwd", HIDDEN_BYTES / 2),
        ("attn.ag", "all-gather", "bwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "bwd", HIDDEN_BYTES),
        ("block.a2a", "all-to-all", "bwd", HIDDEN_BYTES / 2), ("block.a2a", "all-to-all", "bwd", HIDDEN_BYTES / 2),
        ("mlp.ag", "all-gather", "bwd", HIDDEN_BYTES), ("mlp.rs", "reduce-scatter", "bwd", HIDDEN_BYTES)]


def test_norms_and_adds_split_alike_pay_no_skip_collective() -> None:
    """tp 2 without sp, both norms and both adds by features: each add reads its skip input as its block's norm
    does, so no collective moves it (the walk's gathers only: qkv's and fc1's inputs, the hand-on)."""
    job = tiny_tp_job(sp=False)
    paths = ("blocks.*.norm1", "blocks.*.residual1", "blocks.*.norm2", "blocks.*.residual2")
    block = tp_split_plan(job, [(path, "out", 2) for path in paths]).layers[1].layer
    assert [(name, phase) for name, _, phase, _ in comm_rows(block) if name.startswith("block.")] == [
        ("block.ag", "fwd"), ("block.ag", "bwd")]


def test_the_positions_split_by_features_hold_their_table_slice_and_sum_no_gradient_over_tp() -> None:
    """tp 4 without sp, the positions' add on half of each token's features (2 parts; each pair of tp ranks
    repeats it): the lookup's partial sums (over 4) all-reduced and sliced (strategy.reshard's pattern: no
    reduce-scatter where the destination splits fewer parts than the partial sums), the block reads the whole
    hidden state: all-gathered over each pair; backward the positions' half gradient all-gathered over each pair
    for the lookup. Each rank holds
    half the position table (512 parameters; Megatron's count: a quarter, 256): 256 parameters more weight memory;
    no gradient summed over tp (plan_tp_token_params empty), the dp gradient bucket as large as a rank holds."""
    job = tiny_tp_job(sp=False, tp=4)
    plan = tp_split_plan(job, [("embedding.positions", "out", 2)])
    embedding = plan.layers[0].layer
    assert comm_rows(embedding) == [("embed.ar", "all-reduce", "fwd", HIDDEN_BYTES),
                                 ("embed.ag", "all-gather", "fwd", HIDDEN_BYTES),
                                 ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert [c.ranks for c in embedding.comms] == [0, 2, 2]  # over tp 4, then the feature halves' pairs
    assert forward_op(embedding, "pos_add").shape == (64 * 16,)
    assert embedding.param_count == TABLE_PARAMS / 4 + POSITION_PARAMS / 2 == 2560
    assert tp_split_plan(job, []).layers[0].layer.param_count == (TABLE_PARAMS + POSITION_PARAMS) / 4 == 2304
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}
    pricer = Pricer(Calibration())
    compiled = compile_job(job, plan, pricer, "layer")
    plain = compile_job(job, tp_split_plan(job, []), pricer, "layer")
    weight = policy_for("bf16").weight_bytes
    assert compiled.devices[0].static_breakdown["weights"] - plain.devices[0].static_breakdown["weights"] == (
        (2560 - 2304) * weight)


def test_the_positions_by_tokens_and_features_sum_their_slice_over_the_token_ranks() -> None:
    """tp 4 without sp, the positions split 2 ways by sequence and 2 by features: each rank holds half the table
    (512 parameters), its gradient summed over the 2 sequence ranks with the dp ranks."""
    job = tiny_tp_job(sp=False, tp=4)
    plan = tp_split_plan(job, [("embedding.positions", "seq", 2), ("embedding.positions", "out", 2)])
    assert forward_op(plan.layers[0].layer, "pos_add").shape == (32 * 16,)
    assert plan_tp_token_params(plan, job.model, job.parallel) == {0: {2: POSITION_PARAMS / 2}}


def test_bert_token_types_and_embedding_norm_split_by_features() -> None:
    """The tiny BERT, tp 2 without sp: the token types' add by features reads the positions' whole sum sliced
    (no collective) and the embedding norm reads it whole: all-gathered (embed.ag); the norm by features
    all-reduces its LayerNorm statistics (norm.sum, norm.sum_sq; backward norm.sum_dy, norm.sum_dy_xhat). Each
    holds half its parameters (the 64 of the token types, the norm's 64: Megatron's count too); no gradient
    summed over tp. By sequence, the norm holds its gain and bias whole, their gradient summed over the pair."""
    job = tiny_tp_job(sp=False, arch="bert")
    megatron = tp_split_plan(job, []).layers[0].layer
    types = tp_split_plan(job, [("embedding.token_types", "out", 2)])
    assert comm_rows(types.layers[0].layer) == [
        ("embed.ar", "all-reduce", "fwd", HIDDEN_BYTES), ("embed.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert forward_op(types.layers[0].layer, "type_add").shape == (64 * 16,)
    norm = tp_split_plan(job, [("embedding.norm", "out", 2)])
    assert comm_rows(norm.layers[0].layer) == [
        ("embed.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("norm.sum", "all-reduce", "fwd", STATISTIC_BYTES), ("norm.sum_sq", "all-reduce", "fwd", STATISTIC_BYTES),
        ("embed.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("norm.sum_dy", "all-reduce", "bwd", STATISTIC_BYTES),
        ("norm.sum_dy_xhat", "all-reduce", "bwd", STATISTIC_BYTES),
        ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert types.layers[0].layer.param_count == norm.layers[0].layer.param_count == megatron.param_count == (
        TABLE_PARAMS + POSITION_PARAMS + 64 + 64) / 2
    assert plan_tp_token_params(types, job.model, job.parallel) == plan_tp_token_params(
        norm, job.model, job.parallel) == {}
    by_tokens = tp_split_plan(job, [("embedding.norm", "seq", 2)])
    assert by_tokens.layers[0].layer.param_count == megatron.param_count + 64 / 2
    assert plan_tp_token_params(by_tokens, job.model, job.parallel) == {0: {2: 64.0}}


@pytest.mark.parametrize(("arch", "path", "dim", "message"), [
    ("gpt", "blocks.*.residual2", "reduce", r"residual2 split.compute@tp='reduce=2' is invalid: .*or any split of "
                                            r"its batch, seq, out whose parts divide 2, or none"),
    ("bert", "embedding.token_types", "reduce", r"type_add splits nothing over tp; give that, or no tp splits; or "
                                                r"any split of its batch, seq, out whose parts divide 2, or none"),
    ("bert", "embedding.norm", "reduce", r"norm splits nothing over tp; give that, or no tp splits; or any split "
                                         r"of its batch, seq, out whose parts divide 2, or none"),
])
def test_an_add_or_a_norm_split_by_a_reduction_dimension_is_refused(arch: str, path: str, dim: str,
                                                                     message: str) -> None:
    """An add or a norm has no reduction dimension to split: refused in one line naming what it can take."""
    job = tiny_tp_job(sp=False, arch=arch)
    assert isinstance(job.model, TransformerSpec)
    tree = StrategyTree.from_parallel(build_transformer(job.model, DeviceSlice.of(job.parallel)), job.parallel)
    with pytest.raises(ConfigError, match=message) as info:
        tree.split(path, "compute", dim, 2, axis="tp", override=True).lower(job.parallel)
    assert "\n" not in str(info.value)
