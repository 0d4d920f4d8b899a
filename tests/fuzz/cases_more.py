"""More fuzz kinds (issue 12): strategy-tree files (`predict --tree`), execution and Kineto trace files (the
trace front-end, `--engine replay`, `graph --frontend trace`), measured-run folders as `validate` reads them, and
`measure`'s own flags (checked before any rank starts: the launcher is replaced by a stub, see harness).

Like cases.py, each kind starts from an input that runs and breaks one thing.
"""

import functools
import gzip
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from tests.fuzz.cases import BROKEN_FLAGS, GROUND_TRUTH, Case, _paths, broken_yaml, encoded

TRACE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exec_trace"
TRACE_FILES = ("rank0.et.json", "rank0.kineto.json", "rank1.et.json", "rank1.kineto.json")

# JSON values that break a trace field: types, extremes, negative times and ids, strings where numbers go.
BROKEN_JSON: tuple[object, ...] = (
    None, True, False, [], {}, [1, 2], 0, -1, -1e9, 0.5, 1e300, 10**30, 2**63, 2**64, "", "abc", "nan", "inf",
    "x" * 400, [[[[[[1]]]]]], {"a": {"b": {"c": 1}}}, -0.0, 1e-320)

# A strategy tree for gpt3-125m on 8 GPUs (tp 2, pp 2): every primitive once (docs/strategy-tree.md).
VALID_TREE = {"strategy_tree": {
    "schedule": [{"path": "", "micro_batches": 8, "kind": "1f1b"}],
    "map": [{"path": "embedding", "stage": 0}, {"path": "blocks.0-4", "stage": 0}, {"path": "blocks.5-11",
                                                                                   "stage": 1}],
    "recompute": [{"path": "blocks.0-3", "mode": "selective"}],
    "split": [{"path": "blocks.*.mlp.fc1", "item": "compute", "dim": "out", "parts": 2}]}}
TREE_ARGV = ["predict", "--engine", "sim", "--model", "gpt3-125m", "--pp", "2", "--tp", "2", "--global-batch", "16",
             "--json", "--tree", "tree.yaml"]


@st.composite
def tree_file_cases(draw: st.DrawFn) -> Case:
    """A strategy-tree file with one node broken (the tree's YAML is one mapping: its primitives' lists)."""
    text, note = draw(broken_yaml(VALID_TREE["strategy_tree"]))
    text = "strategy_tree:\n" + "".join(f"  {line}\n" for line in text.splitlines())
    path = draw(st.sampled_from(("", "", "", "", "", "", "blocks.0-999999999", "blocks.*.*.*", "x" * 300, "blocks.-1",
                                 "blocks.5-2", "..", "blocks..0", "blocks.[", "*" * 50)))
    if path:  # or one path, any primitive, replaced by an odd one
        text = text.replace('"blocks.0-4"', json.dumps(path), 1)
        note = f"path <- {path[:40]}"
    data = draw(encoded(text)) if draw(st.integers(0, 3)) == 0 else text.encode()  # mostly about the tree itself
    return Case(TREE_ARGV, {"tree.yaml": data}, f"tree {note}")


@functools.cache
def _trace_texts() -> dict[str, str]:
    """Each fixture file as json.dumps writes it: a case parses afresh only the file it breaks (a parse is a
    third of a deep copy's time) and writes every other file as it is."""
    return {name: json.dumps(json.loads(gzip.decompress((TRACE_FIXTURES / f"{name}.gz").read_bytes())))
            for name in TRACE_FILES}


TRACE_COMMANDS = (
    ["predict", "--frontend", "trace", "--model", "trace", "--engine", "replay", "--json"],
    ["predict", "--frontend", "trace", "--model", "trace", "--engine", "replay", "--json"],
    ["predict", "--frontend", "trace", "--model", "trace", "--json"],
    ["predict", "--frontend", "trace", "--model", "trace/rank0.et.json", "--num-gpus", "1", "--json"],
    ["graph", "--frontend", "trace", "--model", "trace"],
)


def _break_trace_field(draw: st.DrawFn, data: dict[str, Any]) -> str:
    """Break one field of one node (an execution trace) or one event (a Kineto trace) in place; what broke."""
    items_key = "nodes" if "nodes" in data else "traceEvents"
    items = data[items_key]
    index = draw(st.integers(0, len(items) - 1))
    if draw(st.integers(0, 5)) == 0:  # a top-level key instead
        key = draw(st.sampled_from(sorted(data)))
        value = draw(st.sampled_from(BROKEN_JSON))
        data[key] = value
        return f"{key} <- {str(value)[:40]}"
    path = draw(st.sampled_from(_paths(items[index]) or [()]))
    value = draw(st.one_of(st.sampled_from(BROKEN_JSON), st.integers(-(2**70), 2**70),
                           st.floats(allow_nan=False, allow_infinity=False)))
    node: Any = items
    for part in (index, *path[:-1]):
        node = node[part]
    if path:
        node[path[-1]] = value
    else:
        items[index] = value
    return f"{items_key}[{index}].{'.'.join(map(str, path))} <- {str(value)[:40]}"


def _break_trace_file(draw: st.DrawFn, text: str) -> tuple[bytes, str]:
    how = draw(st.sampled_from(("deep", "nan", "truncated", "empty", "list", "latin-1", "utf-16", "invalid",
                                "huge-number")))
    if how == "deep":
        depth = draw(st.sampled_from((70, 500, 5000, 100_000)))
        return ('{"nodes": ' + "[" * depth + "]" * depth + "}").encode(), f"nested {depth} deep"
    if how == "nan":
        text = text.replace('"dur": ', '"dur": NaN, "x": ', 1).replace('"id": ', '"id": Infinity, "y": ', 1)
        return text.encode(), how
    if how == "truncated":
        return text[: len(text) // 2].encode(), how
    if how == "empty":
        return b"", how
    if how == "list":
        return b"[" + text.encode() + b"]", how
    if how == "huge-number":
        return text.replace('"id": ', '"id": ' + "9" * 5000 + ', "z": ', 1).encode(), how
    return draw(encoded(text)), how


def _cycle(data: dict[str, Any]) -> str:
    """Two nodes each other's parent (ctrl_deps), a third under them."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or len(nodes) < 3:
        return "no cycle"
    a, b, c = nodes[1], nodes[2], nodes[3]
    a["ctrl_deps"], b["ctrl_deps"], c["ctrl_deps"] = b["id"], a["id"], a["id"]
    a["name"] = b["name"] = "nccl:all_reduce"
    return "ctrl_deps cycle"


@st.composite
def trace_cases(draw: st.DrawFn) -> Case:
    """The two-rank fixture (execution + Kineto traces) with one field, one file or the folder broken."""
    texts = _trace_texts()
    target = draw(st.sampled_from(TRACE_FILES))
    how = draw(st.sampled_from(("field", "field", "field", "file", "cycle", "missing")))
    files = {f"trace/{name}": text.encode() for name, text in texts.items()}
    note = ""
    if how in ("field", "cycle"):
        if how == "cycle":
            target = target.replace("kineto", "et")
        data = json.loads(texts[target])
        note = _break_trace_field(draw, data) if how == "field" else _cycle(data)
        files[f"trace/{target}"] = json.dumps(data).encode()
    if how == "file":
        files[f"trace/{target}"], note = _break_trace_file(draw, texts[target])
    elif how == "missing":
        del files[f"trace/{target}"]
        note = "missing"
    if draw(st.booleans()):  # compressed, as torch writes them
        name = f"trace/{target}"
        if name in files:
            files[f"{name}.gz"] = gzip.compress(files.pop(name), compresslevel=1)
    argv = list(draw(st.sampled_from(TRACE_COMMANDS)))
    if argv[4].endswith(".et.json") and f"trace/{TRACE_FILES[0]}" not in files:
        argv[4] += ".gz"
    return Case(argv, files, f"{target} {note}")


def _measured_run(index: int) -> dict[str, Any]:
    return json.loads(sorted(GROUND_TRUTH.glob("*.json"))[index].read_text())


@st.composite
def measured_folder_layout_cases(draw: st.DrawFn) -> Case:
    """A measured-run folder as a whole: several runs, other files beside them, sub-folders, odd names, a run
    that is not an object, duplicated run ids, an empty folder."""
    files: dict[str, bytes] = {}
    count = draw(st.integers(0, 3))
    for index in range(count):
        files[f"runs/r{index}.json"] = json.dumps(_measured_run(index)).encode()
    extra = draw(st.sampled_from(("none", "notes.txt", "sub/r.json", "list", "duplicate", "binary", "empty",
                                  "deep", "long-name", "dir.json", "huge-field")))
    if extra == "notes.txt":
        files["runs/notes.txt"] = b"not a run\n"
    elif extra == "sub/r.json":
        files["runs/sub/r.json"] = json.dumps(_measured_run(0)).encode()
    elif extra == "list":
        files["runs/list.json"] = b"[1, 2, 3]"
    elif extra == "duplicate":
        files["runs/copy.json"] = json.dumps(_measured_run(0)).encode()
    elif extra == "binary":
        files["runs/bin.json"] = b"\xff\xfe\x00\x01" * 100
    elif extra == "empty":
        files["runs/empty.json"] = b""
    elif extra == "deep":
        files["runs/deep.json"] = b'{"job": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    elif extra == "long-name":
        files["runs/" + "n" * 200 + ".json"] = json.dumps(_measured_run(0)).encode()
    elif extra == "dir.json":
        files["runs/dir.json/r.json"] = b"{}"
    elif extra == "huge-field":
        run = _measured_run(0)
        run["run_id"] = "x" * 300_000
        files["runs/huge.json"] = json.dumps(run).encode()
    engine = draw(st.sampled_from(("analytical", "analytical", "sim", "all")))
    argv = ["validate", "runs", "--json", "--engine", engine, "--costs", "roofline"]
    if not files:
        argv[1] = draw(st.sampled_from(("runs", "missing-folder")))
        files["runs/.keep"] = b""
    return Case(argv, files, f"{count} runs + {extra}")


# measure flags whose broken values must be refused before a rank starts (the memory check included)
MEASURE_MUST_REFUSE: dict[str, tuple[str, ...]] = {
    "--run-id": ("../victim", "a/b/c", "..", ".hidden", "/etc/passwd", "a\\b", "x" * 300, "", "a\x00b", "a b"),
    "--timeout-s": ("nan", "inf", "-inf", "0", "-1", "1e400", "1e300"),
    "--threads": ("-1", "-5", str(-(2**70)), "100000", str(2**70)),
    "--iterations": ("0", "-1", str(10**30)),
    "--warmup": ("-1", str(10**30)),
}
OVERSIZE_JOBS = (["--model", "gpt3-175b", "--num-gpus", "8"], ["--model", "llama3.1-70b", "--num-gpus", "2"],
                 ["--model", "gpt3-13b", "--num-gpus", "16"], ["--model", "gpt3-175b", "--num-gpus", "1"],
                 ["--model", "gpt3-125m", "--num-gpus", "4096"], ["--model", "gpt3-125m", "--global-batch",
                                                                  str(10**9), "--micro-batch", str(10**6)])


@st.composite
def measure_flag_cases(draw: st.DrawFn) -> Case:
    """`measure` with one broken flag: the values in MEASURE_MUST_REFUSE and the oversize jobs must be refused
    (exit 2); any other value may pass the checks, where the launcher stub stands in for the ranks."""
    base = ["measure", "--model", "gpt3-125m", "--cluster", "local-cpu", "--out", "out", "--json"]
    kind = draw(st.sampled_from(("refuse", "refuse", "oversize", "any")))
    if kind == "oversize":
        flags = list(draw(st.sampled_from(OVERSIZE_JOBS)))
        return Case([*base, *flags], {}, f"measure oversize {' '.join(flags)[:60]}", must_refuse=True)
    if kind == "refuse":
        flag = draw(st.sampled_from(sorted(MEASURE_MUST_REFUSE)))
        value = draw(st.sampled_from(MEASURE_MUST_REFUSE[flag]))
        return Case([*base, flag, value], {}, f"measure {flag} {value[:40]!r}", must_refuse=True)
    flag = draw(st.sampled_from(("--run-id", "--timeout-s", "--threads", "--iterations", "--warmup", "--num-gpus",
                                 "--tp", "--pp", "--zero", "--micro-batch", "--precision", "--out", "--suite",
                                 "--repeats")))
    value = draw(st.one_of(st.sampled_from(BROKEN_FLAGS), st.text(max_size=12)))
    return Case([*base, flag, value], {}, f"measure {flag} {value[:40]!r}")
