"""The Chrome / Perfetto trace of a simulated iteration is valid trace-event JSON."""

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, SimDevice
from trainsim.report.trace import write_chrome_trace
from trainsim.sim import SimOptions, SimOutcome, simulate
from trainsim.sim.synthetic import synthetic_pipeline


@pytest.fixture(scope="module")
def simulated() -> tuple[ExecGraph, SimOutcome]:
    graph = synthetic_pipeline(stages=3, micro_batches=4, layers_per_stage=2, seed=11)
    return graph, simulate(graph, SimOptions(overlap_slowdown=0.25, bandwidth_sharing=True))


def _load(path: Path) -> list[dict[str, Any]]:
    document = json.loads(path.read_text(encoding="utf-8"))
    assert set(document) >= {"traceEvents"}
    return document["traceEvents"]


def test_trace_is_valid_json_with_complete_events(simulated: tuple[ExecGraph, SimOutcome], tmp_path: Path) -> None:
    graph, outcome = simulated
    events = _load(write_chrome_trace(graph, outcome, tmp_path / "iter.json"))
    complete = [e for e in events if e["ph"] == "X"]
    tasks = [e for e in complete if e.get("cat") != "sync_wait"]
    assert len(tasks) == len(graph.tasks)
    for event in complete:
        assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(event)
        assert event["ts"] >= 0 and event["dur"] >= 0
    first = next(e for e in tasks if e["name"] == graph.tasks[0].name)
    assert set(first["args"]) >= {"layer", "micro_batch", "stage", "phase", "category"}
    assert first["ts"] == outcome.start_s[0] * 1e6


def test_events_on_one_thread_never_overlap(simulated: tuple[ExecGraph, SimOutcome], tmp_path: Path) -> None:
    graph, outcome = simulated
    events = _load(write_chrome_trace(graph, outcome, tmp_path / "iter.json"))
    threads: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in events:
        if event["ph"] == "X":
            threads.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    assert len(threads) == 3 * len(graph.devices)
    for spans in threads.values():
        spans.sort()
        for (_, end), (start, _) in pairwise(spans):
            assert start >= end - 1e-6  # microseconds, rounded to whole nanoseconds


def test_metadata_names_and_memory_counters(simulated: tuple[ExecGraph, SimOutcome], tmp_path: Path) -> None:
    graph, outcome = simulated
    names = [f"stage {d.stage}" for d in graph.devices]
    events = _load(write_chrome_trace(graph, outcome, tmp_path / "iter.json", device_names=names))
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == dict(enumerate(names))
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {(d.index, s) for d in graph.devices for s in ("compute", "feature comm", "gradient comm")}
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {d.index for d in graph.devices}
    assert max(e["args"]["allocated_bytes"] for e in counters) == outcome.peak_memory_bytes


def test_collective_wait_is_drawn(tmp_path: Path) -> None:
    # Rank 0 is ready at 1 s, rank 1 at 3 s: rank 0 holds its gradient stream waiting for 2 s.
    devices = [SimDevice(index=i, stage=i, ranks=1, capacity_bytes=1e12, static_bytes=0.0) for i in range(2)]
    graph = ExecGraph(devices=devices, tasks=[])
    for rank, delay in enumerate((1.0, 3.0)):
        gate = graph.add(name=f"C{rank}", device=rank, stream="compute", kind="compute", duration_s=delay)
        graph.add(name=f"AR{rank}", device=rank, stream="gradient", kind="comm", duration_s=2.0, deps=(gate.tid,),
                  sync_key="ar")
    events = _load(write_chrome_trace(graph, simulate(graph, SimOptions()), tmp_path / "t.json"))
    waits = [e for e in events if e.get("cat") == "sync_wait"]
    assert [(e["name"], e["ts"], e["dur"]) for e in waits] == [("sync wait: AR0", 1e6, 2e6)]


def test_write_is_atomic_and_checks_names(simulated: tuple[ExecGraph, SimOutcome], tmp_path: Path) -> None:
    graph, outcome = simulated
    target = tmp_path / "iter.json"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(ConfigError, match="device_names"):
        write_chrome_trace(graph, outcome, target, device_names=["only one"])
    assert target.read_text(encoding="utf-8") == "old"
    write_chrome_trace(graph, outcome, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter.json"]  # no temporary file left behind


def read_trace(path: Path) -> dict[str, Any]:
    """Parse a trace the way a trace viewer does (the Trace Event Format's rules, not only its JSON): slices per
    (process, thread) that nest or follow each other, and flow arrows whose "s" and "f" each bind to the
    slice enclosing them on their own thread. Returns the slices and the bound arrows
    (id -> (category, name, source slice, target slice)); raises AssertionError on any broken rule."""
    events = _load(path)
    slices: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in events:
        assert event["ph"] in {"M", "X", "C", "s", "f"}, event
        if event["ph"] == "X":
            slices.setdefault((event["pid"], event["tid"]), []).append(event)
    for spans in slices.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))

    def enclosing(event: dict[str, Any]) -> dict[str, Any]:
        found = [s for s in slices.get((event["pid"], event["tid"]), [])
                 if s["ts"] - 1e-3 <= event["ts"] <= s["ts"] + s["dur"] + 1e-3 and s.get("cat") != "sync_wait"]
        assert found, f"flow {event['ph']} {event['id']} at {event['ts']} binds to no slice"
        return found[-1]

    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == sum(e["ph"] == "s" for e in events) and set(starts) == set(ends), "one s and one f per id"
    arrows = {}
    for flow_id, start in starts.items():
        end = ends[flow_id]
        assert (start["cat"], start["name"]) == (end["cat"], end["name"]) and end.get("bp") == "e"
        assert end["ts"] >= start["ts"] - 1e-3, "an arrow points forward in time"
        arrows[flow_id] = (start["cat"], start["name"], enclosing(start), enclosing(end))
    return {"slices": slices, "arrows": arrows}


def test_flow_arrows_join_pipeline_transfers_and_collectives(tmp_path: Path) -> None:
    import trainsim

    prediction = trainsim.simulate(model="gpt3-125m", num_gpus=8, pp=2, tp=2, global_batch=8)
    assert prediction.result is not None and prediction.result.timeline is not None
    timeline = prediction.result.timeline
    graph = timeline.exec_graph
    trace = read_trace(write_chrome_trace(graph, timeline.outcome, tmp_path / "t.json"))
    arrows = list(trace["arrows"].values())
    crossing = [(dep, task.tid) for task in graph.tasks for dep in task.deps if graph.tasks[dep].device != task.device]
    pipeline = [a for a in arrows if a[0] == "pipeline"]
    assert crossing and len(pipeline) == len(crossing)
    for _, name, source, target in pipeline:  # from a send on one stage to the task of the other that waits
        assert name == "pp transfer" and source["pid"] != target["pid"] and source["cat"] == "pp_comm"
        assert target["ts"] >= source["ts"] + source["dur"] - 1e-3
    groups: dict[str, set[int]] = {}
    for task in graph.tasks:
        if task.sync_key:
            groups.setdefault(task.sync_key, set()).add(task.device)
    collective = [a for a in arrows if a[0] == "collective"]
    assert len(collective) == sum(len(devices) - 1 for devices in groups.values() if len(devices) > 1) > 0
    for _, name, source, target in collective:
        assert name.startswith("collective ") and source["pid"] != target["pid"] and source["ts"] == target["ts"]


def test_the_parser_catches_a_dangling_arrow(tmp_path: Path) -> None:
    """Negative control for read_trace: an arrow that ends where no slice is."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "a", "pid": 0, "tid": 1, "ts": 0.0, "dur": 1.0},
        {"ph": "s", "id": 1, "name": "pp transfer", "cat": "pipeline", "pid": 0, "tid": 1, "ts": 0.5},
        {"ph": "f", "bp": "e", "id": 1, "name": "pp transfer", "cat": "pipeline", "pid": 1, "tid": 1, "ts": 2.0}]}))
    with pytest.raises(AssertionError, match="binds to no slice"):
        read_trace(path)
