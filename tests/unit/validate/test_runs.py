"""How a calibration row becomes a job: the attention kernel of the row's training stack."""

from trainsim.validate.runs import parallel_from_row

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
