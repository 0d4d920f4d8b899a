"""Op microbenchmarks: time the torch kernel that stands in for each unique op of an OpGraph.

Following the precision-aware predictor (sec. III: "we profile each operator's execution
time across both forward and backward computation graphs using the specific settings from the job config"), every
op is run with the job's own shapes and dtype on the local device:

- matmul (batch, m, n, k): forward as F.linear (x[m,k] @ w[n,k]^T + bias, the layout of nn.Linear), dgrad as
  dy[m,k'] @ w, wgrad as dy^T @ x (+ the bias-gradient sum), as autograd runs them; under amp-* the forward runs
  inside torch.autocast with fp32 weights (so the weight cast is included) and wgrad casts its result to fp32.
- attention (batch*heads, q, kv, head_dim): F.scaled_dot_product_attention (causal when the op is), its
  backward through autograd; an unfused op (the catalog's fused_attention=False) as the two batched matmuls.
- pointwise ops by name: layer norm, GELU, SiLU-gate, add, RoPE-like multiply-add, softmax, cross-entropy,
  embedding lookup, copy (torch.cat of strided parts: a reshard's host copies, either phase); backward through
  autograd.grad (retain_graph, so one forward serves every repeat).

torch is imported inside the functions that time things; signature_of() and friends are plain Python so the cost
lookup (cost/profiled.py) can share them without torch.
"""

import contextlib
import math
import os
import platform
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.graph import COPY_OP, Op, OpGraph
from trainsim.measure.phase import ProbeLog, ReferenceProbe
from trainsim.profile.database import Environment, OpSignature, ProfileDB

NO_BIAS_MATMULS = ("router",)  # the MoE router has no bias
LOGITS_MATMUL = "logits"  # the vocabulary projection: no bias, and its output feeds the fp32 loss
OPTIMIZER_SIGNATURE_KIND = "optimizer"
OVERHEAD_SIGNATURE_KIND = "overhead"
GRAD_COPY_SIGNATURE_KIND = "gradcopy"
UNSUPPORTED_DTYPES = ("fp8",)  # NB: torch has no portable fp8 GEMM; these ops fall back to the roofline


@dataclass(frozen=True, slots=True)
class KernelHints:
    """What the op shapes do not say but the kernels need: row widths of pointwise ops and model habits.

    hidden: width of norm rows and embedding rows; vocab: logits row width on this device (vocab / tp);
    seq_len: softmax row width; bias: linear layers carry a bias; norm: layernorm | rmsnorm;
    amp: the autocast dtype of the amp-* precisions ("bf16" | "fp16"), "" otherwise: weights stay fp32 and
    matmuls and the loss run under torch.autocast, casts included.
    """

    hidden: int = 1024
    vocab: int = 32000
    seq_len: int = 1024
    bias: bool = True
    norm: str = "layernorm"
    amp: str = ""

    def describe(self) -> str:
        return (f"hidden={self.hidden} vocab={self.vocab} seq={self.seq_len} bias={self.bias} norm={self.norm} "
                f"amp={self.amp or 'no'}")


# --- signatures (no torch) ---


def _prod(shape: Iterable[int]) -> float:
    return math.prod(float(d) for d in shape)


def _attention_impl(op: Op) -> str:
    """NB: an attention Op does not carry causal, and a captured one not its kernel; they follow from
    cost/flops.py's formulas: a fused kernel moves only Q, K, V and O (x2 backward), and a fused causal one does
    half the FLOPs (2 x b*q*kv*d forward, 5 x backward) of a full one (4 and 10). A profile times the fused
    kernel torch picks on the profiled device (its SDPA), whichever fused kernel the job names."""
    bh, q, kv, d = op.shape
    qkvo_bytes = bh * (2 * q + 2 * kv) * d * BYTES_PER_DTYPE[op.dtype] * (2.0 if op.phase == "bwd" else 1.0)
    fused = op.kernel != "math" if op.kernel else math.isclose(op.bytes_moved, qkvo_bytes, rel_tol=1e-9)
    if not fused:
        return "attn.unfused"
    ratio = op.flops / max(_prod(op.shape), 1.0)
    causal = ratio < (3.0 if op.phase == "fwd" else 7.5)
    return "sdpa.causal" if causal else "sdpa"


def _pointwise_impl(op: Op) -> str:
    name = op.name.removesuffix(".bwd")
    if op.kind == "norm":
        return "norm"
    if op.kind == "softmax":
        return "softmax"
    if op.kind == "loss":
        return "cross_entropy"
    if op.kind == "embedding":
        return "embedding"
    if name in ("gelu", "swiglu", "rope", COPY_OP):
        return name
    return "add"  # residual adds, position-embedding add and other two-input elementwise ops


def _conv_signature(op: Op) -> OpSignature | None:
    """A convolution by its geometry (Op.kernel "KHxKWsS", set by the CNN front-end) and its output and input
    channels: (batch, out channels, out h, out w, in channels), in channels from the FLOPs."""
    match = re.fullmatch(r"(\d+)x(\d+)s(\d+)", op.kernel)
    if match is None or len(op.shape) != 4:
        return None
    n, c_out, h, w = op.shape
    kh, kw = int(match[1]), int(match[2])
    c_in = round(op.flops / (2.0 * n * c_out * h * w * kh * kw))
    if c_in < 1:
        return None
    part = op.name.rsplit(".", 1)[-1] if op.name.endswith((".dgrad", ".wgrad")) else "fwd"
    return OpSignature("conv", f"conv.{part}.{op.kernel}", op.phase, op.dtype, (n, c_out, h, w, c_in))


def signature_of(op: Op) -> OpSignature | None:
    """The measurement an op is answered by; None for ops no microbenchmark stands in for (fp8; convolutions and
    pools without their geometry)."""
    if op.dtype in UNSUPPORTED_DTYPES:
        return None
    if op.kind == "conv":
        return _conv_signature(op)
    if op.kind == "pool":
        if not re.fullmatch(r"(avg|max)\d+x\d+s\d+o\d+x\d+", op.kernel) or len(op.shape) != 1:
            return None
        return OpSignature("pool", f"pool.{op.kernel}", op.phase, op.dtype, tuple(op.shape))
    if op.kind == "matmul":
        if len(op.shape) != 4:
            return None
        base, _, suffix = op.name.partition(".")
        impl = f"mm.{suffix}" if suffix in ("dgrad", "wgrad") else "mm"
        if base == LOGITS_MATMUL:
            impl += ".logits"
        elif base in NO_BIAS_MATMULS:
            impl += ".nobias"
        return OpSignature("matmul", impl, op.phase, op.dtype, tuple(op.shape))
    if op.kind == "attention":
        if len(op.shape) != 4:
            return None
        return OpSignature("attention", _attention_impl(op), op.phase, op.dtype, tuple(op.shape))
    return OpSignature(op.kind, _pointwise_impl(op), op.phase, op.dtype, tuple(op.shape))


def unique_signatures(graph: OpGraph) -> tuple[list[OpSignature], list[Op]]:
    """Unique signatures in graph order (forward before backward within a layer), and the ops without one."""
    seen: dict[OpSignature, None] = {}
    unsupported: list[Op] = []
    for layer in graph.layers:
        for op in layer.fwd + layer.bwd:
            sig = signature_of(op)
            if sig is None:
                unsupported.append(op)
            else:
                seen.setdefault(sig, None)
    return list(seen), unsupported


def optimizer_signature(params: int) -> OpSignature:
    """Adam over `params` fp32 parameters (master weights and moments are fp32 under every precision)."""
    return OpSignature(OPTIMIZER_SIGNATURE_KIND, "adam", "step", "fp32", (int(params),))


ZERO_STATE_ADAM_IMPL = "adam-zero-state"


def zero_state_optimizer_signature(params: int) -> OpSignature:
    """The same Adam step over all-zero gradients, whose state stays zero (cost/optimizer_zeros.py): torch's CPU
    square root is slower over zeros."""
    return OpSignature(OPTIMIZER_SIGNATURE_KIND, ZERO_STATE_ADAM_IMPL, "step", "fp32", (int(params),))


def has_sparse_tables(graph: OpGraph) -> bool:
    """Whether a graph holds embedding tables whose rows a batch may never look up (a DLRM's sparse layer)."""
    return any(layer.kind == "sparse" for layer in graph.layers)


def grad_copy_signature(params: int) -> OpSignature:
    """A data-parallel gradient sync's copies over `params` fp32 gradients: into flat buckets, scaled by 1 / dp,
    and back (measure_grad_copies)."""
    return OpSignature(GRAD_COPY_SIGNATURE_KIND, "cat-div-copy", "step", "fp32", (int(params),))


def overhead_signature() -> OpSignature:
    """The framework's cost per graph op beyond the kernel calls the op microbenchmarks time."""
    return OpSignature(OVERHEAD_SIGNATURE_KIND, "autograd", "step", "fp32", (1,))


def parameter_tensors(graph: OpGraph, hints: KernelHints) -> list[int]:
    """Sizes of the parameter tensors the optimizer walks, one list entry per tensor. NB: the graph keeps
    parameter counts per layer, not per tensor; the tensors are rebuilt from the ops: a weight per forward
    matmul (n x k) and a bias with it, a weight (and a bias for layernorm) per norm, the rest of the layer's
    parameters as embedding tables. The count matters: torch's CPU Adam costs ~0.1 ms per tensor."""
    sizes: list[int] = []
    for layer in graph.layers:
        tensors: list[int] = []
        channels = 0  # the output channels of the layer's last convolution (a BatchNorm after it has as many)
        for op in layer.fwd:
            if op.kind == "matmul" and len(op.shape) == 4:
                _, _, n, k = op.shape
                tensors.append(n * k)
                if hints.bias and op.name not in (*NO_BIAS_MATMULS, LOGITS_MATMUL):
                    tensors.append(n)
            elif (conv := _conv_signature(op)) is not None:  # a CNN's convolution: its weight (no bias under BN)
                _, channels, _, _, c_in = conv.shape
                kh, kw = (int(x) for x in op.kernel.split("s")[0].split("x"))
                tensors.append(channels * c_in * kh * kw)
            elif op.kind == "norm" and channels:  # BatchNorm: scale and shift per channel
                tensors += [channels] * 2
            elif op.kind == "norm":
                tensors += [hints.hidden] * (2 if hints.norm == "layernorm" else 1)
        if sum(tensors) > layer.param_count:  # a tied vocabulary projection: its weight is the embedding's
            tensors = _fit(tensors, layer.param_count)
        rest = round(layer.param_count) - sum(tensors)
        tables = [op for op in layer.fwd if op.kind == "embedding" or op.name == "pos_add"]
        if rest > 0:
            parts = max(1, len(tables))
            tensors += [rest // parts + rest % parts] + [rest // parts] * (parts - 1)
        sizes += [t for t in tensors if t > 0] * layer.count
    return sizes


def _fit(tensors: list[int], budget: float) -> list[int]:
    """Drop the largest tensors until the rest fit the layer's parameter count."""
    kept = sorted(tensors)
    while kept and sum(kept) > budget:
        kept.pop()
    return kept


# --- the local device ---


def torch_versions() -> str:
    import torch

    cuda = f" cuda {torch.version.cuda}" if torch.cuda.is_available() and torch.version.cuda else ""
    return f"torch {torch.__version__}{cuda}"


def hardware_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def local_environment(device_name: str, device: str) -> Environment:
    import torch

    return Environment(device_name, torch_versions(), torch.get_num_threads(), hardware_name(device))


# --- timing ---


Clock = Callable[[], float]


def clock_for(device: str) -> tuple[Clock, str]:
    """The clock op times are read on. NB: on a CPU with one intra-op thread the calling thread's CPU time
    (time.thread_time) is the op's run time without the slices other processes take from the core; a shared
    machine otherwise adds their load to every measurement. With more threads (or on a GPU) wall time."""
    if device == "cpu":
        import torch

        if torch.get_num_threads() == 1:
            return time.thread_time, "thread CPU time"
    return time.perf_counter, "wall time"


def time_callable(fn: Callable[[], object], sync: Callable[[], None], warmup: int, repeats: int,
                  min_sample_s: float = 2e-4, max_inner: int = 64, clock: Clock = time.perf_counter,
                  flush: Callable[[], None] | None = None, probe: "ProbeLog | None" = None) -> list[float]:
    """`repeats` samples of seconds per call after `warmup` calls. A sample averages enough back-to-back calls
    to last min_sample_s, so microsecond ops are not all timer resolution and Python overhead. flush runs
    (untimed) before each sample: it evicts the caches, so the op starts cold as inside a training step. probe:
    the reference probe timed just before (ahead of the flush) and just after each sample (measure.phase)."""
    for _ in range(max(warmup, 1)):
        fn()
    sync()
    start = clock()
    fn()
    sync()
    one = max(clock() - start, 1e-9)
    inner = min(max_inner, max(1, math.ceil(min_sample_s / one)))
    samples: list[float] = []
    for _ in range(max(repeats, 1)):
        if probe is not None:
            probe.before()
        if flush is not None:
            flush()
            sync()
        start = clock()
        for _ in range(inner):
            fn()
        sync()
        samples.append((clock() - start) / inner)
        if probe is not None:
            probe.after()
    return samples


# --- kernels (torch imported inside) ---


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def _row_width(elements: int, preferred: int) -> int:
    """The row width to lay `elements` out as rows: the preferred width when it divides, else the largest
    divisor up to 4096."""
    if preferred > 0 and elements % preferred == 0:
        return preferred
    for width in range(min(4096, elements), 0, -1):
        if elements % width == 0:
            return width
    return 1


def _backward_of(out: Any, inputs: list[Any]) -> Callable[[], object]:
    """A callable that runs the backward of `out` with respect to `inputs` again and again."""
    import torch

    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)


def _matmul_kernel(sig: OpSignature, hints: KernelHints, device: str) -> tuple[Callable[[], object], str]:
    import torch
    import torch.nn.functional as F

    b, m, n, k = sig.shape
    dt = _torch_dtype(sig.dtype)
    batch = (b,) if b > 1 else ()
    bias = hints.bias and not sig.impl.endswith((".nobias", ".logits"))
    # NB: the loss runs in fp32 under every precision policy (frontends/transformer.py), so 16-bit logits are
    # cast up on the way in and their gradient cast down on the way back: those casts belong to this op.
    logits_cast = sig.impl.endswith(".logits") and dt != torch.float32
    if sig.impl.startswith("mm.dgrad"):
        if logits_cast:
            dy32, w = torch.randn(*batch, m, k, device=device), torch.randn(*batch, k, n, dtype=dt, device=device)
            return (lambda: torch.matmul(dy32.to(dt), w)), "fp32 grad cast, dy @ w"
        dy, w = torch.randn(*batch, m, k, dtype=dt, device=device), torch.randn(*batch, k, n, dtype=dt, device=device)
        return (lambda: torch.matmul(dy, w)), "dy @ w"
    if sig.impl.startswith("mm.wgrad"):
        # out[m, n] = dy^T @ x with dy [k, n] (tokens x out-features) and x [k, m]: dW of nn.Linear is
        # [out, in] = [n, m] in memory; its transpose has the same cost.
        dy, x = torch.randn(*batch, k, n, dtype=dt, device=device), torch.randn(*batch, k, m, dtype=dt, device=device)
        cast = bool(hints.amp) and dt != torch.float32

        def wgrad() -> object:
            dw = torch.matmul(dy.transpose(-1, -2), x)
            db = dy.sum(dim=-2) if bias else None
            if cast:  # NB: autocast's ToCopyBackward casts the 16-bit weight gradient to the fp32 weight
                dw = dw.float()
                db = db.float() if db is not None else None
            return dw, db

        return wgrad, f"dy^T @ x{' + bias grad' if bias else ''}{' + fp32 cast' if cast else ''}"
    amp = bool(hints.amp) and dt != torch.float32
    weight_dtype = torch.float32 if amp else dt
    x = torch.randn(*batch, m, k, dtype=dt, device=device)
    w = torch.randn(*batch, n, k, dtype=weight_dtype, device=device)
    bvec = torch.randn(n, dtype=weight_dtype, device=device) if bias else None
    if batch:
        return (lambda: torch.matmul(x, w.transpose(-1, -2))), "batched x @ w^T"
    if amp:
        def autocast_linear() -> object:
            with torch.autocast(device_type=device, dtype=dt):
                out = F.linear(x, w, bvec)
            return out.float() if logits_cast else out

        return autocast_linear, f"autocast linear{' + bias' if bias else ''}, fp32 weights" + (
            ", fp32 output" if logits_cast else "")
    if logits_cast:
        return (lambda: F.linear(x, w, bvec).float()), "linear, fp32 output"
    return (lambda: F.linear(x, w, bvec)), f"linear{' + bias' if bias else ''}"


def _attention_kernel(sig: OpSignature, device: str) -> tuple[Callable[[], object], str]:
    import torch
    import torch.nn.functional as F

    bh, q_len, kv_len, d = sig.shape
    dt = _torch_dtype(sig.dtype)
    need_grad = sig.phase == "bwd"
    # (1, tokens, heads, d) transposed to (1, heads, tokens, d): the strided views a fused-QKV model hands in
    qb = torch.randn(1, q_len, bh, d, dtype=dt, device=device, requires_grad=need_grad)
    kb = torch.randn(1, kv_len, bh, d, dtype=dt, device=device, requires_grad=need_grad)
    vb = torch.randn(1, kv_len, bh, d, dtype=dt, device=device, requires_grad=need_grad)
    q, k, v = qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2)
    if sig.impl == "attn.unfused":
        def unfused() -> Any:
            scores = torch.matmul(q, k.transpose(-1, -2))
            return torch.matmul(scores, v)

        fwd, detail = unfused, "q @ k^T, p @ v (softmax separate)"
    else:
        causal = sig.impl == "sdpa.causal"

        def fused() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        fwd, detail = fused, f"scaled_dot_product_attention causal={causal}"
    if need_grad:
        return _backward_of(fwd(), [qb, kb, vb]), detail + " backward"
    return fwd, detail


def _pointwise_kernel(sig: OpSignature, hints: KernelHints, device: str) -> tuple[Callable[[], object], str]:
    import torch
    import torch.nn.functional as F

    elements = int(sig.shape[0])
    dt = _torch_dtype(sig.dtype)
    grad = sig.phase == "bwd"

    def tensor(*shape: int) -> Any:
        return torch.randn(*shape, dtype=dt, device=device, requires_grad=grad)

    impl = sig.impl
    if impl == COPY_OP:  # a reshard's host copy: strided parts concatenated into one tensor (torch.cat)
        width = _row_width(elements, hints.hidden)
        whole = torch.randn(elements // width, width, dtype=dt, device=device)
        halves = whole.chunk(2, dim=1) if width > 1 else (whole,)
        return (lambda: torch.cat(halves, dim=1)), f"cat of {len(halves)} column parts of rows of {width}"
    if impl == "add":
        a, b = torch.randn(elements, dtype=dt, device=device), torch.randn(elements, dtype=dt, device=device)
        # NB: the backward of a residual add is the gradient sum where the stream forked: one add as well
        return (lambda: a + b), "a + b"
    if impl == "norm":
        width = _row_width(elements, hints.hidden)
        x, weight = tensor(elements // width, width), tensor(width)
        if hints.norm == "rmsnorm":
            def norm() -> Any:
                return F.rms_norm(x, (width,), weight)
            inputs, detail = [x, weight], f"rms_norm rows of {width}"
        else:
            bias = tensor(width)

            def norm() -> Any:
                return F.layer_norm(x, (width,), weight, bias)
            inputs, detail = [x, weight, bias], f"layer_norm rows of {width}"
        return (_backward_of(norm(), inputs), detail + " backward") if grad else (norm, detail)
    if impl == "gelu":
        x = tensor(elements)
        return (_backward_of(F.gelu(x), [x]), "gelu backward") if grad else ((lambda: F.gelu(x)), "gelu")
    if impl == "swiglu":
        gate, up = tensor(elements), tensor(elements)

        def swiglu() -> Any:
            return F.silu(gate) * up
        return (_backward_of(swiglu(), [gate, up]), "silu(g)*u backward") if grad else (swiglu, "silu(g)*u")
    if impl == "rope":
        x = tensor(elements)
        cos, sin = torch.randn(elements, dtype=dt, device=device), torch.randn(elements, dtype=dt, device=device)

        def rope() -> Any:
            return x * cos + x.flip(-1) * sin
        return (_backward_of(rope(), [x]), "x*cos + rot(x)*sin backward") if grad else (rope, "x*cos + rot(x)*sin")
    if impl == "softmax":
        width = _row_width(elements, hints.seq_len)
        x = tensor(elements // width, width)
        if grad:
            return _backward_of(F.softmax(x, dim=-1), [x]), f"softmax rows of {width} backward"
        return (lambda: F.softmax(x, dim=-1)), f"softmax rows of {width}"
    if impl == "cross_entropy":
        width = _row_width(elements, hints.vocab)
        logits = tensor(elements // width, width)
        target = torch.randint(0, width, (elements // width,), device=device)
        if grad:
            return _backward_of(F.cross_entropy(logits, target), [logits]), f"cross_entropy over {width} backward"
        return (lambda: F.cross_entropy(logits, target)), f"cross_entropy over {width}"
    if impl == "embedding":
        width = _row_width(elements, hints.hidden)
        table = tensor(hints.vocab, width)
        ids = torch.randint(0, hints.vocab, (elements // width,), device=device)
        if grad:
            return _backward_of(F.embedding(ids, table), [table]), f"embedding {hints.vocab}x{width} backward"
        return (lambda: F.embedding(ids, table)), f"embedding {hints.vocab}x{width}"
    raise AssertionError(f"no kernel for {impl}")


def _conv_kernel(sig: OpSignature, device: str) -> tuple[Callable[[], object], str]:
    """F.conv2d with the op's geometry, padded to give its output size; dgrad and wgrad as autograd runs them
    (torch.nn.grad.conv2d_input / conv2d_weight)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.grad import conv2d_input, conv2d_weight

    n, c_out, h, w, c_in = sig.shape
    match = re.fullmatch(r"conv\.(\w+)\.(\d+)x(\d+)s(\d+)", sig.impl)
    assert match is not None
    part, kh, kw, stride = match[1], int(match[2]), int(match[3]), int(match[4])
    pad = (kh // 2, kw // 2)
    padding: Any = pad  # NB: torch.nn.grad takes an (h, w) padding; its annotation says int
    in_h, in_w = (h - 1) * stride + kh - 2 * pad[0], (w - 1) * stride + kw - 2 * pad[1]
    dt = _torch_dtype(sig.dtype)
    x = torch.randn(n, c_in, in_h, in_w, dtype=dt, device=device)
    weight = torch.randn(c_out, c_in, kh, kw, dtype=dt, device=device)
    dy = torch.randn(n, c_out, h, w, dtype=dt, device=device)
    detail = f"conv2d {c_in}->{c_out} {kh}x{kw} stride {stride} on {in_h}x{in_w}"
    if part == "dgrad":
        return (lambda: conv2d_input(x.shape, weight, dy, stride=stride, padding=padding)), detail + " input grad"
    if part == "wgrad":
        return (lambda: conv2d_weight(x, weight.shape, dy, stride=stride, padding=padding)), detail + " weight grad"
    return (lambda: F.conv2d(x, weight, stride=stride, padding=pad)), detail


def _pool_kernel(sig: OpSignature, device: str) -> tuple[Callable[[], object], str]:
    import torch
    import torch.nn.functional as F

    match = re.fullmatch(r"pool\.(avg|max)(\d+)x(\d+)s(\d+)o(\d+)x(\d+)", sig.impl)
    assert match is not None
    mode, kh, kw, stride, oh, ow = match[1], *(int(match[i]) for i in range(2, 7))
    planes = max(1, int(sig.shape[0]) // (oh * ow))
    pad = (min(kh // 2, 1) if stride == 1 else 0, min(kw // 2, 1) if stride == 1 else 0)
    in_h, in_w = (oh - 1) * stride + kh - 2 * pad[0], (ow - 1) * stride + kw - 2 * pad[1]
    x = torch.randn(1, planes, in_h, in_w, dtype=_torch_dtype(sig.dtype), device=device,
                    requires_grad=sig.phase == "bwd")
    pool = F.avg_pool2d if mode == "avg" else F.max_pool2d

    def run() -> Any:
        return pool(x, (kh, kw), stride, pad)

    detail = f"{mode}_pool2d {kh}x{kw} stride {stride} over {planes} planes of {in_h}x{in_w}"
    if sig.phase == "bwd":
        return _backward_of(run(), [x]), detail + " backward"
    return run, detail


def build_kernel(sig: OpSignature, hints: KernelHints, device: str) -> tuple[Callable[[], object], str]:
    """A zero-argument callable that runs the op once on `device`, and a note on what it runs."""
    if sig.kind == "conv":
        return _conv_kernel(sig, device)
    if sig.kind == "pool":
        return _pool_kernel(sig, device)
    if sig.kind == "matmul":
        return _matmul_kernel(sig, hints, device)
    if sig.kind == "attention":
        return _attention_kernel(sig, device)
    return _pointwise_kernel(sig, hints, device)


def _last_level_cache() -> tuple[int, int]:
    """The CPU's last-level cache (Linux sysfs) and how many CPUs share it; (32 MiB, 1) when it cannot be read."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best, sharers = 0, 1
    with contextlib.suppress(OSError):
        for index in sorted(os.listdir(base)):
            with contextlib.suppress(OSError, ValueError), open(f"{base}/{index}/size") as f:
                text = f.read().strip().upper()
                size = int(text.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
                if size > best:
                    best, sharers = size, _cache_sharers(f"{base}/{index}")
    return (best, sharers) if best else (32 * 2**20, 1)


def _last_level_cache_bytes() -> int:
    """The CPU's last-level cache, 32 MiB when it cannot be read."""
    return _last_level_cache()[0]


def _cache_sharers(index_dir: str) -> int:
    """How many CPUs share a cache (sysfs shared_cpu_list, e.g. "0-1,4"); 1 when it cannot be read."""
    with contextlib.suppress(OSError, ValueError), open(f"{index_dir}/shared_cpu_list") as f:
        count = 0
        for part in f.read().strip().split(","):
            low, _, high = part.partition("-")
            count += int(high or low) - int(low) + 1
        return max(count, 1)
    return 1


def last_level_cache_share_bytes() -> int:
    """One core's share of the CPU's last-level cache: its size over the CPUs sharing it (Linux sysfs; 32 MiB
    alone when it cannot be read)."""
    size, sharers = _last_level_cache()
    return size // sharers


def starts_cold(device: str, footprint_bytes: float, cache_share_bytes: int) -> bool:
    """Whether an op is timed after a cache flush. Inside a training step on a CPU an op whose bytes (inputs,
    weights, output) fit in its core's share of the last-level cache finds them there: its input was just
    written by the op before it and the allocator hands back the buffers the step freed. A larger op streams
    them from memory. A GPU's ops are always timed cold (their kernels see an L2 of a few tens of MiB against
    GiB of tensors). On a 2-core EPYC (8 MiB of L3, 4 MiB per core) a flush before each sample doubled the
    small convolutions of a quarter-width Inception-v3 (162 against 71 ms per step), where the run's own
    forward and backward passes took about the warm figure (docs/strategy-tree.md, the Table IV diagnosis)."""
    return device != "cpu" or footprint_bytes > cache_share_bytes


def cache_flusher(device: str) -> Callable[[], None]:
    """Writes a buffer twice the last-level cache (CPU) or 256 MiB (a GPU's L2 is at most ~100 MiB).
    NB: inside a training step an op's weights come back cold and its inputs half warm; a hot-cache loop
    reads matmul operands from cache and came out 5-12% fast on a 2-core EPYC (bf16), so ops start cold."""
    import torch

    size = 256 * 2**20 if device == "cuda" else 2 * _last_level_cache_bytes()
    buffer = torch.empty(size // 4, dtype=torch.float32, device=device)

    def flush() -> None:
        buffer.fill_(1.0)

    return flush


def _sync_for(device: str) -> Callable[[], None]:
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


Measurement = tuple[list[float], str]  # samples (seconds per call), what was run


def measure_op(sig: OpSignature, hints: KernelHints, device: str, warmup: int, repeats: int,
               cold: bool = True, probe: ProbeLog | None = None) -> Measurement:
    """Samples of one op's kernel; cold: after a cache flush (starts_cold says when)."""
    import torch

    fn, detail = build_kernel(sig, hints, device)
    tf32 = sig.dtype == "tf32"
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32  # NB: only CUDA GEMMs read this; CPU fp32 stays fp32
    try:
        clock, clock_name = clock_for(device)
        flush = cache_flusher(device) if cold else None
        samples = time_callable(fn, _sync_for(device), warmup, repeats, clock=clock, flush=flush, probe=probe)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return samples, f"{detail}; {hints.describe()}; {clock_name}, {'cold' if cold else 'warm'} cache"


def footprints(graph: OpGraph) -> dict[OpSignature, float]:
    """Per op signature, the most bytes one of its ops moves (inputs, weights and output)."""
    out: dict[OpSignature, float] = {}
    for layer in graph.layers:
        for op in layer.fwd + layer.bwd:
            sig = signature_of(op)
            if sig is not None:
                out[sig] = max(out.get(sig, 0.0), op.bytes_moved)
    return out


def _adam_samples(tensor_sizes: list[int], device: str, warmup: int, repeats: int, threads: int,
                  zero_state: bool = False, probed: bool = False) -> tuple[list[float], str, list[tuple[float, float]]]:
    """Samples, what was run, and (probed) the reference probe's pairs around them, timed in this process."""
    import torch

    torch.set_num_threads(threads)
    params = [torch.nn.Parameter(torch.randn(size, device=device)) for size in tensor_sizes]
    for param in params:  # all-zero gradients keep Adam's moments at their zero initial value, step after step
        param.grad = torch.zeros_like(param) if zero_state else torch.randn_like(param)
    # AdamW, as trainsim measure's harnesses step (measure/parallelize.py, measure/split_model.py): Adam with
    # decoupled weight decay (torch's default 0.01), one more pass over the weights than torch.optim.Adam
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    clock, clock_name = clock_for(device)
    probe = ProbeLog(ReferenceProbe()) if probed else None
    samples = time_callable(optimizer.step, _sync_for(device), warmup, repeats, min_sample_s=0.0, max_inner=1,
                            clock=clock, probe=probe)
    grads = "all-zero gradients (zero state)" if zero_state else "random gradients"
    return (samples, f"torch.optim.AdamW over {len(tensor_sizes)} tensors, {grads}; {clock_name}",
            probe.pairs_s if probe is not None else [])


def _free_memory_bytes(device: str) -> float:
    if device == "cuda":
        import torch

        return float(torch.cuda.mem_get_info()[0])
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30


ADAM_BYTES_PER_PARAM = 24  # fp32 weight, gradient, two moments and two parameter-sized temporaries


def measure_optimizer(tensor_sizes: list[int], device: str, warmup: int, repeats: int,
                      zero_state: bool = False, probe: ProbeLog | None = None) -> Measurement:
    """One torch.optim.Adam step (its default implementation for the device) over fp32 parameters, with random
    gradients, or with all-zero ones (`zero_state`: the moments stay zero, cost/optimizer_zeros.py).

    NB: a model whose optimizer state would not fit in a quarter of the free memory is measured on tensors
    scaled down by a common factor (the same count) and the times scaled back up: the step is memory-bound,
    linear in the parameters. On a CPU it runs in a fresh process: the step allocates parameter-sized
    temporaries, and whether glibc serves them from reused heap or from fresh pages (faulted in on first
    touch) depends on the process' history; after the op microbenchmarks it came out 23 ms where a fresh
    process and the real training step take 33-36 ms (small GPT, 2-core EPYC)."""
    import torch

    total = float(sum(tensor_sizes))
    budget = 0.25 * _free_memory_bytes(device) / ADAM_BYTES_PER_PARAM
    sizes = tensor_sizes if total <= budget else [max(1, int(size * budget / total)) for size in tensor_sizes]
    scale = total / max(sum(sizes), 1)
    args = (sizes, device, warmup, repeats, torch.get_num_threads(), zero_state, probe is not None)
    if device == "cpu":
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            samples, detail, pairs = pool.apply(_adam_samples, args)
    else:
        samples, detail, pairs = _adam_samples(*args)
    if probe is not None:  # the probe ran in the process that timed the step
        probe.pairs_s.extend((before, after) for before, after in pairs)
    if scale > 1.0:
        samples = [sample * scale for sample in samples]
        detail += f"; measured on 1/{scale:.3g} of the parameters, scaled back"
    return samples, detail


def measure_grad_copies(tensor_sizes: list[int], device: str, warmup: int, repeats: int,
                        probe: ProbeLog | None = None) -> Measurement:
    """The host side of a gradient sync that copies: the gradients concatenated into a flat bucket, the bucket
    divided by the ranks, each gradient copied back from it (torch DDP with gradient_as_bucket_view=False, its
    default: torch/csrc/distributed/c10d/reducer.cpp, torch 2.x; measure/split_model.GradientSync). The bucket is
    allocated afresh each time, as in the step."""
    import torch

    grads = [torch.randn(size, device=device) for size in tensor_sizes]

    def copies() -> None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.div_(2.0)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset: offset + n].view_as(g))
            offset += n

    clock, clock_name = clock_for(device)
    samples = time_callable(copies, _sync_for(device), warmup, repeats, min_sample_s=0.0, max_inner=1, clock=clock,
                            probe=probe)
    return samples, f"gradient bucket copies over {len(tensor_sizes)} tensors; {clock_name}"


def measure_overhead(device: str, warmup: int, repeats: int, chain: int = 200,
                     probe: ProbeLog | None = None) -> Measurement:
    """Per graph op, what autograd adds to the calls the microbenchmarks time: a chain of `chain` tiny
    multiplies run forward with autograd recording and backward through the engine, minus the same kernels
    called directly (forward, and the backward's multiplies), over 2 x chain graph ops (forward + backward).
    probe: a sample's probe pair is the recorded run's before and the direct run's after."""
    import torch

    x0 = torch.randn(8, device=device, requires_grad=True)
    w = torch.randn(8, device=device)

    def recorded() -> None:
        x = x0
        for _ in range(chain):
            x = x * w
        x.sum().backward()

    def direct() -> None:
        x, g = x0.detach(), torch.ones(8, device=device)
        for _ in range(chain):
            x = x * w
        for _ in range(chain):
            g = g * w

    clock, clock_name = clock_for(device)
    sync = _sync_for(device)
    first = len(probe.pairs_s) if probe is not None else 0
    with_autograd = time_callable(recorded, sync, warmup, repeats, min_sample_s=0.0, max_inner=1, clock=clock,
                                  probe=probe)
    plain = time_callable(direct, sync, warmup, repeats, min_sample_s=0.0, max_inner=1, clock=clock, probe=probe)
    if probe is not None:  # one pair per sample of the difference
        pairs = probe.pairs_s[first:]
        probe.pairs_s[first:] = [(a[0], b[1]) for a, b in zip(pairs[:len(plain)], pairs[len(plain):], strict=True)]
    samples = [max(0.0, a - b) / (2.0 * chain) for a, b in zip(with_autograd, plain, strict=True)]
    return samples, f"autograd record + engine per op, chain of {chain} multiplies; {clock_name}"


# --- a whole graph ---


@dataclass(frozen=True, slots=True)
class OpProfileSummary:
    signatures: int  # unique op signatures of the graph, +1 for the optimizer step, +1 for the overhead
    measured: int  # measured now
    already_stored: int  # skipped: the database had them
    unsupported: tuple[str, ...]  # ops no kernel stands in for (answered by the roofline)


ProgressFn = Callable[[OpSignature, str], None]  # (signature, "measured" | "stored") after each one


def profile_graph(db: ProfileDB, env: Environment, graph: OpGraph, hints: KernelHints, device: str, *,
                  warmup: int, repeats: int, optimizer: bool = True, progress: ProgressFn | None = None,
                  plan: Callable[[int], None] | None = None, probe: ProbeLog | None = None) -> OpProfileSummary:
    """Bring every unique op signature of `graph` (plus the Adam step over its parameters and the framework
    overhead) to `repeats` stored samples for `env`: signatures that have them are skipped, the others get the
    missing samples, each signature committed as soon as it is measured. plan(n) is told the total first.

    Calling it again with a higher `repeats` adds samples spread over time (the acceptance benchmark
    interleaves such passes with the real steps it compares against, so both see the same machine load).
    probe: the reference probe timed around every sample, its timings stored beside the raw samples
    (ProfileDB.add_op_probes) for a phase-normalised copy of the database (profile.database.normalise_op_phases)."""
    signatures, unsupported = unique_signatures(graph)
    if optimizer:
        signatures.append(optimizer_signature(sum(parameter_tensors(graph, hints))))
        if has_sparse_tables(graph):
            signatures.append(zero_state_optimizer_signature(sum(parameter_tensors(graph, hints))))
        if device == "cpu":  # the CPU harnesses sync gradients through copied buckets (measure_grad_copies)
            signatures.append(grad_copy_signature(sum(parameter_tensors(graph, hints))))
    signatures.append(overhead_signature())
    if plan is not None:
        plan(len(signatures))
    measured = stored = 0
    sizes = footprints(graph)
    share = last_level_cache_share_bytes() if device == "cpu" else 0
    for sig in signatures:
        missing = repeats - db.op_repeats(env, sig)
        if missing <= 0:
            stored += 1
            if progress is not None:
                progress(sig, "stored")
            continue
        first = len(probe.pairs_s) if probe is not None else 0
        if sig.kind == OPTIMIZER_SIGNATURE_KIND:
            samples, detail = measure_optimizer(parameter_tensors(graph, hints), device, warmup, missing,
                                                zero_state=sig.impl == ZERO_STATE_ADAM_IMPL, probe=probe)
        elif sig.kind == OVERHEAD_SIGNATURE_KIND:
            samples, detail = measure_overhead(device, warmup, missing, probe=probe)
        elif sig.kind == GRAD_COPY_SIGNATURE_KIND:
            samples, detail = measure_grad_copies(parameter_tensors(graph, hints), device, warmup, missing,
                                                  probe=probe)
        else:
            cold = starts_cold(device, sizes.get(sig, math.inf), share)
            samples, detail = measure_op(sig, hints, device, warmup, missing, cold, probe=probe)
        if probe is not None:
            db.add_op_probes(env, sig, samples, probe.pairs_s[first:])
        db.add_op_samples(env, sig, samples, detail)
        measured += 1
        if progress is not None:
            progress(sig, "measured")
    names = tuple(sorted({f"{op.kind}:{op.name}:{op.dtype}" for op in unsupported}))
    return OpProfileSummary(len(signatures), measured, stored, names)
