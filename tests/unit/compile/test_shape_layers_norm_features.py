"""The head's final norm and the embedding's learned positions at configs over tp other than Megatron's, and a norm
split by its hidden features (compile.shape_layers, strategy.megatron replicable_module "tokens",
_norm_statistics): each shaped at its config, the collectives resharding inserts around it, a norm's statistic
all-reduces, the weights held whole (by tokens: their gradient summed over those tp ranks) or split (by features).

The tiny GPT (tests/conftest.py: hidden 32, 4 heads of 8, ffn 128, vocab 256, max_seq_len 32, tied embeddings,
biases, LayerNorm) at micro-batch 2 x 32 tokens in bf16 on 8 A100s, tp 2 x dp 4: a hidden state of the
micro-batch is 64 tokens x 32 x 2 bytes = 4096 bytes; one fp32 statistic per token 64 x 4 = 256 bytes; a
LayerNorm holds a gain and a bias of 32 each (64 parameters); the position table 32 x 32 = 1024 parameters, the
token table 256 x 32 = 8192; Megatron's embedding holds half of both (4608), its block 6352 parameters per tp rank.
"""


from conftest import comm_rows, forward_op, tiny_tp_job, tp_split_plan
from trainsim.catalog.calibration import Calibration
from trainsim.compile.build import compile_job
from trainsim.compile.splits import plan_mesh_comms, plan_tp_token_params
from trainsim.cost.pricing import Pricer, axis_layout
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.precision import policy_for

HIDDEN_BYTES = 64 * 32 * 2
STATISTIC_BYTES = 64 * 4
NORM_PARAMS = 2 * 32
POSITION_PARAMS = 32 * 32
TABLE_PARAMS = 256 * 32
MEGATRON_BLOCK_PARAMS = 6352
LOSS = [("loss.max", "all-reduce", "fwd", STATISTIC_BYTES), ("loss.target", "all-reduce", "fwd", STATISTIC_BYTES),
        ("loss.sum_exp", "all-reduce", "fwd", STATISTIC_BYTES)]


def _spec(job: Job) -> TransformerSpec:
    assert isinstance(job.model, TransformerSpec)
    return job.model


def _tp_task_s(job: Job, plan: LoweredPlan, layer: str, name: str) -> float:
    """The duration of micro-batch 0's tp collective task `name` of `layer`, compiled at op level."""
    graph = compile_job(job, plan, Pricer(Calibration()), "op")
    return next(t.duration_s for t in graph.tasks if t.category == "tp_comm" and t.micro_batch == 0
                and t.layer == layer and t.name.split(" mb")[0] == name)


def test_the_head_norm_split_by_sequence_without_sp_gathers_the_logits_input() -> None:
    """tp 2 without sp, the final norm on half the tokens: it slices its tokens of the whole hidden state (no
    collective), the vocab-parallel projection reads its input whole: all-gathered (logits.ag, 4096 bytes);
    backward, the projection's partial input gradient is reduce-scattered onto the norm's tokens (logits.rs, not
    Megatron's all-reduce) and the head's input gradient all-gathered (logits.ag). The norm runs 32 x 32 elements,
    keeps its input at half the tokens (2048 bytes fewer), is held whole (64 parameters, as the head always holds
    it) and its gradient is summed over the tp pair with the dp ranks."""
    job = tiny_tp_job(sp=False)
    megatron = tp_split_plan(job, []).layers[3].layer
    plan = tp_split_plan(job, [("head.norm", "seq", 2)])
    head = plan.layers[3].layer
    assert comm_rows(megatron) == [("logits.ar", "all-reduce", "bwd", HIDDEN_BYTES), *LOSS]
    assert comm_rows(head) == [
        ("logits.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("logits.rs", "reduce-scatter", "bwd", HIDDEN_BYTES), ("logits.ag", "all-gather", "bwd", HIDDEN_BYTES),
        *LOSS]
    assert plan_mesh_comms(plan, job.model, job.parallel)[3] == head.comms
    assert forward_op(head, "final_norm").shape == (32 * 32,)
    assert forward_op(megatron, "final_norm").shape == (64 * 32,)
    assert megatron.saved_bytes["none"] - head.saved_bytes["none"] == 32 * 32 * 2 == 2048
    assert head.param_count == megatron.param_count == NORM_PARAMS
    assert plan_tp_token_params(plan, job.model, job.parallel) == {3: {2: float(NORM_PARAMS)}}
    layout = axis_layout("tp", job.parallel, job.cluster)
    pricer = Pricer(Calibration())
    assert _tp_task_s(job, plan, "L3.head", "logits.ag all-gather") == pricer.collective_s(
        "all-gather", HIDDEN_BYTES, layout, job)


def test_the_head_norm_whole_under_sp_all_reduces_the_logits_input_gradient() -> None:
    """With sp, the final norm whole on both ranks: the head's input (split by sequence) is all-gathered before
    it and the projection reads it whole (Megatron's all-gather moves before the norm); backward, the projection's
    partial input gradient is all-reduced onto the whole norm and the head's input gradient sliced. Both ranks run
    the same 64 tokens: no gradient summed over tp."""
    job = tiny_tp_job(sp=True)
    assert comm_rows(tp_split_plan(job, []).layers[3].layer)[:2] == [
        ("logits.ag", "all-gather", "fwd", HIDDEN_BYTES), ("logits.rs", "reduce-scatter", "bwd", HIDDEN_BYTES)]
    plan = tp_split_plan(job, [("head.norm", "seq", 1)])
    head = plan.layers[3].layer
    assert comm_rows(head) == [("logits.ag", "all-gather", "fwd", HIDDEN_BYTES),
                            ("logits.ar", "all-reduce", "bwd", HIDDEN_BYTES), *LOSS]
    assert forward_op(head, "final_norm").shape == (64 * 32,)
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


def test_the_positions_by_tokens_hold_the_whole_table_and_sum_its_gradient_over_their_tp_ranks() -> None:
    """tp 2 without sp, the positions' add on half the tokens: the lookup's partial sums are reduce-scattered onto
    its tokens (embed.rs, not Megatron's all-reduce), the block reads the whole hidden state: all-gathered
    (embed.ag); backward, the block's input gradient is sliced and the positions' all-gathered for the lookup
    (embed.ag). Each rank holds the whole position table (1024 parameters; the token table's half, 4096, as
    Megatron's), its gradient summed over the 2 tp ranks with the 4 dp ranks: a bucket of 1024 parameters over 8
    ranks; the weight memory holds 512 parameters more than Megatron's."""
    job = tiny_tp_job(sp=False)
    plan = tp_split_plan(job, [("embedding.positions", "seq", 2)])
    embedding = plan.layers[0].layer
    assert comm_rows(embedding) == [("embed.rs", "reduce-scatter", "fwd", HIDDEN_BYTES),
                                 ("embed.ag", "all-gather", "fwd", HIDDEN_BYTES),
                                 ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert [op.shape for op in embedding.fwd] == [(64 * 32,), (32 * 32,)]
    assert embedding.param_count == TABLE_PARAMS / 2 + POSITION_PARAMS == 5120
    assert tp_split_plan(job, []).layers[0].layer.param_count == (TABLE_PARAMS + POSITION_PARAMS) / 2 == 4608
    assert plan_tp_token_params(plan, job.model, job.parallel) == {0: {2: float(POSITION_PARAMS)}}
    pricer = Pricer(Calibration())
    compiled = compile_job(job, plan, pricer, "layer")
    plain = compile_job(job, tp_split_plan(job, []), pricer, "layer")
    weight = policy_for("bf16").weight_bytes
    assert compiled.devices[0].static_breakdown["weights"] - plain.devices[0].static_breakdown["weights"] == (
        POSITION_PARAMS / 2 * weight)
    synced = {t.name: t.duration_s for t in compiled.tasks if t.category == "dp_comm"}
    assert synced["dp all-reduce bucket1 L0.embedding..L0.embedding"] == pricer.collective_s(
        "all-reduce", POSITION_PARAMS * policy_for("bf16").grad_bytes, job.cluster.group_layout(8, 1), job)


def test_the_positions_whole_under_sp_read_the_lookup_all_reduced() -> None:
    """With sp, the positions' add whole on both ranks (a config of none): the lookup's partial sums are
    all-reduced (embed.ar, not Megatron's reduce-scatter) and the whole sum sliced for the first block; backward,
    the block's input gradient all-gathered (embed.ag). The table is held whole, no gradient summed over tp."""
    job = tiny_tp_job(sp=True)
    plan = tp_split_plan(job, [("embedding.positions", "seq", 1)])
    embedding = plan.layers[0].layer
    assert comm_rows(embedding) == [("embed.ar", "all-reduce", "fwd", HIDDEN_BYTES),
                                 ("embed.ag", "all-gather", "bwd", HIDDEN_BYTES)]
    assert embedding.param_count == TABLE_PARAMS / 2 + POSITION_PARAMS
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


def test_a_block_norm_split_by_features_all_reduces_its_statistics() -> None:
    """tp 2 without sp, norm1 on half the hidden features of every token: it slices its features of the whole
    hidden state (no collective); its mean and variance need the sums of x and x^2 over all features, partial over
    the pair: two fp32 all-reduces of one value per token (256 bytes; Colossal-AI's 2D LayerNorm); qkv reads its
    input whole: all-gathered (attn.ag). Backward, qkv's partial input gradient is reduce-scattered onto the norm's
    features (attn.rs), the norm's two backward sums (of dy' and dy' x xhat) all-reduced, and the block's input
    gradient all-gathered from the feature halves (block.ag). norm1 runs 64 x 16 elements and holds half its gain
    and bias (the block's 6352 parameters, as Megatron's count); nothing is summed over tp."""
    job = tiny_tp_job(sp=False)
    plan = tp_split_plan(job, [("blocks.*.norm1", "out", 2)])
    block = plan.layers[1].layer
    assert comm_rows(block) == [
        ("norm1.sum", "all-reduce", "fwd", STATISTIC_BYTES), ("norm1.sum_sq", "all-reduce", "fwd", STATISTIC_BYTES),
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("mlp.ar", "all-reduce", "fwd", HIDDEN_BYTES),
        ("attn.rs", "reduce-scatter", "bwd", HIDDEN_BYTES),
        ("norm1.sum_dy", "all-reduce", "bwd", STATISTIC_BYTES),
        ("norm1.sum_dy_xhat", "all-reduce", "bwd", STATISTIC_BYTES),
        ("block.ag", "all-gather", "bwd", HIDDEN_BYTES),
        ("mlp.ar", "all-reduce", "bwd", HIDDEN_BYTES)]
    assert all(c.ranks == 0 for c in block.comms)  # over the whole tp pair
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms
    assert forward_op(block, "norm1").shape == (64 * 16,)
    assert block.param_count == MEGATRON_BLOCK_PARAMS
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}
    megatron = tp_split_plan(job, []).layers[1].layer
    assert megatron.saved_bytes["none"] - block.saved_bytes["none"] == 64 * 16 * 2  # norm1's input, half of it
    layout = axis_layout("tp", job.parallel, job.cluster)
    assert _tp_task_s(job, plan, "L1.block", "norm1.sum_sq all-reduce") == Pricer(Calibration()).collective_s(
        "all-reduce", STATISTIC_BYTES, layout, job)


def test_an_rmsnorm_split_by_features_all_reduces_one_statistic_each_way() -> None:
    """RMSNorm needs the sum of x^2 only, and in the backward the sum of dy' x xhat (derived: LayerNorm's with the
    mean terms dropped): one all-reduce each way. The head's norm split by features, read whole by the projection:
    its input sliced, its output all-gathered (logits.ag), the gradient reduce-scattered (logits.rs) and the head's
    input gradient all-gathered; the norm holds half its gain (16 of 32 parameters)."""
    job = tiny_tp_job(sp=False, norm="rmsnorm")
    plan = tp_split_plan(job, [("head.norm", "out", 2)])
    head = plan.layers[3].layer
    assert comm_rows(head) == [
        ("final_norm.sum_sq", "all-reduce", "fwd", STATISTIC_BYTES), ("logits.ag", "all-gather", "fwd", HIDDEN_BYTES),
        ("logits.rs", "reduce-scatter", "bwd", HIDDEN_BYTES),
        ("final_norm.sum_dy_xhat", "all-reduce", "bwd", STATISTIC_BYTES),
        ("logits.ag", "all-gather", "bwd", HIDDEN_BYTES), *LOSS]
    assert head.param_count == 32 / 2
    assert plan_tp_token_params(plan, job.model, job.parallel) == {}


def test_a_norm_split_by_features_and_sequence_over_tp_4_all_reduces_over_its_feature_pair() -> None:
    """tp 4 without sp, norm2 split 2 ways by sequence and 2 by features: each rank normalises 32 tokens' 16
    features; the statistics are partial over the 2 ranks of a feature pair only: all-reduces over a sub-group of
    2 ranks of one value per token of the rank's 32 (128 bytes). Its half gain and bias (32 parameters) are
    summed over the 2 sequence ranks with the dp ranks."""
    job = tiny_tp_job(sp=False, tp=4)
    plan = tp_split_plan(job, [("blocks.*.norm2", "seq", 2), ("blocks.*.norm2", "out", 2)])
    block = plan.layers[1].layer
    stats = [(c.name, c.phase, c.buffer_bytes, c.ranks) for c in block.comms if c.name.startswith("norm2.")]
    assert stats == [("norm2.sum", "fwd", 32 * 4, 2), ("norm2.sum_sq", "fwd", 32 * 4, 2),
                     ("norm2.sum_dy", "bwd", 32 * 4, 2), ("norm2.sum_dy_xhat", "bwd", 32 * 4, 2)]
    assert forward_op(block, "norm2").shape == (32 * 16,)
    assert plan_tp_token_params(plan, job.model, job.parallel) == {1: {2: NORM_PARAMS / 2},
                                                                   2: {2: NORM_PARAMS / 2}}


def test_a_norm_split_by_features_under_sp_reads_the_sequence_split_by_all_to_all() -> None:
    """With sp the block's input arrives split by sequence; norm1 split by features (sequence whole) reads it by
    an all-to-all over the pair (block.a2a: a rank's 2048 bytes), and in the backward its input gradient goes
    back the same way. The rest as Megatron's sp: qkv all-gathers, the projection reduce-scatters."""
    job = tiny_tp_job(sp=True)
    plan = tp_split_plan(job, [("blocks.*.norm1", "seq", 1), ("blocks.*.norm1", "out", 2)])
    block = plan.layers[1].layer
    assert comm_rows(block)[:5] == [
        ("block.a2a", "all-to-all", "fwd", HIDDEN_BYTES / 2),
        ("norm1.sum", "all-reduce", "fwd", STATISTIC_BYTES), ("norm1.sum_sq", "all-reduce", "fwd", STATISTIC_BYTES),
        ("attn.ag", "all-gather", "fwd", HIDDEN_BYTES), ("attn.rs", "reduce-scatter", "fwd", HIDDEN_BYTES)]
    assert ("block.a2a", "all-to-all", "bwd", HIDDEN_BYTES / 2) in comm_rows(block)
    assert forward_op(block, "norm1").shape == (64 * 16,)
