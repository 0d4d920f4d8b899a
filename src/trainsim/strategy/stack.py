"""StackSpec: the training software that runs a job (Megatron-LM, Megatron-Core, DeepSpeed, FSDP, DDP ...), as
the behaviours that change what a step costs, each settable one by one.

Presets live in catalog/data/stacks/*.yaml, each value citing the framework file and version it comes from.
`generic` is the stack of a job that names none. What each behaviour does to a step's time is the pricing
service's (cost/stack_effects.py, cost/pricing.py) and the compiler's (compile/); this module only says what a
stack does.
"""

from functools import cache
from typing import Any, Literal

from pydantic import Field, model_validator

from trainsim.catalog.files import catalog_entries
from trainsim.errors import ConfigError, UnknownNameError
from trainsim.specbase import Spec
from trainsim.strategy.parallel import AttentionKernel

GENERIC_STACK = "generic"
# Megatron-Core's MoE token dispatchers (moe_token_dispatcher_type, megatron/core/transformer/transformer_config.py,
# megatron-core 0.16.1: allgather | alltoall | flex; its default allgather). flex (DeepEP / HybridEP kernels) is
# not priced.
MoeDispatcher = Literal["alltoall", "allgather"]


class StackSpec(Spec):
    """The behaviours of a training stack. The descriptions are the help texts of the --stack-* flags."""

    name: str = Field(default=GENERIC_STACK, min_length=1, description="stack preset")
    description: str = Field(default="", description="what the preset stands for")
    grad_reduce_overlap: bool = Field(default=True, description="data-parallel gradient reduction overlapped "
                                      "with the backward pass, bucket by bucket (else after the backward pass)")
    grad_bucket_params: float = Field(default=40e6, gt=0, le=1e13, description="gradient bucket size in "
                                      "parameters (frameworks state it in elements)")
    # torch DDP's default (gradient_as_bucket_view=False, torch/csrc/distributed/c10d/reducer.cpp, torch 2.x) and
    # trainsim measure's split executor copy each gradient into its bucket and back; Megatron-LM's DDP keeps the
    # gradients in one contiguous buffer (megatron/core/distributed/param_and_grad_buffer.py): no copies
    grad_bucket_copies: bool = Field(default=False, description="data-parallel gradients copied into flat buckets, "
                                     "scaled and copied back each step (torch DDP's default), a host cost")
    # trainsim measure --tree runs a plan's ops one by one in Python (measure/split_model.py): its per-op cost is
    # measured by `trainsim profile --executor-overhead` (profile/executor_overhead.py)
    split_executor: bool = Field(default=False, description="ops run one by one by trainsim measure's split "
                                 "executor (a host cost per op, profiled)")
    param_gather_overlap: bool = Field(default=True, description="distributed-optimizer (ZeRO 1-2) parameter "
                                       "all-gather overlapped with the next forward pass (else after the step)")
    tp_comm_overlap: bool = Field(default=False, description="tensor-parallel collectives overlapped with the "
                                  "GEMMs (Megatron-Core / TransformerEngine userbuffers)")
    # Megatron's ColumnParallelLinear backward (LinearWithGradAccumulationAndAsyncCommunication,
    # megatron/core/tensor_parallel/layers.py, megatron-core 0.1.0 and 0.9.0): the input gradient's all-reduce
    # (reduce-scatter under sp) is launched async before the weight-gradient GEMM and waited after it; under sp
    # the input's all-gather (repeated for the weight gradient) likewise runs beside the input-gradient GEMM
    tp_dgrad_overlap: bool = Field(default=False, description="each column-parallel linear's backward "
                                   "tensor-parallel collectives overlapped with its GEMMs: the input-gradient "
                                   "all-reduce / reduce-scatter with the weight-gradient GEMM and, under sequence "
                                   "parallelism, the re-gather of its input with the input-gradient GEMM "
                                   "(Megatron's async tensor-parallel all-reduce)")
    # torch's tensor parallelism: parallelize_module with ColwiseParallel / RowwiseParallel (torch/distributed/
    # tensor/parallel/style.py, torch 2.x) swaps each linear's weights for DTensors and hooks its inputs and
    # outputs; its host cost per layer is measured by `trainsim profile --tp` (profile/framework.py)
    tp_module_wrappers: bool = Field(default=True, description="tensor parallelism wraps the modules in torch's "
                                     "DTensor classes (parallelize_module), a host cost per layer, profiled "
                                     "(else the stack's own tensor-parallel layers)")
    cp_comm_overlap: bool = Field(default=False, description="context-parallel key/value exchange overlapped "
                                  "with the attention kernels (TransformerEngine's ring attention)")
    pp_comm_overlap: bool = Field(default=False, description="pipeline send/recv overlapped with compute in "
                                  "interleaved schedules")
    # megatron/core/pipeline_parallel/combined_1f1b.py (megatron-core 0.16.1, overlap_moe_expert_parallel_comm):
    # the forward of one micro-batch runs beside the backward of another, each one's expert all-to-alls hidden
    # behind the other's compute, in the 1F1B steady state only (pricing: cost.stack_effects.ep_overlap_share)
    ep_comm_overlap: bool = Field(default=False, description="MoE expert-parallel all-to-alls (dispatch, combine) "
                                  "of one micro-batch overlapped with the compute of another in the 1F1B steady "
                                  "state (Megatron-Core's combined 1F1B schedule); pp 1, or pp > 1 interleaved")
    moe_dispatcher: MoeDispatcher = Field(
        default="alltoall", description="MoE token dispatcher: alltoall (the routed copies all-to-all over ep, "
        "gathered over tp: Megatron-Core's MoEAlltoAllTokenDispatcher) | allgather (the hidden state all-gathered "
        "over tp x ep, reduce-scattered back: MoEAllGatherTokenDispatcher)")
    pp_scatter_gather: bool = Field(default=False, description="pipeline sends split over the tensor-parallel "
                                    "ranks and all-gathered over NVLink (Megatron-LM scatter-gather)")
    fsdp_prefetch_depth: int = Field(default=1, ge=0, le=64, description="ZeRO-3 / FSDP: layers whose parameter "
                                     "all-gather may run ahead of the layer computing (0 = no prefetch)")
    fsdp_bucket_params: float = Field(default=0.0, ge=0, le=1e13, description="ZeRO-3 / FSDP: gradients "
                                      "reduce-scattered in buckets of this many parameters (0 = each layer's "
                                      "own, as FSDP wraps blocks)")
    fused_layernorm_linear: bool = Field(default=True, description="LayerNorm fused with the next GEMM's input "
                                         "cast (fp8: no separate cast kernel)")
    fused_bias_activation: bool = Field(default=True, description="activation fused with its bias add / gate")
    fused_cross_entropy: bool = Field(default=True, description="cross-entropy in one pass over the logits")
    loss_grad_buffers: float = Field(default=1.0, ge=0, le=4, description="logits-sized fp32 buffers the loss's "
                                     "backward holds beside its saved probabilities (torch's log_softmax + "
                                     "nll_loss: 2, the gradients of log_softmax's output and input)")
    fused_fp8_cast: bool = Field(default=True, description="fp8 casts of GEMM inputs fused into the producer")
    attention: AttentionKernel = Field(default="flash2", description="the attention kernel the stack picks "
                                       "(a job's own --attention wins)")
    cuda_graphs: bool = Field(default=False, description="CUDA graphs: no per-micro-batch host launch cost")
    selective_recompute: Literal["attention", "op"] = Field(
        default="attention", description="what selective recompute keeps: attention (Megatron: all but the "
        "attention core) | op (torchtitan's op-level policy: the attention output and every other matmul output)")

    @model_validator(mode="after")
    def _check(self) -> "StackSpec":
        # megatron/core/transformer/transformer_config.py (megatron-core 0.16.1): overlap_moe_expert_parallel_comm
        # "is supported with alltoall/flex token dispatcher"
        if self.ep_comm_overlap and self.moe_dispatcher != "alltoall":
            raise ValueError("ep_comm_overlap needs moe_dispatcher alltoall (Megatron-Core overlaps the "
                             "all-to-all dispatcher's collectives only)")
        return self

    def describe(self) -> str:
        return self.name


BEHAVIOURS: tuple[str, ...] = tuple(name for name in StackSpec.model_fields if name not in ("name", "description"))


@cache
def _presets() -> dict[str, StackSpec]:
    table = {GENERIC_STACK: StackSpec()}
    for entry in catalog_entries("stacks", "stacks"):
        stack = StackSpec.parse(entry, f"stack {entry.get('name')}")
        table[stack.name] = stack
    return table


def stack_names() -> list[str]:
    return sorted(_presets())


def load_stack(name: str) -> StackSpec:
    """A preset by name; an unknown name is one line listing the presets."""
    stack = _presets().get(name)
    if stack is None:
        raise UnknownNameError("stack", name, stack_names())
    return stack


def make_stack(value: Any, overrides: dict[str, Any] | None = None, where: str = "stack") -> StackSpec:
    """A stack from a job file's or a flag's value: a preset name, or a mapping {preset: NAME, behaviour:
    value ...}; `overrides` (behaviour -> value) apply on top."""
    if value is None:
        value = GENERIC_STACK
    if isinstance(value, StackSpec):
        base, changes = value, {}
    elif isinstance(value, str):
        base, changes = load_stack(value), {}
    elif isinstance(value, dict):
        changes = dict(value)
        base = load_stack(str(changes.pop("preset", GENERIC_STACK)))
    else:
        raise ConfigError(where, value, "must be a stack name or a mapping with preset: and behaviours")
    changes.update(overrides or {})
    unknown = sorted(set(changes) - set(BEHAVIOURS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", changes[unknown[0]],
                          "unknown behaviour; allowed: preset, " + ", ".join(BEHAVIOURS))
    if not changes:
        return base
    return StackSpec.parse({**base.model_dump(), **changes}, where)
