"""The op log of the torch front-end: a TorchDispatchMode that turns each aten op of a fake-tensor training step
into an IR Op with its module path, phase, dtype, FLOPs and bytes (imports torch; load it lazily).

Module paths: forward ops take the innermost module running (forward pre/post hooks keep a stack). Backward
ops take the path of the forward op whose autograd node runs them: a forward op that creates a node records
the node's sequence number (torch's counter minus one, read before the op runs), and during backward
torch._C._current_autograd_node() names the node.

Precision: the trace runs in the model's storage dtype (fp32 for fp32, tf32 and amp; 16-bit for fp16, bf16,
fp8). Each tensor carries a virtual dtype. Under amp the autocast table decides each forward op's dtype from its
inputs' virtual dtypes, as torch.autocast would on CUDA, and the casts autocast inserts become ops of their own
(a weight is cast once per step: autocast caches casts of leaf tensors). A backward op runs in the dtype of
the forward op that made its node. NB: tensors a backward op reads are costed at that dtype (in the real run
they are the cast copies the forward saved).
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from trainsim.frontends.torch.costs import op_flops, op_kind, op_shape
from trainsim.hardware.device import BYTES_PER_DTYPE, DType
from trainsim.ir.graph import Op, OpKind, Phase
from trainsim.strategy.autocast_rules import cuda_autocast_table, dtype_for, widest
from trainsim.strategy.precision import Precision

TORCH_DTYPES: dict[torch.dtype, DType] = {
    torch.float32: "fp32", torch.float64: "fp32",  # NB: float64 (rare bookkeeping) is costed as fp32
    torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8",
}
_ALIASING = frozenset({"detach", "alias", "lift_fresh", "_unsafe_view", "_reshape_alias", "lift_fresh_copy"})
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                          "_local_scalar_dense", "set_", "resize_", "sym_size", "sym_stride", "sym_numel"})
_CASTS = frozenset({"_to_copy", "to", "_to_dtype"})
_GEMM_LIKE: frozenset[OpKind] = frozenset({"matmul", "attention", "conv"})
_STORAGE: dict[DType, DType] = {"tf32": "fp32", "fp8": "bf16"}


def storage_dtype(dtype: DType) -> DType:
    """The dtype a tensor is kept in when an op computes in `dtype` (tf32 keeps fp32, fp8 GEMMs write bf16)."""
    return _STORAGE.get(dtype, dtype)


@dataclass(slots=True)
class Value:
    """What the log knows of a tensor: virtual dtype, size, whether it is (a view of) a parameter."""

    vid: int
    dtype: DType
    numel: int
    param: bool = False
    aux: bool = False  # an attention kernel's side output (logsumexp): dropped under selective recompute


@dataclass(slots=True)
class NodeRecord:
    """The forward op behind an autograd node: where its backward ops go and which dtype they run in."""

    path: str
    segment: str
    dtype: DType
    backward_casts: list[Op] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A forward aten call with its tensors replaced by (shape, virtual dtype), for the fake-CUDA probe."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    op: Op
    output_dtype: DType | None


@dataclass(frozen=True, slots=True)
class TensorStub:
    shape: tuple[int, ...]
    dtype: DType
    torch_dtype: torch.dtype


@dataclass(slots=True)
class LoggedOp:
    """An op and its dataflow: the value ids of the floating tensors it reads and writes (torch.fuse reads
    them; empty for the casts autocast inserts, which have no tensor of their own)."""

    op: Op
    segment: str
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()


class Segments:
    """Which layer an op belongs to: a child of the repeated container (`block:<name>`), or `embedding` before
    the first block runs and `head` after it."""

    def __init__(self, container: str) -> None:
        self.container = container
        self.started = False
        self.prefix = container + "." if container else ""

    def of(self, path: str) -> str:
        if path.startswith(self.prefix) and path != self.container:
            self.started = True
            return "block:" + path[len(self.prefix):].split(".", 1)[0]
        return "head" if self.started else "embedding"


class OpLog(TorchDispatchMode):
    """Records the ops of one forward + backward pass. Enter it inside a FakeTensorMode."""

    def __init__(self, *, precision: Precision, segments: Segments, param_paths: WeakIdKeyDictionary,
                 causal: bool | None, keep_calls: bool = False) -> None:
        super().__init__()
        self.precision: Precision = precision
        self.segments = segments
        self.param_paths = param_paths  # parameter -> owning module path
        self.causal = causal
        self.keep_calls = keep_calls
        self.phase: Phase = "fwd"
        self.ops: list[LoggedOp] = []
        self.calls: list[CallRecord] = []
        self.stack: list[str] = [""]
        # segment -> (value id, dtype) -> (bytes, aux)
        self.saved: dict[str, dict[tuple[int, DType], tuple[float, bool]]] = {}
        self.boundary_bytes: dict[str, float] = {}  # segment -> activation bytes it passes on
        self.boundary_values: dict[str, int] = {}  # segment -> the value id of that activation
        self._last_forward: LoggedOp | None = None  # the forward op recorded last (what it saves after it ran)
        self._values: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._nodes: dict[int, NodeRecord] = {}
        self._cast_cache: dict[tuple[int, DType], None] = {}
        self._next_vid = 0
        self._last_bwd = ("", "head")
        self._pending_saves: list[tuple[torch.Tensor, str]] = []
        self._last_outs: list[torch.Tensor] = []
        self.path_segments: dict[str, str] = {}
        self.value_bytes: dict[int, float] = {}  # value id -> bytes (its numel in its virtual dtype)
        self.param_values: set[int] = set()
        self._table = cuda_autocast_table()
        self._amp = precision in ("amp-fp16", "amp-bf16")

    # ---- tensors -------------------------------------------------------------------------------------------
    def value(self, tensor: torch.Tensor) -> Value:
        found = self._values.get(tensor)
        if found is None:
            found = self._new_value(TORCH_DTYPES.get(tensor.dtype, "fp32"), tensor, tensor in self.param_paths)
        return found

    def _new_value(self, dtype: DType, tensor: torch.Tensor, param: bool = False, aux: bool = False) -> Value:
        self._next_vid += 1
        found = Value(self._next_vid, dtype, int(tensor.numel()), param, aux)
        self._values[tensor] = found
        self.value_bytes[found.vid] = float(found.numel * BYTES_PER_DTYPE[dtype])
        if param:
            self.param_values.add(found.vid)
        return found

    def _flow(self, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(read, written) value ids of an op's floating tensors; call after its outputs have their values."""
        reads = tuple(dict.fromkeys(self.value(t).vid for t in ins if t.is_floating_point()))
        writes = tuple(dict.fromkeys(self.value(t).vid for t in outs if t.is_floating_point()
                                     and not any(t is i for i in ins)))
        return reads, writes

    def tensor_bytes(self, tensor: torch.Tensor) -> float:
        value = self.value(tensor)
        return float(value.numel * BYTES_PER_DTYPE[value.dtype])

    # ---- module hooks --------------------------------------------------------------------------------------
    def enter_module(self, path: str) -> None:
        self.stack.append(path)

    def exit_module(self) -> None:
        self.stack.pop()

    @property
    def path(self) -> str:
        return self.stack[-1]

    def note_saved(self, tensor: Any) -> None:
        """saved_tensors_hooks pack hook: count an activation kept for backward once per layer.

        An op's inputs are saved just before the op reaches the log, so they wait for it: under amp an
        autocast op saves the cast copies, in the op's dtype."""
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            return
        if self.value(tensor).param:
            return  # weights are not activations
        self._pending_saves.append((tensor, self.segments.of(self.path)))

    def _settle_saves(self, ins: list[torch.Tensor], cast_to: DType | None) -> tuple[float, float]:
        """Pending saves are the previous op's outputs (saved after it ran) and this op's inputs (saved before
        it runs): an input the op casts is kept as the cast copy. Each tensor is counted once per layer, with the
        op that reads it (this one where it is among its inputs, else the previous forward op: Op.saved_bytes);
        returns this op's (bytes, aux bytes)."""
        previous = list(self._last_outs)
        mine_bytes = mine_aux = 0.0
        for tensor, segment in self._pending_saves:
            value = self.value(tensor)
            dtype = value.dtype
            if any(tensor is t for t in previous):
                previous = [t for t in previous if t is not tensor]
            elif cast_to is not None and any(tensor is t for t in ins):
                dtype = cast_to
            key = (value.vid, dtype)
            kept = self.saved.setdefault(segment, {})
            if key in kept:
                continue
            size = float(value.numel * BYTES_PER_DTYPE[dtype])
            kept[key] = (size, value.aux)
            aux = size if value.aux else 0.0
            if any(tensor is t for t in ins) or self._last_forward is None:
                mine_bytes, mine_aux = mine_bytes + size, mine_aux + aux
            else:
                self._keep(self._last_forward, (size, aux))
        self._pending_saves.clear()
        return mine_bytes, mine_aux

    @staticmethod
    def _keep(op: LoggedOp | None, saved: tuple[float, float]) -> None:
        """Add (bytes, aux bytes) a forward op keeps for its backward to it."""
        if op is not None and saved[0] > 0.0:
            op.op = replace(op.op, saved_bytes=op.op.saved_bytes + saved[0],
                            saved_aux_bytes=op.op.saved_aux_bytes + saved[1])

    def note_boundary(self, segment: str, tensors: Iterable[Any]) -> None:
        """The activation a segment hands on (the embedding's: what the first block reads): its bytes and value
        id."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                self.boundary_bytes.setdefault(segment, self.tensor_bytes(tensor))
                self.boundary_values.setdefault(segment, self.value(tensor).vid)
                return

    # ---- dispatch ------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        sequence_nr = torch._C._autograd._get_sequence_nr()  # pyright: ignore[reportAttributeAccessIssue]
        out = func(*args, **kwargs)
        if func.namespace == "aten":
            self._record(func, args, kwargs, out, sequence_nr - 1)
        return out

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, node_nr: int) -> None:
        name = func.overloadpacket.__name__
        if name in _ALLOCATIONS:
            return
        ins = _unique(t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        outs = _unique(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        makes_node = (self.phase == "fwd" and torch.is_grad_enabled()
                      and any(t.requires_grad for t in ins))
        if self.phase == "fwd" and (func.is_view or name in _ALIASING or not any(
                t.is_floating_point() for t in ins + outs)):
            self._keep(self._last_forward, self._settle_saves(ins, None))
            self._last_outs = outs
        if func.is_view or name in _ALIASING:
            self._view(ins, outs, makes_node, node_nr)
            return
        if not any(t.is_floating_point() for t in ins + outs):
            return  # integer and boolean bookkeeping: positions, masks
        if self.phase == "fwd":
            self._forward(func, name, args, kwargs, out, ins, outs, makes_node, node_nr)
        else:
            self._backward(func, name, args, kwargs, out, ins, outs)

    def _view(self, ins: list[torch.Tensor], outs: list[torch.Tensor], makes_node: bool, node_nr: int) -> None:
        if not ins:
            return
        source = self.value(ins[0])
        for tensor in outs:
            if tensor is not ins[0]:
                self._values[tensor] = source
        if makes_node:
            self._nodes[node_nr] = NodeRecord(self.path, self.segments.of(self.path), source.dtype)

    def _forward(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                 ins: list[torch.Tensor], outs: list[torch.Tensor], makes_node: bool, node_nr: int) -> None:
        path = self.path
        segment = self.segments.of(path)
        self.path_segments.setdefault(path, segment)
        floats_in = [t for t in ins if t.is_floating_point()]
        in_dtypes: list[DType] = [self.value(t).dtype for t in floats_in]
        kind = op_kind(name)
        weight = any(self.value(t).param for t in floats_in)
        if not in_dtypes:
            in_dtypes = [TORCH_DTYPES.get(t.dtype, "fp32") for t in outs if t.is_floating_point()]
        dtype = dtype_for(name, in_dtypes, self.precision, weight_operand=weight)
        category = self._table.category(name) if self._amp else None
        record = NodeRecord(path, segment, dtype)
        if category is not None:
            self._autocast_casts(floats_in, dtype, path, segment, record)
        saved, saved_aux = self._settle_saves(floats_in, storage_dtype(dtype) if category is not None else None)
        self._last_outs = outs
        read = sum(t.numel() * BYTES_PER_DTYPE[storage_dtype(dtype)] if category else self.tensor_bytes(t)
                   for t in floats_in)
        new_outs = [t for t in outs if not any(t is i for i in ins)]  # in-place outputs keep their dtype
        explicit_cast = name in _CASTS or any(t.is_floating_point() and t.dtype != floats_in[0].dtype
                                              for t in new_outs if floats_in)
        for index, tensor in enumerate(new_outs):
            if explicit_cast or not tensor.is_floating_point():
                self._new_value(TORCH_DTYPES.get(tensor.dtype, "fp32"), tensor)
            else:
                aux = kind == "softmax" or (kind == "attention" and index > 0)
                self._new_value(storage_dtype(dtype), tensor, aux=aux)
        written = sum(self.tensor_bytes(t) for t in new_outs if t.is_floating_point())
        if dtype == "fp8":  # fp8 GEMMs read 1-byte operands and write 16-bit results (as cost.flops.matmul_op)
            read = sum(t.numel() for t in floats_in) * BYTES_PER_DTYPE["fp8"]
        if explicit_cast and new_outs and new_outs[0].is_floating_point():
            dtype = widest([self.value(new_outs[0]).dtype, *in_dtypes]) or dtype
        op = Op(name, kind, path, "fwd", dtype, op_flops(name, func, args, kwargs, out, self.causal),
                float(read + written), op_shape(name, kind, args, out),
                recompute_selective=kind in ("attention", "softmax"), saved_bytes=saved, saved_aux_bytes=saved_aux)
        self._last_forward = LoggedOp(op, segment, *self._flow(floats_in, outs))
        self.ops.append(self._last_forward)
        if makes_node:
            self._nodes[node_nr] = record
        if self.keep_calls:
            first: DType | None = next((self.value(t).dtype for t in outs if t.is_floating_point()), None)
            self.calls.append(CallRecord(func, self._stubs(args), self._stubs(kwargs), op, first))

    def _autocast_casts(self, floats_in: list[torch.Tensor], dtype: DType, path: str, segment: str,
                        record: NodeRecord) -> None:
        """The casts torch.autocast inserts before an op of its lists: one op per input of another dtype."""
        target = storage_dtype(dtype)
        for tensor in floats_in:
            value = self.value(tensor)
            if value.dtype == target:
                continue
            if value.param:
                key = (value.vid, target)
                if key in self._cast_cache:
                    continue
                self._cast_cache[key] = None
            moved = float(value.numel * (BYTES_PER_DTYPE[value.dtype] + BYTES_PER_DTYPE[target]))
            shape = tuple(int(d) for d in tensor.shape)
            self.ops.append(LoggedOp(Op("_to_copy", "elementwise", path, "fwd", target, 0.0, moved, shape),
                                     segment))
            if tensor.requires_grad:
                record.backward_casts.append(Op("_to_copy", "elementwise", path, "bwd", value.dtype, 0.0, moved,
                                                shape))

    def _backward(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                  ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        kind = op_kind(name)
        path, segment, dtype = self._backward_home(ins)
        if kind in _GEMM_LIKE:
            compute = dtype
        else:
            compute = storage_dtype(dtype)
        element = BYTES_PER_DTYPE[storage_dtype(compute)]
        moved = float(sum(t.numel() for t in ins + outs if t.is_floating_point()) * element)
        if compute == "fp8":
            moved = float(sum(t.numel() for t in ins) + sum(t.numel() for t in outs) * BYTES_PER_DTYPE["bf16"])
        for tensor in outs:
            if tensor.is_floating_point() and not any(tensor is i for i in ins):
                self._new_value(storage_dtype(compute), tensor)
        op = Op(name, kind, path, "bwd", compute, op_flops(name, func, args, kwargs, out, self.causal), moved,
                op_shape(name, kind, args, out), recompute_selective=kind in ("attention", "softmax"))
        self.ops.append(LoggedOp(op, segment, *self._flow(ins, outs)))

    def _backward_home(self, ins: list[torch.Tensor]) -> tuple[str, str, DType]:
        """(module path, segment, dtype) of a backward op: those of the forward op behind the running node."""
        node = torch._C._current_autograd_node()
        record = self._nodes.get(node._sequence_nr()) if node is not None else None
        if record is not None:
            self._last_bwd = (record.path, record.segment)
            return record.path, record.segment, record.dtype
        variable = getattr(node, "variable", None)
        if variable is not None and variable in self.param_paths:
            path = self.param_paths[variable]
            found = self.path_segments.get(path, self._last_bwd[1])
            return path, found, self.value(variable).dtype
        dtypes: list[DType] = [self.value(t).dtype for t in ins if t.is_floating_point()]
        return self._last_bwd[0], self._last_bwd[1], widest(dtypes) or "fp32"

    def flush_backward_casts(self) -> None:
        """The backward of each autocast cast (the gradient cast back to its source dtype), after backward."""
        for record in self._nodes.values():
            self.ops.extend(LoggedOp(op, record.segment) for op in record.backward_casts)
            record.backward_casts.clear()

    def _stubs(self, value: Any) -> Any:
        def stub(item: Any) -> Any:
            if isinstance(item, torch.Tensor):
                dtype = self.value(item).dtype if item.is_floating_point() else None
                torch_dtype = _TORCH_OF[dtype] if dtype else item.dtype
                return TensorStub(tuple(int(d) for d in item.shape), dtype or "fp32", torch_dtype)
            return item

        return tree_map(stub, value)


_TORCH_OF: dict[DType, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                                       "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            found.append(tensor)
    return found


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            yield leaf
