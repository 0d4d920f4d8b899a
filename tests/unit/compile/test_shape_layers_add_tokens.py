"""A block's residual add split by tokens (batch or sequence) over tp while the norm reading the same skip input is
split otherwise (compile.shape_layers, strategy.megatron _skip_reshards; Proteus Sec. IV-B: a split on any op
takes effect, Sec. V-B: the collective each layout change needs): the add's second input, the skip connection,
is the tensor its block's norm reads (the block's input for residual1, residual1's sum for residual2). Forward,
it is resharded from the tensor's layout onto the add's where the add reads it otherwise than the norm (a slice
from a whole tensor: free; an all-gather from sp's sequence halves); backward, the add's input gradient is
resharded onto the tensor's gradient layout before it is summed with the norm's (an all-gather from the add's
token halves; a slice onto sp's halves: free) - the path a residual add split by features takes
(test_shape_layers_add_features.py).

The tiny GPT (tests/conftest.py: hidden 32, 4 heads, ffn 128, LayerNorm, biases) at micro-batch 2 x 32 tokens in
bf16 on 8 A100s, tp 2 x dp 4: a hidden state of the micro-batch is 64 tokens x 32 x 2 bytes = 4096 bytes (H).
"""


from conftest import comm_rows, forward_op, tiny_tp_job, tp_split_plan
from trainsim.catalog.calibration import Calibration
from trainsim.compile.build import compile_job
from trainsim.compile.splits import plan_mesh_comms
from trainsim.cost.pricing import Pricer, axis_layout

H = 64 * 32 * 2.0


def test_the_last_add_by_sequence_beside_a_whole_norm_gathers_its_skip_gradient() -> None:
    """tp 2 without sp, residual2 on half the sequence, norm2 (Megatron's, no sp) whole: forward, fc2's partial
    sums reduce-scattered onto the add's halves (mlp.rs), the skip input (residual1's whole output, as norm2 reads
    it) sliced - no collective - and the halves gathered for the hand-on (block.ag). Backward, the handed gradient
    sliced; fc2's output gradient gathered from the add's halves (mlp.ag) and so is the skip's: one all-gather of
    H (block.ag, bwd) before it is summed with norm2's whole input gradient. The op-level task of that gather
    takes the Pricer's all-gather time of H over the tp pair."""
    job = tiny_tp_job(sp=False)
    plan = tp_split_plan(job, [("blocks.*.residual2", "seq", 2)])
    block = plan.layers[1].layer
    assert comm_rows(block) == [
        ("attn.ar", "all-reduce", "fwd", H), ("mlp.rs", "reduce-scatter", "fwd", H),
        ("block.ag", "all-gather", "fwd", H),
        ("attn.ar", "all-reduce", "bwd", H), ("block.ag", "all-gather", "bwd", H),
        ("mlp.ag", "all-gather", "bwd", H), ("mlp.ar", "all-reduce", "bwd", H)]
    assert all(c.ranks == 0 for c in block.comms)  # over the whole tp pair
    assert plan_mesh_comms(plan, job.model, job.parallel)[1] == block.comms
    assert forward_op(block, "residual2").shape == (32 * 32,)
    assert forward_op(block, "norm2").shape == (64 * 32,)
    pricer = Pricer(Calibration())
    tasks = [t for t in compile_job(job, plan, pricer, "op").tasks
             if t.micro_batch == 0 and t.layer == "L1.block" and t.category == "tp_comm"]
    gathers = [t for t in tasks if t.name.startswith("block.ag all-gather")]
    assert len(tasks) == 7 and len(gathers) == 2 and tasks[-1] is gathers[1]  # the skip's: the block's last
    assert {t.duration_s for t in gathers} == {
        pricer.collective_s("all-gather", H, axis_layout("tp", job.parallel, job.cluster), job)}


def test_the_first_add_by_sequence_gathers_the_skip_gradient_for_norm1() -> None:
    """tp 2 without sp, residual1 on half the sequence, norm1 whole: the skip input (the block's whole input)
    sliced forward; backward its half gradient all-gathered (block.ag, H) before the sum with norm1's whole one,
    besides the walk's: the projection's partial sums reduce-scattered (attn.rs), norm2's whole read gathered
    (block.ag, fwd), the projection's output gradient gathered (attn.ag)."""
    job = tiny_tp_job(sp=False)
    block = tp_split_plan(job, [("blocks.*.residual1", "seq", 2)]).layers[1].layer
    assert comm_rows(block) == [
        ("attn.rs", "reduce-scatter", "fwd", H), ("block.ag", "all-gather", "fwd", H),
        ("mlp.ar", "all-reduce", "fwd", H),
        ("attn.ag", "all-gather", "bwd", H), ("attn.ar", "all-reduce", "bwd", H),
        ("block.ag", "all-gather", "bwd", H), ("mlp.ar", "all-reduce", "bwd", H)]


def test_a_whole_add_under_sp_gathers_its_skip_input_forward() -> None:
    """With sp, residual2 whole (seq 1) while norm2 takes Megatron's sequence halves: the skip input (residual1's
    halves) all-gathered forward (block.ag, fwd, H) for the add; backward its whole gradient sliced onto the
    halves (no collective). fc2's partial sums all-reduced onto the whole add (mlp.ar); the hand-on slices; its
    gradient gathered (block.ag, bwd)."""
    job = tiny_tp_job(sp=True)
    block = tp_split_plan(job, [("blocks.*.residual2", "seq", 1)]).layers[1].layer
    assert comm_rows(block) == [
        ("attn.ag", "all-gather", "fwd", H), ("attn.rs", "reduce-scatter", "fwd", H),
        ("mlp.ag", "all-gather", "fwd", H), ("block.ag", "all-gather", "fwd", H),
        ("mlp.ar", "all-reduce", "fwd", H),
        ("attn.ag", "all-gather", "bwd", H), ("attn.rs", "reduce-scatter", "bwd", H),
        ("block.ag", "all-gather", "bwd", H), ("mlp.rs", "reduce-scatter", "bwd", H)]


def test_an_add_by_batch_beside_a_norm_by_sequence_gathers_each_gradient_once() -> None:
    """tp 2 without sp, norm2 on half the sequence, residual2 on half the batch: the skip input (residual1's
    whole output) is sliced both ways forward; backward the add's batch-half gradient is gathered (block.ag) and
    so is norm2's sequence-half one (block.ag, the walk's) before they are summed: two all-gathers of H."""
    job = tiny_tp_job(sp=False)
    block = tp_split_plan(job, [("blocks.*.norm2", "seq", 2), ("blocks.*.residual2", "batch", 2)]).layers[1].layer
    assert [(name, phase) for name, _, phase, _ in comm_rows(block) if name.startswith("block.")] == [
        ("block.ag", "fwd"), ("block.ag", "bwd"), ("block.ag", "bwd")]
    assert {size for name, _, _, size in comm_rows(block) if name.startswith("block.")} == {H}


def test_adds_and_norms_split_alike_by_sequence_pay_no_skip_collective() -> None:
    """tp 2 without sp, both norms and both adds on half the sequence (norm16's per-op sequence parallelism):
    each add reads its skip input as its norm does, so no collective moves it: the block collectives are the
    walk's, the hand-on's halves gathered forward and, backward, norm1's and residual1's summed gradient halves
    gathered once for the block's whole input."""
    job = tiny_tp_job(sp=False)
    paths = ("blocks.*.norm1", "blocks.*.residual1", "blocks.*.norm2", "blocks.*.residual2")
    block = tp_split_plan(job, [(path, "seq", 2) for path in paths]).layers[1].layer
    assert [(name, phase) for name, _, phase, _ in comm_rows(block) if name.startswith("block.")] == [
        ("block.ag", "fwd"), ("block.ag", "bwd")]
