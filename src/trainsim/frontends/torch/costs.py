"""Kind, FLOPs and IR shape of one aten op seen by the torch front-end (imports torch; load it lazily).

GEMMs, convolutions and attention take torch.utils.flop_counter's registered formulas (2 FLOPs per
multiply-add); the CPU attention kernels, which that registry lacks, take its sdpa formulas. Other ops count
FLOPs per element with the conventions of the analytic builder (trainsim.frontends.catalog.transformer), so that the two
front-ends agree: a norm is 5 FLOPs per element, a softmax 5, GELU 8, anything else 1.
"""

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._pytree import tree_leaves

from trainsim.ir.graph import OpKind

_MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "addr", "_scaled_mm",
                     "_grouped_mm"})
_CONV = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution",
                   "convolution_overrideable", "_slow_conv2d_forward", "_slow_conv2d_backward",
                   "cudnn_convolution_transpose", "mkldnn_convolution"})
_NORM = frozenset({"native_layer_norm", "native_layer_norm_backward", "native_group_norm",
                   "native_group_norm_backward", "native_batch_norm", "native_batch_norm_backward",
                   "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_fused_rms_norm",
                   "_fused_rms_norm_backward", "_batch_norm_with_update", "batch_norm_backward"})
_SOFTMAX = frozenset({"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"})
_EMBEDDING = frozenset({"embedding", "embedding_dense_backward", "_embedding_bag", "_embedding_bag_backward",
                        "embedding_backward"})
_LOSS = frozenset({"nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
                   "mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward",
                   "huber_loss", "huber_loss_backward", "binary_cross_entropy",
                   "binary_cross_entropy_backward", "binary_cross_entropy_with_logits", "kl_div"})
_POOL = frozenset({"max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
                   "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
                   "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "max_pool3d_with_indices",
                   "avg_pool3d", "_adaptive_avg_pool3d"})
_ATTENTION_CPU = frozenset({"_scaled_dot_product_flash_attention_for_cpu"})
_ATTENTION_CPU_BWD = frozenset({"_scaled_dot_product_flash_attention_for_cpu_backward"})
_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "prod",
                         "logsumexp", "norm", "linalg_vector_norm", "cumsum", "argmax", "any", "all"})

# FLOPs per element where one aten op stands for several arithmetic steps. NB: the conventions of
# trainsim.frontends.catalog.transformer (a norm 5, softmax 5, GELU 8, SwiGLU's activation 4); a backward op counts
# twice its forward, as cost.flops.pointwise_backward does.
_PER_ELEMENT: dict[str, float] = {
    "native_layer_norm": 5.0, "native_group_norm": 5.0, "native_batch_norm": 5.0, "_fused_rms_norm": 5.0,
    "_native_batch_norm_legit": 5.0, "_native_batch_norm_legit_functional": 5.0,
    "native_layer_norm_backward": 10.0, "native_group_norm_backward": 10.0, "native_batch_norm_backward": 10.0,
    "_fused_rms_norm_backward": 10.0,
    "_softmax": 5.0, "_log_softmax": 5.0, "_softmax_backward_data": 10.0, "_log_softmax_backward_data": 10.0,
    "gelu": 8.0, "gelu_backward": 16.0, "silu": 4.0, "silu_backward": 8.0, "sigmoid": 4.0, "tanh": 4.0,
    "sigmoid_backward": 2.0, "tanh_backward": 2.0,
}
# NB: data movement and fills do no arithmetic: 0 FLOPs (their bytes still count).
_NO_ARITHMETIC = frozenset({"_to_copy", "clone", "copy_", "copy", "cat", "stack", "constant_pad_nd", "index_select",
                            "gather", "fill_", "zero_", "zeros", "zeros_like", "ones", "ones_like", "full",
                            "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor", "slice_backward",
                            "select_backward", "index", "repeat", "roll", "flip", "_unsafe_index"})


def op_kind(name: str) -> OpKind:
    if name in _MATMUL:
        return "matmul"
    if "attention" in name:
        return "attention"
    if name in _CONV:
        return "conv"
    if name in _NORM:
        return "norm"
    if name in _SOFTMAX:
        return "softmax"
    if name in _EMBEDDING:
        return "embedding"
    if name in _LOSS:
        return "loss"
    if name in _POOL:
        return "pool"
    return "elementwise"


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape)


def _numel(value: torch.Tensor) -> int:
    return int(value.numel())


def schema_arg(func: Any, args: Sequence[Any], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
    """The value of argument `name` of an aten call, given positionally or by keyword."""
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            if index < len(args) and not argument.kwarg_only:
                return args[index]
            return kwargs.get(name, default)
    return default


def _attention_flops(name: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any,
                     causal: bool | None) -> float:
    packet = func.overloadpacket
    if name in _ATTENTION_CPU:
        flops = float(flop_counter.sdpa_flop_count(_shape(args[0]), _shape(args[1]), _shape(args[2])))
    elif name in _ATTENTION_CPU_BWD:
        flops = float(flop_counter.sdpa_backward_flop_count(_shape(args[0]), _shape(args[1]), _shape(args[2]),
                                                            _shape(args[3])))
    elif packet in flop_counter.flop_registry:
        flops = float(flop_counter.flop_registry[packet](*args, **kwargs, out_val=out))
    else:
        return 0.0
    is_causal = bool(schema_arg(func, args, kwargs, "is_causal", False))
    if causal or (causal is None and is_causal):
        flops *= 0.5  # NB: a fused causal kernel skips the masked half (as cost.flops.attention_op)
    return flops


def op_flops(name: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any,
             causal: bool | None) -> float:
    """FLOPs of one aten call. causal: treat masked attention as causal (None: trust the call's is_causal)."""
    if "attention" in name:
        return _attention_flops(name, func, args, kwargs, out, causal)
    if func.overloadpacket in flop_counter.flop_registry:
        return float(flop_counter.flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
    if name in _NO_ARITHMETIC:
        return 0.0
    if name == "_grouped_mm":
        return _grouped_mm_flops(args)
    if name in _MATMUL:  # dot, mv, addmv, addr: 2 FLOPs per multiply-add
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        return 2.0 * max(_numel(t) for t in inputs) * (_numel(inputs[-1]) if name == "addr" else 1)
    tensors_out = [o for o in _leaves(out) if isinstance(o, torch.Tensor)]
    tensors_in = [a for a in _leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    if name in _REDUCTIONS and tensors_in:
        elements = _numel(tensors_in[0])
    elif tensors_out:
        elements = max(_numel(t) for t in tensors_out)
    elif tensors_in:
        elements = _numel(tensors_in[0])  # in-place ops returning nothing new
    else:
        elements = 0
    return _PER_ELEMENT.get(name, 1.0) * elements


def _grouped_mm_flops(args: Sequence[Any]) -> float:
    """FLOPs of aten._grouped_mm (mat_a, mat_b, offs): the groups partition one dimension of the product, so the
    total is 2 M N K of the operands as laid out. 2-d x 3-d (groups of rows of a, one weight each: an MoE's
    experts): 2 M K N; 3-d x 3-d (batched): 2 G M K N; 2-d x 2-d (groups along K) and 3-d x 2-d (groups along N):
    2 M K N over the whole K or N. flop_counter's registry has no formula for it."""
    a, b = _shape(args[0]), _shape(args[1])
    if len(a) == 3 and len(b) == 3:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 3:  # 3-d x 2-d: b is (K, N_total)
        return 2.0 * a[1] * a[2] * b[1]
    return 2.0 * a[0] * a[1] * b[-1]


def op_shape(name: str, kind: OpKind, args: Sequence[Any], out: Any) -> tuple[int, ...]:
    """(batch, m, n, k) for GEMMs and attention (m query tokens, n key tokens, k head dim); else the output."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if kind == "matmul" and name in ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm") and len(tensors) >= 2:
        # _grouped_mm (mat_a, mat_b, offs): one GEMM of the groups' rows, 2-d x 3-d (_grouped_mm_flops)
        grouped = name == "_grouped_mm"
        a, b = (_shape(t) for t in (tensors[:2] if grouped else tensors[-2:]))
        if len(a) == 2 and len(b) == (3 if grouped else 2):
            return (1, a[0], b[-1], a[1])
        if len(a) == 3 and len(b) == 3:
            return (a[0], a[1], b[2], a[2])
    if kind == "attention":
        queries = tensors[1:] if "backward" in name else tensors
        if len(queries) >= 2 and len(_shape(queries[0])) == 4:
            q, k = _shape(queries[0]), _shape(queries[1])
            return (q[0] * q[1], q[2], k[2], q[3])
    outs = [o for o in _leaves(out) if isinstance(o, torch.Tensor)]
    if outs:
        return _shape(outs[0])
    return _shape(tensors[0]) if tensors else ()


def _leaves(value: Any) -> list[Any]:
    return tree_leaves(value)
