"""DeepSeek's block structure priced as it is: multi-head latent attention (ir.model_spec.MlaSpec, Megatron-Core's
MLASelfAttention split over tp, megatron-core 0.16.1) and leading dense blocks (first_k_dense_replace) beside MoE
blocks of their own expert FFN width.

The tiny model: hidden 32, 4 heads, RMSNorm, SwiGLU, no biases; MLA with q_lora_rank 16, kv_lora_rank 8,
qk_nope_head_dim 4, qk_rope_head_dim 2, v_head_dim 4 (a query or key head 6 wide); 4 blocks, the first 2 dense
(ffn 64), the others 4 experts of width 16, top-2. A micro-batch of 2 sequences of 32 tokens: T = 64 tokens.

By hand, per block (tp 1):
- parameters held whole over tp: q_down 32 x 16 + q_norm 16 + kv_down 32 x (8 + 2) + kv_norm 8 = 856;
  split over tp: q_up 16 x 4 x 6 = 384, kv_up 8 x 4 x (4 + 4) = 256, out 4 x 4 x 32 = 512: 1152; the two block
  norms 2 x 32 = 64; a dense MLP 3 x 32 x 64 = 6144; an MoE's 4 experts 4 x 3 x 32 x 16 = 6144 + router 32 x 4.
- forward FLOPs: q_down 2 T 16 32 = 65536, kv_down 2 T 10 32 = 40960, q_up 2 T 24 16 = 49152, kv_up 2 T 32 8 =
  32768, core 2 x (2 x 4 heads) x 32 x 32 x (6 + 4) / 2 (causal, fused) = 81920, out 2 T 32 16 = 65536:
  335872; a dense MLP 2 T 128 32 + 2 T 32 64 = 786432; the experts on T k = 128 routed tokens 2 x 128 x 32 x 32
  + 2 x 128 x 32 x 16 = 393216 and the router 2 T 4 32 = 16384.
"""

from typing import Any

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.compile.splits import plan_tp_token_params
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.frontends.catalog.transformer import block_layer, build_transformer
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig
from trainsim.strategy.stages import plan_stages

MLA = {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4}
TINY: dict[str, Any] = {"name": "tiny-deepseek", "arch": "llama", "num_layers": 4, "hidden": 32, "ffn_hidden": 64,
                        "num_heads": 4, "vocab": 64, "max_seq_len": 32, "mlp": "swiglu", "norm": "rmsnorm",
                        "position": "rope", "bias": False, "tied_embeddings": False, "num_experts": 4, "top_k": 2,
                        "expert_ffn_hidden": 16, "leading_dense_layers": 2, "mla": MLA}
ATTN_WHOLE, ATTN_SPLIT, NORMS, MLP = 856, 1152, 64, 6144
ATTN_FLOPS, DENSE_MLP_FLOPS, EXPERT_FLOPS, ROUTER_FLOPS = 335872, 786432, 393216, 16384


def _job(**settings: Any) -> tuple[Job, OpGraph]:
    spec = TransformerSpec(**{**TINY, **settings.pop("model", {})})
    schedule = {"schedule": "interleaved-1f1b"} if settings.get("vpp", 1) > 1 else {}
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 32, **schedule, **settings})
    return make_job(spec, a100_cluster(8), par), build_transformer(spec, DeviceSlice.of(par))


def _flops(layer_ops: tuple[Any, ...], names: tuple[str, ...]) -> float:
    return sum(op.flops for op in layer_ops if op.name in names)


def test_a_latent_attention_block_has_its_hand_counted_flops_and_parameters() -> None:
    _, graph = _job()
    dense, moe = graph.layers[1], graph.layers[2]
    assert (dense.kind, dense.count, moe.kind, moe.count) == ("block", 2, "moe_block", 2)
    attention = ("q_down", "kv_down", "q_up", "kv_up", "attention", "out_proj")
    assert _flops(dense.fwd, attention) == ATTN_FLOPS
    assert _flops(moe.fwd, attention) == ATTN_FLOPS
    assert _flops(dense.fwd, ("gate_up", "down")) == DENSE_MLP_FLOPS  # the dense blocks' own width, 64
    assert _flops(moe.fwd, ("gate_up", "down")) == EXPERT_FLOPS  # the experts' width, 16
    assert _flops(moe.fwd, ("router",)) == ROUTER_FLOPS
    assert dense.full_param_count == ATTN_WHOLE + ATTN_SPLIT + NORMS + MLP
    assert moe.full_param_count == ATTN_WHOLE + ATTN_SPLIT + NORMS + MLP + 32 * 4
    assert dense.param_count == dense.full_param_count  # tp 1: every rank holds it all


def test_over_tp_the_down_projections_stay_whole_and_the_up_projections_split_the_heads() -> None:
    """tp 2, sp: each rank runs the down-projections and latent norms on its 32-token sequence share with their
    whole weights, and the up-projections on all 64 tokens for its 2 heads; the latents (16 + 10 features) are
    all-gathered over tp forward and reduce-scattered backward (q_up: 64 x 16 x 2 = 2048 bytes, kv_up: 64 x 10 x
    2 = 1280), the output projection's reduce-scatter and the MLP's pair move the hidden state (64 x 32 x 2)."""
    job, graph = _job(tp=2, dp=4, sp=True)
    dense = graph.layers[1]
    # their weights' gradient sum over tp is left out, as the norms' (strategy.megatron.token_split_params)
    assert plan_tp_token_params(default_plan(graph, job.parallel), job.model, job.parallel) == {}
    shapes = {op.name: op.shape for op in dense.fwd if op.kind == "matmul"}
    assert shapes["q_down"] == (1, 32, 16, 32) and shapes["kv_down"] == (1, 32, 10, 32)
    assert shapes["q_up"] == (1, 64, 12, 16) and shapes["kv_up"] == (1, 64, 16, 8)
    assert shapes["out_proj"] == (1, 64, 32, 8)
    assert dense.param_count == ATTN_WHOLE + (ATTN_SPLIT + NORMS + MLP) / 2
    tp = [(c.name, c.collective, c.phase, c.buffer_bytes) for c in dense.comms if c.axis == "tp"]
    assert tp[:3] == [("attn.ag", "all-gather", "fwd", 2048.0), ("attn.ag", "all-gather", "fwd", 1280.0),
                      ("attn.rs", "reduce-scatter", "fwd", 4096.0)]
    assert [(c.name, c.buffer_bytes) for c in dense.comms if c.phase == "bwd" and c.name.startswith("attn")] == [
        ("attn.ag", 4096.0), ("attn.rs", 1280.0), ("attn.rs", 2048.0)]  # as the backward pass meets them
    assert [c.column_input for c in dense.comms if c.phase == "fwd"][:2] == ["q_up", "kv_up"]


def test_without_sp_the_latents_gradient_is_all_reduced_and_nothing_gathered() -> None:
    _, graph = _job(tp=2, dp=4, sp=False)
    comms = [(c.name, c.collective, c.phase, c.buffer_bytes) for c in graph.layers[1].comms]
    assert comms == [("attn.ar", "all-reduce", "fwd", 4096.0), ("mlp.ar", "all-reduce", "fwd", 4096.0),
                     ("attn.ar", "all-reduce", "bwd", 1280.0), ("attn.ar", "all-reduce", "bwd", 2048.0),
                     ("mlp.ar", "all-reduce", "bwd", 4096.0)]


def test_without_a_query_latent_one_query_projection_reads_the_hidden_state() -> None:
    """q_lora_rank 0 (DeepSeek-V2-Lite): q_proj 32 x 4 x 6 = 768 parameters, 2 T 24 32 FLOPs."""
    _, graph = _job(model={"mla": {**MLA, "q_lora_rank": 0}})
    dense = graph.layers[1]
    assert [op.name for op in dense.fwd][:6] == ["norm1", "kv_down", "kv_norm", "q_proj", "kv_up", "rope"]
    assert _flops(dense.fwd, ("q_proj",)) == 2 * 64 * 24 * 32
    assert dense.full_param_count == 32 * 10 + 8 + 768 + 256 + 512 + NORMS + MLP


def test_the_leading_dense_blocks_go_to_the_first_stages_in_both_engines() -> None:
    """pp 2: rank 0 holds the 2 dense blocks, rank 1 the 2 MoE ones; pp 2 x vpp 2 (a block per virtual stage,
    virtual stage c x 2 + r on rank r): each rank holds one dense block (virtual stages 0 and 1) and one MoE."""
    for vpp, expected in ((1, [{"block": 2.0}, {"moe_block": 2.0}]),
                          (2, [{"block": 1.0, "moe_block": 1.0}, {"block": 1.0, "moe_block": 1.0}])):
        job, graph = _job(pp=2, vpp=vpp, ep=2, dp=4)
        stages = plan_stages(graph, job.parallel)
        assert [{p.layer.kind: p.count for p in stage if p.layer.kind != "embedding" and p.layer.kind != "head"}
                for stage in stages] == expected
        assignments = default_plan(graph, job.parallel).layers
        assert [(a.layer.kind, a.stage, a.chunk) for a in assignments[1:-1]] == [
            ("block", 0, 0), ("block", 0 if vpp == 1 else 1, 0), ("moe_block", 1 if vpp == 1 else 0, vpp - 1),
            ("moe_block", 1, vpp - 1)]


@pytest.mark.parametrize("settings", [{"tp": 2, "ep": 2, "sp": True, "zero": 1},
                                      {"tp": 2, "ep": 2, "pp": 2, "sp": False},
                                      {"tp": 2, "ep": 2, "pp": 2, "vpp": 2, "sp": True, "zero": 1},
                                      {"ep": 2, "pp": 2, "zero": 2}, {"tp": 2, "ep": 2, "cp": 2, "sp": True},
                                      {"tp": 2, "ep": 2, "pp": 2, "sp": True,
                                       "model": {"shared_expert_ffn_hidden": 16, "mla": {**MLA, "q_lora_rank": 0}}}])
def test_engines_agree_with_runtime_effects_off(settings: dict[str, Any]) -> None:
    job, graph = _job(**settings)
    analytical = AnalyticalEstimator(Pricer(Calibration())).estimate(job, graph)
    sim = SimEstimator(Pricer(Calibration()), overlap=False, sharing=False).estimate(job, graph)
    assert sim.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.02)
    assert sim.peak_memory_bytes == pytest.approx(analytical.peak_memory_bytes, rel=0.02)


def test_shared_experts_run_every_token_split_over_tp_and_are_no_expert_parameters() -> None:
    """A shared expert of width 16 (Megatron-Core's SharedExpertMLP): 3 x 32 x 16 = 1536 parameters, held split
    over tp beside the routed experts' ep share, not among the expert shard; 2 T 32 32 + 2 T 32 16 = 196608
    forward FLOPs on all 64 tokens. Under sp at tp 2 it gathers the hidden state before its first matmul and
    reduce-scatters its output (64 x 32 x 2 = 4096 bytes each), before the router."""
    shared = {"shared_expert_ffn_hidden": 16}
    _, plain = _job(tp=2, ep=2, sp=True)
    _, graph = _job(tp=2, ep=2, sp=True, model=shared)
    moe, before = graph.layers[2], plain.layers[2]
    assert moe.full_param_count == before.full_param_count + 1536
    assert moe.param_count == before.param_count + 1536 / 2
    assert moe.experts == before.experts
    assert [op.module_path for op in moe.fwd if "shared" in op.module_path] == [
        "blocks.moe_block.shared.mlp.gate_up", "blocks.moe_block.shared.mlp.act", "blocks.moe_block.shared.mlp.down"]
    _, whole = _job(model=shared)
    assert _flops(whole.layers[2].fwd, ("gate_up", "down")) == EXPERT_FLOPS + 196608
    added = [(c.name, c.collective, c.phase, c.buffer_bytes) for c in moe.comms if c not in before.comms]
    assert added == [("mlp.ag", "all-gather", "fwd", 4096.0), ("mlp.rs", "reduce-scatter", "fwd", 4096.0),
                     ("mlp.ag", "all-gather", "bwd", 4096.0), ("mlp.rs", "reduce-scatter", "bwd", 4096.0)]
    assert moe.saved_bytes["none"] == before.saved_bytes["none"] + 64 * 8 * 3 * 2  # gate, up, product at 16 / 2


def test_the_spec_refuses_what_it_cannot_price() -> None:
    with pytest.raises(ValueError, match="leading_dense_layers=2 needs num_experts > 1, moe_every=1"):
        TransformerSpec(**{**TINY, "moe_every": 2})
    with pytest.raises(ValueError, match="mla needs position=rope"):
        TransformerSpec(**{**TINY, "position": "learned"})
    spec = TransformerSpec(**TINY)
    dev = DeviceSlice.of(ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "tp": 2}))
    with pytest.raises(ConfigError, match="multi-head latent attention"):
        block_layer(spec, dev, 1, False, frozenset({("out_proj", OpConfig(1, 1, 1, 1))}))


def test_active_parameters_count_the_experts_at_their_width() -> None:
    """Two MoE blocks of 4 experts top-2 at width 16: 2 x 2 x 3 x 32 x 16 idle expert weights."""
    assert TransformerSpec(**TINY).idle_expert_params == 2 * 2 * 3 * 32 * 16
