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
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import sharded_job
from trainsim.measure.dlrm_campaign import Campaign, CampaignFiles, CampaignTask, run_campaign
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
    """The generated task's DLRM on `ranks` ranks and its tables (measure.dlrm_campaign.CampaignTask)."""
    return CampaignTask(kind, seed).model(ranks)  # type: ignore[arg-type]


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


def run(experiment: str, heavy_tasks: int = 10, only_ranks: int = 0) -> None:
    """The campaign through measure.dlrm_campaign (resumable: configs already in OUT/<experiment>.csv are
    skipped): e2e = `heavy_tasks` heavy + 10 normal tasks x BATCHES with size-lookup-greedy, each config alone;
    sharding = the heavy tasks x the six sharders at the last batch, a task's six plans interleaved."""
    tasks = [CampaignTask("heavy", s) for s in range(heavy_tasks)]
    if experiment == "e2e":
        tasks += [CampaignTask("normal", 100 + s) for s in range(10)]
    sharding = experiment == "sharding"
    campaign = Campaign(tuple(tasks), batches=(BATCHES[-1],) if sharding else BATCHES,
                        ranks=(only_ranks,) if only_ranks else (2, 4),
                        sharders=SHARDERS if sharding else ("size-lookup-greedy",), iterations=ITERATIONS, warmup=1,
                        interleave=sharding, experiment=experiment, timeout_s=1500)
    files = CampaignFiles.open(OUT / f"{experiment}.csv", OUT / f"{experiment}_traces.jsonl")
    run_campaign(campaign, files, progress=lambda what, count: print(f"{what} ({count} measured)", flush=True))


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
