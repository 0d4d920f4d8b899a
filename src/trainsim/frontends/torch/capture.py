"""The PyTorch front-end: an nn.Module and example input shapes -> OpGraph with forward and backward ops.

One training step (forward, loss, torch.autograd.grad over the parameters) runs under FakeTensorMode, so no
weight or activation is allocated, and a dispatch-mode op log (torch_oplog) records every aten op with its
module path, dtype, FLOPs and bytes. Ops are grouped into layers by module path (torch_layers): the children
of the repeated container (the largest ModuleList / Sequential of identical modules: GPT-2's transformer.h,
LLaMA's model.layers) are blocks, what runs before them the embedding layer, what runs after the head.

Repeated layers, traced once: the container is cut to its first two children for the trace (two, so that the
trace shows both are identical); identical blocks become one Layer whose count is the container's full length,
so an 80-layer model costs as much to ingest as a 2-layer one. The cut assumes each block hands on an activation
of the shape it received (a transformer's residual stream): a traced block whose output is shaped unlike its input
(a CNN stage ending in a pool or a strided convolution) makes the untraced blocks unlike the traced ones, so the
whole container is traced instead, each block priced on its own shapes. If the traced blocks differ (a
model that treats layers differently by index), the whole container is traced and blocks are grouped by their op
signature. A step that fails to trace on fake tensors is refused in one line naming the innermost module that
failed (ConfigError), never a traceback.
Builders that already cut the model (graph_from_hf_config builds 2 layers) pass the real count as repeat_count.

torch is imported here, never at trainsim import time.
"""

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils.weak import WeakIdKeyDictionary

from trainsim.errors import ConfigError, TrainsimError, exception_reason
from trainsim.frontends.torch.fuse import fuse_log
from trainsim.frontends.torch.layers import Container, build_layers, find_container
from trainsim.frontends.torch.oplog import OpLog, Segments, iter_tensors
from trainsim.ir.graph import OpGraph
from trainsim.strategy.precision import PRECISIONS, Precision

_TRACE_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
_INPUT_DTYPES: dict[str, torch.dtype] = {"float": torch.float32, "float32": torch.float32, "int64": torch.int64,
                                         "long": torch.int64, "int32": torch.int32, "bool": torch.bool,
                                         "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An example input: its shape and dtype ("float" inputs take the model's trace dtype)."""

    shape: tuple[int, ...]
    dtype: str = "float"

    def __post_init__(self) -> None:
        if not self.shape or any(not isinstance(d, int) or d <= 0 for d in self.shape):
            raise ConfigError("input shape", self.shape, "must be a non-empty tuple of positive integers")
        if self.dtype not in _INPUT_DTYPES:
            raise ConfigError("input dtype", self.dtype, "choose one of: " + ", ".join(_INPUT_DTYPES))


InputSpec = TensorSpec | tuple[int, ...]
ModuleOrFactory = nn.Module | Callable[[], nn.Module]


@dataclass(frozen=True, slots=True)
class Capture:
    """What one traced step produced, before grouping (kept for tests and the fake-CUDA probe)."""

    log: OpLog
    container: Container | None
    model: nn.Module
    state: dict[str, torch.Tensor]  # fake parameters and buffers by name
    param_names: tuple[str, ...]  # the parameters among them (tied weights once)

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return {key: self.state[key] for key in self.param_names}


def graph_from_module(model: ModuleOrFactory, example_inputs: Mapping[str, InputSpec] | Sequence[InputSpec], *,
                      precision: Precision = "fp32", micro_batch: int | None = None, seq_len: int | None = None,
                      name: str | None = None, loss_fn: Callable[[Any], torch.Tensor] | None = None,
                      causal_attention: bool | None = None, repeat_count: int | None = None,
                      fused: bool = False) -> OpGraph:
    """Trace one training step of `model` on fake tensors and return its OpGraph.

    model: a module (its weights are replaced by fake tensors for the trace) or a factory, called under
        FakeTensorMode so that no weight is allocated (the way to ingest a model too large for this machine).
    example_inputs: shapes by keyword (HF style: {"input_ids": TensorSpec((8, 512), "int64")}) or positional.
    micro_batch, seq_len: default to the first input's first two dimensions.
    loss_fn: output -> scalar loss; default: output.loss when the model returns one, else the sum of the first
        floating output.
    causal_attention: count attention as causal (a fused kernel skips half) even when the model passes an
        explicit mask; None trusts each call's is_causal flag.
    repeat_count: the real length of the repeated container when the module was built shorter.
    fused: lower the eager ops to the kernels a fused training stack runs (torch.fuse); False keeps one op per
        aten call.
    """
    capture = capture_step(model, example_inputs, precision=precision, loss_fn=loss_fn,
                           causal_attention=causal_attention)
    if capture.container is not None and capture.container.truncated and not capture.container.identical(capture.log):
        capture = capture_step(model, example_inputs, precision=precision, loss_fn=loss_fn,
                               causal_attention=causal_attention, max_traced=None)
    mb, seq = _batch_dims(example_inputs, micro_batch, seq_len)
    if fused:
        fuse_log(capture.log)
    layers = build_layers(capture.log, capture.container, capture.model, capture.params, repeat_count)
    label = name or type(capture.model).__name__
    return OpGraph(label, layers, mb * seq, mb, frontend="torch")


def capture_step(model: ModuleOrFactory, example_inputs: Mapping[str, InputSpec] | Sequence[InputSpec], *,
                 precision: Precision, loss_fn: Callable[[Any], torch.Tensor] | None = None,
                 causal_attention: bool | None = None, max_traced: int | None = 2,
                 keep_calls: bool = False) -> Capture:
    """Run forward + backward once under FakeTensorMode with the op log; see graph_from_module."""
    if precision not in PRECISIONS:
        raise ConfigError("precision", precision, "choose one of: " + ", ".join(PRECISIONS))
    mode = _fake_mode_of(model)
    trace_dtype = _TRACE_DTYPES.get(precision, torch.float32)
    with mode:
        module = model if isinstance(model, nn.Module) else model()
        if not isinstance(module, nn.Module):
            raise ConfigError("model factory", type(module).__name__, "must return a torch.nn.Module")
        module.train()
        state = _fake_state(module, mode, trace_dtype)
        device = next((t.device for t in state.values()), torch.device("cpu"))
        args, kwargs = _example_tensors(example_inputs, trace_dtype, device)
    container = find_container(module, max_traced)
    param_paths: WeakIdKeyDictionary = WeakIdKeyDictionary()
    for key, tensor in state.items():
        param_paths[tensor] = key.rpartition(".")[0]
    log = OpLog(precision=precision, segments=Segments(container.path if container else ""),
                param_paths=param_paths, causal=causal_attention, keep_calls=keep_calls)
    param_names = tuple(key for key, _ in module.named_parameters())
    params = [state[key] for key in param_names if state[key].requires_grad]
    watch = _Watch()
    try:
        with _truncated(container), _module_hooks(module, log, container, watch), _quiet_meta_failures(), mode:
            live = {key: state[key] for key in _state_keys(module) if key in state}  # the traced children's
            with log, torch.autograd.graph.saved_tensors_hooks(_pack(log), _unpack):
                output = torch.func.functional_call(module, live, args, kwargs)
                loss = (loss_fn or _default_loss)(output)
            log.phase = "bwd"
            with log:
                torch.autograd.grad(loss, params, allow_unused=True)
            log.flush_backward_casts()
    except _ReshapingBlock:  # the untraced blocks would see other shapes than the traced: trace them all
        return capture_step(model, example_inputs, precision=precision, loss_fn=loss_fn,
                            causal_attention=causal_attention, max_traced=None, keep_calls=keep_calls)
    except TrainsimError:
        raise
    except Exception as exc:  # the user's module failed on fake tensors: one line, never a traceback
        raise _untraceable(module, watch, log.phase, exc) from exc
    return Capture(log, container, module, state, param_names)


class _ReshapingBlock(Exception):
    """A traced block of a cut container handed on an activation shaped unlike its input (stops the trace)."""


@dataclass(slots=True)
class _Watch:
    """What the module hooks saw: the innermost module whose forward raised."""

    failed_in: str | None = None


def _untraceable(module: nn.Module, watch: _Watch, phase: str, exc: Exception) -> ConfigError:
    where = f"module {watch.failed_in!r}" if watch.failed_in else type(module).__name__
    reason = exception_reason(exc)
    return ConfigError("model", type(module).__name__,
                       f"its {'forward' if phase == 'fwd' else 'backward'} fails on fake tensors of the example "
                       f"inputs in {where} ({type(exc).__name__}: {reason}); the torch front-end captures modules "
                       "that run one training step on the inputs given")


def _hands_on_its_shape(inputs: Any, output: Any) -> bool:
    """Does a block hand on a floating activation shaped like one it received (a residual stream)?"""
    received = {tuple(t.shape) for t in iter_tensors(inputs) if t.is_floating_point()}
    handed = next((tuple(t.shape) for t in iter_tensors(output) if t.is_floating_point()), None)
    return not received or handed is None or handed in received


def _state_keys(module: nn.Module) -> list[str]:
    return [key for key, _ in module.named_parameters()] + [key for key, _ in module.named_buffers()]


def _fake_mode_of(model: ModuleOrFactory) -> FakeTensorMode:
    if isinstance(model, nn.Module):
        for tensor in model.parameters():
            if isinstance(tensor, FakeTensor):
                return tensor.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _fake_state(module: nn.Module, mode: FakeTensorMode, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Fake copies of the parameters (in the trace dtype, requiring grad) and buffers; tied weights once."""
    state: dict[str, torch.Tensor] = {}
    for key, param in module.named_parameters():
        fake = param if isinstance(param, FakeTensor) else mode.from_tensor(param.detach())
        fake = fake.detach().to(dtype) if fake.is_floating_point() else fake.detach()
        state[key] = fake.requires_grad_(param.requires_grad and fake.is_floating_point())
    for key, buffer in module.named_buffers():
        fake = buffer if isinstance(buffer, FakeTensor) else mode.from_tensor(buffer)
        state[key] = fake
    return state


def _example_tensors(inputs: Mapping[str, InputSpec] | Sequence[InputSpec], float_dtype: torch.dtype,
                     device: torch.device) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    def make(spec: InputSpec) -> torch.Tensor:
        spec = spec if isinstance(spec, TensorSpec) else TensorSpec(tuple(spec))
        dtype = float_dtype if spec.dtype == "float" else _INPUT_DTYPES[spec.dtype]
        return torch.zeros(spec.shape, dtype=dtype, device=device)

    if isinstance(inputs, Mapping):
        return (), {key: make(spec) for key, spec in inputs.items()}
    return tuple(make(spec) for spec in inputs), {}


def _batch_dims(inputs: Mapping[str, InputSpec] | Sequence[InputSpec], micro_batch: int | None,
                seq_len: int | None) -> tuple[int, int]:
    specs = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
    if not specs:
        raise ConfigError("example_inputs", inputs, "give at least one input shape")
    first = specs[0].shape if isinstance(specs[0], TensorSpec) else tuple(specs[0])
    mb = micro_batch or int(first[0])
    seq = seq_len or (int(first[1]) if len(first) > 1 else 1)
    return mb, seq


def _default_loss(output: Any) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    for tensor in iter_tensors(output if not hasattr(output, "to_tuple") else output.to_tuple()):
        if tensor.is_floating_point():
            return tensor.sum()
    raise ConfigError("model output", type(output).__name__, "has no floating tensor; pass loss_fn")


def _pack(log: OpLog) -> Callable[[torch.Tensor], torch.Tensor]:
    def pack(tensor: torch.Tensor) -> torch.Tensor:
        log.note_saved(tensor)
        return tensor

    return pack


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def _quiet_meta_failures() -> Iterator[None]:
    """Silence FakeTensorMode's log of a failing meta kernel (torch/_subclasses/fake_tensor.py, torch 2.x, logs the
    traceback before re-raising): the failure is reported once, in one line, by capture_step."""
    logger = logging.getLogger(FakeTensorMode.__module__)
    was_disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was_disabled


@contextlib.contextmanager
def _truncated(container: Container | None) -> Iterator[None]:
    """Cut the repeated container to the children traced, and restore it afterwards."""
    if container is None or not container.truncated:
        yield
        return
    children = container.module._modules
    saved = dict(children)
    children.clear()
    children.update({key: saved[key] for key in container.traced})
    try:
        yield
    finally:
        children.clear()
        children.update(saved)


@contextlib.contextmanager
def _module_hooks(module: nn.Module, log: OpLog, container: Container | None, watch: _Watch) -> Iterator[None]:
    """Keep the module stack of the log, note the activation each block passes on, and what `watch` holds."""
    handles = []
    first_block = f"{container.path}.{container.traced[0]}".lstrip(".") if container else None
    cut = container is not None and container.truncated
    for path, sub in module.named_modules():
        if sub is module:
            continue

        def pre(_mod: nn.Module, args: Any, kwargs: Any, path: str = path) -> None:
            if path == first_block:
                log.note_boundary("embedding", iter_tensors((args, kwargs)))
            log.enter_module(path)

        def post(_mod: nn.Module, args: Any, kwargs: Any, output: Any, path: str = path) -> None:
            log.exit_module()
            if output is None and watch.failed_in is None:  # torch calls always_call hooks with None on a raise
                watch.failed_in = path
            if container is not None and path.rpartition(".")[0] == container.path and output is not None:
                log.note_boundary("block:" + path.rpartition(".")[2], iter_tensors(output))
                if cut and not _hands_on_its_shape((args, kwargs), output):
                    raise _ReshapingBlock(path)

        handles.append(sub.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(sub.register_forward_hook(post, with_kwargs=True, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
