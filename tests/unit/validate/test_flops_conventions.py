"""One MFU (Result.mfu); a published figure's FLOP convention is converted to, by name, per source."""


import pytest

from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import DEFAULT_RUNS_FILES, MEASUREMENTS_DIR
from trainsim.errors import UnknownNameError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.validate.flops_conventions import FLOPS_CONVENTIONS, convention_flops, in_convention
from trainsim.validate.predict_runs import FLOP_METRICS, metric_value
from trainsim.validate.runs import flops_convention_of, read_runs, source_group


def _job() -> Job:
    parallel = ParallelSpec(tp=2, dp=4, micro_batch=1, global_batch=8, seq_len=2048)
    return make_job(load_model("gpt3-1.3b"), load_cluster("dgx-a100-80gb"), parallel)


def test_the_conventions_by_name() -> None:
    job = _job()
    model = job.model
    assert isinstance(model, TransformerSpec)
    tokens = 8 * 2048
    assert convention_flops("6nd", job, 1e9) == 6e9 * tokens
    attention = 12.0 * model.num_layers * model.hidden * 2048
    assert convention_flops("6nd+attention", job, 1e9) == (6e9 + attention) * tokens
    with pytest.raises(UnknownNameError, match="6nd"):
        FLOPS_CONVENTIONS.get("megatron-eq4")


def test_a_converted_mfu_is_results_mfu_with_the_conventions_flops() -> None:
    job = _job()
    result = AnalyticalEstimator().estimate(job, graph_for(job))
    params = 1.3e9
    flops = convention_flops("6nd", job, params)
    expected = flops / (result.iteration_time_s * job.num_gpus * result.peak_flops_per_gpu)
    converted = in_convention(result, job, params, "6nd")
    assert converted.mfu == pytest.approx(expected, rel=1e-12)
    assert converted.tflops_per_gpu == pytest.approx(expected * result.peak_flops_per_gpu / 1e12, rel=1e-12)
    assert converted.iteration_time_s == result.iteration_time_s
    assert metric_value("mfu", job, result, params, "6nd") == converted.mfu


def test_every_source_with_flop_figures_states_its_convention() -> None:
    sources = {source_group(row.source) for name in DEFAULT_RUNS_FILES
               for row in read_runs(MEASUREMENTS_DIR / name) if row.metric in FLOP_METRICS}
    assert sources == {"mosaicml/llm-foundry", "NVIDIA/NeMo", "NVIDIA-NeMo/Megatron-Bridge"}
    assert {flops_convention_of(source) for source in sources} == {"6nd+attention"}
    assert flops_convention_of("VIA-Research/vTrain row 1") is None
