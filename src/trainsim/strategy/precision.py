"""Precision policies: which dtype matmuls, other ops, gradients, and master weights use."""

from dataclasses import dataclass
from typing import Literal, get_args

from trainsim.hardware.device import DType

Precision = Literal["fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16", "fp8"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)



@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    """Dtypes of one precision setting.

    fp16/bf16 mean 16-bit mixed precision as Megatron and FSDP run it: 16-bit weights, activations and
    gradients, fp32 master weights and Adam moments. amp-* keep fp32 weights and cast at the op (torch.autocast).
    fp8 runs linear-layer GEMMs in fp8 and everything else as bf16 mixed precision.
    """

    name: Precision
    linear_dtype: DType
    matmul_dtype: DType  # attention batched matmuls
    activation_dtype: DType
    weight_bytes: int
    grad_bytes: int
    master_bytes: int  # fp32 master copy kept by the optimizer (0 when the weights already are fp32)
    optimizer_state_bytes: int  # Adam m and v


def policy_for(precision: Precision) -> PrecisionPolicy:
    if precision in ("fp32", "tf32"):
        dtype: DType = "fp32" if precision == "fp32" else "tf32"
        return PrecisionPolicy(precision, dtype, dtype, "fp32", 4, 4, 0, 8)
    if precision in ("amp-fp16", "amp-bf16"):
        half: DType = "fp16" if precision == "amp-fp16" else "bf16"
        return PrecisionPolicy(precision, half, half, half, 4, 4, 0, 8)
    if precision == "fp8":
        return PrecisionPolicy(precision, "fp8", "bf16", "bf16", 2, 2, 4, 8)
    half16: DType = "fp16" if precision == "fp16" else "bf16"
    return PrecisionPolicy(precision, half16, half16, half16, 2, 2, 4, 8)
