"""One MFU (Result.mfu); a published figure's FLOP convention is converted to, by name, per source."""


from dataclasses import replace

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
from trainsim.validate.predict_runs import FLOP_METRICS, estimator_params, metric_value
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
    embedding = model.vocab * model.hidden  # torchtitan leaves the input embedding out
    assert convention_flops("6nd-embedding+attention", job, 1e9) == (6 * (1e9 - embedding) + attention) * tokens
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
    rows = [row for name in DEFAULT_RUNS_FILES for row in read_runs(MEASUREMENTS_DIR / name)
            if row.metric in FLOP_METRICS]
    assert {source_group(row.source) for row in rows} == {"mosaicml/llm-foundry", "NVIDIA/NeMo",
                                                          "NVIDIA-NeMo/Megatron-Bridge"}
    by_source = {source_group(row.source): flops_convention_of(row.fields) for row in rows}
    assert by_source == {"mosaicml/llm-foundry": "6nd+attention", "NVIDIA/NeMo": "megatron",
                         "NVIDIA-NeMo/Megatron-Bridge": "megatron-causal"}


def test_a_rows_stated_formula_wins_over_its_source() -> None:
    nemo = "NVIDIA/NeMo llama3 table"
    assert flops_convention_of({"source": nemo, "flops_convention": "megatron-eq3"}) == "megatron-eq3"
    assert flops_convention_of({"source": nemo, "flops_convention": "hardware"}) == "6nd+attention+recompute"
    # `model` and `unknown` name no formula: the source's, else model FLOPs with attention
    assert flops_convention_of({"source": "a paper", "flops_convention": "model"}) == "6nd+attention"
    assert flops_convention_of({"source": "a paper", "flops_convention": "unknown"}) == "6nd+attention"
    assert flops_convention_of({"source": "VIA-Research/vTrain row 1"}) == "6nd+attention"


def test_megatron_eq3_as_printed() -> None:
    """96 B s l h^2 (1 + s/6h + V/16lh) per iteration: GPT-3 175B (l 96, h 12288, V 51200, s 2048)."""
    model = load_model("gpt3-175b")
    assert isinstance(model, TransformerSpec)
    model = model.model_copy(update={"vocab": 51200})
    parallel = ParallelSpec(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, seq_len=2048)
    job = make_job(model, load_cluster("dgx-a100-superpod").with_num_gpus(1024), parallel)
    layers, h, s, v, batch = 96, 12288, 2048, 51200, 1536
    printed = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    assert convention_flops("megatron-eq3", job, 175e9) == pytest.approx(printed, rel=1e-12)


def test_hardware_flops_count_the_recomputed_forward() -> None:
    job = _job()
    model = job.model
    assert isinstance(model, TransformerSpec)
    attention_forward = 4.0 * model.num_layers * model.hidden * 2048 * job.tokens_per_iteration
    model_flops = convention_flops("6nd+attention", job, 1e9)
    for recompute, extra in (("none", 0.0), ("selective", attention_forward),
                             ("full", 2e9 * job.tokens_per_iteration + attention_forward)):
        plan = job.parallel.model_copy(update={"recompute": recompute})
        assert convention_flops("6nd+attention+recompute", replace(job, parallel=plan), 1e9) == pytest.approx(
            model_flops + extra, rel=1e-12)


def test_a_mixture_of_experts_counts_the_experts_a_token_uses() -> None:
    mixtral = load_model("mixtral-8x7b")
    assert isinstance(mixtral, TransformerSpec)
    # Jiang et al. 2024, Mixtral of Experts, sec. 2: 47B parameters, 13B active per token (12.9B)
    assert estimator_params(mixtral) == pytest.approx(12.9e9, rel=0.01)
    dense = mixtral.model_copy(update={"num_experts": 1, "top_k": 1})
    parallel = ParallelSpec(tp=2, dp=4, ep=4, micro_batch=1, global_batch=8, seq_len=2048)
    cluster = load_cluster("dgx-h100-80gb")
    moe_job = make_job(mixtral, cluster, parallel)
    dense_job = make_job(dense, cluster, parallel.model_copy(update={"ep": 1}))
    mlp_per_token = 12.0 * mixtral.num_layers * mixtral.hidden * mixtral.ffn_hidden * 1.5  # one expert
    for convention in ("megatron", "megatron-causal"):  # the routed experts' MLPs: top_k = 2 of them
        extra = convention_flops(convention, moe_job, 0.0) - convention_flops(convention, dense_job, 0.0)
        assert extra == pytest.approx(mlp_per_token * moe_job.tokens_per_iteration, rel=1e-12)


def test_deepseek_v3_in_megatron_bridge_s_count() -> None:
    """Megatron-Bridge 0.3.1's count (megatron/bridge/training/utils/flop_utils.py) of DeepSeek-V3 at 4,096
    tokens, by hand: attention 6 x 61 x (1536 (7168 + 128 x 192 + 1) + 512 (7168 + 128 x 256 + 1) + 7168 x 64 +
    128 x 128 x 7168 + 4096 x 128 x 320 / 2) = 99,183,587,328; MLPs 12 x 7168 x 3/2 x (3 x 18432 + 58 (8 x 2048 +
    2048)) = 145,068,392,448 (3 dense blocks, 58 MoE blocks of 8 routed and 1 shared expert); logits 6 x 7168 x
    129280 = 5,560,074,240 per token."""
    deepseek = load_model("deepseek-v3")
    assert isinstance(deepseek, TransformerSpec)
    parallel = ParallelSpec(pp=16, dp=128, ep=64, micro_batch=1, global_batch=15360, seq_len=4096)
    job = make_job(deepseek, load_cluster("hgx-h800").with_num_gpus(2048), parallel)
    per_token = convention_flops("megatron-causal", job, 0.0) / job.tokens_per_iteration
    assert per_token == 99_183_587_328 + 145_068_392_448 + 5_560_074_240
