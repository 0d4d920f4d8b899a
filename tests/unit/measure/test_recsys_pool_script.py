"""scripts/recsys_quiet.py's pooling of measured passes on tiny hand-made sets: per config the median over every
pass's iterations, the trace of the pass nearest it, the loads' range (no timing run)."""

import csv
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import module_from_file

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    module = module_from_file("scripts/recsys_quiet.py")
    return module


def _write_pass(out: Path, name: str, iterations_s: list[float], load: tuple[float, float], fields: tuple) -> None:
    row = {"experiment": "e2e", "ranks": 2, "task": "heavy0-r2", "kind": "heavy", "seed": 0, "tables": 28,
           "sharder": "size-lookup-greedy", "local_batch": 32, "measured_s": sorted(iterations_s)[1],
           "fastest_s": min(iterations_s), "load_before": load[0], "load_after": load[1]}
    with (out / f"e2e_{name}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerow(row)
    trace = {"task": "heavy0-r2", "sharder": "size-lookup-greedy", "local_batch": 32, "ranks": 2,
             "iterations_s": iterations_s, "events": [[["a", 0.0, 1.0]], [["a", 0.0, 1.0]]], "cpu_s": [[name]],
             "faults": [[0]], "load": list(load)}
    (out / f"e2e_{name}_traces.jsonl").write_text(json.dumps(trace) + "\n")


def test_pool_takes_the_median_of_every_visit_and_the_nearest_trace(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()
    monkeypatch.setattr(script, "OUT", tmp_path)
    _write_pass(tmp_path, "a", [1.0, 2.0, 3.0], (5.0, 6.0), script.FIELDS)
    _write_pass(tmp_path, "b", [4.0, 5.0, 6.0], (4.0, 9.0), script.FIELDS)
    _write_pass(tmp_path, "c", [3.0, 3.5, 4.0], (7.0, 7.0), script.FIELDS)
    script.pool("abc", ["a", "b", "c"])
    (row,) = list(csv.DictReader((tmp_path / "e2e_abc.csv").open()))
    assert float(row["measured_s"]) == 3.5  # the median of the 9 iterations 1, 2, 3, 3, 3.5, 4, 4, 5, 6
    assert float(row["fastest_s"]) == 1.0
    assert (float(row["load_before"]), float(row["load_after"])) == (4.0, 9.0)
    (trace,) = [json.loads(line) for line in (tmp_path / "e2e_abc_traces.jsonl").open()]
    assert trace["cpu_s"] == [["c"]]  # pass c's median (3.5) is the pooled one
    assert trace["iterations_s"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 3.0, 3.5, 4.0]
    assert trace["pooled_from"] == ["a", "b", "c"]
