"""The collectives of one Table IV cell as its run issues them: per call, the rank's process and training-thread
CPU seconds, against the compiled task graph's collectives (a diagnostic, docs/strategy-tree.md eleventh session).

    flock /tmp/trainsim-timing.lock python scripts/proteus_collective_trace.py --model inception-v3-small \
        --strategy s2 --ranks 2 --out /tmp/trace-inception

Each rank's torch.distributed calls (all_gather, reduce_scatter_tensor, all_to_all, all_reduce, barrier) are
wrapped, through a sitecustomize module on the ranks' PYTHONPATH, to record per call its process CPU (every thread:
the caller's dispatch and wait, gloo's worker and transport threads), the calling thread's CPU, its wall time, and
the gloo threads' CPU between its end and the next call; the ranks write them when they exit. The harness' barriers
split the steps; the first two are left out (set-up and warm-up).
"""

import argparse
import collections
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proteus_table4 as table4

ENV = "TRAINSIM_COLLECTIVE_TRACE"
WRAPPED = ("all_gather", "reduce_scatter_tensor", "all_to_all", "all_reduce", "barrier")
SITECUSTOMIZE = f'''
import os
if os.environ.get("{ENV}"):
    import json, sys, threading, time
    _calls, _last = [], []
    def _wrap(mod, name):
        orig = getattr(mod, name)
        def wrapped(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return orig(*args, **kwargs)
            p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            if _last and _calls:
                _calls[-1]["after_gloo_s"] = (p0 - _last[0][0]) - (t0 - _last[0][1])
            out = orig(*args, **kwargs)
            p1, t1, w1 = time.process_time(), time.thread_time(), time.perf_counter()
            sizes = [a.numel() * a.element_size() for a in args if hasattr(a, "numel")]
            sizes += [sum(x.numel() * x.element_size() for x in a) for a in args if isinstance(a, list)]
            _calls.append({{"fn": name, "bytes": max(sizes, default=0), "async": bool(kwargs.get("async_op")),
                           "process_s": p1 - p0, "thread_s": t1 - t0, "wall_s": w1 - w0}})
            _last[:] = [(p1, t1)]
            return out
        setattr(mod, name, wrapped)
    import builtins
    _import = builtins.__import__
    def _hook(name, *a, **k):
        module = _import(name, *a, **k)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and hasattr(dist, "all_gather") and not getattr(dist, "_trace_wrapped", False):
            dist._trace_wrapped = True
            for fn in {WRAPPED!r}:
                _wrap(dist, fn)
        return module
    builtins.__import__ = _hook
    _exit = os._exit
    def _dump_and_exit(code):
        if _calls:
            with open(os.path.join(os.environ["{ENV}"], f"trace-{{os.getpid()}}.json"), "w") as f:
                json.dump(_calls, f)
        _exit(code)
    os._exit = _dump_and_exit
'''


def steps_of(calls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The calls between consecutive barriers, less the first two groups (set-up and warm-up)."""
    steps: list[list[dict[str, Any]]] = [[]]
    for call in calls:
        if call["fn"] == "barrier":
            steps.append([])
        else:
            steps[-1].append(call)
    return [s for s in steps if s][2:]


def per_function(steps: list[list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per wrapped function: calls per step, and per call the process CPU (in the call and the gloo threads' work
    after it until the next call), the calling thread's part, the wall time, the median message."""
    calls: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for step in steps:
        for call in step:
            calls[call["fn"] + (" (async)" if call["async"] else "")].append(call)
    return {fn: {"calls_per_step": len(c) / len(steps),
                 "process_s_per_call": statistics.fmean(x["process_s"] + x.get("after_gloo_s", 0.0) for x in c),
                 "thread_s_per_call": statistics.fmean(x["thread_s"] for x in c),
                 "wall_s_per_call": statistics.fmean(x["wall_s"] for x in c),
                 "median_bytes": statistics.median(x["bytes"] for x in c)} for fn, c in sorted(calls.items())}


def compiled_collectives(model: str, strategy: str, ranks: int, db: Path) -> dict[str, int]:
    """The compiled task graph's collectives of simulated device 0 by name (their first word: the collective;
    "dp" the data-parallel gradient buckets), as the Table IV script simulates the cell with `db`'s costs."""
    from trainsim.catalog.calibration import load_calibration
    from trainsim.estimate.engines import make_engine

    job, graph, plan = table4.job_and_plan(model, strategy, ranks)
    result = make_engine("sim", "profiled", db, "op", load_calibration()).estimate(job, graph, plan)
    assert result.timeline is not None  # the simulator always returns its timeline
    columns = result.timeline.exec_graph.columns()
    return dict(collections.Counter(name.split(" ")[0] for name, kind, device in
                                    zip(columns.name, columns.kind, columns.device, strict=True)
                                    if str(kind) == "comm" and device == 0 and name))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(table4.MODELS))
    parser.add_argument("--strategy", default="s2", choices=table4.STRATEGIES)
    parser.add_argument("--ranks", type=int, default=2, choices=(2, 4))
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--db", type=Path, default=table4.ROOT / "results" / "proteus_table4_v3" / "profile-cpu.db",
                        help="the profile database the compiled graph is priced with (its counts do not depend on it)")
    args = parser.parse_args()
    site = args.out / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    os.environ[ENV] = str(args.out)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), str(table4.ROOT / "src")])
    load = [Path("/proc/loadavg").read_text().split()[:3]]
    run = table4.measure(args.model, args.strategy, args.ranks, args.out, args.iterations, 1)
    if "error" in run:
        raise SystemExit(f"the run failed: {run['error']}")
    load.append(Path("/proc/loadavg").read_text().split()[:3])
    ranks = [per_function(steps_of(json.loads(p.read_text()))) for p in sorted(args.out.glob("trace-*.json"))]
    record = {"cell": f"{args.model}/{args.strategy}/g{args.ranks}", "load_average_before_after": load,
              "cpu_s": run.get("cpu_s"), "ranks": ranks,
              "compiled_device0": compiled_collectives(args.model, args.strategy, args.ranks, args.db)}
    (args.out / "collective-trace.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
