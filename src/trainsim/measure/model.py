"""A job's transformer built in plain PyTorch from its TransformerSpec, whole or as pipeline chunks.

GPT layout: LayerNorm, GeLU MLP, learned positions, biases, tied input/output embedding. LLaMA layout: RMSNorm,
SwiGLU MLP, rotary positions, no biases, grouped-query attention, untied head. The spec's flags pick each part,
so any catalog transformer (MPT/BLOOM with ALiBi, BERT without a causal mask) builds from the same pieces.
Q, K and V are separate projections (as torchtitan writes them) so tensor parallelism shards whole heads;
Megatron's fused QKV GEMM has the same FLOPs.

A chunk holds the layers of one pipeline stage: the first adds the embedding, the last the final norm and the
output head. Layers keep their global index as their name (`layers.7`), so parameter names match across splits.
Imported only where torch is available (measure workers).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.launch import MEASURED_ATTENTION
from trainsim.measure.unfused_attention import unfused_attention
from trainsim.strategy.parallel import AttentionKernel, Recompute
from trainsim.strategy.stage_plan import unit_kind

INIT_STD = 0.02  # GPT-2 / Megatron init of every weight matrix
# Megatron's attention dropout (megatron-core 0.9.0 transformer_config.py: attention_dropout = 0.1; Megatron-LM's
# --attention-dropout default), applied to the probabilities by its unfused CoreAttention
MATH_ATTENTION_DROPOUT = 0.1
ROPE_THETA = 10000.0


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Which part of the model one pipeline chunk holds: layers [first_layer, end_layer), embedding, head."""

    first_layer: int
    end_layer: int
    has_embedding: bool
    has_head: bool


def split_layers(num_layers: int, num_chunks: int, blocks_per_chunk: Sequence[int] = ()) -> list[ChunkPlan]:
    """Contiguous layer ranges, one per virtual stage: blocks_per_chunk (the strategy's split,
    strategy.stages.virtual_stage_blocks) or equal ranges (num_chunks must divide num_layers)."""
    counts = list(blocks_per_chunk) or [num_layers // num_chunks] * num_chunks
    starts = [sum(counts[:i]) for i in range(num_chunks + 1)]
    return [ChunkPlan(starts[i], starts[i + 1], i == 0, i == num_chunks - 1) for i in range(num_chunks)]


def _norm(spec: TransformerSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden, eps=1e-5)
    return nn.LayerNorm(spec.hidden, bias=spec.bias)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Press et al. 2022 (ALiBi), sec. 3: geometric slopes 2^(-8 i / n); non-powers of two interleave the next."""
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8.0 * (i + 1) / closest) for i in range(closest)]
    if closest < num_heads:
        extra = [2 ** (-4.0 * (2 * i + 1) / closest) for i in range(num_heads - closest)]
        slopes += extra
    return torch.tensor(slopes)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al. 2021) in the half-split form of GPT-NeoX and Hugging Face LLaMA."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    """Self-attention. The number of heads is read from the projection outputs, so the same code runs on the
    local heads of a tensor-parallel rank; head_offset (set by tensor parallelism) places ALiBi slopes."""

    cos: torch.Tensor  # rope buffers [max_seq_len, head_dim / 2]
    sin: torch.Tensor
    slopes: torch.Tensor  # alibi buffer [num_heads]

    def __init__(self, spec: TransformerSpec, recompute: Recompute, kernel: AttentionKernel = "flash2") -> None:
        super().__init__()
        if kernel not in MEASURED_ATTENTION:
            raise ValueError(f"attention kernel {kernel!r} is not measured ({', '.join(MEASURED_ATTENTION)} are)")
        hd = spec.head_dim
        self.kernel = kernel
        self.head_dim = hd
        self.q = nn.Linear(spec.hidden, spec.num_heads * hd, bias=spec.bias)
        self.k = nn.Linear(spec.hidden, spec.kv_heads * hd, bias=spec.bias)
        self.v = nn.Linear(spec.hidden, spec.kv_heads * hd, bias=spec.bias)
        self.o = nn.Linear(spec.num_heads * hd, spec.hidden, bias=spec.bias)
        self.causal = spec.causal
        self.position = spec.position
        self.selective = recompute == "selective"
        self.head_offset = 0
        if spec.position == "rope":
            inv = 1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
            angles = torch.outer(torch.arange(spec.max_seq_len, dtype=torch.float32), inv)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)
        if spec.position == "alibi":
            self.register_buffer("slopes", alibi_slopes(spec.num_heads), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "math":
            return self._forward_unfused(x)
        b, s, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x))
        if self.position == "rope":
            cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.selective:  # Korthikanti et al. 2022, sec. 4.2: recompute the attention core only
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        assert isinstance(y, torch.Tensor)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [d0, d1, hidden] -> q, k, v [d0, d1, heads, head_dim] (this rank's heads), in x's leading layout."""
        d0, d1, _ = x.shape
        q, k, v = (proj(x).view(d0, d1, -1, self.head_dim) for proj in (self.q, self.k, self.v))
        return q, k, v

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        if self.position != "alibi":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._alibi(q.shape[1], q.shape[2], q)[None],
                                              enable_gqa=gqa)

    def _forward_unfused(self, x: torch.Tensor) -> torch.Tensor:
        """Megatron's unfused core in its [s, b, heads, d] layout (megatron-core 0.9.0 attention.py), where the
        heads' batched GEMMs read q, k and v in place; x is turned to [s, b, h] once (Megatron runs in it)."""
        s = x.shape[1]
        q, k, v = self._qkv(x.transpose(0, 1).contiguous())
        if self.position == "rope":
            cos, sin = self.cos[:s, None, None].to(q.dtype), self.sin[:s, None, None].to(q.dtype)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.selective:
            y = checkpoint(self._unfused_core, q, k, v, use_reentrant=False)
        else:
            y = self._unfused_core(q, k, v)
        assert isinstance(y, torch.Tensor)
        return self.o(y)

    def _unfused_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        bias = self._alibi(q.shape[2], q.shape[0], q) if self.position == "alibi" else None
        return unfused_attention(q, k, v, self.causal, bias, MATH_ATTENTION_DROPOUT if self.training else 0.0)

    def _alibi(self, heads: int, s: int, like: torch.Tensor) -> torch.Tensor:
        """[heads, s, s] ALiBi score bias of this rank's heads, with the causal mask in it."""
        slopes = self.slopes[self.head_offset:self.head_offset + heads].to(like.dtype)
        pos = torch.arange(s, device=like.device)
        distance = (pos[None, :] - pos[:, None]).to(like.dtype)  # j - i: <= 0 at and below the diagonal
        bias = slopes[:, None, None] * distance[None]
        if self.causal:
            bias = bias.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        return bias


class MLP(nn.Module):
    """GeLU MLP (up, down) or SwiGLU (gate, up, down; Shazeer 2020)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.swiglu = spec.mlp == "swiglu"
        self.up = nn.Linear(spec.hidden, spec.ffn_hidden, bias=spec.bias)
        self.gate = nn.Linear(spec.hidden, spec.ffn_hidden, bias=spec.bias) if self.swiglu else None
        self.down = nn.Linear(spec.ffn_hidden, spec.hidden, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class MoE(nn.Module):
    """Top-k gated experts (GShard, Lepikhin et al. 2020, sec. 2.2; Mixtral's top-2 of 8, Jiang et al. 2024, sec.
    2.1), each the model's MLP (GeLU or SwiGLU, with the model's biases), dropless: no capacity limit. Each
    expert's output is scaled by its routing probability, as the catalog prices it (no renormalisation of the
    top-k probabilities)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.top_k = spec.top_k
        self.router = nn.Linear(spec.hidden, spec.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(spec) for _ in range(spec.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        gates = F.softmax(self.router(flat), dim=-1)
        weight, expert = gates.topk(self.top_k, dim=-1)
        out = torch.zeros_like(flat)
        for e, mlp in enumerate(self.experts):
            rows, slot = (expert == e).nonzero(as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, mlp(flat[rows]) * weight[rows, slot, None])
        return out.reshape(x.shape)


class Block(nn.Module):
    """Pre-norm transformer layer; with `experts` the MLP is a mixture of experts (MoE)."""

    def __init__(self, spec: TransformerSpec, recompute: Recompute, experts: bool = False,
                 attention: AttentionKernel = "flash2") -> None:
        super().__init__()
        self.attn_norm = _norm(spec)
        self.attn = Attention(spec, recompute, attention)
        self.mlp_norm = _norm(spec)
        self.mlp: nn.Module = MoE(spec) if experts else MLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Embedding(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.max_seq_len, spec.hidden) if spec.position == "learned" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        return x


class Head(nn.Module):
    """Final norm and output projection. With tied embeddings in the same chunk the projection reads the
    embedding's weight (kept as an unregistered reference, so wrappers see one parameter, not two)."""

    tied_to: nn.Embedding | None

    def __init__(self, spec: TransformerSpec, tied_to: nn.Embedding | None) -> None:
        super().__init__()
        self.norm = _norm(spec)
        self.weight = None if tied_to is not None else nn.Parameter(torch.empty(spec.vocab, spec.hidden))
        object.__setattr__(self, "tied_to", tied_to)

    def forward(self, x: torch.Tensor) -> Any:
        x = self.norm(x)
        weight = self._weight()
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(weight, DTensor):  # vocab-parallel head: logits come out sharded on the vocab
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, weight.device_mesh, [Replicate()], run_check=False)
            x = x.redistribute(placements=[Replicate()])
        return F.linear(x, weight)

    def _weight(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        assert self.tied_to is not None
        return self.tied_to.weight  # after FSDP2's all-gather, the embedding's current (unsharded) parameter


class TransformerChunk(nn.Module):
    """Layers [first_layer, end_layer) of the model, with the embedding and/or the head where the plan says.
    With `experts`, the model's MoE layers (every moe_every-th block, strategy.stage_plan.unit_kind) get an MoE
    MLP, seeded with the rest of their layer; without, every layer is dense (measure.stage swaps its own in)."""

    def __init__(self, spec: TransformerSpec, plan: ChunkPlan, recompute: Recompute, seed: int = 0,
                 experts: bool = False, attention: AttentionKernel = "flash2") -> None:
        super().__init__()
        self.embed = Embedding(spec) if plan.has_embedding else None
        self.layers = nn.ModuleDict({str(i): Block(spec, recompute, experts and unit_kind(spec, i + 1) == "moe_block",
                                                   attention)
                                     for i in range(plan.first_layer, plan.end_layer)})
        tied = self.embed.tok if (spec.tied_embeddings and self.embed is not None) else None
        self.head = Head(spec, tied) if plan.has_head else None
        self.full_recompute = recompute == "full"
        # Megatron keeps a copy of a tied embedding on the last pipeline stage and all-reduces its gradient
        # with the first stage's (Shoeybi et al. 2019); these chunks take part in that all-reduce.
        self.embedding_grad_sync = spec.tied_embeddings and plan.has_embedding != plan.has_head
        self._init_weights(seed)

    def forward(self, x: torch.Tensor) -> Any:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.layers.values():
            if self.full_recompute:
                x = checkpoint(block, x, use_reentrant=False)  # type: ignore[assignment]
            else:
                x = block(x)
        if self.head is not None:
            return self.head(x)
        return x

    def tied_weight(self) -> torch.Tensor | None:
        """The parameter whose gradient is all-reduced between the first and the last pipeline stage."""
        if not self.embedding_grad_sync:
            return None
        if self.embed is not None:
            return self.embed.tok.weight
        assert self.head is not None and self.head.weight is not None
        return self.head.weight


    def _init_weights(self, seed: int) -> None:
        """Seeded per part (embedding, each layer by its global index, head), so a model split into pipeline
        chunks or sharded for tensor parallelism starts from exactly the weights of the whole model. An untied
        copy of a tied embedding (last pipeline stage) starts equal to the embedding, as Megatron's does."""
        if self.embed is not None:
            _init_normal(self.embed, _generator(seed, EMBED_KEY, self.embed))
        for index, block in self.layers.items():
            _init_normal(block, _generator(seed, int(index) + 1, block))
        if self.head is not None and self.head.weight is not None:
            # a tied copy draws what Embedding.tok draws (the first tensor _init_normal fills under EMBED_KEY)
            key = EMBED_KEY if self.embedding_grad_sync else HEAD_KEY
            nn.init.normal_(self.head.weight, std=INIT_STD, generator=_generator(seed, key, self.head))


EMBED_KEY = 0
HEAD_KEY = 1 << 20


def _generator(seed: int, key: int, module: nn.Module) -> torch.Generator:
    device = next(module.parameters()).device
    return torch.Generator(device=device).manual_seed(seed * (1 << 24) + key)


def _init_normal(root: nn.Module, gen: torch.Generator) -> None:
    for module in root.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=INIT_STD, generator=gen)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=INIT_STD, generator=gen)


def build_chunk(spec: TransformerSpec, plan: ChunkPlan, recompute: Recompute = "none",
                seed: int = 0, experts: bool = False, attention: AttentionKernel = "flash2") -> TransformerChunk:
    return TransformerChunk(spec, plan, recompute, seed, experts, attention)


def build_model(spec: TransformerSpec, recompute: Recompute = "none", seed: int = 0,
                experts: bool = False, attention: AttentionKernel = "flash2") -> TransformerChunk:
    """The whole model as one chunk."""
    return TransformerChunk(spec, ChunkPlan(0, spec.num_layers, True, True), recompute, seed, experts, attention)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over (batch x sequence) positions (logits may be vocab-sharded DTensors)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
