"""Build a Job from a job file and command-line flags (flags override the file)."""

from pathlib import Path
from typing import Any

from trainsim.catalog import load_cluster
from trainsim.catalog.files import read_mapping, shown_path
from trainsim.errors import ConfigError, unknown_key
from trainsim.frontends.registry import ModelSource
from trainsim.job import Job, default_seq_len, make_job
from trainsim.strategy.parallel import ATTENTION_KERNELS, OPTIMIZER_IMPLS, RECOMPUTES, SCHEDULES, ParallelSpec
from trainsim.strategy.precision import PRECISIONS

DEFAULT_MODEL = "gpt3-1.3b"
DEFAULT_CLUSTER = "dgx-a100-80gb"
JOB_KEYS = ("model", "frontend", "cluster", "num_gpus")
STRATEGY_KEYS = tuple(ParallelSpec.model_fields)


def read_job_file(path: Path | None) -> dict[str, Any]:
    """A job file holds model, frontend, cluster, num_gpus and strategy keys, at the top level or under
    `strategy`."""
    if path is None:
        return {}
    data = read_mapping(path)
    strategy = data.pop("strategy", {})
    if not isinstance(strategy, dict):
        raise ConfigError(f"{path}: strategy", strategy, "must be a mapping of strategy keys")
    flat = {**strategy, **data}
    for key in flat:
        if key not in JOB_KEYS + STRATEGY_KEYS:
            allowed = ", ".join(JOB_KEYS + STRATEGY_KEYS)
            raise unknown_key(f"{shown_path(path)}: {key}", f"allowed: {allowed}")
    for key in ("model", "cluster"):
        if isinstance(flat.get(key), str):
            flat[key] = beside(path, flat[key])
    return flat


_PATH_SUFFIXES = (".yaml", ".yml", ".json", ".py", ".gz")


def beside(job_file: Path, name: str) -> str:
    """A file a job file names, relative to the job file's folder (not the working directory); catalog names and
    absolute paths stay as they are. FILE.py:factory resolves its file."""
    file_part, colon, factory = name.partition(":") if ".py:" in name else (name, "", "")
    if not file_part or Path(file_part).is_absolute():
        return name
    candidate = job_file.parent / file_part
    looks_like_path = "/" in file_part or file_part.endswith(_PATH_SUFFIXES)
    try:
        exists = candidate.exists()
    except OSError:  # too long or otherwise no path: a catalog name
        exists = False
    return f"{candidate}{colon}{factory}" if looks_like_path or exists else name


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ConfigError(field, value, "choose one of: " + ", ".join(choices))


def model_source(settings: dict[str, Any]) -> ModelSource:
    """The model the settings name (default: the catalog's gpt3-1.3b) and the front-end that reads it."""
    return ModelSource(str(settings.get("model") or DEFAULT_MODEL), str(settings.get("frontend") or "catalog"))


def job_from_settings(settings: dict[str, Any]) -> Job:
    """settings: job-file keys merged with the flags that were given (None = not given)."""
    given = {key: value for key, value in settings.items() if value is not None}
    check_choice("precision", given.get("precision"), PRECISIONS)
    check_choice("recompute", given.get("recompute"), RECOMPUTES)
    check_choice("schedule", given.get("schedule"), SCHEDULES)
    check_choice("attention", given.get("attention"), ATTENTION_KERNELS)
    check_choice("optimizer_impl", given.get("optimizer_impl"), OPTIMIZER_IMPLS)
    for key in ("num_gpus", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "seq_len"):
        if key in given and not _positive_int(given[key]):
            raise ConfigError(key, given[key], "must be a positive integer")
    for key in ("dp", "global_batch"):
        if key in given and not _positive_int(given[key]):
            raise ConfigError(key, given[key], "must be a positive integer (leave it out to infer it)")
    source = model_source(given)
    given.pop("model", None)
    given.pop("frontend", None)
    for key, value in source.job_defaults().items():
        given.setdefault(key, value)
    model = source.model_spec()
    given.setdefault("seq_len", default_seq_len(model))
    cluster = load_cluster(str(given.pop("cluster", DEFAULT_CLUSTER)))
    if "num_gpus" in given:
        cluster = cluster.with_num_gpus(given.pop("num_gpus"))
    if given.get("vpp", 1) > 1 and "schedule" not in given:
        given["schedule"] = "interleaved-1f1b"
    parallel = ParallelSpec.parse(given, "strategy")
    return make_job(model, cluster, parallel)
