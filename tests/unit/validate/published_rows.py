"""Hypothesis strategies for rows of the runs.csv schema (the calibration data's README, section 1) shaped like
published multi-node training jobs: the families, widths, depths, vocabularies, GPUs, clusters, parallel
layouts and metrics that papers and vendor pages print, with the cells a source leaves empty left empty.

`published_rows()` keeps tp * pp * dp * cp = num_gpus (the schema guarantees it); `rule_breaking_rows()` breaks
one rule of the schema or of the stacks in each row, to check that such a row is refused in one line."""

from typing import Any

from hypothesis import strategies as st

# GPUs in the job: servers of 8 as published, up to Llama 3's 16K-GPU cluster's largest reported job shape
# (10,752 = 1,344 nodes x 8), and NVL72 rack counts
NUM_GPUS = (16, 32, 48, 64, 72, 96, 128, 144, 192, 256, 384, 512, 576, 768, 1024, 1152, 1536, 2048, 2304, 3072,
            3072, 4096, 4608, 6144, 8192, 10752)
HEAD_DIMS = (64, 80, 96, 128, 192, 256)
HEADS = (16, 20, 24, 25, 32, 40, 48, 52, 56, 64, 71, 80, 96, 112, 128, 160)
VOCABS = ("", "", "32000", "50257", "50304", "50368", "51200", "65024", "100352", "128256", "131072", "151936",
          "152064", "250880", "256000", "32768", "49152")
SEQ_LENS = (2048, 2048, 4096, 4096, 8192, 8192, 16384, 32768, 65536, 131072)
# (gpu cell, cluster cells it is published with, notes naming it)
GPUS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("a100-sxm4-80gb", ("", "dgx-a100-80gb", "other"), ""),
    ("a100-sxm4-40gb", ("", "dgx-a100-40gb", "other"), ""),
    ("a100-unknown", ("", "other"), "A100 GPUs"),
    ("h100-sxm5-80gb", ("", "dgx-h100-80gb", "other"), ""),
    ("h100-sxm5-96gb-500w", ("",), ""),
    ("h200-sxm-141gb", ("", "dgx-h200"), ""),
    ("b200", ("", "dgx-b200"), ""),
    ("gb200", ("", "gb200-nvl72"), "GB200 NVL72 racks"),
    ("b300", ("",), ""),
    ("gb300", ("",), "GB300 NVL72"),
    ("v100-sxm2-32gb", ("", "other"), ""),
    ("other", ("", "other"), "8x NVIDIA H800 SXM5 per node, RoCE"),
    ("other", ("", "other"), "A800 80GB servers"),
    ("other", ("", "other"), "Frontier, AMD MI250X"),
    ("other", ("", "other"), "CSCS Alps, GH200 superchips"),
    ("other", ("", "other"), "V100 32GB, Summit"),
    ("other", ("other",), "TPU v4 pod slice"),
    ("other", ("other",), "MI300X nodes"),
    ("other", ("", "other"), "HGX B200 servers"),
    ("other", ("other",), "Perlmutter GPU nodes"),
    ("a100-unknown", ("other",), "64 AWS p4d.24xlarge instances"),
    ("h100-sxm5-80gb", ("other",), "Eos, DGX H100 SuperPOD"),
)
# (arch cell, notes naming the model, MoE: an ep that divides its experts)
FAMILIES: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("gpt", "model=GPT-3 175B", ()),
    ("llama", "model=Llama 3.1 405B", ()),
    ("mpt", "model=MPT-30B", ()),
    ("bloom", "model=BLOOM 176B", ()),
    ("other", "model=Falcon 180B", ()),
    ("other", "model=Qwen2 72B", ()),
    ("other", "model=Mixtral 8x22B", (1, 2, 4, 8)),
    ("other", "model=DeepSeek-V3 671B", (1, 8, 16, 32, 64)),
    ("other", "model=Qwen3-235B-A22B", (1, 4, 8, 16)),
    ("other", "an in-house model", ()),
)
STACK_NOTES = ("", "", "Megatron-LM", "Megatron-DeepSpeed", "NeMo", "PyTorch FSDP", "torchtitan", "DeepSpeed ZeRO-3",
               "MegaScale")
METRICS = ("iteration_time_s", "iteration_time_s", "tokens_per_s_per_gpu", "mfu", "tflops_per_gpu", "peak_memory_gib",
           "layer_fwd_ms")
FLOPS_CONVENTIONS = ("", "megatron-eq3", "model", "hardware", "unknown")


def _divisors(n: int, at_most: int) -> list[int]:
    return [d for d in range(1, min(n, at_most) + 1) if n % d == 0]


@st.composite
def model_cells(draw: st.DrawFn) -> dict[str, str]:
    arch, notes, expert_eps = draw(st.sampled_from(FAMILIES))
    heads = draw(st.sampled_from(HEADS))
    hidden = heads * draw(st.sampled_from(HEAD_DIMS))
    kv_heads = draw(st.sampled_from(["", str(heads)] + [str(k) for k in (1, 2, 4, 8, 16) if heads % k == 0]))
    if arch in ("gpt", "mpt", "bloom"):
        kv_heads = draw(st.sampled_from(["", str(heads)]))
    ffn = draw(st.sampled_from(["", str(4 * hidden), str(-(-(8 * hidden // 3) // 256) * 256), str(7 * hidden // 2)]))
    cells = {"arch": arch, "num_layers": str(draw(st.integers(24, 126))), "hidden": str(hidden),
             "ffn_hidden": ffn, "num_heads": str(heads), "num_kv_heads": kv_heads,
             "vocab": draw(st.sampled_from(VOCABS)), "seq_len": str(draw(st.sampled_from(SEQ_LENS))),
             "notes": notes, "ep": str(draw(st.sampled_from(expert_eps or (1,))))}
    return cells


@st.composite
def machine_cells(draw: st.DrawFn) -> dict[str, str]:
    gpu, clusters, notes = draw(st.sampled_from(GPUS))
    num_gpus = draw(st.sampled_from(NUM_GPUS) | st.integers(2, 1344).map(lambda nodes: 8 * nodes))
    per_node = draw(st.sampled_from(["", "", "8", "4", "72"] if gpu in ("gb200", "gb300") else ["", "8", "8", "4"]))
    return {"gpu": gpu, "cluster": draw(st.sampled_from(clusters)), "num_gpus": str(num_gpus),
            "gpus_per_node": per_node, "gpu_notes": notes}


@st.composite
def layout_cells(draw: st.DrawFn, num_gpus: int, model: dict[str, str]) -> dict[str, str]:
    """tp, pp, cp, dp with tp * pp * dp * cp = num_gpus; tp a power of two that divides the heads and divides or
    is a multiple of the kv heads (Megatron-LM's and Megatron-Core's asserts), the pipeline at most one stage per
    layer (at most two virtual stages more), and room for ep in dp x cp."""
    heads, num_layers, ep = int(model["num_heads"]), int(model["num_layers"]), int(model["ep"])
    kv_heads = int(model["num_kv_heads"] or heads)
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if num_gpus % t == 0 and heads % t == 0
                               and (kv_heads % t == 0 or t % kv_heads == 0)]))
    rest = num_gpus // tp
    pp = draw(st.sampled_from([d for d in _divisors(rest, 64) if d <= num_layers]))
    rest //= pp
    cp = draw(st.sampled_from([d for d in _divisors(rest, 16) if d in (1, 2, 4, 8, 16)]))
    dp = rest // cp
    # up to two virtual stages more than layers: the embedding and the loss counted in the split (Megatron-Core)
    vpp_choices = [""] + [str(v) for v in range(1, 9) if pp * v <= num_layers + 2] if pp > 1 else ["", "1"]
    return {"tp": str(tp), "pp": str(pp), "dp": str(dp), "cp": str(cp),
            "ep": str(ep if (dp * cp) % ep == 0 else 1),
            "sp": draw(st.sampled_from(["", "0", "1"] if tp > 1 else ["", "0"])),
            "vpp": draw(st.sampled_from(vpp_choices))}


@st.composite
def training_cells(draw: st.DrawFn, dp: int) -> dict[str, str]:
    micro = draw(st.sampled_from(["", "1", "1", "2", "4", "8", "16"]))
    per_step = dp * int(micro or 1)
    batch = draw(st.sampled_from(["", str(per_step * draw(st.integers(1, 64))), str(per_step * 16 + 1),
                                  str(max(1, per_step // 2)), "1024", "1536", "2048"]))
    return {"micro_batch": micro, "global_batch": batch,
            "zero": draw(st.sampled_from(["", "0", "1", "2", "3"])),
            "recompute": draw(st.sampled_from(["", "none", "selective", "full"])),
            "precision": draw(st.sampled_from(["", "fp16", "bf16", "bf16", "fp8"]))}


@st.composite
def published_rows(draw: st.DrawFn) -> dict[str, str]:
    """One metric row of a plausible published multi-node run (tp * pp * dp * cp = num_gpus)."""
    model = draw(model_cells())
    machine = draw(machine_cells())
    layout = draw(layout_cells(int(machine["num_gpus"]), model))
    training = draw(training_cells(int(layout["dp"])))
    metric = draw(st.sampled_from(METRICS))
    convention = draw(st.sampled_from(FLOPS_CONVENTIONS)) if metric in ("mfu", "tflops_per_gpu") else ""
    value = {"iteration_time_s": "12.5", "tokens_per_s_per_gpu": "3100", "mfu": "0.41",
             "tflops_per_gpu": "400", "peak_memory_gib": "61.2", "layer_fwd_ms": "8.5"}[metric]
    notes = "; ".join(text for text in (model.pop("notes"), machine.pop("gpu_notes"),
                                        draw(st.sampled_from(STACK_NOTES))) if text)
    row: dict[str, Any] = {"run_id": "generated", "source": "somewhere/paper Table 1", **model, **machine, **layout,
                           **training, "metric": metric, "value": value, "flops_convention": convention,
                           "derived": "0", "completeness": "full", "notes": notes}
    return row


# One broken rule per row: (cells to replace, formatted with the row's cells; the field the refusal must name)
BROKEN_RULES: tuple[tuple[dict[str, str], str], ...] = (
    ({"dp": "{dp_plus_1}"}, "tp*pp*dp*cp"),
    ({"tp": "8", "pp": "1", "cp": "1", "dp": "{gpus_over_8}", "hidden": "1536", "num_heads": "12",
      "num_kv_heads": ""}, "tp"),
    ({"pp": "{num_gpus}", "tp": "1", "cp": "1", "dp": "1", "num_layers": "8", "vpp": ""}, "pp"),
    ({"ep": "4", "notes": "a dense model"}, "ep"),
    ({"gpu": "other", "notes": "TPU v5p pod"}, "gpu"),
    ({"num_layers": "many"}, "num_layers"),
    ({"seq_len": "0"}, "seq_len"),
    ({"precision": "int4"}, "precision"),
    ({"recompute": "sometimes"}, "recompute"),
    ({"zero": "4"}, "zero"),
)


@st.composite
def rule_breaking_rows(draw: st.DrawFn) -> tuple[dict[str, str], str]:
    """A published row with one rule broken, and the field its refusal must name."""
    row = draw(published_rows())
    cells, field = draw(st.sampled_from(BROKEN_RULES))
    values = {**row, "gpus_over_8": int(row["num_gpus"]) // 8,  # every NUM_GPUS is whole servers of 8
              "dp_plus_1": int(row["dp"]) + 1}
    return {**row, **{key: value.format(**values) for key, value in cells.items()}}, field
