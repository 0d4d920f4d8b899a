"""One rank's execution trace as an OpGraph (what `trainsim graph --frontend trace` shows).

Each top-level forward or backward op becomes an Op. FLOPs and bytes come from the tensor shapes the trace
recorded: GEMMs, convolutions and attention by formula wherever they sit in the op's subtree, other leaf aten
ops at one FLOP per output element (the torch front-end's convention), views and allocations at zero. The trace
has no module tree, so the graph is one layer; optimizer ops and collectives are left out (they are not
forward/backward compute). Parameters: the tensors the optimizer updates in place.
"""

import re
from math import prod

from trainsim.frontends.trace.rank_trace import RankTrace, TensorRef, TraceOp
from trainsim.hardware.device import DType
from trainsim.ir.graph import Layer, Op, OpGraph, OpKind

_GEMMS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
_ATTENTION = re.compile(r"^aten::_scaled_dot_product_\w*attention\w*$")
_CONV = frozenset({"aten::convolution", "aten::_convolution", "aten::convolution_backward"})
# NB: views, allocations and metadata ops move no data and do no arithmetic.
_FREE = frozenset({"aten::as_strided", "aten::view", "aten::t", "aten::transpose", "aten::expand", "aten::detach",
                   "detach", "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_strided",
                   "aten::empty_like", "aten::reshape", "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze",
                   "aten::permute", "aten::select", "aten::slice", "aten::alias", "aten::lift_fresh",
                   "aten::_unsafe_view", "aten::resize_", "aten::split", "aten::chunk", "aten::unbind",
                   "aten::broadcast_tensors", "aten::contiguous", "aten::numpy_T", "aten::set_"})
_NO_ARITHMETIC = frozenset({"aten::copy_", "aten::_to_copy", "aten::to", "aten::fill_", "aten::zero_",
                            "aten::clone", "aten::cat", "aten::stack", "aten::index_select", "aten::gather"})
_KINDS: tuple[tuple[str, OpKind], ...] = (
    ("attention", "attention"), ("conv", "conv"), ("layer_norm", "norm"), ("group_norm", "norm"),
    ("batch_norm", "norm"), ("rms_norm", "norm"), ("softmax", "softmax"), ("embedding", "embedding"),
    ("loss", "loss"), ("pool", "pool"), ("linear", "matmul"), ("addmm", "matmul"), ("bmm", "matmul"),
    ("matmul", "matmul"), ("mm", "matmul"))
_IR_DTYPES: dict[str, DType] = {"float32": "fp32", "float64": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def gemm_dims(op: TraceOp) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of mm / addmm / bmm / baddbmm from their last two tensor arguments."""
    tensors = [t for t in op.inputs if t.shape]
    if op.name not in _GEMMS or len(tensors) < 2:
        return None
    a, b = tensors[-2].shape, tensors[-1].shape
    if len(a) == 2 and len(b) == 2:
        return 1, a[0], b[1], a[1]
    if len(a) == 3 and len(b) == 3:
        return a[0], a[1], b[2], a[2]
    return None


def formula_flops(op: TraceOp) -> float | None:
    """FLOPs of a GEMM, attention or convolution op (2 per multiply-add), None for other ops."""
    dims = gemm_dims(op)
    if dims is not None:
        batch, m, n, k = dims
        return 2.0 * batch * m * n * k
    if _ATTENTION.match(op.name):
        q, k = (op.inputs[1], op.inputs[2]) if "backward" in op.name else (op.inputs[0], op.inputs[1])
        if len(q.shape) != 4 or len(k.shape) != 4:
            return None
        # NB: scores and weighted sum, 4*b*h*s_q*s_k*d forward; the backward does twice that (4 GEMMs).
        forward = 4.0 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
        return 2.0 * forward if "backward" in op.name else forward
    if op.name in _CONV:
        weight = next((t for t in op.inputs[1:3] if len(t.shape) >= 3), None)
        out = op.inputs[0] if op.name == "aten::convolution_backward" else (op.outputs[0] if op.outputs else None)
        if weight is None or out is None:
            return None
        forward = 2.0 * prod(out.shape) * prod(weight.shape[1:])
        return 2.0 * forward if op.name == "aten::convolution_backward" else forward  # NB: dgrad + wgrad
    return None


def op_cost(trace: RankTrace, op: TraceOp) -> tuple[float, float]:
    """(FLOPs, bytes moved) of an op and everything it calls."""
    flops = formula_flops(op)
    if flops is not None:
        return flops, float(_io_bytes(op.inputs) + _io_bytes(op.outputs))
    if op.children:
        total_flops = total_bytes = 0.0
        for child in op.children:
            f, b = op_cost(trace, trace.ops[child])
            total_flops += f
            total_bytes += b
        return total_flops, total_bytes
    if op.name in _FREE or not op.name.startswith("aten::"):
        return 0.0, 0.0
    moved = float(_io_bytes(op.inputs) + _io_bytes(op.outputs))
    if op.name in _NO_ARITHMETIC:
        return 0.0, moved
    elements = max((t.numel for t in op.outputs), default=max((t.numel for t in op.inputs), default=0))
    return float(elements), moved


def _io_bytes(tensors: tuple[TensorRef, ...]) -> int:
    return sum(t.nbytes for t in tensors)


def op_kind(name: str) -> OpKind:
    base = re.sub(r"Backward\d*$", "", name.removeprefix("aten::")).lower()
    for key, kind in _KINDS:
        if key in base:
            return kind
    return "elementwise"


def _dtype(op: TraceOp) -> DType:
    for tensor in (*op.inputs, *op.outputs):
        if tensor.dtype.startswith("float8"):
            return "fp8"
        if tensor.dtype in _IR_DTYPES:
            return _IR_DTYPES[tensor.dtype]
    return "fp32"


def _shape(trace: RankTrace, op: TraceOp) -> tuple[int, ...]:
    for node in (op, *trace.descendants(op)):
        dims = gemm_dims(node)
        if dims is not None:
            return dims
    tensors = op.outputs or op.inputs or tuple(t for child in trace.descendants(op) for t in child.outputs)
    return tensors[0].shape if tensors else ()


def trace_op_graph(trace: RankTrace, name: str | None = None) -> OpGraph:
    """The OpGraph of one rank's traced iteration (see the module docstring)."""
    fwd: list[Op] = []
    bwd: list[Op] = []
    for op in trace.top_level():
        if op.collective is not None or op.phase == "optimizer":
            continue
        flops, moved = op_cost(trace, op)
        ir = Op(op.name, op_kind(op.name), f"trace.{op.node_id}", op.phase, _dtype(op), flops, moved,
                _shape(trace, op))
        (bwd if op.phase == "bwd" else fwd).append(ir)
    params = float(parameter_count(trace))
    label = name or f"trace rank {trace.rank}"
    # NB: the trace is the run as it ran (its recompute included): every mode keeps what its forward ops wrote
    saved = float(saved_activation_bytes(trace))
    layer = Layer(f"rank{trace.rank}", "block", 1, tuple(fwd), tuple(bwd), (), params, params,
                  {"none": saved, "selective": saved, "full": saved})
    samples = _samples(trace)
    return OpGraph(label, (layer,), samples, samples)


def parameter_count(trace: RankTrace) -> int:
    """Elements of the tensors the optimizer updates in place (inputs that are also outputs of its ops)."""
    seen: dict[int, int] = {}
    for op in trace.ops.values():
        if op.phase != "optimizer" or op.children:
            continue
        written = {t.tensor_id for t in op.outputs}
        for tensor in op.inputs:
            if tensor.tensor_id in written:
                seen[tensor.tensor_id] = tensor.numel
    return sum(seen.values())


def saved_activation_bytes(trace: RankTrace) -> int:
    """Bytes of the distinct tensors the top-level forward ops wrote: what autograd can keep for the backward
    pass (an upper bound: a tensor freed before the backward pass is counted too)."""
    seen: dict[int, int] = {}
    for op in trace.top_level():
        if op.phase == "fwd":
            for tensor in op.outputs:
                seen[tensor.tensor_id] = tensor.nbytes
    return sum(seen.values())


def _samples(trace: RankTrace) -> int:
    """NB: the trace does not say what the batch is: the first dimension of the first forward op's input."""
    for op in trace.top_level():
        if op.phase == "fwd" and op.inputs and op.inputs[0].shape:
            return max(1, op.inputs[0].shape[0])
    return 1
