"""A strategy tree's tp configs on the torch front-end's captured GPT-2 measured on this machine's gloo ranks against
`trainsim predict --frontend torch --tree F --engine sim` with profiled op costs (docs/strategy-tree.md, "Running
the plans: `trainsim measure --tree`").

The model is the Table IV analogue's GPT-2 (data/strategies/proteus/small/models/gpt2-small.yaml: 4 layers of 256,
4 heads, vocabulary 4096, tied) as the torch front-end captures it (its Hugging Face GPT2LMHeadModel), micro-batch
4 x 128 tokens, fp32, one intra-op thread per rank. The plans: the attention and MLP pairs over tp 2
(data/strategies/frontend/gpt2-torch-tp2-attn-mlp.yaml, torch's ColwiseParallel / RowwiseParallel) and the same
model whole on one rank. Steps, each timed one under the timing lock:

    flock /tmp/trainsim-timing.lock python scripts/front_end_tp_ground_truth.py --profile --out OUT  # the ops
    flock /tmp/trainsim-timing.lock python scripts/front_end_tp_ground_truth.py --measure --out OUT  # one pass
    python scripts/front_end_tp_ground_truth.py --summary --out OUT                                    # compare

--profile: a copy of --base (a CPU-clock database holding the 2-rank gloo collectives and the Adam step, as
scripts/op_tp_ground_truth.py makes) gets every op of the two plans at its per-rank shape (the captured graph shaped
by the compiler from the tree's configs; the whole graph at tp 1) on thread CPU time (profile.ops.profile_graph).
--measure: each plan once (`trainsim measure --frontend torch`), appended to OUT/runs/ as "<plan>-HHMMSS".
--summary: per plan the median over its runs of the busiest rank's process CPU per step (less the harness'
barriers; scripts/op_tp_ground_truth.busiest_cpu_s), against the prediction on local-cpu-ranks (the ranks one node,
their collectives on the profiled CPU-clock curves).
"""

import argparse
import dataclasses
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_tp_ground_truth import busiest_cpu_s, thread_cpu_s, trainsim

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "strategies" / "proteus" / "small" / "models" / "gpt2-small.yaml"
TREE = ROOT / "data" / "strategies" / "frontend" / "gpt2-torch-tp2-attn-mlp.yaml"
BASE_DB = ROOT / "results" / "op_tp_host15" / "profile-cpu.db"
MICRO_BATCH, SEQ_LEN = 4, 128
PLANS: dict[str, tuple[int, Path | None]] = {"torch tp2 attn-mlp": (2, TREE), "torch tp1": (1, None)}


def job_flags(tp: int, cluster: str = "local-cpu-ranks") -> list[str]:
    return ["--frontend", "torch", "--model", str(MODEL), "--cluster", cluster, "--tp", str(tp), "--num-gpus",
            str(tp), "--micro-batch", str(MICRO_BATCH), "--global-batch", str(MICRO_BATCH), "--seq-len",
            str(SEQ_LEN), "--precision", "fp32"]


def profile(out: Path, base: Path, repeats: int) -> None:
    """The two plans' ops at their per-rank shapes, into a copy of the base database (module doc)."""
    import torch

    from trainsim.compile.shape_layers import shape_layers
    from trainsim.frontends.registry import ModelSource
    from trainsim.jobfile import job_from_settings
    from trainsim.pipeline import graph_for
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.job import hints_for
    from trainsim.profile.ops import local_environment, profile_graph
    from trainsim.report.profile import LOCAL_CPU_DEVICE
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree_yaml import load_tree_yaml

    out.mkdir(parents=True, exist_ok=True)
    db_path = out / "profile-cpu.db"
    if not db_path.exists():
        shutil.copyfile(base, db_path)
    torch.set_num_threads(1)
    env = local_environment(LOCAL_CPU_DEVICE, "cpu")
    for tp, tree in PLANS.values():
        job = job_from_settings({"model": str(MODEL), "frontend": "torch", "tp": tp, "num_gpus": tp,
                                 "micro_batch": MICRO_BATCH, "global_batch": MICRO_BATCH, "seq_len": SEQ_LEN,
                                 "precision": "fp32", "cluster": "local-cpu-ranks"})
        graph = graph_for(job, ModelSource(str(MODEL), "torch"))
        if tree is not None:
            shaped = shape_layers(job, load_tree_yaml(tree, graph).lower(job.parallel))
            layers = list({id(a.layer): a.layer for a in shaped.layers}.values())
            graph = dataclasses.replace(graph, layers=tuple(layers))
        graph = dataclasses.replace(graph, layers=tuple(_flat(layer) for layer in graph.layers))
        with ProfileDB.open(db_path) as db:
            summary = profile_graph(db, env, graph, hints_for(job.model, DeviceSlice.of(job.parallel)), "cpu",
                                    warmup=2, repeats=repeats)
        print(f"tp {tp}: {summary}", file=sys.stderr)


def _flat(layer: Any) -> Any:
    """The layer's element-wise, norm, softmax and loss ops with their elements as a 1-dim shape, the pointwise
    microbenchmarks' (profile.ops: a kernel over shape[0] elements); the captured op, whose shape keeps its dims,
    is then answered at its size (the product of its dims) by interpolation on the same kernel's curve
    (cost.profiled). Ops of no shape (scalars) are left out: the fallback prices them."""
    def flat(op: Any) -> Any:
        if op.kind in ("matmul", "attention", "conv", "pool") or len(op.shape) <= 1:
            return op
        return dataclasses.replace(op, shape=(math.prod(op.shape),))

    def kept(ops: Any) -> tuple[Any, ...]:
        return tuple(flat(op) for op in ops if op.shape)

    return dataclasses.replace(layer, fwd=kept(layer.fwd), bwd=kept(layer.bwd))


def measure(out: Path, iterations: int, warmup: int) -> None:
    for plan, (tp, tree) in PLANS.items():
        run_id = f"{plan.replace(' ', '-')}-{time.strftime('%H%M%S')}"
        flags = ["--tree", str(tree)] if tree else []
        trainsim("measure", *job_flags(tp, "local-cpu"), *flags, "--iterations", str(iterations), "--warmup",
                 str(warmup), "--out", str(out / "runs"), "--run-id", run_id, "--json")
        print(f"measured {run_id}", file=sys.stderr)


def _runs(out: Path, plan: str) -> list[dict[str, Any]]:
    prefix = plan.replace(" ", "-") + "-"
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob(f"{prefix}*.json"))
            if p.stem[len(prefix):].isdigit()]


def summary(out: Path) -> list[dict[str, Any]]:
    rows = []
    for plan, (tp, tree) in PLANS.items():
        runs = _runs(out, plan)
        if not runs:
            continue
        flags = ["--tree", str(tree)] if tree else []
        predicted = json.loads(trainsim("predict", *job_flags(tp), "--engine", "sim", *flags, "--costs", "profiled",
                                        "--db", str(out / "profile-cpu.db"), "--json"))
        rows.append({"plan": plan, "runs": len(runs),
                     "cpu_s": statistics.median(busiest_cpu_s(r) for r in runs),
                     "cpu_s_per_run": [round(busiest_cpu_s(r), 4) for r in runs],
                     "thread_cpu_s": statistics.median(thread_cpu_s(r) for r in runs),
                     "wall_s": statistics.median(statistics.median(r["iteration_times_s"]) for r in runs),
                     "loss": [r["final_loss"] for r in runs],
                     "load": [round(r["settings"]["load_average_1m"][0], 1) for r in runs],
                     "predicted_s": predicted["iteration_time_s"], "breakdown_s": predicted["breakdown"],
                     "notes": predicted.get("notes", [])})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| plan | runs | measured CPU / step (busiest rank; min-max) | predicted (sim, profiled) | error | "
             "training thread | predicted tp_comm | measured wall (median) | load (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        spread = f"{min(r['cpu_s_per_run']) * 1e3:.0f}-{max(r['cpu_s_per_run']) * 1e3:.0f}"
        lines.append(f"| {r['plan']} | {r['runs']} | {r['cpu_s'] * 1e3:.1f} ms ({spread}) | "
                     f"{r['predicted_s'] * 1e3:.1f} ms | {r['predicted_s'] / r['cpu_s'] - 1:+.1%} | "
                     f"{r['thread_cpu_s'] * 1e3:.1f} ms | {r['breakdown_s'].get('tp_comm', 0.0) * 1e3:.1f} ms | "
                     f"{r['wall_s'] * 1e3:.1f} ms | {', '.join(map(str, r['load']))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "front_end_tp")
    parser.add_argument("--base", type=Path, default=BASE_DB, help="--profile copies this CPU-clock database first")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--repeats", type=int, default=6, help="--profile: timed samples per op")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.profile:
        profile(args.out, args.base, args.repeats)
    if args.measure:
        measure(args.out, args.iterations, args.warmup)
    if args.summary:
        rows = summary(args.out)
        (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
        text = markdown(rows)
        (args.out / "summary.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
