"""Build a Job from a job file and command-line flags (flags override the file)."""

from pathlib import Path
from typing import Any, get_args

from trainsim.catalog import load_cluster
from trainsim.catalog.files import key_lines, read_mapping
from trainsim.errors import ConfigError
from trainsim.frontends.registry import ModelSource
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job, default_seq_len, make_job
from trainsim.strategy.parallel import ATTENTION_KERNELS, OPTIMIZER_IMPLS, RECOMPUTES, SCHEDULES, ParallelSpec
from trainsim.strategy.precision import PRECISIONS
from trainsim.strategy.stack import make_stack

DEFAULT_MODEL = "gpt3-1.3b"
DEFAULT_CLUSTER = "dgx-a100-80gb"
JOB_KEYS = ("model", "frontend", "cluster", "num_gpus", "calibration", "stack")
STRATEGY_KEYS = tuple(ParallelSpec.model_fields)
MODEL_SPEC_TYPES: tuple[type, ...] = get_args(get_args(ModelSpec)[0])  # the kinds of model ModelSpec unites


def read_job_file(path: Path | None) -> dict[str, Any]:
    """A job file holds model, frontend, cluster, num_gpus, calibration (a file from `trainsim calibrate
    --output`, relative to the job file), stack (a preset name, or a mapping {preset: NAME, behaviour: value ...})
    and strategy keys, at the top level or under `strategy`."""
    if path is None:
        return {}
    data = read_mapping(path)
    strategy = data.pop("strategy", {})
    if not isinstance(strategy, dict):
        raise ConfigError(f"{path}: strategy", strategy, "must be a mapping of strategy keys")
    flat = {**strategy, **data}
    unknown = [key for key in flat if key not in JOB_KEYS + STRATEGY_KEYS]
    if unknown:
        raise ConfigError.across_fields(str(path), _unknown_keys(path, {key: flat[key] for key in unknown}))
    if "calibration" in flat:
        if not isinstance(flat["calibration"], str) or not flat["calibration"]:
            raise ConfigError(f"{path}: calibration", flat["calibration"], "must be the path of a calibration file")
        flat["calibration"] = path.parent / flat["calibration"]
    for key in ("model", "cluster"):
        if isinstance(flat.get(key), str):
            flat[key] = beside(path, flat[key])
    return flat


def _unknown_keys(path: Path, unknown: dict[str, Any]) -> str:
    """Every unknown key with its line and the closest allowed key, then the allowed keys (docs/inputs.md)."""
    import difflib

    lines = key_lines(path)
    named = []
    for key in unknown:  # NB: never the value: a file named by mistake must not be echoed
        close = difflib.get_close_matches(str(key), JOB_KEYS + STRATEGY_KEYS, n=1)
        where = f" (line {lines[key]})" if key in lines else ""
        named.append(f"{str(key)[:60]}{where}" + (f", did you mean {close[0]}?" if close else ""))
    return (f"unknown key{'s' if len(unknown) > 1 else ''} " + "; ".join(named)
            + "; the keys a job file takes are in docs/inputs.md (`trainsim predict --help`)")


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


def job_from_settings(settings: dict[str, Any], *, tree_sizes_stages: bool = False) -> Job:
    """settings: job-file keys merged with the flags that were given (None = not given). `model` may be a
    ModelSpec and `cluster` a ClusterSpec (the Python API passes objects through); `stack_overrides` (behaviour
    -> value, from the flags) apply on top of the stack the settings name. tree_sizes_stages: a strategy tree
    comes with the job, whose maps may give stages their own device counts: a dp given need not fill the GPUs
    (tp x dp x cp x pp), the tree's stages must (StrategyTree.lower with the job's GPUs)."""
    given = {key: value for key, value in settings.items() if value is not None}
    stack = make_stack(given.pop("stack", None), given.pop("stack_overrides", None))
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
    given.pop("calibration", None)  # NB: the prices' parameters, not the job's (read by the command)
    spec = given.pop("model", None)
    if isinstance(spec, MODEL_SPEC_TYPES):
        model = spec  # an object: no front-end reads it, so it brings no job defaults
        given.pop("frontend", None)
    else:
        source = model_source({**given, "model": spec})
        given.pop("frontend", None)
        for key, value in source.job_defaults().items():
            given.setdefault(key, value)
        model = source.model_spec()
    given.setdefault("seq_len", default_seq_len(model))
    given.setdefault("attention", stack.attention)  # the stack's kernel unless the job names one
    named = given.pop("cluster", DEFAULT_CLUSTER)
    cluster = named if isinstance(named, ClusterSpec) else load_cluster(str(named))
    if "num_gpus" in given:
        cluster = cluster.with_num_gpus(given.pop("num_gpus"))
    if given.get("vpp", 1) > 1 and "schedule" not in given:
        given["schedule"] = "interleaved-1f1b"
    parallel = ParallelSpec.parse(given, "strategy")
    fills = parallel.num_gpus if tree_sizes_stages and parallel.dp > 0 else None
    return make_job(model, cluster, parallel, stack, num_gpus=fills)
