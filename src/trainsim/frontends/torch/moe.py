"""Mixture-of-experts blocks in a fake-tensor capture: the routing assumption the torch front-end traces, and
expert parallelism on the captured graph.

Hugging Face's sparse MoE experts (MixtralExperts, transformers/models/mixtral/modeling_mixtral.py, transformers
5.x) pick each expert's tokens from the router's top-k indices (one_hot, nonzero, where): shapes that depend on
the data, which fake tensors cannot size. The capture keeps the router as the model runs it (its linear, softmax,
top-k and renormalisation on fake tensors: static shapes) and replaces the experts' token selection by balanced
routing, the assumption the catalog front-end prices (frontends.catalog.transformer._mlp_ops: every expert runs
T k / E of the T tokens' k routed copies; dropless, as Megatron-Core's default capacity factor None): routed copy
j (token j // k, its slot j % k) goes to expert j // (T k / E). Each expert gathers its tokens (an index op), runs
gate_up, the activation and down on them, scales them by their routing weights and adds them back into the
output (index_add), as the model's own loop does, inside a parameter-free child module `experts.slots.E`: every
op of expert E carries that module path (the op log names ops by module), so the expert ops group per expert.

Expert parallelism (ep > 1, tp = 1): a rank holds E / ep experts (their weights only) and, routing balanced, receives
T k routed copies from its ep group, T k ep / E per local expert, so the capture traces E / ep experts of that many
rows each. The block becomes an MoE block (Layer.experts: the experts' parameters, their gradient summed over the
expert data-parallel group) with the all-to-alls over ep Megatron-Core's all-to-all dispatcher runs, priced as the
catalog prices them (strategy.megatron.ep_token_comms: the dispatch of T k h with the probabilities, the combine of
T k h, each way). NB: the router's weight is counted whole on every rank (the catalog counts it 1 / ep with the
experts).
"""

import dataclasses
import types
from typing import Any

import torch
from torch import nn

from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import expert_shard
from trainsim.ir.graph import Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.megatron import ep_token_comms

_EXPERT_PATH = "experts.slots."
_LAYOUT = ("the torch front-end traces experts with fused gate_up_proj and down_proj weights and no bias "
           "(Mixtral's layout) only")


class _ExpertSlot(nn.Module):
    """One expert's computation on its tokens: their gather, gate_up, the activation, down, the routing weights'
    scaling and the add back into the output (no parameters: the weights stay the experts module's 3D ones)."""

    def forward(self, experts: Any, weights: tuple[torch.Tensor, torch.Tensor], hidden_states: torch.Tensor,
                token_idx: torch.Tensor, routing_weights: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        gate_up, down = weights
        gate, up = nn.functional.linear(hidden_states[token_idx], gate_up).chunk(2, dim=-1)
        # act_fn.forward, not act_fn(...): its ops stay on this expert's module path
        routed = nn.functional.linear(experts.act_fn.forward(gate) * up, down)
        return output.index_add_(0, token_idx, (routed * routing_weights[:, None]).to(output.dtype))


def mixtral_config(spec: TransformerSpec) -> dict[str, Any]:
    """A catalog mixture of experts as a Mixtral config.json mapping: every block an MoE of num_experts routed
    experts at ffn_hidden (Mixtral's intermediate_size), no shared experts, LLaMA's attention, norms and MLP."""
    shape = (spec.mlp, spec.norm, spec.position, spec.bias, spec.moe_every, spec.leading_dense_layers,
             spec.shared_expert_ffn_hidden, spec.expert_ffn, spec.mla)
    if shape != ("swiglu", "rmsnorm", "rope", False, 1, 0, 0, spec.ffn_hidden, None):
        raise ConfigError(f"model {spec.name}", "moe", "the torch front-end maps Mixtral-shaped mixtures of experts "
                          "(swiglu/rmsnorm/rope, no bias, every block an MoE of routed experts at ffn_hidden, no "
                          "shared experts, no latent attention)")
    return {"model_type": "mixtral", "_name_or_path": spec.name, "num_hidden_layers": spec.num_layers,
            "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden,
            "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.kv_heads,
            "vocab_size": spec.vocab, "max_position_embeddings": spec.max_seq_len,
            "tie_word_embeddings": spec.tied_embeddings, "num_local_experts": spec.num_experts,
            "num_experts_per_tok": spec.top_k}


def moe_layers(graph: OpGraph, spec: TransformerSpec, dev: DeviceSlice) -> OpGraph:
    """The captured graph (traced at ep: with_balanced_routing) with each layer running experts an MoE block: its
    experts' parameters on a rank (Layer.experts), the whole layer's in full_param_count, and the all-to-alls over
    ep (module doc). A graph in which no layer ran balanced-routing experts (a model whose experts
    with_balanced_routing did not recognise, traced as its own code runs them) is refused: it would be priced
    without its experts' shard and all-to-alls."""
    if not any(_EXPERT_PATH in op.module_path for layer in graph.layers for op in layer.fwd):
        raise ConfigError(f"model {spec.name}", "experts", _LAYOUT)
    shard = expert_shard(spec, dev, 1)  # the rank's E / ep experts, as the catalog counts them

    def moe(layer: Layer) -> Layer:
        if not any(_EXPERT_PATH in op.module_path for op in layer.fwd):
            return layer
        return dataclasses.replace(layer, kind="moe_block", comms=layer.comms + ep_token_comms(spec, dev),
                                   full_param_count=layer.full_param_count + (dev.ep - 1) * shard.params,
                                   experts=shard)

    return dataclasses.replace(graph, layers=tuple(moe(layer) for layer in graph.layers))


def expert_of(module_path: str) -> int | None:
    """The expert an op of a captured MoE runs for (its index among the rank's experts), None for any other op."""
    _, found, tail = module_path.partition(_EXPERT_PATH)
    return int(tail.split(".", 1)[0]) if found else None


def is_moe_config(config: Any) -> bool:
    return int(getattr(config, "num_local_experts", 1) or 1) > 1


def with_balanced_routing(model: nn.Module, ep: int = 1) -> nn.Module:
    """The model with every Mixtral-style experts module (3D gate_up_proj and down_proj, num_experts) tracing
    balanced routing (module doc), holding E / ep of its experts (one rank of an ep group: its first E / ep, their
    weights only) which run all T k routed copies a rank receives (T k ep / E each); call under FakeTensorMode.
    A module holding experts of another layout, or a model with no such module, is refused."""
    patched = 0
    for path, found in list(model.named_modules()):
        if not path.endswith("experts") or not hasattr(found, "num_experts"):
            continue
        module: Any = found
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or getattr(
                module, "has_bias", False) or getattr(module, "is_transposed", False):
            raise ConfigError("model", type(module).__name__, _LAYOUT)
        experts = int(module.num_experts)
        if experts % ep:
            raise ConfigError("ep", ep, f"must divide the number of experts ({experts})")
        local = experts // ep
        if local < experts:
            module.gate_up_proj = nn.Parameter(torch.empty(local, *gate_up.shape[1:], dtype=gate_up.dtype))
            module.down_proj = nn.Parameter(torch.empty(local, *down.shape[1:], dtype=down.dtype))
        module.add_module("slots", nn.ModuleList(_ExpertSlot() for _ in range(local)))
        module.forward = types.MethodType(_balanced_forward, module)
        patched += 1
    if not patched:
        raise ConfigError("model", type(model).__name__, _LAYOUT)
    return model


def _balanced_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor) -> torch.Tensor:
    tokens, top_k = hidden_states.shape[0], top_k_index.shape[-1]
    experts = len(self.slots)  # this rank's: the T k routed copies it receives split evenly among them
    if tokens * top_k % experts:
        raise ConfigError("micro_batch x seq_len", tokens, f"balanced routing needs tokens x top_k ({top_k}) "
                          f"divisible by the experts a rank holds ({experts})")
    rows = tokens * top_k // experts
    copies = torch.arange(tokens * top_k, device=hidden_states.device)
    token_of, slot_of = copies // top_k, copies % top_k
    output = torch.zeros_like(hidden_states)
    # each expert's weights: views of the 3D weights made once (their gradient written once, as a grouped GEMM
    # writes it), not HF's eager gate_up_proj[e] per expert, whose backward adds E whole-weight gradients
    weights = list(zip(self.gate_up_proj.unbind(0), self.down_proj.unbind(0), strict=True))
    for expert, slot in enumerate(self.slots):
        token_idx = token_of[expert * rows:(expert + 1) * rows]
        slot_idx = slot_of[expert * rows:(expert + 1) * rows]
        output = slot(self, weights[expert], hidden_states, token_idx, top_k_weights[token_idx, slot_idx], output)
    return output
