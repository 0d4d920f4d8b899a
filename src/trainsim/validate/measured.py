"""Read a folder of measured runs (`trainsim measure --out DIR`) as rows of the runs.csv schema, so
`trainsim validate DIR` predicts them exactly as it predicts the calibration CSV.

Each run gives two rows: iteration_time_s (the median of its timed iterations) and peak_memory_gib (the
largest rank's peak: CUDA max allocated, or the RSS high-water mark on a CPU, interpreter and torch included).
The job's fields map onto the CSV columns; the row's model is rebuilt from the arch's layout in
catalog/data/calibration/row_defaults.yaml, so a run whose model departs from that layout (or whose learned
position table is longer than seq_len) says so in its notes column.
"""

from pathlib import Path
from typing import Any

from trainsim.errors import InputFileError
from trainsim.measure.results import MeasuredRun, load_runs
from trainsim.validate.runs import RunRow, row_defaults

LAYOUT_KEYS = ("mlp", "norm", "position", "bias", "tied_embeddings")


def read_measured(folder: Path) -> list[RunRow]:
    runs = load_runs(folder)
    if not runs:
        raise InputFileError(f"{folder} holds no measured runs (RUN_ID.json files written by trainsim measure)")
    return [row for run in runs for row in rows_of(run)]


def rows_of(run: MeasuredRun) -> list[RunRow]:
    fields = run_fields(run)
    source = fields["source"]
    peak_gib = run.max_peak_memory_bytes / 2**30
    return [RunRow(run.run_id, source, metric, value, {**fields, "metric": metric, "value": repr(value)})
            for metric, value in (("iteration_time_s", run.stats.median_s), ("peak_memory_gib", peak_gib))]


def run_fields(run: MeasuredRun) -> dict[str, str]:
    """The run's job as runs.csv columns (strings, as csv.DictReader gives them)."""
    model: dict[str, Any] = run.job["model"]
    par: dict[str, Any] = run.job["parallel"]
    cluster: dict[str, Any] = run.job["cluster"]
    nodes = max(1, int(run.settings.get("nodes", 1)))
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
        "sp": int(bool(par["sp"])), "schedule": par["schedule"], "notes": "; ".join(layout_notes(model, par)),
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
