"""Read runs in the schema of shared/data/calibration/runs.csv and turn each into a Job."""

import csv
import io
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from trainsim.catalog.files import DATA_DIR, read_mapping, read_text, shown_path
from trainsim.catalog.loader import cluster_names, load_cluster, load_device
from trainsim.catalog.model_files import parse_model
from trainsim.errors import ConfigError, InputFileError, TrainsimError, short_repr
from trainsim.hardware.cluster import ClusterSpec
from trainsim.job import Job, make_job
from trainsim.specbase import MAX_INT_FIELD
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec, load_stack

REQUIRED_COLUMNS = ("run_id", "source", "arch", "num_layers", "hidden", "num_heads", "seq_len", "gpu",
                    "num_gpus", "tp", "pp", "dp", "metric", "value")
# peak_allocated_gib: the peak without the runtime's reserve (CUDA context, or on a CPU the interpreter and torch),
# what CUDA's max-allocated counter and the RSS above a rank's baseline measure
METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_gib",
           "peak_allocated_gib", "layer_fwd_ms", "layer_bwd_ms")


@dataclass(frozen=True, slots=True)
class RunRow:
    """One measured value of a run. job: the run's exact job where the source has it (a run measured by
    `trainsim measure`); otherwise the job is rebuilt from the row's columns (job_from_row)."""

    run_id: str
    source: str
    metric: str
    measured: float
    fields: dict[str, str]
    job: Job | None = None


@dataclass(frozen=True, slots=True)
class RunJob:
    """A row's job, or the reason it cannot be predicted."""

    job: Job | None
    skipped: str | None


@cache
def row_defaults() -> dict[str, Any]:
    return read_mapping(DATA_DIR / "calibration" / "row_defaults.yaml")


# The calibration runs.csv is 2 MiB; a runs file 32 times that is not one.
MAX_RUNS_FILE_BYTES = 64 * 2**20


def read_runs(path: Path) -> list[RunRow]:
    """Every row of a runs CSV (UTF-8, size-capped); a malformed file or a row without a usable measured value is
    one InputFileError line naming the file and the line."""
    name = shown_path(path)
    try:
        reader = csv.DictReader(io.StringIO(read_text(path, MAX_RUNS_FILE_BYTES), newline=""))
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputFileError(f"{name} lacks the columns {', '.join(missing)} of the runs.csv schema")
        rows = list(reader)
    except csv.Error as exc:  # a field over csv's limit (128 KiB), a NUL byte
        raise InputFileError(f"{name} is not a valid CSV file: {exc}") from None
    return [_row(r, name, i) for i, r in enumerate(rows, start=2)]


def _row(raw: dict[str | None, str | None], name: str, line: int) -> RunRow:
    if None in raw or any(value is None for value in raw.values()):
        raise InputFileError(f"{name}:{line}: the row has {'more' if None in raw else 'fewer'} cells than the header")
    fields: dict[str, str] = {str(key): str(value) for key, value in raw.items()}
    text = fields["value"].strip()
    try:
        measured = float(text)
    except ValueError:
        measured = math.nan
    if not math.isfinite(measured) or measured <= 0:
        raise InputFileError(f"{name}:{line}: value={short_repr(text)} is invalid: must be a positive finite number")
    return RunRow(fields["run_id"], fields["source"], fields["metric"], measured, fields)


def _int(fields: dict[str, str], key: str, default: int | None = None) -> int:
    """An integer cell ('8' or '8.0'); empty cells take the default. A fraction, NaN, infinity or a number past
    MAX_INT_FIELD is a ConfigError naming the column."""
    text = (fields.get(key) or "").strip()
    if not text:
        if default is None:
            raise ConfigError(key, text, "the column is empty")
        return default
    try:
        value = float(text[:40])
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value) or abs(value) > MAX_INT_FIELD:
        raise ConfigError(key, text, "must be a whole number")
    return int(value)


def model_from_row(fields: dict[str, str]) -> dict[str, Any]:
    defaults = row_defaults()
    arch = fields["arch"]
    hidden, heads = _int(fields, "hidden"), _int(fields, "num_heads")
    kv_heads = _int(fields, "num_kv_heads", heads)
    if arch not in defaults["arch"]:
        arch = _nearest_arch(fields, hidden, heads, kv_heads)
    layout = dict(defaults["arch"][arch])
    if arch == "llama" and kv_heads < heads:
        layout["vocab"] = defaults["llama_gqa_vocab"]
    if arch == "llama":
        rounding = defaults["llama_ffn_round"]
        ffn_default = -(-(8 * hidden // 3) // rounding) * rounding
    else:
        ffn_default = defaults["ffn_multiple"] * hidden
    seq = _int(fields, "seq_len")
    if seq <= 0:  # named as the row's column, not as the model's max_seq_len it fills
        raise ConfigError("seq_len", seq, "must be a positive number of tokens")
    model = {**layout, "name": f"{arch}-l{fields['num_layers']}-h{hidden}", "arch": arch,
             "num_layers": _int(fields, "num_layers"), "hidden": hidden, "num_heads": heads,
             "num_kv_heads": kv_heads, "ffn_hidden": _int(fields, "ffn_hidden", ffn_default),
             "vocab": _int(fields, "vocab", layout["vocab"]), "max_seq_len": seq}
    return {**model, **moe_of_row(fields)}


def moe_of_row(fields: dict[str, str]) -> dict[str, Any]:
    """The experts of a row whose notes (else run id) name a mixture-of-experts model (row_defaults.yaml
    moe_by_text): num_experts, top_k, moe_every, and where the entry states them the expert's FFN width
    (expert_ffn_hidden: the row's ffn_hidden stays the dense blocks', or the entry's dense_ffn), the shared
    experts (their widths together: shared_expert_ffn_hidden), the leading dense blocks and the multi-head latent
    attention; {} for any other row."""
    text = f"{fields.get('notes', '')} {fields.get('run_id', '')}"
    for entry in row_defaults()["moe_by_text"]:
        if re.search(entry["pattern"], text, flags=re.IGNORECASE):
            moe = {"num_experts": entry["num_experts"], "top_k": entry["top_k"], "moe_every": entry.get("moe_every", 1)}
            stated = {key: entry[name] for name, key in _MOE_ENTRY_FIELDS.items() if name in entry}
            width = entry.get("expert_ffn") or _int(fields, "ffn_hidden", 0)
            shared = {"shared_expert_ffn_hidden": entry["shared_experts"] * width} if "shared_experts" in entry else {}
            return moe | stated | shared
    return _moe_stated_in(fields.get("notes", ""), fields)


# a moe_by_text entry's optional facts -> the model spec's fields
_MOE_ENTRY_FIELDS = {"expert_ffn": "expert_ffn_hidden", "dense_layers": "leading_dense_layers", "mla": "mla",
                     "dense_ffn": "ffn_hidden"}


def _moe_stated_in(notes: str, fields: dict[str, str]) -> dict[str, Any]:
    """The experts a row's notes state in words (row_defaults.yaml moe_in_words: "64 experts", "8x7B"; the experts
    a token uses from "top-2" or "2 active experts", else the row's stack's default router); {} where they state
    no expert count. The largest count stated is the model's (a "top-2 of 64 experts" names both)."""
    rule = row_defaults()["moe_in_words"]
    counts = [int(found) for pattern in rule["experts"]
              for found in re.findall(pattern, notes, flags=re.IGNORECASE)]
    if not counts or max(counts) < 2:
        return {}
    for pattern in rule["top_k"]:
        found = re.search(pattern, notes, flags=re.IGNORECASE)
        if found:
            return {"num_experts": max(counts), "top_k": int(found.group(1)), "moe_every": 1}
    by_stack = rule["top_k_by_stack"]
    return {"num_experts": max(counts), "top_k": by_stack.get(stack_of_row(fields).name, by_stack["default"]),
            "moe_every": 1}


def _nearest_arch(fields: dict[str, str], hidden: int, heads: int, kv_heads: int) -> str:
    """The documented family an `other` row is priced as (row_defaults.yaml `other_arch`): grouped-query attention,
    an FFN that is not a multiple of the width or a named mixture of experts (every one in moe_by_text has gated
    MLPs and RMSNorm) marks a LLaMA-style block, anything else a GPT-style one."""
    rule = row_defaults()["other_arch"]
    ffn = _int(fields, "ffn_hidden", 0)
    gated = kv_heads < heads or (ffn > 0 and ffn % hidden != 0) or bool(moe_of_row(fields))  # MoEs: gated
    return rule["gated"] if gated else rule["plain"]


def source_group(source: str) -> str:
    """The publication or repository of a row (its source without table, section or row details)."""
    return source.split()[0] if source.strip() else "unknown"


def flops_convention_of(fields: dict[str, str]) -> str:
    """The named FLOP convention (validate.flops_conventions) a row counts its MFU and TFLOP/s in: the formula its
    flops_convention cell names, else its source's (row_defaults.yaml), else the default model-FLOPs count."""
    defaults = row_defaults()
    by_cell = defaults["flops_convention_by_column"].get((fields.get("flops_convention") or "").strip())
    if by_cell is not None:
        return by_cell
    return defaults["flops_convention_by_source"].get(source_group(fields.get("source", "")),
                                                      defaults["flops_convention"])


def stack_of_row(fields: dict[str, str]) -> StackSpec:
    """The training stack the row's run ran (row_defaults.yaml: stack_by_run, else stack_by_source, else the stack
    its source or notes name (stack_by_text), else `stack`)."""
    defaults = row_defaults()
    source = fields.get("source", "")
    by_source = defaults["stack_by_source"].get(source_group(source))
    if by_source is None:
        by_source = _stack_named_in(source, fields) or _stack_named_in(fields.get("notes", ""), fields)
    return load_stack(defaults["stack_by_run"].get(fields.get("run_id", ""), by_source or defaults["stack"]))


def _stack_named_in(text: str, fields: dict[str, str]) -> str | None:
    """The first stack of row_defaults.yaml's stack_by_text whose pattern the text matches (the release line the
    row's GPU dates it to, where the entry says)."""
    for entry in row_defaults()["stack_by_text"]:
        if re.search(entry["pattern"], text, flags=re.IGNORECASE):
            return entry.get("stack_on_gpu", {}).get(fields.get("gpu", ""), entry["stack"])
    return None


def parallel_from_row(fields: dict[str, str]) -> dict[str, Any]:
    base = row_defaults()["strategy"]
    tp, pp, cp = _int(fields, "tp"), _int(fields, "pp"), _int(fields, "cp", 1)
    dp = _int(fields, "dp", 0) or _dp_by_definition(fields, tp * pp * cp)
    global_batch = _int(fields, "global_batch", 0)
    micro = _int(fields, "micro_batch", _default_micro_batch(global_batch, dp, pp, base["micro_batch"]))
    # model chunks need a pipeline; Megatron-Core turns sequence parallelism off at tp 1 with a warning
    # (megatron/core/tensor_parallel/layers.py, RowParallelLinear, megatron-core 0.9.0)
    vpp = _int(fields, "vpp", base["vpp"]) if pp > 1 else 1
    sp = _int(fields, "sp", int(base["sp"]))
    if sp not in (0, 1):
        raise ConfigError("sp", sp, "must be 0 (off) or 1 (on), or empty")
    sp = sp if tp > 1 else 0
    stack = stack_of_row(fields)
    return {
        "tp": tp, "pp": pp, "dp": dp, "cp": cp,
        "ep": _int(fields, "ep", 1), "vpp": vpp, "sp": bool(sp),
        "zero": _int(fields, "zero", base["zero_by_stack"].get(stack.name, base["zero"])),
        "micro_batch": micro,
        "global_batch": global_batch,
        "seq_len": _int(fields, "seq_len"),
        "recompute": fields.get("recompute") or base["recompute"],
        "precision": fields.get("precision") or row_defaults()["precision_by_source"].get(
            source_group(fields.get("source", "")), base["precision"]),
        "schedule": fields.get("schedule") or ("interleaved-1f1b" if vpp > 1 else "1f1b"),
        "attention": fields.get("attention") or stack.attention,
        "optimizer_impl": fields.get("optimizer_impl") or base["optimizer_impl"],
        **(_ends_counted_in_split(_int(fields, "num_layers"), pp, vpp) if vpp > 1 else {}),
    }


def _ends_counted_in_split(num_layers: int, pp: int, vpp: int) -> dict[str, bool]:
    """A pipeline of one or two more virtual stages than the model has layers (126 layers on pp 16 x vpp 8) runs
    only with the embedding and the loss counted as layers of the split (Megatron-Core's
    account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split,
    megatron/core/transformer/transformer_config.py, megatron-core 0.16.1; Llama 3 405B's pipeline took one
    layer off its first and last stages for them, Dubey et al. 2024, sec. 3.3.2): both set; otherwise neither
    (the schema states no stage layout)."""
    stages = pp * vpp
    return {"embedding_in_split": True, "loss_in_split": True} if num_layers < stages <= num_layers + 2 else {}


def _dp_by_definition(fields: dict[str, str], model_parallel: int) -> int:
    """An empty dp cell: num_gpus / (tp x pp x cp), by definition (the calibration data's README, section 2);
    0 where that is no whole number, which make_job refuses naming every degree."""
    num_gpus = _int(fields, "num_gpus")
    return num_gpus // model_parallel if model_parallel > 0 and num_gpus % model_parallel == 0 else 0


def _default_micro_batch(global_batch: int, dp: int, pp: int, with_pipeline: int) -> int:
    """An empty micro_batch cell: without a pipeline, the replica's whole share of the global batch in one
    micro-batch (DeepSpeed's rule when only the global batch is given: deepspeed/runtime/config.py
    _set_batch_related_parameters, gradient_accumulation_steps = 1, deepspeed 0.12.6); with one, `with_pipeline`."""
    if pp > 1 or global_batch <= 0 or dp <= 0:
        return with_pipeline
    return max(1, round(global_batch / dp))


def _whole_micro_batches(parallel: dict[str, Any]) -> dict[str, Any]:
    """A stated global batch that is not a whole number of micro-batches per replica (a source that rounds its
    batch, or states it in tokens) runs as the nearest whole number of micro-batches, at least one.

    Under the interleaved schedule the micro-batches per replica come in groups of pp: Megatron-LM runs no other
    count with its default group size (megatron/core/pipeline_parallel/schedules.py,
    forward_backward_pipelining_with_interleaving: microbatch_group_size_per_vp_stage defaults to pp, at most the
    micro-batch count, and the count must be a multiple of it; megatron-core 0.16.1, as Megatron-LM's 2021
    "number of microbatches is not divisible by pipeline-model-parallel-size" check). There the batch rounds to
    the nearest whole number of groups, and an empty global batch runs one group, the fewest micro-batches the
    schedule runs (Megatron's default global batch, dp x micro_batch, is one micro-batch and refused)."""
    group = parallel["pp"] if parallel["schedule"] == "interleaved-1f1b" else 1
    replica_batch = parallel["dp"] * parallel["micro_batch"] * group
    global_batch = parallel["global_batch"]
    if replica_batch <= 0 or (global_batch <= 0 and group == 1) or (global_batch > 0 and
                                                                     global_batch % replica_batch == 0):
        return parallel
    return {**parallel, "global_batch": max(1, round(global_batch / replica_batch)) * replica_batch}


def _folded_experts(parallel: dict[str, Any]) -> dict[str, Any]:
    """An expert-parallel degree wider than dp x cp: Megatron-Core's MoE parallel folding (megatron-core 0.10+,
    expert_tensor_parallel_size apart from tp) lays the expert groups over tensor-parallel ranks too, which
    trainsim's plans cannot express (experts share data ranks only). Such a row runs as its nearest plan: ep the
    largest common divisor of its ep and dp x cp (the same experts per token and expert FLOPs per GPU; the
    all-to-all over fewer, data-parallel ranks)."""
    data_ranks = parallel["dp"] * parallel["cp"]
    if parallel["ep"] <= 1 or data_ranks % parallel["ep"] == 0:
        return parallel
    return {**parallel, "ep": math.gcd(parallel["ep"], data_ranks)}


def _cluster_name(fields: dict[str, str], by_gpu: str) -> str:
    """The cluster preset a row runs on: the one its cluster cell names, else its source's servers
    (row_defaults.yaml cluster_by_source), else its GPU's (cluster_for_gpu)."""
    stated = (fields.get("cluster") or "").strip()
    if stated in cluster_names():
        return stated
    return row_defaults().get("cluster_by_source", {}).get(source_group(fields.get("source", "")), by_gpu)


def _gpu_named_in_notes(fields: dict[str, str]) -> dict[str, str]:
    """A row whose gpu is `other` as the device (and servers) its notes name (row_defaults.yaml gpu_by_text);
    other rows as they are."""
    if fields["gpu"] != "other":
        return fields
    for entry in row_defaults()["gpu_by_text"]:
        if re.search(entry["pattern"], fields.get("notes", ""), flags=re.IGNORECASE):
            return {**fields, "gpu": entry["gpu"], "cluster": entry.get("cluster", fields.get("cluster", ""))}
    return fields


def _machine_named_in_notes(fields: dict[str, str]) -> dict[str, str]:
    """A row whose cluster cell names no preset, on the machine its notes name (row_defaults.yaml
    cluster_by_text) where that machine carries the row's GPU: the machine's preset as its cluster, and the
    machine's GPU where the row's gpu cell leaves it open (`other`, or a variant the source does not state)."""
    if (fields.get("cluster") or "").strip() in cluster_names():
        return fields
    gpu = fields["gpu"]
    for entry in row_defaults().get("cluster_by_text", []):
        if gpu != "other" and gpu not in entry["gpus"]:
            continue
        if re.search(entry["pattern"], fields.get("notes", ""), flags=re.IGNORECASE):
            open_variant = gpu == "other" or gpu.endswith("-unknown")
            machine_gpu = load_cluster(entry["cluster"]).device.name if open_variant else gpu
            return {**fields, "gpu": machine_gpu, "cluster": entry["cluster"]}
    return fields


def _gpus_per_server(fields: dict[str, str], cluster: ClusterSpec) -> int:
    """The GPUs per server of a row: its gpus_per_node cell, else its preset's. On a rack-scale preset a cell
    that states the rack's NVLink domain (72 on a GB200 / GB300 NVL72; the schema leaves the cell empty there,
    but a source may print the rack) counts the rack, not a server: the servers stay the preset's compute trays
    (4 GPUs each, 18 trays a rack: NVIDIA GB200 NVL72 and GB300 NVL72 product pages)."""
    stated = _int(fields, "gpus_per_node", cluster.gpus_per_node)
    return cluster.gpus_per_node if stated == cluster.nvlink_domain_gpus else stated


def job_from_row(fields: dict[str, str]) -> RunJob:
    fields = _machine_named_in_notes(_gpu_named_in_notes(fields))
    gpu = fields["gpu"]
    clusters = row_defaults()["cluster_for_gpu"]
    if gpu not in clusters:
        return RunJob(None, f"gpu {gpu!r} is not in the catalog (nor named in the row's notes)")
    try:
        if _int(fields, "ep", 1) > 1 and not moe_of_row(fields):
            return RunJob(None, f"ep {fields['ep']}: the notes name no mixture-of-experts model of "
                                "row_defaults.yaml moe_by_text and state no expert count (the schema has none)")
        device = load_device(gpu)
        cluster = load_cluster(_cluster_name(fields, clusters[gpu]))
        update: dict[str, Any] = {"device": device}
        gpus_per_node = _gpus_per_server(fields, cluster)
        if gpus_per_node <= 0:
            raise ConfigError("gpus_per_node", gpus_per_node, "must be a positive integer")
        update["gpus_per_node"] = gpus_per_node
        # servers of another size than the preset's (4-GPU HPC nodes): the preset's NICs per GPU, at least one
        update["nics_per_node"] = max(1, round(cluster.nics_per_node * gpus_per_node / cluster.gpus_per_node))
        cluster = cluster.model_copy(update=update).with_num_gpus(_int(fields, "num_gpus"))
        model = parse_model(model_from_row(fields), "row model")
        parallel = _folded_experts(_whole_micro_batches(parallel_from_row(fields)))
        return RunJob(make_job(model, cluster, ParallelSpec.parse(parallel), stack_of_row(fields)), None)
    except (TrainsimError, ValueError) as exc:
        return RunJob(None, str(exc))
