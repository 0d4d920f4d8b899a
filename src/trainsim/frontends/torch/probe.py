"""The fake-CUDA probe: ask torch's own CUDA autocast kernels which dtype an op runs in, without a GPU.

A CPU build of torch still registers the AutocastCUDA kernels. Tensors made under FakeTensorMode with
device="cuda" carry the CUDA dispatch keys (no memory, no driver), so with CUDA autocast switched on, a call goes
through the real AutocastCUDA kernel, which casts the inputs, and the fake kernel below it gives the output
dtype. What does not work this way: autograd on such tensors (torch aborts the process: never let a probe
tensor require grad) and ops that need a CUDA device guard (slicing, some views); those calls return None.

Used by the tests to check the autocast table (strategy/autocast_rules.py) against torch. Imports torch.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map

from trainsim.frontends.torch.oplog import TORCH_DTYPES, CallRecord, TensorStub
from trainsim.hardware.device import DType
from trainsim.strategy.autocast_rules import normalize_op_name

_HALF: dict[str, torch.dtype] = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}


@contextlib.contextmanager
def cuda_autocast(precision: str) -> Iterator[FakeTensorMode]:
    """A FakeTensorMode in which CUDA autocast is on with the precision's half dtype, and grad is off."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    previous = (torch._C.is_autocast_enabled("cuda"), torch._C.get_autocast_dtype("cuda"))
    torch._C.set_autocast_enabled("cuda", True)
    torch._C.set_autocast_dtype("cuda", _HALF[precision])
    torch._C.autocast_increment_nesting()
    try:
        with torch.no_grad(), mode:
            yield mode
    finally:
        torch._C.autocast_decrement_nesting()
        torch._C.set_autocast_enabled("cuda", previous[0])
        torch._C.set_autocast_dtype("cuda", previous[1])
        torch._C.clear_autocast_cache()


def fake_cuda(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A fake CUDA tensor (call inside cuda_autocast)."""
    return torch.empty(shape, dtype=dtype, device="cuda")


def output_dtype(value: Any) -> DType | None:
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return TORCH_DTYPES.get(leaf.dtype)
    return None


def probe(call: Callable[[], Any]) -> DType | None:
    """The output dtype of `call` (run inside cuda_autocast), or None when it cannot run on fake CUDA."""
    try:
        return output_dtype(call())
    except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError):
        return None


def probe_call(record: CallRecord, precision: str) -> DType | None:
    """Replay a logged forward call on fake CUDA tensors of its inputs' virtual dtypes, under CUDA autocast.

    Ops the trace sees after decomposition (the aliases of the autocast table) are replayed as the autocast
    op above them (_softmax as softmax, native_layer_norm as layer_norm ...), since that is where autocast acts.
    """
    with cuda_autocast(precision):
        args, kwargs = _materialize(record.args), _materialize(record.kwargs)
        kwargs.pop("device", None)
        replay = _PARENTS.get(normalize_op_name(str(record.func._schema.name)))
        if replay is not None:
            return probe(lambda: replay(args, kwargs))
        return probe(lambda: record.func(*args, **kwargs))


def _materialize(value: Any) -> Any:
    def make(item: Any) -> Any:
        if isinstance(item, TensorStub):
            return fake_cuda(item.shape, item.torch_dtype)
        if isinstance(item, torch.device):
            return torch.device("cuda")
        return item

    return tree_map(make, value)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, key: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(key, default)


aten = torch.ops.aten
_PARENTS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], Any]] = {
    "_softmax": lambda a, k: aten.softmax.int(a[0], a[1]),
    "_log_softmax": lambda a, k: aten.log_softmax.int(a[0], a[1]),
    "native_layer_norm": lambda a, k: aten.layer_norm(a[0], a[1], a[2], a[3], a[4]),
    "native_group_norm": lambda a, k: aten.group_norm(a[0], a[6], a[1], a[2], a[7]),
    "_fused_rms_norm": lambda a, k: aten.rms_norm(a[0], a[1], a[2], a[3] if len(a) > 3 else None),
    "nll_loss_forward": lambda a, k: aten.nll_loss(a[0], a[1], a[2], a[3], a[4]),
    "nll_loss2d_forward": lambda a, k: aten.nll_loss2d(a[0], a[1], a[2], a[3], a[4]),
    "_scaled_dot_product_flash_attention_for_cpu": lambda a, k: aten.scaled_dot_product_attention(
        a[0], a[1], a[2], attn_mask=k.get("attn_mask"), dropout_p=_arg(a, k, 3, "dropout_p", 0.0),
        is_causal=_arg(a, k, 4, "is_causal", False), scale=k.get("scale")),
}
