"""The roofline op-cost model: GEMM efficiency curve properties."""

import pytest

from trainsim.catalog.calibration import Calibration, ComputeParams
from trainsim.cost.compute import matmul_efficiency
from trainsim.pipeline import graph_for

PEAK = 312e12


@pytest.mark.parametrize("exponent", [0.5, 1.0, 1.48, 3.0])
@pytest.mark.parametrize("dim_exponent", [0.3, 0.7, 1.0])
def test_gemm_time_never_grows_as_work_shrinks(exponent: float, dim_exponent: float) -> None:
    cal = Calibration(compute=ComputeParams(matmul_half_work_flop_per_tflops=3e7, matmul_exponent=exponent,
                                            matmul_half_dim=64.0, matmul_dim_exponent=dim_exponent))
    previous = 0.0
    for step in range(40):
        side = 8 * 1.3**step  # a cube GEMM of growing side: work and smallest dimension both grow
        work = 2.0 * side**3
        seconds = work / (PEAK * matmul_efficiency(work, PEAK, 0.87, cal, 1.0, side))
        assert seconds >= previous * (1 - 1e-12), (side, seconds, previous)
        previous = seconds


def test_large_gemms_approach_the_maximum_efficiency() -> None:
    cal = Calibration(compute=ComputeParams(matmul_half_work_flop_per_tflops=3e7, matmul_exponent=1.5,
                                            matmul_half_dim=32.0, matmul_dim_exponent=1.0))
    assert matmul_efficiency(2.0 * 16384**3, PEAK, 0.87, cal, 1.0, 16384) == pytest.approx(0.87, rel=0.01)


def _attention_seconds(device_name: str, kernel: str, cal: Calibration) -> float:
    from trainsim.catalog import load_device
    from trainsim.cost.compute import op_time_s
    from trainsim.ir.flops import attention_op

    op = attention_op("block.attn.core", "bf16", 32, 4096, 4096, 128, causal=True, kernel=kernel)
    return op_time_s(op, load_device(device_name), cal)


FLASH_CAL = Calibration(compute=ComputeParams(attention_efficiency=0.4, flash3_attention_efficiency=0.8,
                                              kernel_overhead_s=0.0, memory_efficiency=1.0),
                        default_matmul_max_efficiency=0.8)


def test_flash3_is_costed_with_its_own_efficiency_on_hopper() -> None:
    flash2 = _attention_seconds("h100-sxm5-80gb", "flash2", FLASH_CAL)
    flash3 = _attention_seconds("h100-sxm5-80gb", "flash3", FLASH_CAL)
    assert flash2 / flash3 == pytest.approx(0.8 / 0.4, rel=1e-9)


def test_flash3_on_a_device_without_it_runs_as_flash2() -> None:
    flash2 = _attention_seconds("a100-sxm4-80gb", "flash2", FLASH_CAL)
    assert _attention_seconds("a100-sxm4-80gb", "flash3", FLASH_CAL) == pytest.approx(flash2, rel=1e-12)


def test_no_attention_kernel_beats_the_devices_best_gemm() -> None:
    """eff = min(matmul eff x attention factor, MAMF): a factor of 10 gives exactly FLOPs / (peak x 0.8)."""
    from trainsim.catalog import load_device
    from trainsim.ir.flops import attention_op

    cal = FLASH_CAL.model_copy(update={"compute": FLASH_CAL.compute.model_copy(
        update={"flash3_attention_efficiency": 10.0})})
    op = attention_op("block.attn.core", "bf16", 32, 4096, 4096, 128, causal=True, kernel="flash3")
    peak = load_device("h100-sxm5-80gb").peak_for("bf16")
    assert _attention_seconds("h100-sxm5-80gb", "flash3", cal) == pytest.approx(op.flops / (peak * 0.8), rel=1e-9)


def _with_half(cal: Calibration, half_kv_tokens: float) -> Calibration:
    return cal.model_copy(update={"compute": cal.compute.model_copy(
        update={"attention_half_kv_tokens": half_kv_tokens})})


@pytest.mark.parametrize("kv_tokens, half, expected", [(1024, 1024.0, 0.5), (3072, 1024.0, 0.75),
                                                        (4096, 0.0, 1.0), (512, 1536.0, 0.25)])
def test_key_loop_efficiency_is_kv_over_kv_plus_half(kv_tokens: int, half: float, expected: float) -> None:
    from trainsim.cost.compute import key_loop_efficiency
    from trainsim.ir.flops import attention_op

    cal = _with_half(FLASH_CAL, half)
    for kernel in ("flash2", "flash3"):
        op = attention_op("block.attn.core", "bf16", 32, kv_tokens, kv_tokens, 128, causal=True, kernel=kernel)
        assert key_loop_efficiency(op, cal) == expected
    math_op = attention_op("block.attn.core", "bf16", 32, kv_tokens, kv_tokens, 128, causal=True, kernel="math")
    assert key_loop_efficiency(math_op, cal) == 1.0  # unfused: GEMMs priced as GEMMs


def test_a_fused_kernel_at_its_half_point_takes_twice_as_long() -> None:
    """4,096 keys with the half point at 4,096: the kernel's rate halves, its time doubles (compute-bound, no
    overhead, far below the MAMF cap); the unfused kernel is unchanged."""
    for device, kernel in (("h100-sxm5-80gb", "flash2"), ("h100-sxm5-80gb", "flash3"), ("a100-sxm4-80gb", "flash2"),
                           ("a100-sxm4-80gb", "math")):
        plain = _attention_seconds(device, kernel, FLASH_CAL)
        halved = _attention_seconds(device, kernel, _with_half(FLASH_CAL, 4096.0))
        assert halved == pytest.approx(plain * (1.0 if kernel == "math" else 2.0), rel=1e-12), (device, kernel)


def test_a_kernel_the_device_lacks_is_said_in_the_result() -> None:
    from trainsim.catalog import load_cluster, load_model
    from trainsim.estimate.analytical import AnalyticalEstimator
    from trainsim.job import make_job
    from trainsim.strategy.parallel import ParallelSpec

    def notes(cluster: str) -> list[str]:
        job = make_job(load_model("gpt3-125m"), load_cluster(cluster).with_num_gpus(8),
                       ParallelSpec(attention="flash3", global_batch=8, seq_len=1024))
        return AnalyticalEstimator().estimate(job, graph_for(job)).notes

    assert notes("dgx-h100-80gb") == []
    assert notes("dgx-a100-80gb") == [
        "attention=flash3: a100-sxm4-80gb has no Hopper-native attention kernel; costed as flash2"]
