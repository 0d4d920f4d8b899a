"""The DLRM end-to-end experiment re-measured so that host load cannot pass for model error: every run takes the
exclusive timing lock (run it as `flock -x /tmp/trainsim-timing.lock python scripts/recsys_quiet.py measure 420`),
records the host's 1-minute load average before and after, and keeps, beside each span's wall time, its thread
CPU time (measure.dlrm_rank). Writes data/recsys/cpu/e2e_quiet.csv and e2e_quiet_traces.jsonl; resumable, and it
stops starting new configs when its time budget (seconds) is spent.

  python scripts/recsys_quiet.py measure [budget_s] [ranks]   # under flock -x, on a quiet host
  python scripts/recsys_quiet.py predict                     # -> e2e_quiet_predicted.csv and the tables
"""

import csv
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from recsys_experiments import BATCHES, CAP, OUT, dense, task

from trainsim.embedding.sharders import shard
from trainsim.measure.dlrm import DlrmConfig, measure_dlrm

ITERATIONS = 5
FIELDS = ("experiment", "ranks", "task", "kind", "seed", "tables", "sharder", "local_batch", "measured_s",
          "fastest_s", "load_before", "load_after")
SHARDER = "size-lookup-greedy"


def order() -> list[tuple[str, int]]:
    """Heavy and normal tasks alternated, so a partial campaign covers both."""
    out = []
    for i in range(10):
        out += [("heavy", i), ("normal", 100 + i)]
    return out


def measure(budget_s: float, rank_counts: tuple[int, ...]) -> None:
    path, traces_path = OUT / "e2e_quiet.csv", OUT / "e2e_quiet_traces.jsonl"
    seen = set()
    if path.exists():
        seen = {(r["ranks"], r["task"], r["local_batch"]) for r in csv.DictReader(path.open())}
    began = time.monotonic()
    new_file = not path.exists()
    with path.open("a", newline="") as f, traces_path.open("a") as traces:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        for ranks in rank_counts:
            for kind, seed in order():
                model, tables = task(kind, ranks, seed)
                plan = shard(tables, SHARDER, ranks, cap_bytes=CAP, seed=seed)
                configs = [DlrmConfig(f"{model.name}/{b}", plan, b, dense(model), seed=1) for b in BATCHES
                           if (str(ranks), model.name, str(b)) not in seen]
                if not configs:
                    continue
                if time.monotonic() - began > budget_s:
                    print(f"budget of {budget_s:.0f} s spent", flush=True)
                    return
                start = time.monotonic()
                measured = measure_dlrm(configs, iterations=ITERATIONS, warmup=1, timeout_s=600)
                print(f"{model.name}: {len(configs)} configs in {time.monotonic() - start:.0f} s, load "
                      f"{measured[0].load_avg[0]:.2f} -> {measured[0].load_avg[1]:.2f}", flush=True)
                for c, m in zip(configs, measured, strict=True):
                    writer.writerow({"experiment": "e2e", "ranks": ranks, "task": model.name, "kind": kind,
                                     "seed": seed, "tables": len(tables), "sharder": SHARDER,
                                     "local_batch": c.local_batch, "measured_s": m.iteration_s,
                                     "fastest_s": min(m.iterations_s), "load_before": m.load_avg[0],
                                     "load_after": m.load_avg[1]})
                    traces.write(json.dumps({"task": model.name, "sharder": SHARDER, "local_batch": c.local_batch,
                                             "ranks": ranks, "iterations_s": m.iterations_s,
                                             "events": m.rank_events, "cpu_s": m.rank_cpu_s,
                                             "load": m.load_avg}) + "\n")
                f.flush()
                traces.flush()


# --- prediction and the comparison ---

TERM_SPANS = {"bottom_mlp fwd": "bottom_fwd_s", "embeddings fwd": "lookup_fwd_s", "top_mlp fwd": "top_fwd_s",
              "top_mlp bwd": "top_bwd_s", "bottom_mlp bwd": "bottom_bwd_s", "embeddings bwd": "lookup_bwd_s",
              "optimizer step": "optimizer_s"}
PREDICTORS = ("roofline_alpha_beta_s", "mlp_sigmoid_s", "max_sum_s", "trace_predicted_s", "trace_replay_s",
              "trace_replay_cpu_s")


def predict() -> None:
    import numpy as np
    from recsys_experiments import CLUSTER, local_curves, predictions

    from trainsim.cost.embedding_lookup import MlpLookup
    from trainsim.cost.pricing import Pricer
    from trainsim.cost.sharded_dlrm import price_sharded_iteration
    from trainsim.estimate.trace_predict import overheads_from, simulate_trace
    from trainsim.frontends.catalog.sharded_dlrm import sharded_job

    lookup_path = Path(os.environ.get("LOOKUP_MODEL", OUT / "lookup_mlp.json"))
    lookups, comm = MlpLookup.load(lookup_path), local_curves()
    rows = list(csv.DictReader((OUT / "e2e_quiet.csv").open()))
    traces = {(t["task"], str(t["local_batch"])): t for t in map(json.loads, (OUT / "e2e_quiet_traces.jsonl").open())}
    overheads = overheads_from([t["events"] for t in traces.values()])
    terms: dict[str, list[tuple[float, float, float]]] = {}  # span -> (predicted, wall, cpu) per rank and config
    out_rows = []
    for row in rows:
        ranks, seed, batch = int(row["ranks"]), int(row["seed"]), int(row["local_batch"])
        model, tables = task(row["kind"], ranks, seed)
        plan = shard(tables, SHARDER, ranks, cap_bytes=CAP, seed=seed)
        t = traces[(row["task"], row["local_batch"])]
        pred = predictions(model, plan, batch, lookups, comm, t["events"], overheads)
        sjob = sharded_job(model, plan, CLUSTER, batch)
        it = price_sharded_iteration(sjob.graph, plan, sjob.job, Pricer(comm_costs=comm), lookups)
        pred["trace_replay_cpu_s"] = simulate_trace(t["events"], it, {}, replay=True, cpu_s=t["cpu_s"])
        out_rows.append({**row, **pred})
        for r, (spans, cpus) in enumerate(zip(t["events"], t["cpu_s"], strict=True)):
            for (name, start, end), cpu in zip(spans, cpus, strict=True):
                if name in TERM_SPANS:
                    priced = getattr(it.ranks[r], TERM_SPANS[name])
                    terms.setdefault(name, []).append((priced, end - start, cpu))
    with (OUT / "e2e_quiet_predicted.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*FIELDS, *PREDICTORS])
        writer.writeheader()
        for r in out_rows:
            writer.writerow({k: r.get(k, "") for k in [*FIELDS, *PREDICTORS]})
    loads = [float(r[k]) for r in rows for k in ("load_before", "load_after")]
    print(f"{len(rows)} configs, host 1-minute load during the runs {min(loads):.2f}-{max(loads):.2f} "
          f"(median {np.median(loads):.2f}); lookup model {lookup_path}")
    print(f"{'span':<16}{'n':>5}{'wall/priced':>13}{'cpu/priced':>12}{'wall/cpu':>10}   "
          "(medians; p10-p90 of cpu/priced)")
    for name, values in terms.items():
        v = np.array([x for x in values if x[0] > 0 and x[2] > 0])
        if not len(v):
            continue
        cp = v[:, 2] / v[:, 0]
        print(f"{name:<16}{len(v):>5}{np.median(v[:, 1] / v[:, 0]):13.2f}{np.median(cp):12.2f}"
              f"{np.median(v[:, 1] / v[:, 2]):10.2f}   {np.percentile(cp, 10):.2f}-{np.percentile(cp, 90):.2f}")
    summarize(out_rows)


def summarize(rows: list[dict]) -> None:
    import math

    def geomean(values: list[float]) -> float:
        return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))

    targets = (("measured_s", "wall (median iteration)"), ("trace_replay_cpu_s", "CPU-time replay"))
    for target, label in targets:
        print(f"against the {label}: geomean / max |error| (signed median)")
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            groups.setdefault((str(r["ranks"]), r["kind"]), []).append(r)
            groups.setdefault(("all", "all"), []).append(r)
        for key in sorted(groups):
            rs, cells = groups[key], []
            for p in PREDICTORS:
                if p == target:
                    continue
                errors = [(float(r[p]) - float(r[target])) / float(r[target]) for r in rs]
                absolute = [abs(e) for e in errors]
                cells.append(f"{p[:-2]} {geomean(absolute) * 100:.1f}%/{max(absolute) * 100:.0f}% "
                             f"({sorted(errors)[len(errors) // 2] * 100:+.0f}%)")
            print(f"  {key[0]} {key[1]} n={len(rs)}: " + "; ".join(cells))


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    command = sys.argv[1] if len(sys.argv) > 1 else "measure"
    if command == "measure":
        budget = float(sys.argv[2]) if len(sys.argv) > 2 else 420.0
        measure(budget, (int(sys.argv[3]),) if len(sys.argv) > 3 else (2, 4))
    elif command == "predict":
        predict()
