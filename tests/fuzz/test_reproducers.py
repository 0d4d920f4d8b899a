"""Every reproducer of issue 12, through the command line: refused with one short line (exit 2), or answered
with finite figures (exit 0). Each case names what broke before."""

import json
import warnings
from pathlib import Path

import pytest
from tests.fuzz.cases import RUN_ROW, VALID_CLUSTER, VALID_CNN, Case, _measured_run
from tests.fuzz.harness import Outcome, run_case

from trainsim.errors import MAX_MESSAGE_CHARS

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi", strict=True))


def _yaml(data: dict[str, object]) -> bytes:
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in data.items()).encode()


def _cluster(**device: object) -> bytes:
    return _yaml({**VALID_CLUSTER, "device": {**VALID_CLUSTER["device"], **device}})  # type: ignore[dict-item]


def _csv(**cells: str) -> bytes:
    row = {**RUN_ROW, **cells}
    return (",".join(row) + "\n" + ",".join(row.values()) + "\n").encode()


def _run(tmp_path: Path, argv: list[str], files: dict[str, bytes] | None = None) -> Outcome:
    return run_case(Case(argv, files or {}), tmp_path)


def _refused(outcome: Outcome, *fragments: str) -> None:
    assert outcome.kind == "refused", outcome
    assert len(outcome.detail) <= MAX_MESSAGE_CHARS
    for fragment in fragments:
        assert fragment in outcome.detail, outcome.detail


NOT_FINITE_CLUSTERS = {
    "peak .nan": ("peak_flops_per_s", {"fp32": ".nan"}),
    "hbm 1e400GiB": ("hbm_bytes", "1e400GiB"),
    "peak as a list": ("peak_flops_per_s", {"fp32": [1, 2]}),
}


@pytest.mark.parametrize("case", list(NOT_FINITE_CLUSTERS))
@pytest.mark.parametrize("command", ["predict", "search"])
def test_non_finite_cluster_numbers_are_refused(case: str, command: str, tmp_path: Path) -> None:
    key, value = NOT_FINITE_CLUSTERS[case]
    text = _cluster(**{key: value}).replace(b'".nan"', b".nan")
    argv = [command, "--model", "gpt3-125m", "--cluster", "c.yaml", "--json"]
    _refused(_run(tmp_path, [*argv, "--global-batch", "16"] if command == "search" else argv, {"c.yaml": text}),
             key)


def test_infinite_link_latency_is_refused(tmp_path: Path) -> None:
    text = _yaml({**VALID_CLUSTER, "intra_node": {**VALID_CLUSTER["intra_node"], "latency_s": 1}})  # type: ignore
    text = text.replace(b'"latency_s": 1', b'"latency_s": .inf')
    _refused(_run(tmp_path, ["predict", "--cluster", "c.yaml"], {"c.yaml": text}), "latency_s")


def test_a_search_on_a_link_of_the_largest_finite_latency_answers_in_one_line(tmp_path: Path) -> None:
    # found by the long fuzz (seed 12): the search's grid engine overflowed to inf - inf and numpy's warning went
    # to stderr; such plans now go to the plain engine, which refuses or prices them as before
    link = {**VALID_CLUSTER["intra_node"], "latency_s": 1.7976931348623157e308}  # type: ignore[dict-item]
    text = _yaml({**VALID_CLUSTER, "intra_node": link})
    argv = ["search", "--model", "gpt3-125m", "--cluster", "c.yaml", "--json", "--global-batch", "16"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a numpy warning is a second line on stderr
        outcome = _run(tmp_path, argv, {"c.yaml": text})
    assert outcome.kind in ("ok", "refused"), outcome
    assert len(outcome.detail) <= MAX_MESSAGE_CHARS


def test_a_zero_size_layer_is_refused(tmp_path: Path) -> None:
    layers = [dict(layer) for layer in VALID_CNN["layers"]]  # type: ignore[union-attr]
    layers[0]["out_channels"] = 0
    model = _yaml({**VALID_CNN, "layers": layers})
    _refused(_run(tmp_path, ["predict", "--model", "m.yaml"], {"m.yaml": model}), "out_channels", "greater than 0")


@pytest.mark.parametrize(("change", "fragment"), [({"layers": []}, "layers"), ("pool kernel 0x0", "kernel")])
def test_empty_cnns_and_zero_kernels_are_refused(change: object, fragment: str, tmp_path: Path) -> None:
    data = dict(VALID_CNN)
    if isinstance(change, dict):
        data.update(change)
    else:
        layers = [dict(layer) for layer in VALID_CNN["layers"]]  # type: ignore[union-attr]
        layers[1]["kernel"] = [0, 0]
        data["layers"] = layers
    _refused(_run(tmp_path, ["predict", "--model", "m.yaml"], {"m.yaml": _yaml(data)}), fragment)


@pytest.mark.parametrize("argv", [["--model", "dlrm-mlperf-terabyte", "--pp", "8"],
                                  ["--model", "resnet50", "--pp", "64", "--num-gpus", "64"]])
def test_more_stages_than_layers_is_refused(argv: list[str], tmp_path: Path) -> None:
    _refused(_run(tmp_path, ["predict", *argv]), "pp=", "layers of")


def test_booleans_are_not_numbers(tmp_path: Path) -> None:
    model = _yaml({"name": "m", "num_layers": True, "hidden": 64, "ffn_hidden": 256, "num_heads": 2, "vocab": 100})
    _refused(_run(tmp_path, ["predict", "--model", "m.yaml"], {"m.yaml": model}), "num_layers=True")


@pytest.mark.parametrize("model", ["gpt2-1.5b", "gshard-moe-600b"])
def test_the_default_seq_len_follows_the_model(model: str, tmp_path: Path) -> None:
    outcome = _run(tmp_path, ["predict", "--model", model, "--json"])
    assert outcome.kind == "ok", outcome


def test_a_job_files_model_resolves_beside_it_and_content_is_never_echoed(tmp_path: Path) -> None:
    secret = "AKIA-NOT-A-REAL-KEY-1234"
    files = {"jobs/job.yaml": b"model: creds\n", "jobs/creds": f"aws_secret_access_key: {secret}\n".encode(),
             "creds": b"name: other\n"}
    outcome = _run(tmp_path, ["predict", "jobs/job.yaml"], files)
    _refused(outcome, "jobs/creds")  # the file beside the job file, not ./creds
    assert secret not in outcome.detail
    files = {"jobs/job.yaml": b"model: sub/m.yaml\nseq_len: 512\n",
             "jobs/sub/m.yaml": _yaml({"name": "tiny", "num_layers": 2, "hidden": 64, "ffn_hidden": 256,
                                       "num_heads": 2, "vocab": 100, "max_seq_len": 512})}
    assert _run(tmp_path, ["predict", "jobs/job.yaml", "--json"], files).kind == "ok"


@pytest.mark.parametrize("model", ["/dev/zero", "x" * 300, "/etc"])
def test_special_and_long_paths_are_one_line(model: str, tmp_path: Path) -> None:
    _refused(_run(tmp_path, ["predict", "job.yaml"], {"job.yaml": f"model: {model}\n".encode()}))


@pytest.mark.parametrize(("name", "text"), [
    ("billion laughs", LAUGHS.encode()),
    ("self-referencing alias", b"a: &x [*x]\n"),
    ("2,000 nested brackets", b"tp: " + b"[" * 2000 + b"]" * 2000 + b"\n"),
    ("5,000 digits", b"tp: " + b"9" * 5000 + b"\n"),
    ("Latin-1", "# caf\xe9\ntp: 2\n".encode("latin-1")),
    ("UTF-16", "tp: 2\n".encode("utf-16")),
])
def test_hostile_job_files_are_refused_with_one_line(name: str, text: bytes, tmp_path: Path) -> None:
    _refused(_run(tmp_path, ["predict", "job.yaml"], {"job.yaml": text}), "job.yaml")


@pytest.mark.parametrize("argv", [
    ["--model", "gpt3-175b", "--num-gpus", "640", "--tp", "8", "--pp", "8", "--global-batch", "10240"],
    ["--global-batch", str(10**11)],
    ["--global-batch", str(8 * 10**7)],
])
def test_the_simulator_refuses_work_past_its_bound(argv: list[str], tmp_path: Path) -> None:
    _refused(_run(tmp_path, ["predict", "--engine", "sim", *argv]), "analytical")


def test_a_huge_strategy_tree_range_is_refused(tmp_path: Path) -> None:
    tree = b"strategy_tree:\n  map:\n    - {path: blocks.0-999999999, stage: 0}\n"
    _refused(_run(tmp_path, ["predict", "--engine", "sim", "--tree", "t.yaml"], {"t.yaml": tree}), "blocks.24")


@pytest.mark.parametrize("batch", [str(10**16), str(10**30)])
def test_search_refuses_global_batches_past_the_bound(batch: str, tmp_path: Path) -> None:
    _refused(_run(tmp_path, ["search", "--global-batch", batch]), "global_batch")


VALIDATE_CSVS = {
    "measured 1e400": (_csv(value="1e400"), "value"),
    "measured 0": (_csv(value="0"), "value"),
    "missing value cell": (_csv()[:-6] + b"\n", "fewer cells"),
    "inf in an integer column": (_csv(num_layers="inf"), ""),
    "a 200 KiB field": (_csv(notes="x" * 200_000) if "notes" in RUN_ROW else _csv(source="x" * 200_000), "CSV"),
    "not UTF-8": (_csv(source="caf\xe9").decode().encode("latin-1"), "UTF-8"),
}


@pytest.mark.parametrize("case", list(VALIDATE_CSVS))
def test_broken_runs_files_are_refused_or_skipped(case: str, tmp_path: Path) -> None:
    text, fragment = VALIDATE_CSVS[case]
    outcome = _run(tmp_path, ["validate", "runs.csv", "--json"], {"runs.csv": text})
    if outcome.kind == "ok":  # a row the engines cannot build is skipped with its reason, the file still scored
        assert case == "inf in an integer column"
        return
    _refused(outcome, fragment)


def test_gpus_per_node_zero_is_a_skipped_row(tmp_path: Path) -> None:
    outcome = _run(tmp_path, ["validate", "runs.csv", "--json"], {"runs.csv": _csv(gpus_per_node="0")})
    assert outcome.kind == "ok", outcome


@pytest.mark.parametrize(("key", "value"), [("machine", []), ("iteration_times_s", [0, 0]), ("settings", []),
                                            ("peak_memory_bytes", [1e400]), ("job", {"model": 1}),
                                            ("peak_memory_bytes", True), ("peak_memory_bytes", [0])])
def test_broken_measured_runs_are_refused(key: str, value: object, tmp_path: Path) -> None:
    run = _measured_run()
    run[key] = value
    text = json.dumps(run).replace("1e400", "Infinity").encode()
    _refused(_run(tmp_path, ["validate", "runs", "--engine", "analytical"], {"runs/r.json": text}), "r.json")


MEASURE_FLAGS = {
    "run id ../victim": (["--run-id", "../victim"], "run_id"),
    "run id a/b/c": (["--run-id", "a/b/c"], "run_id"),
    "timeout nan": (["--timeout-s", "nan"], "timeout_s"),
    "timeout inf": (["--timeout-s", "inf"], "timeout_s"),
    "threads -1": (["--threads", "-1"], "threads"),
    "175b on 8 ranks": (["--model", "gpt3-175b", "--num-gpus", "8", "--cluster", "local-cpu"], "GiB"),
}


@pytest.mark.parametrize("case", list(MEASURE_FLAGS))
def test_measure_refuses_before_starting_a_rank(case: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    victim = tmp_path / "victim.json"  # what --run-id ../victim names from --out
    victim.write_text("{}")
    flags, fragment = MEASURE_FLAGS[case]
    outcome = _run(tmp_path, ["measure", "--model", "gpt3-125m", "--out", "out", *flags])
    _refused(outcome, fragment)
    assert victim.exists() and not (tmp_path / "out" / "logs").exists()


@pytest.mark.parametrize(("flags", "fragment"), [(["--threads", "0"], "threads"), (["--db", "/etc"], "db"),
                                                 (["--sizes", "1e400GiB"], "sizes")])
def test_profile_refuses_bad_settings(flags: list[str], fragment: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _refused(_run(tmp_path, ["profile", "--no-ops", *flags]), fragment)


def test_a_trees_own_micro_batch_count_is_bounded_too(tmp_path: Path) -> None:
    """Found by the long fuzz: a tree's schedule of 2,897 micro-batches with a computation split ran 15 s and
    1 GB (the bound counted the job's 8 micro-batches, at layer level); now refused before building anything."""
    tree = (b"strategy_tree:\n  schedule: [{path: '', micro_batches: 2897, kind: 1f1b}]\n"
            b"  split: [{path: 'blocks.*.mlp.fc1', item: compute, dim: out, parts: 2}]\n")
    argv = ["predict", "--engine", "sim", "--model", "gpt3-125m", "--pp", "2", "--tp", "2", "--global-batch", "16",
            "--tree", "t.yaml"]
    _refused(_run(tmp_path, argv, {"t.yaml": tree}), "2897 micro-batches", "analytical")
