"""Model specifications: what is computed, independent of where and how it runs."""

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from trainsim.specbase import Spec

# The most layers a model takes: 10x the deepest transformer trained (DeepNet, 1,000 layers; Wang et al. 2022);
# engines walk layers one by one (gradient buckets, pipeline stages), so the count bounds their work.
MAX_LAYERS = 10_000

Arch = Literal["gpt", "llama", "bert", "mpt", "bloom", "moe", "mixtral", "other"]
# TransformerSpec's fields of DeepSeek-V2/V3's layout: a multi-head latent attention, routed experts of a width of
# their own, shared experts, leading dense blocks; at their defaults (0 or None) a transformer has none of them
DEEPSEEK_LAYOUT_FIELDS = ("mla", "expert_ffn_hidden", "shared_expert_ffn_hidden", "leading_dense_layers")


class MlaSpec(Spec):
    """Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2, sec. 2.1; Megatron-Core's MLASelfAttention,
    megatron/core/transformer/multi_latent_attention.py, megatron-core 0.16.1): the hidden state is projected
    down to a query latent (q_lora_rank) and a key-value latent (kv_lora_rank) plus one rotary key shared by the
    heads (qk_rope_head_dim); each is normalised and projected up to the heads' queries (qk_nope_head_dim +
    qk_rope_head_dim each), keys without position (qk_nope_head_dim) and values (v_head_dim)."""

    q_lora_rank: int = Field(default=0, ge=0, description="0: the queries are not compressed (one q projection)")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)

    @property
    def qk_head_dim(self) -> int:
        """A query's (and a key's) features per head: the part without position and the rotary part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class TransformerSpec(Spec):
    """A decoder or encoder stack. ffn_hidden is the SwiGLU inner size for mlp=swiglu."""

    kind: Literal["transformer"] = "transformer"
    name: str
    description: str = ""
    arch: Arch = "gpt"
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden: int = Field(gt=0)
    ffn_hidden: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(default=0, ge=0, description="0 means num_heads (multi-head attention)")
    vocab: int = Field(gt=0)
    max_seq_len: int = Field(default=2048, gt=0)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rope", "alibi"] = "learned"
    bias: bool = True
    tied_embeddings: bool = True
    causal: bool = True
    num_experts: int = Field(default=1, gt=0)
    top_k: int = Field(default=1, gt=0)
    moe_every: int = Field(default=1, gt=0, description="every n-th block is a mixture of experts")
    expert_ffn_hidden: int = Field(default=0, ge=0, description="one routed expert's FFN width; 0 means ffn_hidden "
                                   "(the dense blocks' width)")
    shared_expert_ffn_hidden: int = Field(default=0, ge=0, description="the shared experts' FFN width together, "
                                          "run on every token of an MoE block (Megatron-Core's "
                                          "moe_shared_expert_intermediate_size); 0: none")
    leading_dense_layers: int = Field(default=0, ge=0, description="the first blocks are dense, the rest MoE "
                                      "(DeepSeek's first_k_dense_replace)")
    mla: MlaSpec | None = Field(default=None, description="multi-head latent attention; None: the heads' own "
                                "q, k and v projections")
    published_params: float | None = Field(default=None, description="parameter count as published")
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "TransformerSpec":
        if self.hidden % self.num_heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by num_heads={self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be divisible by num_kv_heads={self.kv_heads}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be at most num_experts={self.num_experts}")
        if self.leading_dense_layers and not (self.is_moe and self.moe_every == 1
                                              and self.leading_dense_layers < self.num_layers):
            raise ValueError(f"leading_dense_layers={self.leading_dense_layers} needs num_experts > 1, moe_every=1 "
                             f"and fewer than num_layers={self.num_layers} (got num_experts={self.num_experts}, "
                             f"moe_every={self.moe_every})")
        if self.shared_expert_ffn_hidden and not self.is_moe:
            raise ValueError(f"shared_expert_ffn_hidden={self.shared_expert_ffn_hidden} needs num_experts > 1")
        if self.mla is not None and self.position != "rope":
            raise ValueError(f"mla needs position=rope (its decoupled rotary keys), not {self.position}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def kv_features(self) -> int:
        """A token's keys and values over all heads, as the attention core reads them: 2 x kv heads x head dim,
        or under multi-head latent attention each head's key (qk_head_dim) and value (v_head_dim)."""
        if self.mla is not None:
            return self.num_heads * (self.mla.qk_head_dim + self.mla.v_head_dim)
        return 2 * self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        return (self.num_layers - self.leading_dense_layers) // self.moe_every if self.is_moe else 0

    @property
    def expert_ffn(self) -> int:
        """One routed expert's FFN width (the dense blocks' ffn_hidden where the spec states none of its own)."""
        return self.expert_ffn_hidden or self.ffn_hidden

    def is_moe_block(self, block: int) -> bool:
        """Whether block `block` (0-based, in model order) is a mixture of experts: past the leading dense blocks,
        every moe_every-th."""
        return self.is_moe and block >= self.leading_dense_layers and block % self.moe_every == self.moe_every - 1

    @property
    def idle_expert_params(self) -> int:
        """Expert weights one token does not use: num_experts - top_k experts' MLP in each MoE block. Total
        parameters minus these are the active parameters a mixture of experts' 6 N D counts (Fedus et al. 2022,
        Switch Transformers, sec. 2: FLOPs per token follow the experts a token is routed to)."""
        mats = 3 if self.mlp == "swiglu" else 2
        expert = mats * self.hidden * self.expert_ffn + ((self.expert_ffn + self.hidden) if self.bias else 0)
        return self.num_moe_layers * (self.num_experts - self.top_k) * expert


class ConvLayer(Spec):
    """One layer of a CNN, with its output spatial size for a 224x224 (or the model's) input."""

    type: Literal["conv", "fc", "pool", "norm", "relu", "concat"]
    name: str
    # NB: no zero sizes: a layer of 0 channels or a 0x0 kernel or output has no work, and a pool divides by it
    in_channels: int = Field(gt=0)
    out_channels: int = Field(gt=0)
    kernel: tuple[PositiveInt, PositiveInt] = (1, 1)
    stride: int = Field(default=1, gt=0)
    out_hw: tuple[PositiveInt, PositiveInt] = (1, 1)
    block: str = Field(default="", description="the block this layer belongs to (module path prefix)")


class CnnSpec(Spec):
    kind: Literal["cnn"] = "cnn"
    name: str
    description: str = ""
    input_hw: tuple[PositiveInt, PositiveInt] = (224, 224)
    layers: tuple[ConvLayer, ...] = Field(min_length=1)
    published_params: float | None = None
    source: str = ""


class EmbeddingTable(Spec):
    rows: int = Field(gt=0)
    dim: int = Field(gt=0)
    pooling_factor: float = Field(default=1.0, gt=0, description="lookups per sample")
    count: int = Field(default=1, gt=0, description="identical tables")
    zipf_alpha: float = Field(default=0.0, ge=0, le=4, description="index skew: row i is drawn with probability "
                              "proportional to (i + 1) ** -zipf_alpha; 0 = uniform")


class DlrmSpec(Spec):
    kind: Literal["dlrm"] = "dlrm"
    name: str
    description: str = ""
    dense_features: int = Field(gt=0)
    bottom_mlp: tuple[PositiveInt, ...] = Field(min_length=1)
    top_mlp: tuple[PositiveInt, ...] = Field(min_length=1)
    tables: tuple[EmbeddingTable, ...] = Field(min_length=1)
    published_params: float | None = None
    source: str = ""

    @property
    def num_tables(self) -> int:
        return sum(table.count for table in self.tables)


class OpaqueSpec(Spec):
    """A model known only through a front-end that reads no layer structure (a jax train step, an nn.Module
    without a config, an execution trace): the OpGraph the front-end builds is the model. Only data and pipeline
    parallelism apply to it, and tp where the graph keeps the module paths a strategy tree's configs over tp
    address (split_by_tree: the torch and JAX front-ends' captures, compile.shape_front_end)."""

    kind: Literal["opaque"] = "opaque"
    name: str
    description: str = ""
    published_params: float | None = None
    source: str = ""  # what the front-end read it from
    split_by_tree: bool = False  # tp > 1 allowed: a tree's configs over tp split the graph's ops
    no_tp_reason: str = ""  # where split_by_tree is False: what the source lacks for tp (make_job's refusal)


ModelSpec = Annotated[TransformerSpec | CnnSpec | DlrmSpec | OpaqueSpec, Field(discriminator="kind")]
