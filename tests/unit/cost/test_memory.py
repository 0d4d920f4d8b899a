"""Memory formulas against their papers, exactly.

Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1-5
and Table 2, per layer for s tokens, b sequences, hidden h, a heads, tensor-parallel size t, 16-bit
activations, GPT with dropout and unfused attention, ffn = 4h:
    no parallelism                 sbh (34 + 5as/h)
    tensor parallel                sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel     sbh/t (34 + 5as/h)
    selective recompute            the same without the 5as/h term (the s x s scores are recomputed)
    full recompute                 2sbh (the layer input only)
Model states: Rajbhandari et al. 2020, "ZeRO", sec. 3 and Figure 1: 2 + 2 + K bytes/param with K = 12 for
mixed-precision Adam (fp32 master weights, momentum, variance); stage 1 shards K, stage 2 also the gradients,
stage 3 also the weights over N data-parallel ranks.
"""

from collections.abc import Callable

import pytest

from trainsim.catalog import load_model
from trainsim.cost.memory import model_state_bytes
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.pipeline import graph_for
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stages import in_flight_micro_batches

B, S = 2, 2048  # micro-batch sequences, sequence length


def _gpt3_175b() -> TransformerSpec:
    spec = load_model("gpt3-175b")
    assert isinstance(spec, TransformerSpec)
    assert (spec.arch, spec.mlp, spec.ffn_hidden, spec.num_kv_heads) == ("gpt", "gelu", 4 * spec.hidden, 0)
    return spec


def _saved(tp: int = 1, sp: bool = False) -> dict[str, float]:
    spec = _gpt3_175b()
    dev = DeviceSlice(B, S, policy_for("bf16"), tp=tp, sp=sp, attention="math")
    block = next(layer for layer in build_transformer(spec, dev).layers if layer.kind == "block")
    return block.saved_bytes


def _sbh_a() -> tuple[int, int]:
    spec = _gpt3_175b()
    return S * B * spec.hidden, spec.num_heads


def test_no_parallelism_sbh_34_plus_5as_over_h() -> None:
    sbh, a = _sbh_a()
    # Korthikanti eq. 2: sbh(34 + 5as/h) = 34 sbh + 5 a s^2 b.
    expected = 34 * sbh + 5 * a * S * S * B
    saved = _saved()
    assert saved["none"] == expected
    assert saved["selective"] == 34 * sbh
    assert saved["full"] == 2 * sbh


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_sbh_10_plus_24_over_t(t: int) -> None:
    sbh, a = _sbh_a()
    # Korthikanti eq. 3: sbh(10 + 24/t + 5as/(ht)); the 10 sbh (norms, dropout) are replicated.
    expected = 10 * sbh + 24 * sbh // t + 5 * a * S * S * B // t
    saved = _saved(tp=t)
    assert saved["none"] == expected
    assert saved["selective"] == 10 * sbh + 24 * sbh // t  # Table 2, selective recompute with TP
    assert saved["full"] == 2 * sbh  # full recompute without SP keeps the whole layer input


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_and_sequence_parallel_sbh_over_t(t: int) -> None:
    sbh, a = _sbh_a()
    # Korthikanti eq. 4: sbh/t (34 + 5as/h); Table 2: selective 34 sbh/t.
    saved = _saved(tp=t, sp=True)
    assert saved["none"] == (34 * sbh + 5 * a * S * S * B) // t
    assert saved["selective"] == 34 * sbh // t
    # NB: with SP the checkpointed layer input is the sequence-sharded hidden state, 2sbh/t.
    assert saved["full"] == 2 * sbh // t


PARAMS = 1.0e9


def _state_per_param(zero: int, dp: int, cp: int = 1, precision: str = "bf16") -> float:
    par = ParallelSpec.parse({"dp": dp, "cp": cp, "zero": zero, "precision": precision})
    return sum(model_state_bytes(PARAMS, par).values()) / PARAMS


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_model_states_16_bytes_per_param(precision: str) -> None:
    # Rajbhandari et al. 2020: 2 (weights) + 2 (gradients) + 12 (fp32 master, momentum, variance) = 16.
    assert _state_per_param(zero=0, dp=8, precision=precision) == 16.0


@pytest.mark.parametrize(("zero", "bytes_of_n"), [
    (0, lambda n: 2 + 2 + 12),
    (1, lambda n: 2 + 2 + 12 / n),  # P_os
    (2, lambda n: 2 + (2 + 12) / n),  # P_os+g
    (3, lambda n: (2 + 2 + 12) / n),  # P_os+g+p
])
@pytest.mark.parametrize("n", [2, 8, 64])
def test_zero_stages(zero: int, bytes_of_n: Callable[[int], float], n: int) -> None:
    assert _state_per_param(zero=zero, dp=n) == pytest.approx(bytes_of_n(n), rel=1e-12)


def test_zero_shards_over_dp_times_cp() -> None:
    # Megatron-LM's distributed optimizer shards over the dp x cp group: dp=4, cp=2 is N=8.
    assert _state_per_param(zero=3, dp=4, cp=2) == pytest.approx(16 / 8, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_1f1b_stage_i_holds_p_minus_i_micro_batches(p: int) -> None:
    # Narayanan et al. 2021 sec. 2.2: 1F1B keeps at most p micro-batches in flight on the first stage.
    m = 4 * p
    assert in_flight_micro_batches("1f1b", 0, p, 1, m) == p
    assert [in_flight_micro_batches("1f1b", i, p, 1, m) for i in range(p)] == [p - i for i in range(p)]
    # With fewer micro-batches than stages, only m exist.
    assert in_flight_micro_batches("1f1b", 0, p, 1, 1) == 1


def test_gpipe_holds_all_micro_batches() -> None:
    assert in_flight_micro_batches("gpipe", 0, 4, 1, 32) == 32
    assert in_flight_micro_batches("gpipe", 3, 4, 1, 32) == 32


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 3), (8, 4), (8, 8)])
def test_interleaved_first_stage_holds_p_plus_p_minus_1_over_v(p: int, v: int) -> None:
    # Korthikanti et al. 2022 sec. 4.2.3: the first stage of the interleaved schedule holds
    # p + (p - 1)/v stages' worth of activations.
    assert in_flight_micro_batches("interleaved-1f1b", 0, p, v, 16 * p) == pytest.approx(p + (p - 1) / v,
                                                                                           rel=1e-12)


def _peak_parts(impl: str, recompute: str = "full", zero: int = 0,
                model: str = "gpt3-6.7b") -> tuple[dict[str, float], float]:
    """The analytical engine's breakdown on one H200 (8 with ZeRO), and the model's parameters."""
    from trainsim.catalog import load_cluster
    from trainsim.estimate.analytical import AnalyticalEstimator
    from trainsim.job import make_job

    gpus = 8 if zero else 1
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 2048, "precision": "amp-bf16", "recompute": recompute,
                              "zero": zero, "optimizer_impl": impl})
    job = make_job(load_model(model), load_cluster("dgx-h200").with_num_gpus(gpus), par)
    estimator = AnalyticalEstimator()
    result = estimator.estimate(job, graph_for(job))
    params = sum(layer.count * layer.param_count for layer in graph_for(job).layers)
    assert sum(result.memory_breakdown.values()) == pytest.approx(result.peak_memory_bytes, rel=1e-12)
    return result.memory_breakdown, params


def test_fused_adam_needs_no_step_memory() -> None:
    parts, _ = _peak_parts("fused")
    assert parts["optimizer_step"] == 0.0 and parts["activations"] > 0.0


def test_foreach_adam_peaks_at_the_step_with_one_fp32_temporary_per_parameter() -> None:
    """torch.optim.AdamW(foreach=True): _foreach_sqrt of the second moments is one fp32 copy of every
    parameter. With full recompute it outgrows the activations, which are freed by then."""
    parts, params = _peak_parts("foreach")
    assert parts["optimizer_step"] == pytest.approx(4.0 * params, rel=1e-12)
    assert parts["activations"] == 0.0 and parts["temporary"] == 0.0


def test_foreach_adam_under_zero_needs_only_its_shard() -> None:
    parts, params = _peak_parts("foreach", zero=1, model="gpt3-13b")
    assert parts["optimizer_step"] == pytest.approx(4.0 * params / 8, rel=1e-12)


def test_the_forward_peak_wins_when_activations_outgrow_the_step() -> None:
    parts, params = _peak_parts("foreach", recompute="none", model="gpt3-125m")
    assert parts["optimizer_step"] == 0.0 and parts["activations"] > 4.0 * params


def _working(recompute: str, attention: str) -> tuple[float, dict[str, float]]:
    from trainsim.cost.memory import _working_bytes
    from trainsim.strategy.stages import StagePart

    spec = _gpt3_175b()
    dev = DeviceSlice(B, S, policy_for("bf16"), attention=attention)  # type: ignore[arg-type]
    block = next(layer for layer in build_transformer(spec, dev).layers if layer.kind == "block")
    par = ParallelSpec(recompute=recompute)  # type: ignore[arg-type]
    return _working_bytes([StagePart(block, 1)], par), block.saved_bytes


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_recompute_working_memory_is_what_the_backward_rebuilds(attention: str) -> None:
    # Full recompute rebuilds the whole block's activations in the backward; selective recompute only the
    # part it dropped (the 5as/h attention term: Korthikanti et al. sec. 5); with a fused attention kernel only
    # its fp32 softmax statistics (one per head and token, Dao et al. 2022, Algorithm 2).
    for recompute, expected in (("none", lambda s: 0.0), ("full", lambda s: s["none"]),
                                ("selective", lambda s: s["none"] - s["selective"])):
        working, saved = _working(recompute, attention)
        assert working == expected(saved)
    working, _ = _working("selective", attention)
    a = _gpt3_175b().num_heads
    assert working == (5 * a * S * S * B if attention == "math" else 4 * a * S * B)


def test_torchtitan_op_level_selective_keeps_the_attention_output_and_every_other_matmul_output() -> None:
    """torchtitan/models/llama3/infra/parallelize.py (0.1.0): the op policy saves mm outputs except every second
    mm and the SDPA output; the checkpoint keeps the block input. Llama: wq wk wv wo w1 w3 w2 -> wq, wv, w1, w2;
    GPT: wq wk wv wo fc1 fc2 -> wq, wv, fc1. Per token, 16-bit: h + h + kv + h + f (+ h) values, plus the fp32
    log-sum-exp per head."""
    llama = load_model("llama3.1-8b")
    assert isinstance(llama, TransformerSpec)
    dev = DeviceSlice(B, S, policy_for("bf16"))
    block = next(layer for layer in build_transformer(llama, dev).layers if layer.kind == "block")
    h, kv, f, tokens = llama.hidden, llama.kv_heads * llama.head_dim, llama.ffn_hidden, B * S
    expected = tokens * 2 * (h + h + kv + h + f + h) + tokens * llama.num_heads * 4
    assert block.saved_bytes["selective_op"] == expected
    assert block.saved_bytes["selective_op"] < block.saved_bytes["selective"]
    saved = _saved()  # GPT-3 175B: multi-head attention (kv = h), fc1 of 4h
    sbh, a = _sbh_a()
    assert saved["selective_op"] == sbh * 2 * (1 + 1 + 1 + 1 + 4) + B * S * a * 4


def test_the_stack_decides_what_selective_recompute_keeps() -> None:
    from trainsim.catalog import load_cluster
    from trainsim.cost.memory import kept_bytes, saved_key
    from trainsim.cost.pricing import Pricer
    from trainsim.job import make_job
    from trainsim.strategy.stack import StackSpec, load_stack

    megatron, titan = StackSpec(), load_stack("fsdp2")
    assert saved_key("selective", megatron) == "selective" and saved_key("selective", titan) == "selective_op"
    assert saved_key("full", titan) == "full" and saved_key("selective", None) == "selective"
    par = ParallelSpec.parse({"micro_batch": 2, "global_batch": 16, "seq_len": 8192, "zero": 3,
                              "recompute": "selective"})
    cluster = load_cluster("dgx-h100-80gb")
    spec = load_model("llama3.1-8b")
    pricer = Pricer()
    peaks = {}
    for stack in (megatron, titan):
        job = make_job(spec, cluster, par, stack)
        graph = graph_for(job)
        stages = pricer.partition(graph, 1).stages
        block = next(part for part in stages[0] if part.layer.kind == "block")
        peaks[stack.selective_recompute] = pricer.memory(stages, job).breakdown["activations"]
        kept = kept_bytes(block.layer, saved_key("selective", stack))
        assert kept == block.layer.saved_bytes["selective_op" if stack is titan else "selective"]
    block_layer = next(layer for layer in graph.layers if layer.kind == "block")
    drop = block_layer.count * (block_layer.saved_bytes["selective"] - block_layer.saved_bytes["selective_op"])
    assert peaks["attention"] - peaks["op"] == pytest.approx(drop, rel=1e-12)


def test_recompute_working_memory_is_a_block_not_the_head() -> None:
    """The embedding and the head are not recomputed (compile/apply_recompute.py): a vocabulary of 128k makes
    the head's fp32 logits larger than a block, and they must not count twice."""
    from trainsim.catalog import load_cluster
    from trainsim.cost.pricing import Pricer
    from trainsim.job import make_job

    par = ParallelSpec.parse({"micro_batch": 2, "global_batch": 16, "seq_len": 8192, "recompute": "full"})
    job = make_job(load_model("llama3.1-8b"), load_cluster("dgx-h100-80gb"), par)
    graph = graph_for(job)
    head = next(layer for layer in graph.layers if layer.kind == "head")
    block = next(layer for layer in graph.layers if layer.kind == "block")
    assert head.saved_bytes["none"] > block.saved_bytes["none"]
    pricer = Pricer()
    memory = pricer.memory(pricer.partition(graph, 1).stages, job)
    assert memory.breakdown["temporary"] == pytest.approx(block.saved_bytes["none"] + head.saved_bytes["none"],
                                                          rel=1e-12)
