"""Hypothesis strategies for the fuzz suite: a valid input of each kind with one field broken.

A case is the command line of one `trainsim` call plus the files it reads. Each kind starts from an input that
runs (a job file, a model YAML, a cluster YAML, a runs CSV, a measured-run folder, the flags of predict and
search) and breaks exactly one thing: a field takes a nonsense type, an extreme number or an odd string; a key
goes missing; or the whole file is re-encoded (Latin-1, UTF-16, NUL bytes). The values are raw YAML text, so a
broken field can be anything YAML can say (`.nan`, `1e400`, `[]`, an anchor).
"""

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck
from hypothesis import strategies as st

# A case runs a whole command; generated inputs are large on purpose (5,000 digits, 200 KiB cells).
SLOW_INPUTS_ARE_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

GROUND_TRUTH = Path(__file__).resolve().parents[2] / "data" / "ground-truth" / "h200"

# Raw YAML values that break a field: types, extremes, special floats, odd strings.
BROKEN_YAML = (
    "true", "false", "null", "~", "[]", "{}", "[1, 2]", "{a: 1}", '"abc"', '""', "0", "-1", "-0.0", "2.5", "1e-320",
    "1e400", "1.0e+400", "-1.0e+400", ".nan", ".inf", "-.inf", "9" * 5000, "9223372036854775808",
    "18446744073709551616", "1000000000000", "1000000000000000000000000000000", '"1e400GiB"', '"-5GiB"',
    '"nanGiB"', '"infTFLOP/s"', '"80 GiB"', '"\\u0000"', '"' + "x" * 400 + '"', "&a [1, *a]", "!!binary aGVsbG8=",
    "[" * 300 + "]" * 300, '"../../../../etc/passwd"', '"/dev/zero"', '"' + "n" * 300 + '.yaml"',
)
# Flag values that break a command-line option.
BROKEN_FLAGS = ("0", "-1", "nan", "inf", "-inf", "1e400", "abc", "", "2.5", "9" * 5000, "1000000000000",
                str(10**30), "true", "/dev/zero", "x" * 400)


@dataclass
class Case:
    """One call: argv after `trainsim`, and files (name -> bytes) written into a fresh folder first."""

    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    note: str = ""
    must_refuse: bool = False  # a value no check may let through (exit 2 expected, exit 0 is a failure)


def _yaml(fields: dict[str, str]) -> str:
    return "".join(f"{key}: {raw}\n" for key, raw in fields.items())


def _raw(value: object) -> str:
    return json.dumps(value)  # JSON is YAML, flow style, for nested values


VALID_MODEL = {"name": "fuzz-gpt", "num_layers": 4, "hidden": 256, "ffn_hidden": 1024, "num_heads": 4,
               "vocab": 1000, "max_seq_len": 512}
VALID_CNN = {"kind": "cnn", "name": "fuzz-cnn", "layers": [
    {"type": "conv", "name": "c1", "in_channels": 3, "out_channels": 8, "kernel": [3, 3], "out_hw": [32, 32]},
    {"type": "pool", "name": "p1", "in_channels": 8, "out_channels": 8, "kernel": [2, 2], "stride": 2,
     "out_hw": [16, 16]},
    {"type": "fc", "name": "fc", "in_channels": 2048, "out_channels": 10}]}
VALID_DLRM = {"kind": "dlrm", "name": "fuzz-dlrm", "dense_features": 13, "bottom_mlp": [64, 16],
              "top_mlp": [64, 1], "tables": [{"rows": 1000, "dim": 16, "count": 4}]}
VALID_CLUSTER = {"name": "fuzz-cluster", "device": {"name": "fuzz-gpu", "peak_flops_per_s": {
    "fp32": "20TFLOP/s", "bf16": "300TFLOP/s"}, "hbm_bytes": "80GiB", "hbm_bw_bytes_per_s": "2TB/s"},
    "gpus_per_node": 8, "num_nodes": 1, "intra_node": {"name": "nv", "kind": "nvlink", "bw_bytes_per_s": "300GB/s",
                                                        "latency_s": "5us"},
    "inter_node": "ib-hdr-200", "nics_per_node": 8}
VALID_JOB = {"model": "gpt3-125m", "cluster": "dgx-a100-80gb", "num_gpus": 8, "tp": 2, "pp": 2,
             "micro_batch": 2, "global_batch": 16, "seq_len": 1024}
RUN_ROW = {"run_id": "r1", "source": "fuzz", "arch": "gpt", "num_layers": "4", "hidden": "256", "ffn_hidden": "",
           "num_heads": "4", "num_kv_heads": "", "vocab": "", "seq_len": "512", "gpu": "a100-sxm4-80gb",
           "cluster": "", "num_gpus": "2", "gpus_per_node": "8", "tp": "1", "pp": "1", "dp": "2", "cp": "",
           "ep": "", "sp": "", "vpp": "", "micro_batch": "2", "global_batch": "8", "zero": "", "recompute": "none",
           "precision": "bf16", "metric": "iteration_time_s", "value": "0.05", "flops_convention": "", "notes": ""}
BROKEN_CELLS = ("", "abc", "nan", "inf", "-inf", "1e400", "0", "-1", "2.5", "9" * 5000, "x" * 200_000, "\x00",
                "1000000000000", "true")


def _paths(data: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every key path of nested dicts/lists (leaves and inner nodes)."""
    found: list[tuple[object, ...]] = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data[:3]):
            found += _paths(value, (*prefix, index))
    return found


def _replace(data: object, path: tuple[object, ...], raw: str | None) -> str:
    """YAML text of data with the node at path replaced by raw YAML (None: the key removed)."""
    marker = "__FUZZ_MARKER__"
    copied = copy.deepcopy(data)
    node = copied
    for part in path[:-1]:
        node = node[part]  # type: ignore[index]
    if raw is None:
        if isinstance(node, dict):
            del node[path[-1]]
        else:
            node.pop(path[-1])  # type: ignore[union-attr]
    else:
        node[path[-1]] = marker  # type: ignore[index]
    assert isinstance(copied, dict)
    lines = []
    for key, value in copied.items():
        text = _raw(value)
        lines.append(f"{key}: {text}")
    return "\n".join(lines).replace(f'"{marker}"', raw or "null") + "\n"


@st.composite
def broken_yaml(draw: st.DrawFn, data: dict[str, object]) -> tuple[str, str]:
    """(YAML text of data with one node broken, what was broken)."""
    path = draw(st.sampled_from(_paths(data)))
    raw = draw(st.one_of(st.sampled_from(BROKEN_YAML), st.none(), st.integers().map(str),
                         st.floats(allow_nan=True, allow_infinity=True).map(repr),
                         st.text(max_size=20).map(json.dumps)))
    return _replace(data, path, raw), f"{'.'.join(map(str, path))} <- {str(raw)[:40]}"


@st.composite
def encoded(draw: st.DrawFn, text: str) -> bytes:
    """The text as UTF-8, or (sometimes) in another encoding or with NUL/invalid bytes."""
    how = draw(st.sampled_from(("utf-8", "utf-8", "utf-8", "utf-8", "latin-1", "utf-16", "nul", "invalid")))
    if how == "latin-1":
        return ("# caf\xe9\n" + text).encode("latin-1", errors="replace")
    if how == "utf-16":
        return text.encode("utf-16")
    if how == "nul":
        return text.encode() + b"\x00\x00"
    if how == "invalid":
        return b"\xff\xfe\xfa" + text.encode()
    return text.encode()


def _engine(draw: st.DrawFn) -> list[str]:
    return ["--engine", draw(st.sampled_from(("analytical", "analytical", "sim")))]


@st.composite
def job_file_cases(draw: st.DrawFn) -> Case:
    text, note = draw(broken_yaml(VALID_JOB))
    return Case(["predict", "job.yaml", "--json", *_engine(draw)], {"job.yaml": draw(encoded(text))}, note)


@st.composite
def model_file_cases(draw: st.DrawFn) -> Case:
    base = draw(st.sampled_from((VALID_MODEL, VALID_CNN, VALID_DLRM)))
    text, note = draw(broken_yaml(base))
    pp = "2" if base is VALID_MODEL else draw(st.sampled_from(("1", "2", "8")))
    argv = ["predict", "--model", "model.yaml", "--num-gpus", "8", "--pp", pp, "--json", *_engine(draw)]
    if base is VALID_MODEL:
        argv += ["--seq-len", "512"]
    return Case(argv, {"model.yaml": draw(encoded(text))}, note)


@st.composite
def cluster_file_cases(draw: st.DrawFn) -> Case:
    text, note = draw(broken_yaml(VALID_CLUSTER))
    command = draw(st.sampled_from(("predict", "search")))
    argv = [command, "--model", "gpt3-125m", "--cluster", "cluster.yaml", "--json"]
    argv += ["--global-batch", "16"] if command == "search" else _engine(draw)
    return Case(argv, {"cluster.yaml": draw(encoded(text))}, note)


@st.composite
def flag_cases(draw: st.DrawFn) -> Case:
    command = draw(st.sampled_from(("predict", "predict", "search", "graph")))
    flags = {"predict": ["--num-gpus", "--tp", "--pp", "--dp", "--micro-batch", "--global-batch", "--seq-len",
                         "--vpp", "--zero", "--cp", "--ep", "--model", "--cluster", "--precision", "--schedule"],
             "search": ["--num-gpus", "--global-batch", "--seq-len", "--top-k", "--max-micro-batch", "--model"],
             "graph": ["--micro-batch", "--seq-len", "--model"]}[command]
    flag = draw(st.sampled_from(flags))
    value = draw(st.one_of(st.sampled_from(BROKEN_FLAGS), st.integers(min_value=-2, max_value=2**70).map(str)))
    base = {"predict": ["--model", "gpt3-125m", "--json"],
            "search": ["--model", "gpt3-125m", "--num-gpus", "8", "--global-batch", "16", "--json"],
            "graph": ["--model", "gpt3-125m"]}[command]
    if command == "predict":
        base += _engine(draw)
    return Case([command, *base, flag, value], {}, f"{command} {flag} {value[:40]}")


@st.composite
def runs_csv_cases(draw: st.DrawFn) -> Case:
    import csv
    import io

    row = dict(RUN_ROW)
    row["metric"] = draw(st.sampled_from(("iteration_time_s", "tflops_per_gpu", "mfu")))
    broken = draw(st.sampled_from(sorted(row)))
    cell = draw(st.one_of(st.sampled_from(BROKEN_CELLS), st.text(max_size=12)))
    drop = draw(st.booleans()) and draw(st.booleans())
    columns = [c for c in row if not (drop and c == broken)]
    row[broken] = cell
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerow(row)
    argv = ["validate", "runs.csv", "--json", "--engine", draw(st.sampled_from(("analytical", "sim", "all")))]
    note = f"{broken} {'dropped' if drop else '<- ' + repr(cell[:40])}"
    return Case(argv, {"runs.csv": draw(encoded(out.getvalue()))}, note)


def _measured_run() -> dict[str, object]:
    path = sorted(GROUND_TRUTH.glob("*.json"))[0]
    return json.loads(path.read_text())


@st.composite
def measured_folder_cases(draw: st.DrawFn) -> Case:
    run = _measured_run()
    path = draw(st.sampled_from([p for p in _paths(run) if p[0] not in ("traces",)]))
    value = draw(st.sampled_from(([], {}, None, 0, -1, "abc", [0, 0], 1e300, 10**30, True, [], "x" * 300)))
    node: object = run
    for part in path[:-1]:
        node = node[part]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    text = json.dumps(run)
    return Case(["validate", "runs", "--json", "--engine", "analytical", "--costs", "roofline"],
                {"runs/r.json": text.encode()}, f"{'.'.join(map(str, path))} <- {str(value)[:40]}")


def any_case() -> st.SearchStrategy[Case]:
    from tests.fuzz.cases_more import measure_flag_cases, measured_folder_layout_cases, trace_cases, tree_file_cases

    return st.one_of(job_file_cases(), model_file_cases(), cluster_file_cases(), flag_cases(), runs_csv_cases(),
                     measured_folder_cases(), tree_file_cases(), trace_cases(), measured_folder_layout_cases(),
                     measure_flag_cases())
