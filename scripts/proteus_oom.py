"""OOM verdicts on this machine's CPU ranks (Proteus Sec. VIII-C: "Out of 180 simulation results, Proteus's
estimation of OOM is incorrect only under 2 cases"): plans near and over a per-rank memory cap, predicted by the
simulator (the rank's peak less the device's runtime reserve, against the cap) and observed by `trainsim measure
--tree ... --memory-cap-gib CAP` (the harness samples each rank's resident memory above its baseline while the
steps run and records outcome "oom" past the cap). Counts the wrong verdicts. One campaign, under the lock:

    flock /tmp/trainsim-timing.lock python scripts/proteus_oom.py --out results/proteus_oom
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import proteus_table4 as t

# (model, micro-batch, seq_len, trees' model, caps in GiB): DLRM's partitioned tables are what makes it fit (the
# paper's S2), GPT-1.5B's op shard trims its model states
PLANS: list[tuple[str, int, int, str, tuple[float, ...]]] = [
    ("dlrm-oom", 256, 1, "dlrm-small", (0.5, 0.75, 1.0)),
    ("gpt2-1.5b-small", 8, 128, "gpt2-1.5b-small", (0.2, 0.3)),
]


def predicted_job_bytes(model: str, strategy: str, ranks: int, tree_model: str) -> float:
    """The simulator's peak of a rank less what the harness leaves out of its cap: the rank's resident memory
    before the model is built, the device's measured baseline (catalog/runtime_memory.py; its runtime reserve
    holds that baseline and the runtime's working memory above it). Without a measurement, the whole reserve."""
    from trainsim.catalog.runtime_memory import measured_runtime_bytes
    from trainsim.cost.pricing import make_pricer
    from trainsim.estimate.simulation import SimEstimator, sim_calibration

    job, graph, plan = t.job_and_plan(model, strategy, ranks, tree_model)
    result = SimEstimator(make_pricer("roofline", None, sim_calibration()), task_level="op").estimate(job, graph,
                                                                                                      plan)
    measured = measured_runtime_bytes(job.cluster.device.name)
    excluded = measured[0] if measured else result.memory_breakdown.get("runtime_reserved", 0.0)
    return result.peak_memory_bytes - excluded


def observe(model: str, strategy: str, ranks: int, tree_model: str, cap_gib: float, out: Path) -> dict[str, Any]:
    s = t.settings(model, ranks)
    run_id = f"{model}-{strategy}-g{ranks}-cap{cap_gib:g}"
    cmd = [sys.executable, "-m", "trainsim", "measure", "--model", s["model"], "--num-gpus", str(ranks),
           "--micro-batch", str(s["micro_batch"]), "--global-batch", str(s["global_batch"]),
           "--seq-len", str(s["seq_len"]), "--precision", "fp32", "--optimizer-impl", "loop",
           "--tree", str(t.tree_path(tree_model, strategy, ranks)), "--iterations", "1", "--warmup", "1",
           "--threads", "1", "--memory-cap-gib", str(cap_gib), "--out", str(out / "runs"), "--run-id", run_id,
           "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-300:]}
    run = json.loads(done.stdout)
    peaks = [p for p in run["settings"].get("capped_peak_bytes", []) if p is not None]
    return {"outcome": run["settings"]["outcome"], "used_bytes": max(peaks) if peaks else None}


def gpu_verdicts(path: Path) -> dict[str, Any]:
    """The lead's CUDA OOM probes (scripts/gpu/probe.py, oom_verdicts.jsonl) predicted by the analytical engine and
    by the simulator; wrong verdicts per engine."""
    from dataclasses import replace

    from trainsim.cli.measure import job_from_flags
    from trainsim.estimate.engines import make_engine
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.measure.results import measured_stack
    from trainsim.strategy.device_slice import DeviceSlice

    keys = ("model", "seq_len", "micro_batch", "global_batch", "precision", "recompute", "cluster")
    engines = {name: make_engine(name) for name in ("analytical", "sim")}
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["observed"] not in ("fits", "oom"):
            continue
        job = job_from_flags(None, {key: record[key] for key in keys} | {"num_gpus": 1})
        job = replace(job, stack=measured_stack(job.parallel))
        graph = build_graph(job.model, DeviceSlice.of(job.parallel))
        row: dict[str, Any] = {"job": record["run_id"], "observed": record["observed"]}
        for name, engine in engines.items():
            result = engine.estimate(job, graph)
            row[name] = "oom" if result.oom else "fits"
            row[f"{name}_peak_gib"] = result.peak_memory_bytes / 2**30
        rows[record["run_id"]] = row
    out = list(rows.values())
    wrong = {name: sum(r[name] != r["observed"] for r in out) for name in engines}
    return {"jobs": len(out), "wrong": wrong, "rows": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=t.ROOT / "results" / "proteus_oom")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--gpu", type=Path, help="oom_verdicts.jsonl of CUDA probes: predict them, measure nothing")
    args = parser.parse_args()
    if args.gpu is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = gpu_verdicts(args.gpu)
        (args.out / "gpu_oom.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"{result['jobs']} CUDA probes; wrong verdicts: {result['wrong']}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model, mb, seq, tree_model, caps in PLANS:
        t.MODELS[model] = (mb, seq)
        for ranks in (int(r) for r in args.ranks.split(",")):
            for strategy in t.STRATEGIES:
                predicted = predicted_job_bytes(model, strategy, ranks, tree_model)
                for cap in caps:
                    seen = observe(model, strategy, ranks, tree_model, cap, args.out)
                    verdict = "oom" if predicted > cap * 2**30 else "ok"
                    rows.append({"model": model, "strategy": strategy, "ranks": ranks, "cap_gib": cap,
                                 "predicted_bytes": predicted, "predicted": verdict, **seen})
                    print(rows[-1], flush=True)
                    (args.out / "oom.json").write_text(json.dumps(rows, indent=1) + "\n")
    judged = [r for r in rows if "outcome" in r]
    wrong = [r for r in judged if r["outcome"] != r["predicted"]]
    print(f"wrong OOM verdicts: {len(wrong)} of {len(judged)}")


if __name__ == "__main__":
    main()
