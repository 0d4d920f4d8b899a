"""How a calibration row becomes a job: the attention kernel of the row's training stack."""

from trainsim.ir.model_spec import TransformerSpec
from trainsim.validate.runs import job_from_row, model_from_row, parallel_from_row

ROW = {"tp": "1", "pp": "1", "dp": "8", "cp": "1", "seq_len": "4096", "global_batch": "128", "micro_batch": "1"}


def test_nemo_and_megatron_bridge_rows_run_transformer_engines_fused_attention() -> None:
    for source in ("NVIDIA/NeMo docs/source/performance/performance_summary.md@8e3d65d (NeMo 24.07)",
                   "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md@4ab94df"):
        assert parallel_from_row({**ROW, "source": source})["attention"] == "flash3"


def test_other_stacks_default_to_flash2() -> None:
    for source in ("mosaicml/llm-foundry scripts/train/benchmarking/README.md", "VIA-Research/vTrain row 1", ""):
        assert parallel_from_row({**ROW, "source": source})["attention"] == "flash2"


def test_a_rows_own_attention_column_wins() -> None:
    fields = {**ROW, "source": "NVIDIA/NeMo x", "attention": "math"}
    assert parallel_from_row(fields)["attention"] == "math"


def _row(**overrides: str) -> dict[str, str]:
    row = {"source": "somewhere/unknown table 1", "arch": "gpt", "num_layers": "4", "hidden": "256",
           "num_heads": "4", "seq_len": "128", "gpu": "h100-sxm5-80gb", "num_gpus": "16", "tp": "1", "pp": "1",
           "dp": "16", "micro_batch": "2", "global_batch": "64"}
    return {**row, **overrides}


def test_a_row_without_precision_runs_16_bit_even_on_an_fp8_gpu() -> None:
    run = job_from_row(_row())
    assert run.skipped is None and run.job is not None
    assert run.job.parallel.precision == "bf16"


def test_a_source_that_states_its_precision_elsewhere_keeps_it() -> None:
    assert parallel_from_row(_row(source="NVIDIA-NeMo/Megatron-Bridge docs x"))["precision"] == "fp8"


def test_an_other_arch_row_is_priced_as_the_nearest_family() -> None:
    assert model_from_row(_row(arch="other", num_kv_heads="2"))["arch"] == "llama"
    assert model_from_row(_row(arch="other", ffn_hidden="700"))["arch"] == "llama"
    assert model_from_row(_row(arch="other", ffn_hidden="1024"))["arch"] == "gpt"


def test_a_global_batch_of_no_whole_micro_batch_count_rounds_to_the_nearest() -> None:
    run = job_from_row(_row(global_batch="100"))  # 100 / (16 x 2) = 3.1 micro-batches
    assert run.job is not None and run.job.parallel.global_batch == 96
    run = job_from_row(_row(global_batch="8"))  # fewer than one: one micro-batch per replica
    assert run.job is not None and run.job.parallel.global_batch == 32


def test_an_empty_micro_batch_is_the_replicas_whole_batch_without_a_pipeline() -> None:
    run = job_from_row(_row(micro_batch="", global_batch="64"))  # 64 / dp 16: one micro-batch of 4
    assert run.job is not None and (run.job.parallel.micro_batch, run.job.parallel.global_batch) == (4, 64)
    run = job_from_row(_row(micro_batch="", global_batch="64", pp="2", dp="8"))  # a pipeline: micro-batches of 1
    assert run.job is not None and (run.job.parallel.micro_batch, run.job.parallel.global_batch) == (1, 64)
    run = job_from_row(_row(micro_batch="", global_batch=""))  # neither: one sequence per replica
    assert run.job is not None and run.job.parallel.micro_batch == 1


def test_a_rows_cluster_cell_names_its_servers() -> None:
    stated = job_from_row(_row(gpu="a100-sxm4-80gb", cluster="a100-200g", num_gpus="16"))
    by_gpu = job_from_row(_row(gpu="a100-sxm4-80gb", cluster="other", num_gpus="16"))
    assert stated.job is not None and by_gpu.job is not None
    assert stated.job.cluster.inter_node.name == "ib-hdr-200" and stated.job.cluster.nics_per_node == 1
    assert by_gpu.job.cluster.nics_per_node == 8  # dgx-a100-80gb, the GPU's preset
    assert stated.job.cluster.device.name == "a100-sxm4-80gb"  # the row's GPU, on the stated servers


def test_model_chunks_without_a_pipeline_and_sequence_parallelism_without_tp_are_off() -> None:
    run = job_from_row(_row(vpp="2", sp="1"))  # tp 1, pp 1: what the stacks run
    assert run.skipped is None and run.job is not None
    assert (run.job.parallel.vpp, run.job.parallel.sp) == (1, False)
    run = job_from_row(_row(tp="2", pp="2", dp="4", vpp="2", sp="1", global_batch="64"))
    assert run.job is not None and (run.job.parallel.vpp, run.job.parallel.sp) == (2, True)


def test_an_other_gpu_is_the_device_its_notes_name() -> None:
    h800 = job_from_row(_row(gpu="other", notes="8x NVIDIA H800 SXM5 per node; RoCE"))
    assert h800.job is not None and h800.job.cluster.device.name == "h100-sxm5-80gb"
    assert h800.job.cluster.intra_node.bw_bytes_per_s == 200e9  # NVLink cut to 400 GB/s both ways
    a100 = job_from_row(_row(gpu="other", notes="A100 PCIe 40GB cards"))
    assert a100.job is not None and a100.job.cluster.device.name == "a100-sxm4-40gb"
    unnamed = job_from_row(_row(gpu="other", notes="Intel Gaudi 2"))
    assert unnamed.job is None and unnamed.skipped is not None and "'other'" in unnamed.skipped


def test_a_row_naming_a_mixture_of_experts_gets_its_experts() -> None:
    mixtral = _row(arch="llama", hidden="256", ffn_hidden="700", num_kv_heads="2", ep="8", dp="16",
                   notes="model=Mixtral-8x7B (47B nominal)")
    run = job_from_row(mixtral)
    assert run.job is not None
    model = run.job.model
    assert isinstance(model, TransformerSpec)
    assert (model.num_experts, model.top_k, model.moe_every, model.ffn_hidden) == (8, 2, 1, 700)
    assert run.job.parallel.ep == 8
    # the entry's expert width is the experts', the row's FFN the dense blocks', the shared experts an MLP of
    # their widths together; DeepSeek-V3's 3 leading dense blocks and its latent attention (transformers 5.24.0)
    deepseek = model_from_row(_row(arch="other", ffn_hidden="18432", notes="model=DEEPSEEK_V3"))
    assert (deepseek["num_experts"], deepseek["top_k"], deepseek["ffn_hidden"]) == (256, 8, 18432)
    assert (deepseek["expert_ffn_hidden"], deepseek["shared_expert_ffn_hidden"]) == (2048, 2048)
    assert deepseek["leading_dense_layers"] == 3
    expert_width_printed = model_from_row(_row(arch="other", ffn_hidden="2048", notes="DeepSeek-V3 671B"))
    assert expert_width_printed["ffn_hidden"] == 18432  # the dense blocks' width is the model's, stated
    assert deepseek["mla"] == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                               "qk_rope_head_dim": 64, "v_head_dim": 128}
    assert deepseek["arch"] == "llama"  # named MoEs have gated MLPs
    lite = model_from_row(_row(arch="other", notes="DeepSeek-V2-Lite pretraining"))
    assert (lite["num_experts"], lite["leading_dense_layers"], lite["mla"]["q_lora_rank"]) == (64, 1, 0)
    assert "mla" not in model_from_row(_row(arch="other", notes="Mixtral 8x22B"))
    ernie = model_from_row(_row(arch="other", notes="ERNIE-4.5-21B-A3B"))
    assert (ernie["num_experts"], ernie["top_k"], ernie["shared_expert_ffn_hidden"], ernie["ffn_hidden"]) == (
        64, 6, 3072, 12288)
    maverick = model_from_row(_row(arch="other", notes="Llama-4-Maverick 400B"))
    assert (maverick["num_experts"], maverick["top_k"], maverick["moe_every"]) == (128, 1, 2)
    assert maverick["shared_expert_ffn_hidden"] == 8192
    qwen = model_from_row(_row(arch="other", notes="Qwen1.5-MoE-A2.7B"))  # a shared expert 4 experts wide
    assert (qwen["top_k"], qwen["expert_ffn_hidden"], qwen["shared_expert_ffn_hidden"]) == (4, 1408, 5632)


def test_dense_rows_stay_dense_and_an_unnamed_expert_parallel_row_is_refused() -> None:
    assert "num_experts" not in model_from_row(_row(notes="model=LLAMA3_8B; DeepSeek-LLM style data"))
    unnamed = job_from_row(_row(ep="4", notes="an in-house MoE"))
    assert unnamed.job is None and unnamed.skipped is not None and "no expert count" in unnamed.skipped


def test_experts_stated_in_words_are_read_from_the_notes() -> None:
    stated = model_from_row(_row(notes="a MoE of 64 experts, top-2 routing"))
    assert (stated["num_experts"], stated["top_k"], stated["moe_every"]) == (64, 2, 1)
    active = model_from_row(_row(notes="16 experts, 4 active experts per token"))
    assert (active["num_experts"], active["top_k"]) == (16, 4)
    by_size = model_from_row(_row(notes="an 8x22B model, top-2"))
    assert (by_size["num_experts"], by_size["top_k"]) == (8, 2)
    # without the experts a token uses: the router's default of the row's stack
    deepspeed = model_from_row(_row(notes="Megatron-DeepSpeed, 128 experts"))
    assert (deepspeed["num_experts"], deepspeed["top_k"]) == (128, 1)
    core = model_from_row(_row(source="NVIDIA/NeMo x", notes="32 experts"))
    assert (core["num_experts"], core["top_k"]) == (32, 2)
    run = job_from_row(_row(ep="8", dp="16", notes="64 experts, top-1"))
    assert run.job is not None and run.job.parallel.ep == 8
    # a server's size is not an expert count
    assert "num_experts" not in model_from_row(_row(notes="8x A100 80GB per node, 4x200Gb NICs"))


def test_amd_gpus_named_in_the_notes_run_on_their_servers() -> None:
    frontier = job_from_row(_row(gpu="other", num_gpus="16", dp="16", notes="Frontier, AMD MI250X, ROCm 5.x"))
    assert frontier.job is not None and frontier.job.cluster.device.name == "mi250x-gcd"
    assert (frontier.job.cluster.name, frontier.job.cluster.nics_per_node) == ("frontier-mi250x", 4)
    mi300x = job_from_row(_row(gpu="other", notes="8x AMD Instinct MI300X per node"))
    assert mi300x.job is not None and mi300x.job.cluster.device.peak_for("bf16") == 1307.4e12


def test_gh200_superchips_named_in_the_notes_run_on_their_four_gpu_nodes() -> None:
    alps = job_from_row(_row(gpu="other", num_gpus="16", dp="16", gpus_per_node="4", notes="CSCS Alps, GH200"))
    assert alps.job is not None and alps.job.cluster.name == "alps-gh200"
    device = alps.job.cluster.device
    assert (device.name, device.hbm_bytes) == ("gh200-96gb", 96 * 2**30)  # "GB" of HBM as GiB, the catalog's rule
    assert alps.job.cluster.nic_bw_per_gpu_bytes_per_s == 200e9 / 8  # one Slingshot-11 NIC per superchip
    jupiter = job_from_row(_row(gpu="other", num_gpus="16", dp="16", gpus_per_node="4",
                                notes="GH200 nodes of JUPITER"))
    assert jupiter.job is not None and jupiter.job.cluster.name == "jupiter-gh200"
    big = job_from_row(_row(gpu="other", num_gpus="16", dp="16", gpus_per_node="4", notes="GH200 144GB HBM3e"))
    assert big.job is not None and big.job.cluster.device.name == "gh200-144gb"
    assert not job_from_row(_row(gpu="other", notes="GH100 engineering sample")).job  # no GPU named: refused


def test_expert_parallelism_wider_than_the_data_ranks_runs_as_the_nearest_plan() -> None:
    # Megatron-Core's parallel folding: ep 64 over tp 2 x dp 32; trainsim's experts share data ranks only
    folded = job_from_row(_row(arch="other", num_gpus="256", tp="2", pp="4", dp="32", ep="64", num_heads="4",
                               num_kv_heads="2", notes="model=Qwen3-235B-A22B"))
    assert folded.job is not None and folded.job.parallel.ep == 32


def test_servers_of_another_size_keep_the_presets_network_per_gpu() -> None:
    four = job_from_row(_row(gpu="a100-sxm4-80gb", gpus_per_node="4", num_gpus="16"))
    eight = job_from_row(_row(gpu="a100-sxm4-80gb", num_gpus="16"))
    assert four.job is not None and eight.job is not None
    assert (four.job.cluster.gpus_per_node, four.job.cluster.nics_per_node) == (4, 4)  # dgx-a100: 8 NICs, 8 GPUs
    assert four.job.cluster.nic_bw_per_gpu_bytes_per_s == eight.job.cluster.nic_bw_per_gpu_bytes_per_s


def test_a_malformed_expert_parallel_cell_is_a_skip_reason_not_an_error() -> None:
    bad = job_from_row(_row(ep="two"))
    assert bad.job is None and bad.skipped is not None and "ep" in bad.skipped


def test_a_machine_named_in_the_notes_supplies_its_servers_and_network() -> None:
    p4d = job_from_row(_row(gpu="a100-unknown", cluster="other", notes="64 AWS p4d.24xlarge instances"))
    assert p4d.job is not None and p4d.job.cluster.name == "aws-p4d"
    assert p4d.job.cluster.device.name == "a100-sxm4-40gb"  # the variant the row left open: the machine's GPU
    assert p4d.job.cluster.nic_bw_per_gpu_bytes_per_s == 4 * 100e9 / 8 / 8  # 400 Gb/s of EFA per 8 GPUs
    dgx = job_from_row(_row(gpu="a100-unknown", cluster="other", notes="DGX A100 nodes"))
    assert dgx.job is not None and dgx.job.cluster.nic_bw_per_gpu_bytes_per_s == 200e9 / 8
    # a gpu cell of `other` whose notes name only the machine runs on the machine's GPU
    other = job_from_row(_row(gpu="other", cluster="other", notes="NERSC Perlmutter GPU nodes", gpus_per_node="4"))
    assert other.job is not None and other.job.cluster.device.name == "a100-sxm4-40gb"
    assert (other.job.cluster.gpus_per_node, other.job.cluster.nics_per_node) == (4, 4)
    summit = job_from_row(_row(gpu="v100-sxm2-32gb", cluster="other", num_gpus="12", dp="12", global_batch="48",
                               gpus_per_node="6", notes="OLCF Summit"))
    assert summit.job is not None and summit.job.cluster.name == "summit-v100"
    assert summit.job.cluster.device.name == "v100-sxm2-32gb"  # a GPU the row states stays the row's


def test_a_machine_that_cannot_carry_the_rows_gpu_or_a_stated_cluster_is_not_taken_from_the_notes() -> None:
    h100 = job_from_row(_row(gpu="h100-sxm5-80gb", cluster="other", notes="faster than our earlier p4d runs"))
    assert h100.job is not None and h100.job.cluster.name == "dgx-h100-80gb"
    stated = job_from_row(_row(gpu="a100-sxm4-80gb", cluster="dgx-a100-80gb", notes="AWS p4de"))
    assert stated.job is not None and stated.job.cluster.name == "dgx-a100-80gb"
