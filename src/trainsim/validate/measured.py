"""Read a folder of measured runs (`trainsim measure --out DIR`) as rows of the runs.csv schema, so
`trainsim validate DIR` scores them as it scores the calibration CSV.

Each run gives two rows: iteration_time_s (the median of its timed iterations) and the largest rank's peak
memory: peak_allocated_gib (predicted without the runtime's reserve) for CUDA's max allocated and for a CPU's
RSS high-water mark above the rank's baseline before its model was built; peak_memory_gib (the whole process)
for a CPU run that recorded no baseline.
Each row carries the run's exact job (model, cluster and strategy as measured), which the engines predict.
The job's fields also fill the CSV columns; where a row read back from those columns alone would rebuild
another model (the arch's layout in catalog/data/calibration/row_defaults.yaml differs, a learned position
table is longer than seq_len, a schedule the CSV cannot carry), its notes column says so.
"""

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsim.catalog.loader import load_device
from trainsim.errors import InputFileError, UnknownNameError
from trainsim.hardware.device import core_share
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.measure.launch import torch_default_optimizer
from trainsim.measure.results import MeasuredRun, job_from_dict, job_to_dict, load_runs
from trainsim.validate.runs import RunRow, row_defaults

LAYOUT_KEYS = ("mlp", "norm", "position", "bias", "tied_embeddings")


def read_measured(folder: Path) -> list[RunRow]:
    runs = load_runs(folder)
    if not runs:
        raise InputFileError(f"{folder} holds no measured runs (RUN_ID.json files written by trainsim measure)")
    return [row for run in runs for row in rows_of(run)]


def rows_of(run: MeasuredRun) -> list[RunRow]:
    job = measured_job(run)  # first: it validates the job the rows are made of
    if not isinstance(job.model, TransformerSpec):
        raise InputFileError(f"run {run.run_id}: a {job.model.kind} model; measured runs are of transformers")
    if run.world_size != job.num_gpus:
        raise InputFileError(f"run {run.run_id}: {run.world_size} ranks' peak memory for a job on {job.num_gpus}")
    # NB: the columns from the job as validated (every field present, dp and global_batch resolved)
    fields = run_fields(replace(run, job=job_to_dict(job_from_dict(run.job, f"{run.run_id}.job"))))
    if run.job_peak_memory_bytes <= 0:
        raise InputFileError(f"run {run.run_id}: no rank's peak memory is above its baseline")
    source = fields["source"]
    peak_gib = run.job_peak_memory_bytes / 2**30
    allocated = run.peak_memory_kind == "cuda-max-allocated" or bool(run.baseline_memory_bytes)
    memory_metric = "peak_allocated_gib" if allocated else "peak_memory_gib"
    return [RunRow(run.run_id, source, metric, value, {**fields, "metric": metric, "value": repr(value)}, job)
            for metric, value in (("iteration_time_s", run.stats.median_s), (memory_metric, peak_gib))]


def measured_job(run: MeasuredRun) -> Job:
    """The run's job, its cluster laid out on the hosts it ran on (world size / nodes ranks per node: local
    processes of one host share the intra-node link, as the gloo microbenchmarks of `trainsim profile`), with
    the catalog's current model of its device where the catalog has it (the file keeps the one of its day)."""
    job = job_from_dict(run.job, f"{run.run_id}.job")
    job = replace(job, parallel=job.parallel.model_copy(update={"optimizer_impl": optimizer_impl_of(run)}))
    cluster = job.cluster
    with contextlib.suppress(UnknownNameError):
        cluster = cluster.model_copy(update={"device": load_device(cluster.device.name)})
    share = compute_share_of(run)
    if share < 1.0:
        cluster = cluster.model_copy(update={"device": cluster.device.model_copy(update={"compute_share": share})})
    nodes = run.nodes
    if job.num_gpus % nodes == 0:
        cluster = cluster.model_copy(update={"gpus_per_node": job.num_gpus // nodes, "num_nodes": nodes})
    return replace(job, cluster=cluster)


def compute_share_of(run: MeasuredRun) -> float:
    """The share of a core each rank of a CPU run had: the host's usable cores / (its ranks x threads per rank),
    at most 1. GPU runs: 1."""
    if run.settings.get("device") != "cpu":
        return 1.0
    nodes = run.nodes
    threads = max(run.settings.get("threads_per_rank") or [1])
    cores = run.machine.get("cpus_allowed") or run.machine.get("cpu_count") or 0
    return core_share(int(cores), run.world_size / nodes, int(threads))


def optimizer_impl_of(run: MeasuredRun) -> str:
    """The Adam step the run took: its job's, or for files written before measure recorded it, torch.optim's
    default on the run's device (foreach on CUDA, one tensor at a time on a CPU)."""
    stated = run.job.get("parallel", {}).get("optimizer_impl")
    return str(stated) if stated else torch_default_optimizer(str(run.settings.get("device")))


def run_fields(run: MeasuredRun) -> dict[str, str]:
    """The run's job as runs.csv columns (strings, as csv.DictReader gives them)."""
    model: dict[str, Any] = run.job["model"]
    par: dict[str, Any] = run.job["parallel"]
    cluster: dict[str, Any] = run.job["cluster"]
    nodes = run.nodes
    world = run.world_size
    fields: dict[str, Any] = {
        "run_id": run.run_id, "source": f"measured:{run.machine.get('host_sha256', 'unknown')} "
                                        f"{run.machine.get('cpu_model', '')} ({run.settings.get('device')})",
        "arch": model.get("arch", "other"), "num_layers": model["num_layers"], "hidden": model["hidden"],
        "ffn_hidden": model["ffn_hidden"], "num_heads": model["num_heads"],
        "num_kv_heads": model.get("num_kv_heads") or model["num_heads"], "vocab": model["vocab"],
        "seq_len": par["seq_len"], "gpu": cluster["device"]["name"], "cluster": cluster["name"], "num_gpus": world,
        "gpus_per_node": world // nodes,
        **{axis: par[axis] for axis in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch",
                                        "zero", "recompute", "precision")},
        "sp": int(bool(par["sp"])), "schedule": par["schedule"], "attention": par.get("attention", "flash2"),
        "optimizer_impl": optimizer_impl_of(run), "notes": "; ".join(layout_notes(model, par)),
    }
    return {key: str(value) for key, value in fields.items()}


def layout_notes(model: dict[str, Any], par: dict[str, Any]) -> list[str]:
    """Where the row (arch layout + columns) does not rebuild the measured model exactly."""
    notes = []
    layouts = row_defaults()["arch"]
    arch = model.get("arch", "other")
    if arch not in layouts:
        return [f"arch {arch} has no row layout"]
    for key in LAYOUT_KEYS:
        if key in layouts[arch] and model.get(key) != layouts[arch][key]:
            notes.append(f"{key}={model.get(key)} (the {arch} row layout says {layouts[arch][key]})")
    if model.get("position") == "learned" and model.get("max_seq_len") != par["seq_len"]:
        notes.append(f"learned positions for {model.get('max_seq_len')} tokens (a row has seq_len={par['seq_len']})")
    if par.get("schedule") not in ("1f1b", "interleaved-1f1b") and par.get("pp", 1) > 1:
        notes.append(f"schedule={par.get('schedule')} (validate/runs.py reads no schedule column: 1f1b)")
    return notes
