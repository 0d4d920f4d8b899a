"""An MoE block at Megatron's split over meshes and routings that vary (hypothesis): what the experts compute and
the dispatch moves assume Megatron-Core's defaults, dropless routing to top_k experts (moe_expert_capacity_factor
None, megatron/core/transformer/transformer_config.py, megatron-core 0.9.0 and 0.16.1: no token dropped or
padded), through the all-to-all token dispatcher (megatron/core/transformer/moe/token_dispatcher.py, 0.16.1).

Per rank and micro-batch, T local tokens, k = top_k, h hidden, f ffn, E experts, tp t, bf16 (2 bytes): the router
runs the rank's own tokens (T / t under sp, T without: 2 x tokens x E x h FLOPs); the experts' first matmul runs
all T k routed copies of the tp group's tokens over f / t of their features (2 x T k x f / t x h FLOPs, whatever
ep); the dispatch's all-to-all moves the rank's routed copies with their probabilities (T / t x k x (h + 1) x 2
bytes under sp, T x k x (h + 1) x 2 without), the combine's their outputs (T / t x k x h x 2); under sp the
routed copies are gathered over tp (T k (h + 1) x 2) and their outputs reduce-scattered (T k h x 2), at every
ep.
"""

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TINY_GPT_MODEL_YAML
from trainsim.catalog.model_files import parse_model
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for


@st.composite
def _cases(draw: st.DrawFn) -> tuple[TransformerSpec, DeviceSlice]:
    experts = draw(st.sampled_from([4, 8]))
    top_k = draw(st.sampled_from([1, 2, 4]))
    text = (TINY_GPT_MODEL_YAML.replace("bias: true", "bias: false")
            + f"num_experts: {experts}\ntop_k: {top_k}\nmoe_every: 1\n")
    spec = parse_model(yaml.safe_load(text))
    assert isinstance(spec, TransformerSpec)
    tp = draw(st.sampled_from([1, 2, 4]))
    sp = draw(st.booleans()) and tp > 1
    ep = draw(st.sampled_from([d for d in (1, 2, 4) if experts % d == 0]))
    micro_batch = draw(st.sampled_from([1, 2, 4]))
    dev = DeviceSlice(micro_batch, 32, policy_for("bf16"), tp, sp, 1, ep, "flash2")
    return spec, dev


@settings(max_examples=60, deadline=None)
@given(_cases())
def test_router_experts_and_dispatch_assume_dropless_top_k_routing(case: tuple[TransformerSpec, DeviceSlice]) -> None:
    spec, dev = case
    t, k, h, f = dev.tp, spec.top_k, spec.hidden, spec.ffn_hidden
    tokens = dev.local_tokens
    own = tokens // t if dev.sp else tokens
    block = build_transformer(spec, dev).layers[1]
    assert block.kind == "moe_block"
    flops = {op.name: op.flops for op in block.fwd}
    assert flops["router"] == 2 * own * spec.num_experts * h
    assert flops["fc1"] == 2 * tokens * k * (f // t) * h
    comms = {(c.name, c.phase): c.buffer_bytes for c in block.comms}
    if dev.ep > 1:
        assert comms[("dispatch", "fwd")] == comms[("dispatch", "bwd")] == own * k * (h + 1) * 2
        assert comms[("combine", "fwd")] == comms[("combine", "bwd")] == own * k * h * 2
    else:
        assert not any(c.axis == "ep" for c in block.comms)
    if dev.sp:
        assert comms[("mlp.ag", "fwd")] == comms[("mlp.rs", "bwd")] == tokens * k * (h + 1) * 2
        assert comms[("mlp.rs", "fwd")] == comms[("mlp.ag", "bwd")] == tokens * k * h * 2
