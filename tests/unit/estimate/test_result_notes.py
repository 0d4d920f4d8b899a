"""A precision the device cannot run natively is noted on the Result, as a missing attention kernel is
(estimate/result.py _kernel_notes), by every engine; the cost falls back to the next wider dtype's peak."""

import pytest

from trainsim.catalog import load_cluster, load_device, load_model
from trainsim.estimate.engines import make_engine
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
