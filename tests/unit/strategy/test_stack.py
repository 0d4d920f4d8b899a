"""Training stacks: presets, overrides, bad names, the job-file key and the CLI flags."""

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.errors import ConfigError
from trainsim.jobfile import job_from_settings, read_job_file
from trainsim.strategy.stack import BEHAVIOURS, StackSpec, load_stack, make_stack, stack_names

PRESETS = ("megatron-lm", "megatron-core", "megatron-deepspeed", "deepspeed-zero", "fsdp", "fsdp2", "ddp", "colossalai",
           "nanotron")


def test_every_required_preset_loads_and_states_every_behaviour() -> None:
    assert set(PRESETS) | {"generic"} <= set(stack_names())
    for name in PRESETS:
        stack = load_stack(name)
        assert stack.name == name and stack.description
    assert load_stack("generic") == StackSpec()


def test_presets_state_their_frameworks_defaults() -> None:
    assert not load_stack("megatron-deepspeed").grad_reduce_overlap  # DeepSpeed all-reduces after backward
    assert load_stack("megatron-deepspeed").grad_bucket_params == 5e8
    core = load_stack("megatron-core")
    assert core.grad_reduce_overlap and core.param_gather_overlap and core.tp_comm_overlap
    assert core.attention == "flash3" and core.grad_bucket_params == 128 * 1024 * 1024
    assert load_stack("megatron-lm").pp_scatter_gather
    assert load_stack("megatron-deepspeed").pp_scatter_gather  # DeepSpeed pipe_partitioned=True by default
    # torchtitan's op-level selective checkpointing; Megatron's recomputes the attention core
    assert load_stack("fsdp2").selective_recompute == load_stack("fsdp2-compile").selective_recompute == "op"
    assert load_stack("megatron-core").selective_recompute == "attention"
    # Colossal-AI's HybridParallelPlugin: torch DDP's 25 MiB buckets of fp16 gradients, copied into the buckets;
    # ZeRO gathers after the step (overlap_allgather=False); interleaved pipelines overlap their p2p
    colossal = load_stack("colossalai")
    assert colossal.grad_bucket_params == 25 * 1024 * 1024 / 2 and colossal.grad_bucket_copies
    assert not colossal.param_gather_overlap and colossal.pp_comm_overlap and not colossal.fused_bias_activation
    nanotron = load_stack("nanotron")  # torch DDP over fp32 accumulators, plain TP collectives, flash-attn
    assert nanotron.grad_bucket_params == 25 * 1024 * 1024 / 4 and not nanotron.tp_comm_overlap
    # the column-parallel linears' async input-gradient all-reduce: Megatron's (and Colossal-AI's Linear1D_Col),
    # not nanotron's (tp_linear_async_communication=False), DTensor's or the stacks without tensor parallelism;
    # the Megatron-LM 2020-2022 and Megatron-DeepSpeed presets leave it off (stacks.yaml says why)
    overlapping = {name for name in stack_names() if load_stack(name).tp_dgrad_overlap}
    assert overlapping == {"megatron-core", "colossalai"}
    # DTensor's module wrappers (parallelize_module): torch's own stacks and trainsim measure's; the others bring
    # their own tensor-parallel layers (or none)
    wrapping = {name for name in stack_names() if load_stack(name).tp_module_wrappers}
    assert wrapping == {"generic", "ddp", "fsdp", "fsdp2", "fsdp2-compile"}
    assert nanotron.attention == "flash2" and not nanotron.fused_cross_entropy


def test_overrides_apply_one_by_one_on_a_preset() -> None:
    stack = make_stack({"preset": "fsdp", "fsdp_prefetch_depth": 2}, {"cuda_graphs": True})
    assert stack.fsdp_prefetch_depth == 2 and stack.cuda_graphs
    assert stack.model_dump(exclude={"fsdp_prefetch_depth", "cuda_graphs"}) == \
        load_stack("fsdp").model_dump(exclude={"fsdp_prefetch_depth", "cuda_graphs"})


def test_bad_stack_names_and_behaviours_are_one_line_errors() -> None:
    with pytest.raises(ConfigError,
                       match="choose one of: colossalai, ddp, deepspeed-zero, fsdp, fsdp2, fsdp2-compile, generic"):
        load_stack("megatron")
    with pytest.raises(ConfigError, match="unknown behaviour"):
        make_stack({"preset": "fsdp", "overlap_everything": True})
    with pytest.raises(ConfigError, match="fsdp_prefetch_depth"):
        make_stack("fsdp", {"fsdp_prefetch_depth": -1})
    with pytest.raises(ConfigError, match="stack"):
        make_stack(3)


def test_job_file_key_names_a_preset_or_a_mapping(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text("model: gpt3-1.3b\nnum_gpus: 8\nstack: {preset: megatron-core, tp_comm_overlap: false}\n")
    job = job_from_settings(read_job_file(path))
    assert job.stack.name == "megatron-core" and not job.stack.tp_comm_overlap
    assert job.parallel.attention == "flash3"  # the stack's kernel, where the job names none
    job = job_from_settings({"model": "gpt3-1.3b", "num_gpus": 8, "stack": "megatron-core", "attention": "math"})
    assert job.parallel.attention == "math"  # the job's own kernel wins
    assert job_from_settings({"model": "gpt3-1.3b", "num_gpus": 8}).stack == StackSpec()


def test_cli_stack_flags_and_unknown_name_exit_2() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["predict", "--stack", "nope"])
    assert bad.exit_code == 2 and "choose one of:" in bad.output and "Traceback" not in bad.output
    times = []
    for extra in (["--fsdp-prefetch-depth", "0"], []):
        run = runner.invoke(app, ["predict", "--num-gpus", "16", "--stack", "fsdp", "--zero", "3", "--json", *extra])
        assert run.exit_code == 0, run.output
        times.append(json.loads(run.output)["iteration_time_s"])
    assert times[0] > times[1]  # without prefetch every gather is exposed
    peaks = []
    for choice in ("attention", "op"):
        run = runner.invoke(app, ["predict", "--model", "llama3.1-8b", "--num-gpus", "8", "--zero", "3",
                                  "--recompute", "selective", "--selective-recompute", choice, "--json"])
        assert run.exit_code == 0, run.output
        peaks.append(json.loads(run.output)["peak_memory_bytes"])
    assert peaks[1] < peaks[0]  # the op-level policy keeps less
    times = []
    for flag in ("--tp-dgrad-overlap", "--no-tp-dgrad-overlap"):
        run = runner.invoke(app, ["predict", "--num-gpus", "8", "--tp", "8", "--json", flag])
        assert run.exit_code == 0, run.output
        times.append(json.loads(run.output)["iteration_time_s"])
    assert times[0] < times[1]  # the input gradients' all-reduces hide behind the weight-gradient GEMMs
    bad = runner.invoke(app, ["predict", "--selective-recompute", "layer"])
    assert bad.exit_code == 2 and "selective_recompute" in bad.output and "Traceback" not in bad.output
    assert "cuda_graphs" in BEHAVIOURS and "name" not in BEHAVIOURS


def test_validate_restack_replaces_or_adjusts_each_rows_stack() -> None:
    from trainsim.api.functions import _restack

    assert _restack(None, {}) is None
    adjust = _restack(None, {"cuda_graphs": True})
    assert adjust is not None
    adjusted = adjust(load_stack("fsdp"))
    assert adjusted.cuda_graphs and adjusted.name == "fsdp" and adjusted.fused_cross_entropy
    replace = _restack("ddp", {})
    assert replace is not None and replace(load_stack("fsdp")) == load_stack("ddp")
    with pytest.raises(ConfigError, match="choose one of"):
        _restack("nope", {})


def test_calibration_rows_run_on_their_sources_stack() -> None:
    from trainsim.validate.runs import stack_of_row

    assert stack_of_row({"source": "VIA-Research/vTrain data/ground_truth_single.csv row 1"}).name == \
        "megatron-deepspeed"
    assert stack_of_row({"source": "mosaicml/llm-foundry README"}).name == "fsdp"
    assert stack_of_row({"source": "pytorch/torchtitan docs"}).name == "fsdp2"
    assert stack_of_row({"source": "NVIDIA/NeMo docs"}).name == "megatron-core"
    assert stack_of_row({"source": "NVIDIA-NeMo/Megatron-Bridge docs"}).name == "megatron-core"
    assert stack_of_row({"source": "someone else"}).name == "generic"
    assert stack_of_row({"source": "pytorch/torchtitan docs", "run_id": "tt2412_t2_cp1"}).name == "fsdp2-compile"


@pytest.mark.parametrize(("fields", "stack"), [
    ({"source": "Narayanan et al. SC21 Table 1", "notes": "Megatron-LM, PTD-P", "gpu": "a100-sxm4-80gb"},
     "megatron-lm"),
    ({"source": "NVIDIA/Megatron-LM README weak scaling", "gpu": "h100-sxm5-80gb"}, "megatron-core"),
    ({"source": "microsoft/Megatron-DeepSpeed examples", "gpu": "a100-sxm4-40gb"}, "megatron-deepspeed"),
    ({"source": "some paper", "notes": "trained with NeMo 24.05", "gpu": "h100-sxm5-80gb"}, "megatron-core"),
    ({"source": "some paper", "notes": "DeepSpeed ZeRO-3 offload off"}, "deepspeed-zero"),
    ({"source": "some blog", "notes": "PyTorch FSDP FULL_SHARD"}, "fsdp"),
    ({"source": "some blog", "notes": "FSDP2 fully_shard"}, "fsdp2"),
    ({"source": "some blog", "notes": "our own trainer"}, "generic"),
    ({"source": "hpcaitech/ColossalAI examples", "notes": "LLaMA-2 70B benchmark"}, "colossalai"),
    ({"source": "some blog", "notes": "trained with Colossal-AI's HybridParallelPlugin"}, "colossalai"),
    ({"source": "huggingface/nanotron README"}, "nanotron"),
    ({"source": "Black et al. 2022", "notes": "GPT-NeoX library"}, "megatron-deepspeed"),
    ({"source": "facebookresearch/metaseq logbook"}, "fsdp"),
    ({"source": "Jiang et al. 2024 MegaScale Table 2", "gpu": "a100-sxm4-80gb"}, "megatron-core"),
    ({"source": "BigScience 2022", "notes": "model=BLOOM-176B on 384 A100"}, "megatron-deepspeed"),
    ({"source": "Smith et al. 2022", "notes": "Megatron-Turing NLG 530B", "gpu": "a100-sxm4-80gb"},
     "megatron-deepspeed"),
    ({"source": "Biderman et al. 2023", "notes": "model=Pythia-12B"}, "megatron-deepspeed"),
    ({"source": "Zhang et al. 2022", "notes": "OPT-175B logbook"}, "fsdp"),
    ({"source": "Groeneveld et al. 2024", "notes": "OLMo-7B"}, "fsdp"),
    ({"source": "some blog", "notes": "bloomz-style data, OPTIMUS-1 trainer"}, "generic"),
    ({"source": "MLCommons MLPerf Training v4.0 results", "gpu": "h100-sxm5-80gb"}, "megatron-core"),
    ({"source": "MLPerf Training v2.1 GPT-3", "gpu": "a100-sxm4-80gb"}, "megatron-lm"),
    ({"source": "some paper", "notes": "MLPerf-style run with DeepSpeed"}, "deepspeed-zero"),
])
def test_an_unlisted_source_runs_the_stack_its_source_or_notes_name(fields: dict[str, str], stack: str) -> None:
    from trainsim.validate.runs import stack_of_row

    assert stack_of_row(fields).name == stack


def test_an_empty_zero_cell_takes_its_stacks_default_sharding() -> None:
    from trainsim.validate.runs import parallel_from_row

    row = {"tp": "1", "pp": "1", "dp": "64", "seq_len": "2048", "zero": ""}
    assert parallel_from_row({**row, "source": "mosaicml/llm-foundry README"})["zero"] == 3
    assert parallel_from_row({**row, "source": "NVIDIA-NeMo/Megatron-Bridge docs"})["zero"] == 1
    assert parallel_from_row({**row, "source": "VIA-Research/vTrain x"})["zero"] == 0
    assert parallel_from_row({**row, "source": "mosaicml/llm-foundry README", "zero": "2"})["zero"] == 2
