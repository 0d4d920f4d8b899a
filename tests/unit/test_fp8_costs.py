"""fp8 training costs, exact on tiny cases: the quantization casts around every fp8 GEMM, the 16-bit vocabulary
projection, and the clock of a power-capped GPU."""

import pytest

from trainsim.catalog import load_device
from trainsim.cost.calibration import Calibration, ComputeParams
from trainsim.cost.compute import op_time_s
from trainsim.cost.flops import fp8_casts, matmul_op
from trainsim.errors import ConfigError
from trainsim.frontends.shape import DeviceSlice
from trainsim.frontends.transformer import build_transformer
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.precision import policy_for


def _tiny(precision: str) -> OpGraph:
    """A 1-layer GPT block, hidden 8, 2 heads, ffn 32, vocab 16; one sequence of 4 tokens."""
    spec = TransformerSpec.parse({"name": "tiny", "arch": "gpt", "num_layers": 1, "hidden": 8, "num_heads": 2,
                                  "ffn_hidden": 32, "vocab": 16, "max_seq_len": 4, "mlp": "gelu",
                                  "norm": "layernorm", "position": "learned", "bias": True,
                                  "tied_embeddings": True})
    return build_transformer(spec, DeviceSlice(1, 4, policy_for(precision)))  # type: ignore[arg-type]


def test_cast_bytes_of_one_gemm() -> None:
    # C[4,24] = A[4,8] @ W[8,24]: the input A (32 elements) and the gradient dC (96 elements), each read as
    # bf16 and written as fp8 plus its fp8 transpose: 4 bytes per element.
    gemm = matmul_op("qkv", "blocks.attn.qkv", "fp8", 4, 24, 8)
    fwd, bwd = fp8_casts(gemm)
    assert (fwd.name, fwd.phase, fwd.bytes_moved) == ("qkv.cast", "fwd", 32 * 4)
    assert (bwd.name, bwd.phase, bwd.bytes_moved) == ("qkv.grad_cast", "bwd", 96 * 4)


def test_every_fp8_gemm_of_a_block_has_its_casts() -> None:
    block = next(layer for layer in _tiny("fp8").layers if layer.kind == "block")
    fwd = [op.name for op in block.fwd]
    # Forward: each fp8 GEMM right after the cast of its input.
    for gemm in ("qkv", "out_proj", "fc1", "fc2"):
        assert fwd[fwd.index(gemm) - 1] == f"{gemm}.cast"
    bwd = [op.name for op in block.bwd]
    # Backward: the incoming gradient is cast before the GEMM's dgrad and wgrad.
    for gemm in ("qkv", "out_proj", "fc1", "fc2"):
        assert bwd[bwd.index(f"{gemm}.dgrad") - 1] == f"{gemm}.grad_cast"
    casts = {op.name: op.bytes_moved for op in block.fwd + block.bwd if "cast" in op.name}
    # 4 tokens; qkv 8 -> 24, out_proj 8 -> 8, fc1 8 -> 32, fc2 32 -> 8; 4 bytes per element.
    assert casts == {"qkv.cast": 4 * 8 * 4, "qkv.grad_cast": 4 * 24 * 4,
                     "out_proj.cast": 4 * 8 * 4, "out_proj.grad_cast": 4 * 8 * 4,
                     "fc1.cast": 4 * 8 * 4, "fc1.grad_cast": 4 * 32 * 4,
                     "fc2.cast": 4 * 32 * 4, "fc2.grad_cast": 4 * 8 * 4}


def test_16_bit_graphs_have_no_casts() -> None:
    graph = _tiny("bf16")
    assert not [op for layer in graph.layers for op in layer.fwd + layer.bwd if "cast" in op.name]


def test_fp8_keeps_the_vocabulary_projection_in_bf16() -> None:
    head = next(layer for layer in _tiny("fp8").layers if layer.kind == "head")
    assert {op.dtype for op in head.fwd + head.bwd if op.kind == "matmul"} == {"bf16"}
    assert not [op for op in head.fwd + head.bwd if "cast" in op.name]
    block = next(layer for layer in _tiny("fp8").layers if layer.kind == "block")
    assert {op.dtype for op in block.fwd if op.kind == "matmul"} == {"fp8"}


def test_power_cap_lowers_the_clock_by_the_cube_root_of_the_power_ratio() -> None:
    capped = load_device("h100-sxm5-96gb-500w")
    assert capped.compute_clock_fraction == pytest.approx((500 / 700) ** (1 / 3))
    assert load_device("h100-sxm5-80gb").compute_clock_fraction == 1.0


def test_power_cap_slows_compute_bound_ops_only() -> None:
    # 8 W of a 64 W rating: the clock falls to (1/8)^(1/3) = 1/2, so a compute-bound GEMM takes twice as long;
    # a memory-bound op is unchanged (HBM does not follow the core clock).
    spec = {"name": "toy", "peak_flops_per_s": {"fp32": 1e12, "bf16": 1e14}, "hbm_bytes": 1e9,
            "hbm_bw_bytes_per_s": 1e12}
    full = DeviceSpec.parse(spec)
    capped = DeviceSpec.parse({**spec, "rated_power_w": 64, "power_limit_w": 8})
    cal = Calibration(default_matmul_max_efficiency=1.0,
                      compute=ComputeParams(matmul_half_work_flop_per_tflops=1.0, kernel_overhead_s=0.0))
    gemm = matmul_op("g", "g", "bf16", 4096, 4096, 4096)
    assert op_time_s(gemm, capped, cal) == pytest.approx(2.0 * op_time_s(gemm, full, cal), rel=1e-9)
    cast = fp8_casts(matmul_op("g", "g", "fp8", 64, 64, 64))[0]
    assert op_time_s(cast, capped, cal) == op_time_s(cast, full, cal)


def test_power_fields_come_in_pairs() -> None:
    with pytest.raises(ConfigError, match="power_limit_w"):
        DeviceSpec.parse({"name": "toy", "peak_flops_per_s": {"fp32": 1e12}, "hbm_bytes": 1e9,
                          "hbm_bw_bytes_per_s": 1e12, "power_limit_w": 500})
