"""DLRM runs through the trace front-end's predictive trace simulation (Lin et al. Sec. III-D, Algorithm 1), beside
the span-based one, on a campaign that `trainsim measure --generated N ... --execution-trace --out DIR` measured:

    python scripts/recsys_trace_path.py data/recsys/cpu/et18

Each rank's traced iteration starts where it left the barrier that follows the profiler's start
(dlrm_predicted.realign_after_barrier), and an op waits for the collectives that ended just before it
(to_exec_graph's blocking_waits: gloo's waits are no ops in the trace). Per config (leave one config out: every
fit on the OTHER configs' traces only):
- trace: the config's PyTorch execution traces (a traced iteration per rank after the timed ones; of several,
  `--traced-iterations K`, the one with the shortest realigned step) through
  frontends.trace.predicted: the EmbeddingBag ops from the lookup model (frontends.trace.dlrm_predicted; $LOOKUP_MODEL,
  default lookup_mlp_cold.json), every other op from per-op kernel models (power laws fitted on the other configs'
  traced ops), host gaps as their mean per op over the other configs, collectives from the local gloo sweep's
  sigmoid curves ($COLLECTIVES_DB as recsys_experiments.local_curves); the profiler's own cost per recorded op
  (profiler_op_s, fitted on the other configs' traced against untraced iterations) taken out of every kernel-model
  op; simulated to a Result (estimate.sharded_dlrm.traced_result, which adds no turns on shared cores: the
  trace's durations hold them); where the ranks outnumber the host's cores (the campaign CSV's `cores`), each
  lookup takes ranks / cores of its uncontended price (hardware.device.core_share);
- trace-1core: the same with the lookups at their uncontended price (as before the stretch);
- trace-kernels: the same with the lookups from the kernel models too (no lookup model);
- replay-prof: the config's own trace durations with the profiler's cost taken out;
- spans: estimate.trace_predict over the per-rank spans of the median untraced iteration (the span-based path,
  recsys_quiet.py predict's fixed_trace_predicted_s: the same lookup model, the dense ops' microbenchmarks,
  host spans at their mean thread CPU time over the other configs), stretched by ranks / cores where the ranks
  outnumber the host's cores.
Measured: the median untraced iteration of the slowest rank.
"""

import csv
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from recsys_experiments import CAP, CLUSTER, OUT, local_curves
from recsys_quiet import cores_of, fixed_pricing, host_cpu_means

from trainsim.cost.embedding_lookup import MlpLookup
from trainsim.embedding.sharders import shard
from trainsim.estimate.sharded_dlrm import traced_result
from trainsim.estimate.trace_predict import iteration_s, simulate_trace
from trainsim.frontends.trace.dlrm_predicted import lookup_op_seconds, realign_after_barrier
from trainsim.frontends.trace.load import load_trace_directory
from trainsim.frontends.trace.predicted import (
    KernelModels,
    deduct_profiler,
    host_overheads,
    op_samples,
    predicted_trace_graph,
    profiler_op_s,
)
from trainsim.frontends.trace.to_exec_graph import to_exec_graph
from trainsim.hardware.device import core_share
from trainsim.measure.dlrm_campaign import CampaignTask

COLUMNS = ("trace", "trace-1core", "trace-kernels", "replay-prof", "spans")
COMM = local_curves()


def collective_s(kind: str, nbytes: float, ranks: int) -> float:
    # NB: gloo's broadcast and barrier priced as an all-reduce of their bytes (the sweep has all-reduce and
    # all-to-all curves only)
    name = "all-to-all" if kind == "all-to-all" else "all-reduce"
    return COMM.collective_time_s(name, max(nbytes, 4.0), CLUSTER.group_layout(ranks, 1), CLUSTER)


def fastest_trace(folders: list[Path]) -> tuple[list, float]:
    """Of a config's traced iterations, the one whose slowest rank's step (after the realignment) is the shortest:
    the one the profiler and the host disturbed least (chosen on the traces alone, not on the measured truth)."""
    best: tuple[list, float] | None = None
    for folder in (f for f in folders if f.is_dir()):  # the committed campaign keeps only the fastest's files
        traces = load_trace_directory(folder)
        realign_after_barrier(traces)
        step_s = max(end - start for start, end in (trace.step_window_s() for trace in traces))
        if best is None or step_s < best[1]:
            best = (traces, step_s)
    assert best is not None
    return best


def load(root: Path) -> list[dict]:
    rows = {(r["task"], r["sharder"], r["local_batch"]): r for r in csv.DictReader((root / "dlrm_campaign.csv").open())}
    configs = []
    for line in (root / "dlrm_campaign_traces.jsonl").open():
        t = json.loads(line)
        if not t.get("trace_dir"):
            continue
        row = rows[(t["task"], t["sharder"], str(t["local_batch"]))]
        count = int(t.get("traced_iterations", 1))
        folders = [Path(t["trace_dir"])] if count == 1 else [Path(t["trace_dir"]) / f"t{k}" for k in range(count)]
        traces, traced_s = fastest_trace(folders)
        configs.append({**t, "row": row, "measured_s": float(row["measured_s"]), "traces": traces,
                        "traced_s": traced_s})
    return configs


def predict(config: dict, others: list[dict], lookups: MlpLookup, dense_db: Path) -> dict[str, float]:
    row, batch, ranks = config["row"], int(config["local_batch"]), int(config["ranks"])
    model, tables = CampaignTask(row["kind"], int(row["seed"])).model(ranks)
    plan = shard(tables, row["sharder"], ranks, cap_bytes=CAP, seed=int(row["seed"]))
    cores = cores_of(row)
    share = core_share(cores, ranks)
    sjob, _, it = fixed_pricing(model, plan, batch, ranks, lookups, COMM, dense_db, cores=cores)
    traces = config["traces"]
    kernels = KernelModels.fit(op_samples([t for o in others for t in o["traces"]]))
    overheads = host_overheads([to_exec_graph(o["traces"], blocking_waits=True) for o in others])
    per_op = profiler_op_s([(o["traces"], o["measured_s"]) for o in others])
    results = {}
    for column, lookup_share in (("trace", share), ("trace-1core", 1.0)):
        lookup_s = lookup_op_seconds(traces, lookups, plan.pieces(batch), core_share=lookup_share)
        graph = predicted_trace_graph(traces, kernels, overheads, collective_s, lookup_s, blocking_waits=True)
        results[column] = traced_result(sjob.job, sjob.graph, it,
                                        deduct_profiler(graph, traces, per_op, keep=lookup_s)).iteration_time_s
    kernels_only = deduct_profiler(predicted_trace_graph(traces, kernels, overheads, collective_s,
                                                         blocking_waits=True), traces, per_op)
    replay = deduct_profiler(to_exec_graph(traces, start_offsets="zero", blocking_waits=True), traces, per_op)
    cpu_overheads = host_cpu_means(others, ("index-a2a launch", "pooled-a2a-bwd launch", "grad-allreduce launch"))
    return {**results, "trace-kernels": iteration_s(kernels_only), "replay-prof": iteration_s(replay),
            "spans": simulate_trace(config["events"], it, cpu_overheads) / share,
            "profiler_us": per_op * 1e6, "traced_s": config["traced_s"]}


def main(root: Path) -> None:
    lookups = MlpLookup.load(Path(os.environ.get("LOOKUP_MODEL", OUT / "lookup_mlp_cold.json")))
    dense_db = Path(os.environ.get("DENSE_DB", OUT / "dense_ops.db"))
    configs = load(root)
    print(f"{len(configs)} traced configs in {root}; lookup model {lookups.name}; collectives "
          f"{os.environ.get('COLLECTIVES_DB', OUT / 'collectives.db')}")
    print(f"{'config':<40} {'load':>9} {'measured':>9} {'traced':>8} "
          + " ".join(f"{c:>13} {'err':>7}" for c in COLUMNS) + "  prof us/op")
    errors: dict[str, list[float]] = {c: [] for c in COLUMNS}
    for index, config in enumerate(configs):
        times = predict(config, configs[:index] + configs[index + 1:], lookups, dense_db)
        cells = []
        for column in COLUMNS:
            err = times[column] / config["measured_s"] - 1.0
            errors[column].append(err)
            cells.append(f"{times[column] * 1e3:13.2f} {err * 100:+6.1f}%")
        name = f"{config['task']}-{config['sharder']}-b{config['local_batch']}"
        load_avg = config["load"]
        print(f"{name:<40} {load_avg[0]:4.1f}-{load_avg[1]:<4.1f} {config['measured_s'] * 1e3:9.2f} "
              f"{times['traced_s'] * 1e3:8.1f} " + " ".join(cells) + f"  {times['profiler_us']:.1f}")
    for column, values in errors.items():
        absolute = np.maximum(np.abs(values), 1e-6)
        print(f"{column:<14} geomean |error| {math.exp(np.mean(np.log(absolute))) * 100:6.2f}%  max "
              f"{np.max(absolute) * 100:6.1f}%  median signed {np.median(values) * 100:+6.1f}%")


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT / "et18")
