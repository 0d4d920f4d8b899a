"""Lin et al.'s DLRM experiments at the scale of this machine (gloo CPU ranks): measured and predicted iterations of
generated tasks, and sharder selection. Writes data/recsys/cpu/{e2e,sharding}.csv; resumable (configs already in
a CSV are not measured again).

  python scripts/recsys_experiments.py e2e        # measure 10 heavy + 10 normal tasks x 2 batches on 2 and 4 ranks
  python scripts/recsys_experiments.py sharding 10 2   # measure 10 heavy tasks x 6 sharders on 2 ranks (then 4)
  python scripts/recsys_experiments.py predict [e2e|sharding]  # predict every measured row -> *_predicted.csv
"""

import csv
import json
import os
import sys
import time
from pathlib import Path

from trainsim.catalog import load_cluster
from trainsim.comm.collectives import NcclComm
from trainsim.comm.sigmoid import SigmoidComm, fit_sigmoid
from trainsim.cost.embedding_lookup import MlpLookup, RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.embedding.sharders import MEMORY_CAP_FRACTION, SHARDERS, shard
from trainsim.embedding.synthetic import generate_task
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import dlrm_model, sharded_job
from trainsim.ir.model_spec import EmbeddingTable
from trainsim.measure.dlrm import DlrmConfig, measure_dlrm
from trainsim.profile.database import ProfileDB

OUT = Path("data/recsys/cpu")
CLUSTER = load_cluster("local-cpu")
CAP = MEMORY_CAP_FRACTION * CLUSTER.device.hbm_bytes
BATCHES = (32, 128)
ITERATIONS = 5  # measured iterations per configuration (the median of the slowest rank counts)
FIELDS = ("experiment", "ranks", "task", "kind", "seed", "tables", "sharder", "local_batch", "measured_s")
PREDICTED = ("roofline_alpha_beta_s", "mlp_sigmoid_s", "mlp_sigmoid_sim_s", "max_sum_s", "trace_predicted_s",
             "trace_replay_s", "predict_s")


def local_curves(path: Path | None = None) -> SigmoidComm:
    """Sigmoid curves of the local gloo sweep (scripts/recsys_gloo_sweep.py; `path`, else $COLLECTIVES_DB, default
    collectives.db, taken at the host's load), the catalog NCCL model where none."""
    fallback = NcclComm(Pricer().cal)
    path = path or Path(os.environ.get("COLLECTIVES_DB", OUT / "collectives.db"))
    if not path.exists():
        return SigmoidComm({}, fallback)
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with ProfileDB.open_read_only(path) as db:
        for row in db.collective_rows():
            points.setdefault((row.collective, row.world_size), []).append((row.message_bytes, row.stats.median_s))
    return SigmoidComm({k: fit_sigmoid(*zip(*sorted(v), strict=True)) for k, v in points.items() if len(v) >= 4},
                       fallback)


def task(kind: str, ranks: int, seed: int):
    tables = generate_task(kind, ranks, seed)  # type: ignore[arg-type]
    specs = tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling, zipf_alpha=t.zipf_alpha)
                  for t in tables)
    return dlrm_model(f"{kind}{seed}-r{ranks}", specs), tables


def dense(model) -> dict:
    return {"dense_features": model.dense_features, "bottom_mlp": list(model.bottom_mlp),
            "top_mlp": list(model.top_mlp)}


def predictions(model, plan, batch: int, lookups_mlp: MlpLookup, comm: SigmoidComm,
                trace: list | None = None, overheads: dict | None = None) -> dict[str, float]:
    sjob = sharded_job(model, plan, CLUSTER, batch)
    base = estimate_sharded(sjob.job, sjob.graph, plan, "analytical", Pricer(),
                            RooflineLookup(CLUSTER.device))
    learned_pricer = Pricer(comm_costs=comm)
    learned = estimate_sharded(sjob.job, sjob.graph, plan, "analytical", learned_pricer, lookups_mlp)
    sim = estimate_sharded(sjob.job, sjob.graph, plan, "sim", learned_pricer, lookups_mlp)
    # Lin et al.'s baseline: the largest per-rank sum of busy time, no waiting (Sec. IV-B1)
    from trainsim.compile.lower_sharded_dlrm import rank_compute_s
    from trainsim.cost.sharded_dlrm import price_sharded_iteration

    it = price_sharded_iteration(sjob.graph, plan, sjob.job, learned_pricer, lookups_mlp)
    comm_s = it.index_a2a_s + it.pooled_fwd_a2a_s + it.pooled_bwd_a2a_s + it.grad_allreduce_s
    max_sum = max(max(rank_compute_s(it, r) + w.optimizer_s, comm_s) for r, w in enumerate(it.ranks))
    out = {"roofline_alpha_beta_s": base.iteration_time_s, "mlp_sigmoid_s": learned.iteration_time_s,
           "mlp_sigmoid_sim_s": sim.iteration_time_s, "max_sum_s": max_sum}
    if trace is not None:
        from trainsim.estimate.trace_predict import simulate_trace

        out["trace_predicted_s"] = simulate_trace(trace, it, overheads or {})
        out["trace_replay_s"] = simulate_trace(trace, it, {}, replay=True)
    return out


def done_keys(path: Path) -> set[tuple[str, ...]]:
    if not path.exists():
        return set()
    with path.open() as f:
        return {(r["experiment"], r["ranks"], r["task"], r["sharder"], r["local_batch"]) for r in csv.DictReader(f)}


def run(experiment: str, heavy_tasks: int = 10, only_ranks: int = 0) -> None:
    path = OUT / f"{experiment}.csv"
    seen = done_keys(path)
    jobs = []  # (ranks, name, kind, model, tables, sharder, plan, batch)
    rank_counts = (only_ranks,) if only_ranks else (2, 4)
    for ranks in rank_counts:
        kinds = [("heavy", s) for s in range(heavy_tasks)] + ([("normal", 100 + s) for s in range(10)]
                                                     if experiment == "e2e" else [])
        for kind, seed in kinds:
            model, tables = task(kind, ranks, seed)
            sharders = ("size-lookup-greedy",) if experiment == "e2e" else SHARDERS
            batches = BATCHES if experiment == "e2e" else (BATCHES[-1],)
            for name in sharders:
                plan = shard(tables, name, ranks, cap_bytes=CAP, seed=seed)
                for batch in batches:
                    key = (experiment, str(ranks), model.name, name, str(batch))
                    if key not in seen:
                        jobs.append((ranks, model.name, kind, model, tables, name, plan, batch, seed))
    new_file = not path.exists()
    traces = (OUT / f"{experiment}_traces.jsonl").open("a")
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        for ranks in rank_counts:
            mine = [j for j in jobs if j[0] == ranks]
            # sharding: a task's six plans are measured interleaved (one iteration of each in turn), so that the
            # host's changing load falls on all of them alike; chunks hold whole tasks
            group = len(SHARDERS) if experiment == "sharding" else 1
            size = 2 * group if experiment == "sharding" else 10
            for start in range(0, len(mine), size):
                chunk = mine[start:start + size]
                configs = [DlrmConfig(f"{j[1]}/{j[5]}/{j[7]}", j[6], j[7], dense(j[3]), seed=1) for j in chunk]
                began = time.time()
                measured = measure_dlrm(configs, iterations=ITERATIONS, warmup=1, timeout_s=1500, group=group)
                print(f"{ranks} ranks: measured {len(chunk)} configs in {time.time() - began:.0f} s", flush=True)
                for j, m in zip(chunk, measured, strict=True):
                    writer.writerow({"experiment": experiment, "ranks": ranks, "task": j[1], "kind": j[2],
                                     "seed": j[8], "tables": len(j[4]), "sharder": j[5], "local_batch": j[7],
                                     "measured_s": m.iteration_s})
                    traces.write(json.dumps({"task": j[1], "sharder": j[5], "local_batch": j[7], "ranks": ranks,
                                             "iterations_s": m.iterations_s, "events": m.rank_events}) + "\n")
                f.flush()
                traces.flush()


def predict_all(experiments: tuple[str, ...] = ("e2e", "sharding")) -> None:
    lookups = MlpLookup.load(OUT / "lookup_mlp.json")
    comm = local_curves()
    for experiment in experiments:
        path = OUT / f"{experiment}.csv"
        if not path.exists():
            continue
        with path.open() as f:
            rows = list(csv.DictReader(f))
        from trainsim.estimate.trace_predict import overheads_from

        traces = {}
        trace_path = OUT / f"{experiment}_traces.jsonl"
        if trace_path.exists():
            for line in trace_path.read_text().splitlines():
                t = json.loads(line)
                traces[(t["task"], t["sharder"], str(t["local_batch"]))] = t["events"]
        # Lin et al. Sec. IV-B1: overhead statistics aggregated from all collected traces, shared by all tasks
        overheads = overheads_from(list(traces.values()))
        with (OUT / f"{experiment}_predicted.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[*FIELDS, *PREDICTED])
            writer.writeheader()
            for row in rows:
                ranks, seed, batch = int(row["ranks"]), int(row["seed"]), int(row["local_batch"])
                model, tables = task(row["kind"], ranks, seed)
                began = time.perf_counter()
                plan = shard(tables, row["sharder"], ranks, cap_bytes=CAP, seed=seed)
                trace = traces.get((row["task"], row["sharder"], row["local_batch"]))
                out = predictions(model, plan, batch, lookups, comm, trace, overheads)
                writer.writerow({**row, **out, "predict_s": time.perf_counter() - began})


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "e2e"
    if command == "predict":
        predict_all(tuple(sys.argv[2:]) or ("e2e", "sharding"))
    else:
        run(command, int(sys.argv[2]) if len(sys.argv) > 2 else 10, int(sys.argv[3]) if len(sys.argv) > 3 else 0)
