"""FLOP and byte formulas of single ops: small pure functions of shapes, 2 FLOPs per multiply-add."""

from trainsim.hardware.device import BYTES_PER_DTYPE, DType
from trainsim.ir.graph import Op, OpKind


def matmul_flops(batch: int, m: int, n: int, k: int) -> float:
    return 2.0 * batch * m * n * k


def matmul_op(name: str, path: str, dtype: DType, m: int, n: int, k: int, batch: int = 1,
              out_dtype_bytes: int = 2) -> Op:
    """C[m,n] = A[m,k] @ B[k,n]. NB: fp8 GEMMs read 1-byte inputs and write a 16-bit output."""
    in_bytes = BYTES_PER_DTYPE[dtype]
    out_bytes = in_bytes if dtype in ("fp32", "tf32") else out_dtype_bytes
    moved = batch * ((m * k + k * n) * in_bytes + m * n * out_bytes)
    return Op(name, "matmul", path, "fwd", dtype, matmul_flops(batch, m, n, k), moved, (batch, m, n, k))


def matmul_backward(op: Op) -> tuple[Op, Op]:
    """dA = dC @ B^T (m,k over n) and dB = A^T @ dC (k,n over m): each as many FLOPs as the forward."""
    batch, m, n, k = op.shape
    dgrad = matmul_op(op.name + ".dgrad", op.module_path, op.dtype, m, k, n, batch)
    wgrad = matmul_op(op.name + ".wgrad", op.module_path, op.dtype, k, n, m, batch)
    return _as_bwd(dgrad), _as_bwd(wgrad)


def attention_op(path: str, dtype: DType, batch_heads: int, q_tokens: int, kv_tokens: int, head_dim: int,
                 causal: bool, kernel: str = "flash2", value_dim: int = 0) -> Op:
    """Scores Q K^T and the weighted sum P V: 2 * q * kv * (d + dv) FLOPs per head (4 q kv d where the values
    have the queries' and keys' head dim d; value_dim: dv where they do not, 0: d).

    NB: a fused (flash) kernel skips the masked half of a causal score matrix; an unfused one (kernel "math")
    computes it all and also writes the score matrix to memory twice (softmax, dropout).
    """
    fused = kernel != "math"
    dims = head_dim + (value_dim or head_dim)  # a score's reduction, and a value's features
    flops = 2.0 * batch_heads * q_tokens * kv_tokens * dims
    if causal and fused:
        flops *= 0.5
    elem = BYTES_PER_DTYPE[dtype]
    qkvo = batch_heads * (q_tokens + kv_tokens) * dims * elem  # q and k at d, v and the output at dv
    scores = 0.0 if fused else 3.0 * batch_heads * q_tokens * kv_tokens * elem
    return Op("attention", "attention", path, "fwd", dtype, flops, qkvo + scores,
              (batch_heads, q_tokens, kv_tokens, head_dim), recompute_selective=True, kernel=kernel)


def attention_backward(op: Op) -> Op:
    """NB: flash backward recomputes the scores: 5 matmuls against 2 forward -> 2.5x; unfused: 2x."""
    factor = 2.0 if op.kernel == "math" else 2.5
    return Op("attention.bwd", "attention", op.module_path, "bwd", op.dtype, op.flops * factor,
              op.bytes_moved * 2.0, op.shape, kernel=op.kernel)


def pointwise_op(name: str, kind: OpKind, path: str, dtype: DType, elements: float, reads: float = 1.0,
                 writes: float = 1.0, flops_per_element: float = 1.0, selective: bool = False) -> Op:
    """A memory-bound kernel touching `elements` values `reads` + `writes` times."""
    moved = elements * (reads + writes) * BYTES_PER_DTYPE[dtype]
    return Op(name, kind, path, "fwd", dtype, elements * flops_per_element, moved, (int(elements),),
              recompute_selective=selective)


def pointwise_backward(op: Op) -> Op:
    """NB: the gradient of a pointwise op reads the incoming gradient and the saved input: about 1.5x bytes."""
    return _as_bwd(Op(op.name + ".bwd", op.kind, op.module_path, "bwd", op.dtype, op.flops * 2.0,
                      op.bytes_moved * 1.5, op.shape, kernel=op.kernel))


def _as_bwd(op: Op) -> Op:
    return Op(op.name, op.kind, op.module_path, "bwd", op.dtype, op.flops, op.bytes_moved, op.shape,
              op.recompute_selective, op.kernel)


def conv_flops(batch: int, in_channels: int, out_channels: int, kernel: tuple[int, int],
               out_hw: tuple[int, int]) -> float:
    """Direct 2-D convolution (groups=1): 2 * B * out_h * out_w * out_c * in_c * kh * kw."""
    return 2.0 * batch * out_hw[0] * out_hw[1] * out_channels * in_channels * kernel[0] * kernel[1]


def conv_op(name: str, path: str, dtype: DType, batch: int, in_channels: int, out_channels: int,
            kernel: tuple[int, int], stride: int, out_hw: tuple[int, int],
            in_hw: tuple[int, int] | None = None) -> Op:
    """Forward 2-D convolution; shape is the output (batch, out_c, out_h, out_w).

    NB: without in_hw the input is taken as out_hw * stride (a 'same'-padded conv); valid-padded convs read a
    few border rows more. Bytes: input and weights read once, output written once (an ideal implicit GEMM).
    """
    in_h, in_w = in_hw if in_hw is not None else (out_hw[0] * stride, out_hw[1] * stride)
    elem = BYTES_PER_DTYPE[dtype]
    moved = (batch * in_channels * in_h * in_w + out_channels * in_channels * kernel[0] * kernel[1]
             + batch * out_channels * out_hw[0] * out_hw[1]) * elem
    flops = conv_flops(batch, in_channels, out_channels, kernel, out_hw)
    return Op(name, "conv", path, "fwd", dtype, flops, moved, (batch, out_channels, out_hw[0], out_hw[1]))


def conv_backward(op: Op) -> tuple[Op, Op]:
    """dgrad (a transposed convolution of dY with W) and wgrad (dY correlated with X): each as many FLOPs as
    the forward. NB: each is taken to move as many bytes as the forward (it reads two of X, W, dY and writes
    the third).
    """
    dgrad = Op(op.name + ".dgrad", op.kind, op.module_path, "bwd", op.dtype, op.flops, op.bytes_moved,
               op.shape, kernel=op.kernel)
    wgrad = Op(op.name + ".wgrad", op.kind, op.module_path, "bwd", op.dtype, op.flops, op.bytes_moved,
               op.shape, kernel=op.kernel)
    return dgrad, wgrad
