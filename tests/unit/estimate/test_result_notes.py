"""A precision the device cannot run natively is noted on the Result, as a missing attention kernel is
(estimate/result.py _kernel_notes), by every engine; the cost falls back to the next wider dtype's peak."""

import pytest

from conftest import TINY_GPT
from trainsim.catalog import load_cluster, load_device, load_model
from trainsim.catalog.model_files import parse_model
from trainsim.cost.memory import MemoryEstimate
from trainsim.estimate.engines import make_engine
from trainsim.estimate.result import Result, make_result
from trainsim.ir.graph import Layer, Op, OpGraph
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec


def _notes(cluster: str, precision: str, engine: str = "analytical") -> list[str]:
    job = make_job(load_model("gpt3-125m"), load_cluster(cluster).with_num_gpus(8),
                   ParallelSpec(precision=precision, global_batch=8, seq_len=256))  # type: ignore[arg-type]
    return make_engine(engine).estimate(job, graph_for(job)).notes


@pytest.mark.parametrize(("cluster", "precision"), [("dgx-h100-80gb", "fp8"), ("dgx-a100-80gb", "bf16"),
                                                    ("dgx-a100-80gb", "amp-fp16"), ("dgx1-v100", "fp16"),
                                                    ("dgx1-v100", "fp32")])
def test_a_native_precision_has_no_note(cluster: str, precision: str) -> None:
    assert _notes(cluster, precision) == []


@pytest.mark.parametrize("engine", ["analytical", "sim"])
def test_fp8_on_an_a100_is_noted_and_costed_at_bf16(engine: str) -> None:
    assert _notes("dgx-a100-80gb", "fp8", engine) == [
        "precision=fp8: a100-sxm4-80gb has no native fp8 matmul (fp8 tensor cores need compute capability 8.9+: "
        "Ada, Hopper, Blackwell); costed at its bf16 peak, which a real run may not reach"]


@pytest.mark.parametrize("precision", ["bf16", "amp-bf16"])
def test_bf16_on_a_v100_is_noted_and_costed_at_fp16(precision: str) -> None:
    assert _notes("dgx1-v100", precision) == [
        f"precision={precision}: v100-sxm2-32gb has no native bf16 matmul (bf16 tensor cores need compute "
        "capability 8.0+: Ampere and later); costed at its fp16 peak, which a real run may not reach"]


def test_the_peak_a_missing_dtype_runs_at() -> None:
    a100, v100, titan = load_device("a100-sxm4-80gb"), load_device("v100-sxm2-32gb"), load_device("titan-xp")
    assert (a100.peak_dtype_for("fp8"), a100.peak_for("fp8")) == ("bf16", 312e12)
    assert (v100.peak_dtype_for("bf16"), v100.peak_for("bf16")) == ("fp16", 125e12)
    assert (v100.peak_dtype_for("tf32"), titan.peak_dtype_for("fp16")) == ("fp32", "fp32")
    assert a100.peak_dtype_for("tf32") == "tf32"


# --- hardware FLOPs count the recomputed forward (HFU), model FLOPs do not (MFU) ---


def _hfu_result(recompute: str) -> Result:
    def op(name: str, phase: str, flops: float, selective: bool = False) -> Op:
        return Op(name, "matmul", name, phase, "bf16", flops, 0.0, (1, 1, 1, 1),  # type: ignore[arg-type]
                  recompute_selective=selective)

    block = Layer("block", "block", 2, (op("qkv", "fwd", 10.0), op("core", "fwd", 4.0, selective=True)),
                  (op("qkv.dgrad", "bwd", 28.0),), (), 0.0, 0.0)
    graph = OpGraph("tiny", (block,), 16, 1)  # fwd 2 x 14 = 28 FLOPs, bwd 2 x 28 = 56, selective 2 x 4 = 8
    job = make_job(parse_model(TINY_GPT), load_cluster("dgx-a100-80gb").with_num_gpus(1),
                   ParallelSpec(recompute=recompute, micro_batch=1, global_batch=2, seq_len=16))  # type: ignore[arg-type]
    return make_result("analytical", job, graph, {"compute": 1.0}, MemoryEstimate(1.0, 2.0, {"weights": 1.0}, 0))


@pytest.mark.parametrize(("recompute", "hardware_flops"), [("none", 168.0), ("selective", 184.0),
                                                           ("full", 224.0)])
def test_hfu_counts_the_recomputed_forward(recompute: str, hardware_flops: float) -> None:
    """Two micro-batches of 84 model FLOPs; selective runs the 8 attention-core FLOPs again, full the 28 of
    the whole forward."""
    result = _hfu_result(recompute)
    peak = 312e12  # the A100's bf16 peak, one GPU, a 1 s iteration
    assert result.model_flops_per_iteration == 168.0
    assert result.hardware_flops_per_iteration == hardware_flops
    assert result.mfu == pytest.approx(168.0 / peak, rel=1e-12)
    assert result.hfu == pytest.approx(hardware_flops / peak, rel=1e-12)
