"""Trace files read like every other input (issue 12): through the capped reader (a regular file, a size cap on
the file and on what it decompresses to, UTF-8, no NaN or Infinity, nesting bounded) and checked field by
field; every problem is one line naming the file, through the command line exit 2."""

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.errors import MAX_MESSAGE_CHARS, InputFileError
from trainsim.frontends.trace import parse
from trainsim.frontends.trace.load import load_execution_traces, load_trace_directory

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "exec_trace"
RUNNER = CliRunner()


def _fixture(name: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((FIXTURES / f"{name}.gz").read_bytes()))


def _folder(tmp_path: Path, **replace: bytes) -> Path:
    """The two-rank fixture, uncompressed, with some files' bytes replaced."""
    folder = tmp_path / "trace"
    folder.mkdir()
    for name in ("rank0.et.json", "rank0.kineto.json", "rank1.et.json", "rank1.kineto.json"):
        key = name.replace(".", "_")
        data = replace.get(key, json.dumps(_fixture(name)).encode())
        (folder / name).write_bytes(data)
    return folder


def _refused(folder: Path, *fragments: str) -> str:
    """predict --engine replay on the folder: exit 2, one line of at most 300 characters holding fragments."""
    result = RUNNER.invoke(app, ["predict", "--frontend", "trace", "--model", str(folder), "--engine", "replay"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= MAX_MESSAGE_CHARS, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _kineto_with(**event: object) -> bytes:
    data = copy.deepcopy(_fixture("rank0.kineto.json"))
    timed = next(e for e in data["traceEvents"] if e.get("ph") == "X")
    timed.update(event)
    return json.dumps(data).encode()


def test_the_fixture_replays_and_predicts_analytically(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    for engine in ("replay", "analytical"):  # analytical: the traced layer has saved bytes (it had none)
        result = RUNNER.invoke(app, ["predict", "--frontend", "trace", "--model", str(folder), "--engine", engine,
                                     "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["iteration_time_s"] > 0


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    with open(folder / "rank0.et.json", "r+b") as handle:  # sparse: no disk used
        handle.truncate(parse.MAX_TRACE_FILE_BYTES + 1)
    _refused(folder, "rank0.et.json", "more than the")


def test_a_gzip_that_inflates_past_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse, "MAX_TRACE_FILE_BYTES", 2**20)
    bomb = tmp_path / "rank0.et.json.gz"
    bomb.write_bytes(gzip.compress(b'{"nodes": [' + b" " * (4 * 2**20) + b"]}"))  # 4 KiB inflating to 4 MiB
    with pytest.raises(InputFileError, match="decompresses to more than the 1048576 bytes"):
        load_execution_traces([bomb])


@pytest.mark.parametrize("depth", [65, 5000, 200_000])
def test_deep_nesting_is_refused(depth: int, tmp_path: Path) -> None:
    text = b'{"nodes": ' + b"[" * depth + b"]" * depth + b"}"
    _refused(_folder(tmp_path, rank0_et_json=text), "rank0.et.json", "nests deeper than 64")


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_text_that_is_not_utf8_is_refused(encoding: str, tmp_path: Path) -> None:
    text = json.dumps({**_fixture("rank1.kineto.json"), "host_name": "caf\xe9"}, ensure_ascii=False)
    _refused(_folder(tmp_path, rank1_kineto_json=text.encode(encoding)), "rank1.kineto.json", "not UTF-8")


@pytest.mark.parametrize(("event", "fragment"), [
    ({"dur": float("nan")}, "NaN is not a number JSON allows"),  # NaN in the JSON itself
    ({"dur": "nan"}, "dur='nan'"),
    ({"dur": -3.0}, "dur=-3.0"),
    ({"ts": -1.0}, "ts=-1.0"),
    ({"ts": 1e300}, "ts=1e+300"),
    ({"ts": True}, "ts=True"),
])
def test_kineto_times_must_be_finite_and_not_negative(event: dict[str, object], fragment: str,
                                                      tmp_path: Path) -> None:
    _refused(_folder(tmp_path, rank0_kineto_json=_kineto_with(**event)), "rank0.kineto.json", fragment)


@pytest.mark.parametrize(("info", "fragment"), [({"rank": 5, "world_size": 2}, "distributedInfo.rank=5"),
                                                ({"rank": 0, "world_size": "2"}, "world_size='2'"),
                                                ([], "distributedInfo=[]")])
def test_distributed_info_is_checked(info: object, fragment: str, tmp_path: Path) -> None:
    data = {**_fixture("rank0.kineto.json"), "distributedInfo": info}
    _refused(_folder(tmp_path, rank0_kineto_json=json.dumps(data).encode()), fragment)


def _et_with(change: Any) -> bytes:
    data = copy.deepcopy(_fixture("rank0.et.json"))
    change(data["nodes"])
    return json.dumps(data).encode()


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda nodes: nodes[3].pop("id"), "nodes[3]: id=None"),
    (lambda nodes: nodes[3].update(id="7"), "id='7'"),
    (lambda nodes: nodes[4].update(id=nodes[3]["id"]), "an id no other node has"),
    (lambda nodes: nodes[3].update(name=[]), "name=[]"),
    (lambda nodes: nodes[3].update(attrs=[{"value": 1}]), "attrs="),
    (lambda nodes: nodes[3].update(inputs=[]), "inputs=[]"),
    (lambda nodes: nodes[5]["inputs"]["values"][0].__setitem__(3, -4), "tensor record=-4"),
    (lambda nodes: nodes[5]["inputs"]["shapes"].__setitem__(0, [256, -1]), "shape=-1"),
    (lambda nodes: nodes.clear(), "no 'nodes' list"),
])
def test_broken_execution_trace_nodes_are_refused(change: Any, fragment: str, tmp_path: Path) -> None:
    _refused(_folder(tmp_path, rank0_et_json=_et_with(change)), "rank0.et.json", fragment)


def test_a_ctrl_deps_cycle_is_refused_not_walked_forever(tmp_path: Path) -> None:
    def cycle(nodes: list[dict[str, Any]]) -> None:
        a, b, c = nodes[1], nodes[2], nodes[3]
        a["ctrl_deps"], b["ctrl_deps"], c["ctrl_deps"] = b["id"], a["id"], a["id"]
        a["name"] = b["name"] = "nccl:all_reduce"  # comm records: link() walks up through them

    _refused(_folder(tmp_path, rank0_et_json=_et_with(cycle)), "rank0.et.json", "cycle")


def test_a_special_file_is_not_read(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "rank0.et.json").unlink()
    (folder / "rank0.et.json").symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match="not a regular file"):
        load_trace_directory(folder)
