"""What a training stack's behaviours (strategy/stack.py) do to a step's time: the formulas both engines share.

Overlap. A collective of C seconds that runs beside W seconds of compute it does not depend on slows both by
1 + gamma while they overlap (the overlap factor gamma of Proteus, sec. VI-C: compute and communication share
the SMs and the memory bandwidth), so together they take max(W, C) + gamma min(W, C): the exposed time beyond
the compute is max(0, C - W) + gamma min(W, C). gamma (Calibration.runtime.overlap_slowdown) is the one fitted
number; everything else follows from what the stack overlaps.

Bucketed overlap (DDP / Megatron gradient buckets, distributed-optimizer parameter gathers, userbuffers chunks):
n equal buckets of C / n, bucket i ready after i / n of the window W and sent one after another: the last one
ends at max(W + C / n, W / n + C), so max(C / n, C - W (n - 1) / n) stays exposed (the last bucket always);
the rest hides under compute, slowed by gamma. Without overlap the whole C is exposed.
"""

from trainsim.ir.graph import Op
from trainsim.strategy.stack import StackSpec

ACTIVATIONS = ("gelu", "swiglu")  # the activation ops of the graph's MLPs (frontends/catalog/transformer.py)


def overlapped_s(total_s: float, window_s: float, gamma: float) -> float:
    """Exposed seconds of a collective of total_s overlapped with window_s of compute."""
    return max(0.0, total_s - window_s) + gamma * min(total_s, window_s)


def bucketed_s(total_s: float, window_s: float, buckets: float, gamma: float) -> float:
    """Exposed seconds of total_s sent in `buckets` equal buckets that become ready evenly over window_s."""
    if total_s <= 0.0:
        return 0.0
    n = max(1.0, buckets)
    exposed = max(total_s / n, total_s - window_s * (n - 1.0) / n)
    return exposed + gamma * (total_s - exposed)


def unfused_extra_bytes(op: Op, stack: StackSpec, fp8_linears: bool) -> float:
    """Memory traffic an unfused stack adds to an op the graph prices as one fused kernel:
    - an activation without fused_bias_activation: a separate bias add (gelu: one more read + write of the
      tensor, 1x the op's traffic) or, for SwiGLU, a separate SiLU kernel over the gate half (read + write of
      half the inputs: 2/3 of the op's read 2 + write 1);
    - cross-entropy without fused_cross_entropy: log_softmax writes its result and nll_loss reads it back
      (one more read + write of the logits, 1x);
    - fp8: a LayerNorm not fused with its GEMM casts its output in a kernel of its own (read 2 bytes, write 1
      per element: 3/4 of the norm's read + write of 2-byte values), and a GEMM whose input cast is not fused
      reads its 2-byte input and writes the 1-byte copy (3 bytes per input element).
    fp8_linears: the job's linear layers run in fp8."""
    if op.kind == "elementwise" and op.name in ACTIVATIONS and not stack.fused_bias_activation:
        return op.bytes_moved * (2.0 / 3.0 if op.name == "swiglu" else 1.0)
    if op.kind == "loss" and not stack.fused_cross_entropy:
        return op.bytes_moved
    if not fp8_linears:
        return 0.0
    if op.kind == "norm" and not stack.fused_layernorm_linear:
        return 0.75 * op.bytes_moved
    if op.kind == "matmul" and op.dtype == "fp8" and not stack.fused_fp8_cast and len(op.shape) == 4:
        batch, m, _, k = op.shape
        return 3.0 * batch * m * k
    return 0.0
