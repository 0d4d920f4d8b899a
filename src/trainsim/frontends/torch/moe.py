"""Mixture-of-experts blocks in a fake-tensor capture: the routing assumption the torch front-end traces.

Hugging Face's sparse MoE experts (MixtralExperts, transformers/models/mixtral/modeling_mixtral.py, transformers
5.x) pick each expert's tokens from the router's top-k indices (one_hot, nonzero, where): shapes that depend on
the data, which fake tensors cannot size. The capture keeps the router as the model runs it (its linear, softmax,
top-k and renormalisation, on fake tensors: the shapes are static) and replaces the experts' token selection by
balanced routing, the assumption the catalog front-end prices (every expert runs T k / E of the T tokens' k
routed copies: frontends.catalog.transformer._mlp_ops): routed copy j (token j // k, its slot j % k) goes to
expert j // (T k / E). Each expert then gathers its tokens (an index op), runs gate_up, the activation and down
on them, scales by its routing weights and adds back into the output (index_add), as the model's own loop does.

Each expert runs inside a parameter-free child module `experts.E` so that its ops carry the module path
`...experts.E` (the op log names ops by module), and the experts' ops can be grouped per expert.
"""

import types
from typing import Any

import torch
from torch import nn

from trainsim.errors import ConfigError

ROUTING = "balanced (every expert runs T k / E routed token copies, as the catalog prices)"


class _ExpertSlot(nn.Module):
    """One expert's computation on its tokens (no parameters: the weights stay the experts module's 3D ones)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, experts: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        gate, up = nn.functional.linear(tokens, experts.gate_up_proj[self.index]).chunk(2, dim=-1)
        # act_fn.forward, not act_fn(...): its ops stay on this expert's module path
        return nn.functional.linear(experts.act_fn.forward(gate) * up, experts.down_proj[self.index])


def is_moe_config(config: Any) -> bool:
    return int(getattr(config, "num_local_experts", 1) or 1) > 1


def with_balanced_routing(model: nn.Module) -> nn.Module:
    """The model with every Mixtral-style experts module (3D gate_up_proj and down_proj, num_experts) tracing
    balanced routing (module doc); a module holding experts of another layout is refused."""
    for path, module in list(model.named_modules()):
        if not path.endswith("experts") or not hasattr(module, "num_experts"):
            continue
        if not isinstance(getattr(module, "gate_up_proj", None), torch.Tensor) or getattr(module, "has_bias", False):
            raise ConfigError("model", type(module).__name__, "the torch front-end traces experts with fused "
                              "gate_up_proj and down_proj weights and no bias (Mixtral's layout) only")
        slots = nn.ModuleList(_ExpertSlot(e) for e in range(int(module.num_experts)))
        module.add_module("slots", slots)
        module.forward = types.MethodType(_balanced_forward, module)
    return model


def _balanced_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor) -> torch.Tensor:
    tokens, top_k = hidden_states.shape[0], top_k_index.shape[-1]
    experts = int(self.num_experts)
    if tokens * top_k % experts:
        raise ConfigError("micro_batch x seq_len", tokens, f"balanced routing needs tokens x top_k ({top_k}) "
                          f"divisible by the number of experts ({experts})")
    rows = tokens * top_k // experts
    copies = torch.arange(tokens * top_k, device=hidden_states.device)
    token_of, slot_of = copies // top_k, copies % top_k
    output = torch.zeros_like(hidden_states)
    for expert, slot in enumerate(self.slots):
        token_idx = token_of[expert * rows:(expert + 1) * rows]
        slot_idx = slot_of[expert * rows:(expert + 1) * rows]
        routed = slot(self, hidden_states[token_idx]) * top_k_weights[token_idx, slot_idx, None]
        output.index_add_(0, token_idx, routed.to(output.dtype))
    return output
