"""The DLRM experiments re-measured so that host load cannot pass for model error: every run records the host's
1-minute load average before and after, and keeps, beside each span's wall time, its thread CPU time
(measure.dlrm_rank: the work of the span without the time other processes held the core).

Two sets (RECSYS_SET): "quiet", the ranks given the host's cores for the campaign (a session of its own, hence a
scheduler autogroup of its own, at nice -20: the wrapper below), and "loaded", the same campaign at
the host's load. NB: the exclusive timing lock (`flock -x /tmp/trainsim-timing.lock`) is the house way to a quiet
host; on 2026-11-26 it was starved for 20 minutes by back-to-back shared holders, so the quiet set ran under the
shared lock (no other timing campaign can run meanwhile) with the ranks prioritized instead:

  flock -s /tmp/trainsim-timing.lock setsid bash -c 'echo -20 > /proc/self/autogroup;
      nice -n -20 python scripts/recsys_quiet.py measure 270; nice -n -20 python scripts/recsys_quiet.py sharding 150'
  RECSYS_SET=loaded python scripts/recsys_quiet.py measure 240   # no priority: at the host's load

Writes data/recsys/cpu/{e2e,sharding}_<set>.csv and *_traces.jsonl; resumable, and a campaign stops starting new
configs when its time budget (seconds) is spent.

  python scripts/recsys_quiet.py predict            # -> e2e_<set>_predicted.csv and the error tables
  python scripts/recsys_quiet.py predict-sharding   # each predictor's pick per task
  python scripts/recsys_quiet.py fit-host [e2e]     # the dense part's host cost, fitted on the sharding set's
                                                    # traces -> dense_host.json (predict then prices it), or on
                                                    # the e2e set's -> dense_host_e2e.json (predict-sharding)
  python scripts/recsys_quiet.py passes quiet s9    # two measured sets against each other (the floor)
  python scripts/recsys_quiet.py pass-spans A B [e2e|sharding]   # the same per span: thread CPU, page faults
  python scripts/recsys_quiet.py pool P A,B,C [e2e|sharding]      # passes A, B, C pooled into set P
  python scripts/recsys_quiet.py errors A,B host_s,insitu_s       # predicted sets: a compact error table
  python scripts/recsys_quiet.py fit-lookup [e2e]   # the lookups' in-situ factors, the same way round:
                                                    # lookup_in_situ.json / lookup_in_situ_e2e.json
"""

import csv
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from recsys_experiments import BATCHES, CAP, OUT, task

from trainsim.embedding.sharders import shard
from trainsim.hardware.device import core_share
from trainsim.measure.dlrm_campaign import FIELDS, Campaign, CampaignFiles, generated_tasks, run_campaign
from trainsim.measure.dlrm_phase import PROBES as PHASE_PROBES

ITERATIONS = int(os.environ.get("RECSYS_ITERATIONS", "5"))  # measured iterations per config
WARMUP = int(os.environ.get("RECSYS_WARMUP", "1"))  # untimed iterations first
# The ranks' malloc policy (measure.allocator): "keep" since the tenth session; the sets before it ran "system".
ALLOCATOR = os.environ.get("RECSYS_ALLOCATOR", "keep")
# RECSYS_PHASE=1: every rank times measure.dlrm_probe's probes around each iteration (the traces carry them;
# scripts/recsys_phase.py normalises a campaign's sets to the fast phase and checks the premise).
PROBES = PHASE_PROBES if os.environ.get("RECSYS_PHASE", "0") == "1" else ()
SHARDER = "size-lookup-greedy"
# Which measured set the files hold: "quiet" (the ranks given the host's cores: see the module docstring) or
# "loaded" (the same campaign at the host's load, no priority).
SET = os.environ.get("RECSYS_SET", "quiet")


def _campaign(experiment: str, tasks, batches: tuple[int, ...], ranks: tuple[int, ...], sharders: tuple[str, ...],
              budget_s: float) -> None:
    """One campaign through measure.dlrm_campaign into OUT/<experiment>_<set>.csv and its traces JSONL
    (resumable; no new group starts once `budget_s` is spent)."""
    campaign = Campaign(tuple(tasks), batches=batches, ranks=ranks, sharders=sharders, iterations=ITERATIONS,
                        warmup=WARMUP, allocator=ALLOCATOR, probes=PROBES, interleave=experiment == "sharding",
                        experiment=experiment, timeout_s=600)
    files = CampaignFiles.open(OUT / f"{experiment}_{SET}.csv", OUT / f"{experiment}_{SET}_traces.jsonl")
    began = time.monotonic()
    run_campaign(campaign, files, budget_s=budget_s,
                 progress=lambda what, count: print(f"{what} ({count} measured, {time.monotonic() - began:.0f} s)",
                                                    flush=True))


def measure(budget_s: float, rank_counts: tuple[int, ...]) -> None:
    """The 20 tasks (heavy and normal alternated, so a partial campaign covers both) x BATCHES, each task on every
    number of ranks, with size-lookup-greedy."""
    _campaign("e2e", generated_tasks(20, "mixed"), BATCHES, rank_counts, (SHARDER,), budget_s)


def measure_sharding(budget_s: float, ranks: int = 2, batch: int = 128) -> None:
    """The 10 heavy tasks x the six sharders, a task's six plans interleaved (one iteration of each in turn)."""
    from trainsim.embedding.sharders import SHARDERS

    _campaign("sharding", generated_tasks(10, "heavy"), (batch,), (ranks,), SHARDERS, budget_s)

# --- prediction and the comparison ---

TERM_SPANS = {"bottom_mlp fwd": "bottom_fwd_s", "embeddings fwd": "lookup_fwd_s", "top_mlp fwd": "top_fwd_s",
              "top_mlp bwd": "top_bwd_s", "bottom_mlp bwd": "bottom_bwd_s", "embeddings bwd": "lookup_bwd_s",
              "optimizer step": "optimizer_s"}
BEFORE = ("roofline_alpha_beta_s", "mlp_sigmoid_s", "max_sum_s", "trace_predicted_s")
AFTER = ("fixed_s", "fixed_max_sum_s", "fixed_trace_predicted_s")
# With the dense part's host cost per op (fit-host: fitted on the sharding set's traces, applied to the e2e set).
HOST = ("host_s", "host_sim_s", "host_trace_predicted_s")
# $DENSE_HOST / $DENSE_HOST_E2E: another fit (e.g. one on phase-normalised traces, scripts/recsys_phase.py), for
# fit-host to write and predict / predict-sharding to read.
DENSE_HOST = Path(os.environ.get("DENSE_HOST", OUT / "dense_host.json"))
DENSE_HOST_E2E = Path(os.environ.get("DENSE_HOST_E2E", OUT / "dense_host_e2e.json"))
# With the host cost and the lookups' in-situ factors (fit-lookup, fitted on the sharding set's traces), first with
# the loaded sweep's collective curves (collectives.db), then with the sweep taken at priority (collectives_quiet.db,
# the conditions of the quiet set).
IN_SITU = ("lookup_s", "lookup_trace_predicted_s", "insitu_s", "insitu_sim_s", "insitu_trace_predicted_s")
# $LOOKUP_IN_SITU: another fit for `predict` (e.g. one of the same campaign's sharding set); `predict-sharding`
# reads the e2e set's fit, lookup_in_situ_e2e.json, or $LOOKUP_IN_SITU where given.
LOOKUP_IN_SITU = OUT / "lookup_in_situ.json"
QUIET_SWEEP = OUT / "collectives_quiet.db"
REPLAYS = ("trace_replay_s", "trace_replay_cpu_s")
PREDICTORS = (*BEFORE, *AFTER, *HOST, *IN_SITU, *REPLAYS)
SHARDING_PREDICTORS = ("before", "after", "host", "lookup", "insitu")
HOST_CORES = 2  # the cores of the host of the sets measured before the campaign CSV recorded them (its `cores`)


def cores_of(row: dict) -> int:
    """The usable cores of the host a campaign row was measured on: its `cores` column, else HOST_CORES."""
    return int(row["cores"]) if row.get("cores") else HOST_CORES


def fixed_pricing(model, plan, batch: int, ranks: int, lookups, comm, dense_db: Path, host=None,
                  cores: int = HOST_CORES):
    """The iteration priced with this session's mechanisms: the dense part in fp32 (as measured) from the dense
    ops' microbenchmarks, the lookups from the cold thread-CPU lookup model, and the ranks' own share of the host's
    cores (4 ranks on 2 cores take turns: estimate.result.with_shared_cores)."""
    from recsys_experiments import CLUSTER

    from trainsim.cost.compute import RooflineCosts
    from trainsim.cost.pricing import Pricer
    from trainsim.cost.profiled import ProfiledCosts
    from trainsim.cost.sharded_dlrm import NO_HOST_COST, price_sharded_iteration
    from trainsim.frontends.catalog.sharded_dlrm import sharded_job

    device = CLUSTER.device.model_copy(update={"compute_share": core_share(cores, ranks)})
    cluster = CLUSTER.model_copy(update={"device": device})
    pricer = Pricer(comm_costs=comm)
    pricer = Pricer(pricer.cal, op_costs=ProfiledCosts(dense_db, fallback=RooflineCosts(pricer.cal)),
                    comm_costs=comm)
    sjob = sharded_job(model, plan, cluster, batch, precision="fp32")
    return sjob, pricer, price_sharded_iteration(sjob.graph, plan, sjob.job, pricer, lookups,
                                                 host=host or NO_HOST_COST)


def predict() -> None:
    import numpy as np
    from recsys_experiments import local_curves, predictions

    from trainsim.calibrate.dense_host import load_dense_host
    from trainsim.calibrate.lookup_in_situ import load_lookup_in_situ
    from trainsim.compile.lower_sharded_dlrm import rank_compute_s
    from trainsim.cost.embedding_lookup import MlpLookup
    from trainsim.cost.sharded_dlrm import NO_HOST_COST
    from trainsim.estimate.sharded_dlrm import estimate_sharded
    from trainsim.estimate.trace_predict import overheads_from, simulate_trace

    before_lookups = MlpLookup.load(OUT / "lookup_mlp.json")
    after_path = Path(os.environ.get("LOOKUP_MODEL", OUT / "lookup_mlp_cold.json"))
    after_lookups = MlpLookup.load(after_path)
    comm, dense_db = local_curves(), Path(os.environ.get("DENSE_DB", OUT / "dense_ops.db"))
    rows = list(csv.DictReader((OUT / f"e2e_{SET}.csv").open()))
    traces = {(t["task"], str(t["local_batch"])): t for t in map(json.loads, (OUT / f"e2e_{SET}_traces.jsonl").open())}
    overheads = overheads_from([t["events"] for t in traces.values()])
    cpu_overheads = host_cpu_means(list(traces.values()), tuple(overheads))
    terms: dict[str, list[tuple[float, ...]]] = {}  # span -> (before, after, wall, cpu, with host cost)
    host = load_dense_host(DENSE_HOST) if DENSE_HOST.exists() else NO_HOST_COST
    in_situ = load_lookup_in_situ(Path(os.environ.get("LOOKUP_IN_SITU", LOOKUP_IN_SITU)), after_lookups)
    quiet = local_curves(QUIET_SWEEP)
    out_rows = []
    for row in rows:
        ranks, seed, batch = int(row["ranks"]), int(row["seed"]), int(row["local_batch"])
        model, tables = task(row["kind"], ranks, seed)
        plan = shard(tables, SHARDER, ranks, cap_bytes=CAP, seed=seed)
        t = traces[(row["task"], row["local_batch"])]
        pred = predictions(model, plan, batch, before_lookups, comm, t["events"], overheads)
        cores = cores_of(row)
        share = core_share(cores, ranks)
        sjob, pricer, it = fixed_pricing(model, plan, batch, ranks, after_lookups, comm, dense_db, cores=cores)
        pred["fixed_s"] = estimate_sharded(sjob.job, sjob.graph, plan, "analytical", pricer,
                                           after_lookups).iteration_time_s
        comm_s = it.index_a2a_s + it.pooled_fwd_a2a_s + it.pooled_bwd_a2a_s + it.grad_allreduce_s
        pred["fixed_max_sum_s"] = max(max(rank_compute_s(it, r) + w.optimizer_s, comm_s)
                                      for r, w in enumerate(it.ranks)) / share
        pred["fixed_trace_predicted_s"] = simulate_trace(t["events"], it, cpu_overheads) / share
        pred["trace_replay_cpu_s"] = simulate_trace(t["events"], it, {}, replay=True, cpu_s=t["cpu_s"])
        hjob, hpricer, host_it = fixed_pricing(model, plan, batch, ranks, after_lookups, comm, dense_db, host,
                                               cores=cores)
        for engine, key in (("analytical", "host_s"), ("sim", "host_sim_s")):
            pred[key] = estimate_sharded(hjob.job, hjob.graph, plan, engine, hpricer, after_lookups,
                                         host=host).iteration_time_s
        pred["host_trace_predicted_s"] = simulate_trace(t["events"], host_it, cpu_overheads) / share
        pred.update(_in_situ(model, plan, batch, ranks, in_situ, (comm, quiet), dense_db, host, t, cpu_overheads,
                             cores))
        out_rows.append({**row, **pred})
        before_it = _before_iteration(model, plan, batch, before_lookups, comm)
        for r, (spans, cpus) in enumerate(zip(t["events"], t["cpu_s"], strict=True)):
            for (name, start, end), cpu in zip(spans, cpus, strict=True):
                if name in TERM_SPANS:
                    terms.setdefault(name, []).append((getattr(before_it.ranks[r], TERM_SPANS[name]),
                                                       getattr(it.ranks[r], TERM_SPANS[name]), end - start, cpu,
                                                       getattr(host_it.ranks[r], TERM_SPANS[name])))
    with (OUT / f"e2e_{SET}_predicted.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*FIELDS, *PREDICTORS])
        writer.writeheader()
        for r in out_rows:
            writer.writerow({k: r.get(k, "") for k in [*FIELDS, *PREDICTORS]})
    loads = [float(r[k]) for r in rows for k in ("load_before", "load_after")]
    print(f"{len(rows)} configs, host 1-minute load during the runs {min(loads):.2f}-{max(loads):.2f} "
          f"(median {np.median(loads):.2f}); lookup model after: {after_path}; dense host cost: {host}")
    print("per span, medians over ranks and configs: measured wall / measured thread CPU, and thread CPU over the "
          "price before and after (p10-p90)")
    for name, values in terms.items():
        v = np.array([x for x in values if x[0] > 0 and x[1] > 0 and x[3] > 0])
        if not len(v):
            continue
        before, after, hosted = v[:, 3] / v[:, 0], v[:, 3] / v[:, 1], v[:, 3] / v[:, 4]
        print(f"  {name:<16} n={len(v):<4} wall/cpu {np.median(v[:, 2] / v[:, 3]):5.2f}   cpu/before "
              f"{np.median(before):6.2f} ({np.percentile(before, 10):.2f}-{np.percentile(before, 90):.2f})   "
              f"cpu/after {np.median(after):5.2f} ({np.percentile(after, 10):.2f}-{np.percentile(after, 90):.2f})"
              f"   cpu/host {np.median(hosted):5.2f} ({np.percentile(hosted, 10):.2f}-"
              f"{np.percentile(hosted, 90):.2f})")
    summarize(out_rows)


def _in_situ(model, plan, batch: int, ranks: int, lookups, comms, dense_db: Path, host, trace: dict,
             cpu_overheads: dict[str, float], cores: int = HOST_CORES) -> dict[str, float]:
    """The IN_SITU predictors of one config: the host cost and the in-situ lookups, with the loaded sweep's
    curves (comms[0]; Algorithm 1 and the analytical engine) and with the quiet sweep's (comms[1]; both engines
    and Algorithm 1)."""
    from trainsim.estimate.sharded_dlrm import estimate_sharded
    from trainsim.estimate.trace_predict import simulate_trace

    share, out = core_share(cores, ranks), {}
    for comm, prefix in zip(comms, ("lookup", "insitu"), strict=True):
        sjob, pricer, it = fixed_pricing(model, plan, batch, ranks, lookups, comm, dense_db, host, cores)
        out[f"{prefix}_trace_predicted_s"] = simulate_trace(trace["events"], it, cpu_overheads) / share
        for engine, key in (("analytical", f"{prefix}_s"), ("sim", f"{prefix}_sim_s")):
            if key in IN_SITU:
                out[key] = estimate_sharded(sjob.job, sjob.graph, plan, engine, pricer, lookups,
                                            host=host).iteration_time_s
    return out


def fit_lookup(experiment: str = "sharding") -> None:
    """The lookups' in-situ factors (calibrate.lookup_in_situ) from one set's traces, each traced config priced
    by the cold lookup model alone: "sharding" (the e2e set held out for `predict`) into lookup_in_situ.json, or
    "e2e" (the sharding set held out for `predict-sharding`) into lookup_in_situ_e2e.json; another set than
    "quiet" (RECSYS_SET) writes lookup_in_situ_<set>[_e2e].json."""
    from recsys_experiments import local_curves

    from trainsim.calibrate.lookup_in_situ import fit_lookup_in_situ, samples_from_trace, save_lookup_in_situ
    from trainsim.cost.embedding_lookup import MlpLookup

    lookups = MlpLookup.load(Path(os.environ.get("LOOKUP_MODEL", OUT / "lookup_mlp_cold.json")))
    comm, dense_db = local_curves(), Path(os.environ.get("DENSE_DB", OUT / "dense_ops.db"))
    source = OUT / f"{experiment}_{SET}_traces.jsonl"
    name = "lookup_in_situ" + ("" if SET == "quiet" else f"_{SET}") + ("" if experiment == "sharding" else "_e2e")
    target = OUT / f"{name}.json"
    samples = []
    for t, _, _, it in _traced_configs(source, lookups, comm, dense_db):
        samples += samples_from_trace(t["events"], t["cpu_s"], it)
    fitted = fit_lookup_in_situ(samples, lookups)
    save_lookup_in_situ(fitted, target, f"scripts/recsys_quiet.py fit-lookup {experiment} on {source}", len(samples))
    print(f"{len(samples)} lookup spans -> forward x{fitted.fwd_scale:.4f}, backward x{fitted.bwd_scale:.4f} "
          f"-> {target}")



def _traced_configs(source: Path, lookups, comm, dense_db: Path):
    """Each traced config of `source` (a traces JSONL) with its sharding plan, job and iteration priced as
    `predict` prices it without host cost: (trace, plan, job, iteration)."""
    for t in map(json.loads, source.open()):
        kind = "heavy" if t["task"].startswith("heavy") else "normal"
        ranks, batch, seed = int(t["ranks"]), int(t["local_batch"]), int(t["task"].split("-")[0][len(kind):])
        model, tables = task(kind, ranks, seed)
        plan = shard(tables, t["sharder"], ranks, cap_bytes=CAP, seed=seed)
        sjob, _, it = fixed_pricing(model, plan, batch, ranks, lookups, comm, dense_db)
        yield t, plan, sjob, it

def fit_host(experiment: str = "sharding") -> None:
    """The dense part's host cost (calibrate.dense_host) from one set's traces, each traced config priced as
    `predict` prices it without host cost: "sharding" (102 plans; the e2e set stays held out for `predict`) into
    dense_host.json, or "e2e" (80 configs; the sharding set held out for `predict-sharding`) into
    dense_host_e2e.json."""
    from recsys_experiments import local_curves

    from trainsim.calibrate.dense_host import fit_dense_host, samples_from_trace, save_dense_host
    from trainsim.cost.embedding_lookup import MlpLookup
    from trainsim.cost.sharded_dlrm import dense_op_counts

    lookups = MlpLookup.load(Path(os.environ.get("LOOKUP_MODEL", OUT / "lookup_mlp_cold.json")))
    comm, dense_db = local_curves(), Path(os.environ.get("DENSE_DB", OUT / "dense_ops.db"))
    source = OUT / f"{experiment}_{SET}_traces.jsonl"
    target = DENSE_HOST if experiment == "sharding" else DENSE_HOST_E2E
    samples = []
    for t, plan, sjob, it in _traced_configs(source, lookups, comm, dense_db):
        samples += samples_from_trace(t["events"], t["cpu_s"], it, dense_op_counts(sjob.graph, plan))
    host = fit_dense_host(samples)
    save_dense_host(host, target, f"scripts/recsys_quiet.py fit-host {experiment} on {source}", len(samples))
    print(f"{len(samples)} dense spans -> {host} -> {target}")


def host_cpu_means(traces: list[dict], names: tuple[str, ...]) -> dict[str, float]:
    """Mean thread CPU time of each host span over all ranks of all traces (Algorithm 1's overheads, without the
    time the host's other processes held the core)."""
    values: dict[str, list[float]] = {name: [] for name in names}
    for t in traces:
        for spans, cpus in zip(t["events"], t["cpu_s"], strict=True):
            for (name, _, _), cpu in zip(spans, cpus, strict=True):
                if name in values:
                    values[name].append(cpu)
    return {name: sum(v) / len(v) for name, v in values.items() if v}


def _before_iteration(model, plan, batch: int, lookups, comm):
    from recsys_experiments import CLUSTER

    from trainsim.cost.pricing import Pricer
    from trainsim.cost.sharded_dlrm import price_sharded_iteration
    from trainsim.frontends.catalog.sharded_dlrm import sharded_job

    sjob = sharded_job(model, plan, CLUSTER, batch)
    return price_sharded_iteration(sjob.graph, plan, sjob.job, Pricer(comm_costs=comm), lookups)


def summarize(rows: list[dict]) -> None:
    import math

    def geomean(values: list[float]) -> float:
        return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))

    targets = (("measured_s", "measured wall iteration (median of 5, slowest rank)"),
               ("trace_replay_cpu_s", "CPU-time replay (compute at its thread CPU time)"))
    for target, label in targets:
        print(f"against the {label}: geomean |error| / max |error| (median signed error)")
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            groups.setdefault((str(r["ranks"]), r["kind"]), []).append(r)
            groups.setdefault((str(r["ranks"]), f"batch {r['local_batch']}"), []).append(r)
            groups.setdefault((str(r["ranks"]), "all"), []).append(r)
            groups.setdefault(("all", "all"), []).append(r)
        for key in sorted(groups):
            rs, cells = groups[key], []
            for p in PREDICTORS:
                if p == target:
                    continue
                errors = [(float(r[p]) - float(r[target])) / float(r[target]) for r in rs]
                absolute = [abs(e) for e in errors]
                cells.append(f"{p[:-2]} {geomean(absolute) * 100:.1f}/{max(absolute) * 100:.0f}% "
                             f"({sorted(errors)[len(errors) // 2] * 100:+.0f}%)")
            print(f"  {key[0]} ranks {key[1]} n={len(rs)}: " + "; ".join(cells))


def errors(sets: list[str], predictors: list[str]) -> None:
    """A compact table of predicted sets (`predict` wrote e2e_<set>_predicted.csv): per set and predictor the
    geometric mean of |error| (as `summarize`) / max |error| against the measured wall iteration, with the
    median signed error, over every config and per batch."""
    import numpy as np

    print("set".ljust(16) + "".join(p.ljust(26) for p in predictors))
    for name in sets:
        rows = list(csv.DictReader((OUT / f"e2e_{name}_predicted.csv").open()))
        for batch in ("all", *sorted({r["local_batch"] for r in rows}, key=int)):
            mine = [r for r in rows if batch in ("all", r["local_batch"])]
            cells = []
            for p in predictors:
                e = np.array([float(r[p]) / float(r["measured_s"]) - 1.0 for r in mine])
                geomean = np.exp(np.mean(np.log(np.maximum(np.abs(e), 1e-9))))
                cells.append(f"{geomean * 100:5.1f}/{np.max(np.abs(e)) * 100:3.0f}% ({np.median(e) * 100:+3.0f})"
                             .ljust(26))
            print(f"{name} {batch}".ljust(16) + "".join(cells))


def predict_sharding() -> None:
    """Each predictor's pick per task against the measured fastest (wall median, wall fastest, CPU-time replay):
    within 5% counts (the paper's criterion: within 10%); a random pick's expectation beside it."""
    from recsys_experiments import CLUSTER, local_curves

    from trainsim.calibrate.dense_host import load_dense_host
    from trainsim.calibrate.lookup_in_situ import load_lookup_in_situ
    from trainsim.cost.embedding_lookup import MlpLookup
    from trainsim.cost.pricing import Pricer
    from trainsim.cost.sharded_dlrm import NO_HOST_COST
    from trainsim.estimate.sharded_dlrm import estimate_sharded
    from trainsim.estimate.trace_predict import simulate_trace
    from trainsim.frontends.catalog.sharded_dlrm import sharded_job

    before_lookups = MlpLookup.load(OUT / "lookup_mlp.json")
    after_lookups = MlpLookup.load(Path(os.environ.get("LOOKUP_MODEL", OUT / "lookup_mlp_cold.json")))
    comm, dense_db = local_curves(), Path(os.environ.get("DENSE_DB", OUT / "dense_ops.db"))
    host_path = DENSE_HOST_E2E  # fitted on the e2e set: the sharding set is held out
    host = load_dense_host(host_path) if host_path.exists() else NO_HOST_COST
    # fitted on the e2e set too: 'lookup' adds them to 'host', 'insitu' also takes the quiet sweep's curves
    in_situ = load_lookup_in_situ(Path(os.environ.get("LOOKUP_IN_SITU", OUT / "lookup_in_situ_e2e.json")),
                                  after_lookups)
    quiet = local_curves(QUIET_SWEEP)
    print(f"dense host cost (with 'host'): {host}; lookups in situ: x{in_situ.fwd_scale:.4f} forward, "
          f"x{in_situ.bwd_scale:.4f} backward")
    rows = list(csv.DictReader((OUT / f"sharding_{SET}.csv").open()))
    traces = {(t["task"], t["sharder"]): t for t in map(json.loads, (OUT / f"sharding_{SET}_traces.jsonl").open())}
    by_task: dict[str, list[dict]] = {}
    predict_s = 0.0
    for row in rows:
        ranks, seed, batch = int(row["ranks"]), int(row["seed"]), int(row["local_batch"])
        model, tables = task("heavy", ranks, seed)
        began = time.perf_counter()
        plan = shard(tables, row["sharder"], ranks, cap_bytes=CAP, seed=seed)
        sjob, pricer, it = fixed_pricing(model, plan, batch, ranks, after_lookups, comm, dense_db,
                                         cores=cores_of(row))
        after = estimate_sharded(sjob.job, sjob.graph, plan, "analytical", pricer, after_lookups).iteration_time_s
        hosted = estimate_sharded(sjob.job, sjob.graph, plan, "analytical", pricer, after_lookups,
                                  host=host).iteration_time_s
        predict_s += time.perf_counter() - began
        priced = {}
        for name, curves in (("lookup", comm), ("insitu", quiet)):
            ljob, lpricer, _ = fixed_pricing(model, plan, batch, ranks, in_situ, curves, dense_db, host,
                                             cores_of(row))
            priced[name] = estimate_sharded(ljob.job, ljob.graph, plan, "analytical", lpricer, in_situ,
                                            host=host).iteration_time_s
        old = sharded_job(model, plan, CLUSTER, batch)
        before = estimate_sharded(old.job, old.graph, plan, "analytical", Pricer(comm_costs=comm),
                                  before_lookups).iteration_time_s
        t = traces[(row["task"], row["sharder"])]
        cpu_replay = simulate_trace(t["events"], it, {}, replay=True, cpu_s=t["cpu_s"])
        by_task.setdefault(row["task"], []).append({**row, "before": before, "after": after, "host": hosted,
                                                    **priced, "cpu_replay": cpu_replay})
    for ranks in sorted({r["ranks"] for r in rows}):
        tasks = {name: rs for name, rs in by_task.items() if rs[0]["ranks"] == ranks}
        _sharding_report(tasks, {k: v for k, v in traces.items() if str(v["ranks"]) == ranks}, ranks)
    print(f"selection time (after): {predict_s:.1f} s for {len(rows)} plans")


def _sharding_report(by_task: dict[str, list[dict]], traces: dict, ranks: str) -> None:
    import numpy as np

    rows = [r for rs in by_task.values() for r in rs]
    loads = [float(r[k]) for r in rows for k in ("load_before", "load_after")]
    print(f"{len(by_task)} heavy tasks x 6 sharders, {ranks} ranks, local batch 128; host 1-minute load "
          f"{min(loads):.2f}-{max(loads):.2f} (median {np.median(loads):.2f})")
    for target in ("measured_s", "fastest_s", "cpu_replay"):
        cells = []
        for predictor in SHARDING_PREDICTORS:
            hits5 = hits10 = 0
            for rs in by_task.values():
                measured = {r["sharder"]: float(r[target]) for r in rs}
                best = min(measured.values())
                pick = min(rs, key=lambda r: r[predictor])
                gap = measured[pick["sharder"]] / best - 1.0
                hits5, hits10 = hits5 + (gap <= 0.05), hits10 + (gap <= 0.10)
            cells.append(f"{predictor}: {hits5}/{len(by_task)} within 5%, {hits10}/{len(by_task)} within 10%")
        chance = sum(sum(float(r[target]) <= 1.05 * min(float(q[target]) for q in rs) for r in rs) / len(rs)
                     for rs in by_task.values())
        print(f"  vs {target}: " + "; ".join(cells) + f"; a random pick {chance:.1f}/{len(by_task)} within 5%")
    spreads = [(max(t["iterations_s"]) - min(t["iterations_s"])) / float(np.median(t["iterations_s"]))
               for t in traces.values()]
    counts = sorted({len(t["iterations_s"]) for t in traces.values()})
    print(f"  spread of a plan's {'/'.join(map(str, counts))} iterations ((max - min) / median): median "
          f"{np.median(spreads) * 100:.0f}%, "
          f"p90 {np.percentile(spreads, 90) * 100:.0f}%")
    for predictor in SHARDING_PREDICTORS:
        errors = [(r[predictor] - float(r["measured_s"])) / float(r["measured_s"]) for r in rows]
        geomean = float(np.exp(np.mean(np.log(np.abs(errors)))))
        print(f"  {predictor}: geomean |error| against the measured median {geomean * 100:.1f}% (median signed "
              f"{np.median(errors) * 100:+.1f}%)")


def passes(first: str, second: str) -> None:
    """Two measured sets of the same configs against each other (the ground truth's own floor): per config the
    geomean |difference| of the median iterations, and per sharding task whether one set's fastest plan is within
    5% / 10% of the other set's fastest."""
    import numpy as np

    for experiment, key in (("e2e", ("ranks", "task", "local_batch")), ("sharding", ("ranks", "task", "sharder"))):
        sets = []
        for name in (first, second):
            path = OUT / f"{experiment}_{name}.csv"
            sets.append({tuple(r[k] for k in key): r for r in csv.DictReader(path.open())} if path.exists() else {})
        common = sorted(set(sets[0]) & set(sets[1]))
        for ranks in sorted({c[0] for c in common}):
            mine = [c for c in common if c[0] == ranks]
            ratio = np.array([float(sets[1][c]["measured_s"]) / float(sets[0][c]["measured_s"]) for c in mine])
            loads = [float(x[c][k]) for x in sets for c in mine for k in ("load_before", "load_after")]
            print(f"{experiment}, {ranks} ranks, {len(mine)} configs: {second} / {first} median "
                  f"{np.median(ratio):.3f}, "
                  f"geomean |difference| {(np.exp(np.mean(np.abs(np.log(ratio)))) - 1) * 100:.1f}%, max "
                  f"{(np.exp(np.max(np.abs(np.log(ratio)))) - 1) * 100:.0f}%; load {min(loads):.2f}-{max(loads):.2f}")
            if experiment == "sharding":
                _pass_picks(sets, {c[1] for c in mine}, ranks, (first, second))


def pool(target: str, sources: list[str], experiment: str = "e2e") -> None:
    """Several measured passes of the same configs pooled into one set (`target`): per config the median over
    every pass's iterations, the fastest of them, the lowest and highest load, and the traced spans of the pass
    whose own median is nearest the pooled one (the per-rank trace `predict` reads). Configs missing from a pass
    are pooled over the passes that have them. On this host a config's time moves by ~20% from one pass to the
    next (the host's speed, docs/recommendation.md, tenth session); visits spread over a campaign average it."""
    import numpy as np

    key = ("ranks", "task", "local_batch") if experiment == "e2e" else ("ranks", "task", "sharder")
    rows: dict[tuple[str, ...], list[dict]] = {}
    traces: dict[tuple[str, ...], list[dict]] = {}
    for name in sources:
        for row in csv.DictReader((OUT / f"{experiment}_{name}.csv").open()):
            rows.setdefault(tuple(row[k] for k in key), []).append(row)
        for t in map(json.loads, (OUT / f"{experiment}_{name}_traces.jsonl").open()):
            traces.setdefault(tuple(str(t[k]) for k in key), []).append(t)
    with (OUT / f"{experiment}_{target}.csv").open("w", newline="") as f, \
            (OUT / f"{experiment}_{target}_traces.jsonl").open("w") as out:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for k, visits in rows.items():
            pooled = float(np.median(np.concatenate([t["iterations_s"] for t in traces[k]])))
            nearest = min(traces[k], key=lambda t: abs(float(np.median(t["iterations_s"])) - pooled))
            loads = [float(v[side]) for v in visits for side in ("load_before", "load_after")]
            writer.writerow({**visits[0], "measured_s": pooled,
                             "fastest_s": min(float(v["fastest_s"]) for v in visits),
                             "load_before": min(loads), "load_after": max(loads)})
            out.write(json.dumps({**nearest, "iterations_s": [x for t in traces[k] for x in t["iterations_s"]],
                                  "pooled_from": sources}) + "\n")
    print(f"{len(rows)} configs pooled from {', '.join(sources)} -> {experiment}_{target}.csv")


def pass_spans(first: str, second: str, experiment: str = "e2e") -> None:
    """Per span, over the configs and ranks two sets share: the median ratio of the spans' thread CPU time
    (second / first), the geomean |difference| and, per set, the median minor page faults per span and the share
    of spans that faulted (sets before the tenth session did not record faults)."""
    import numpy as np

    sets = []
    for name in (first, second):
        traces = {(str(t["ranks"]), t["task"], str(t["local_batch"]), t["sharder"]): t
                  for t in map(json.loads, (OUT / f"{experiment}_{name}_traces.jsonl").open())}
        sets.append(traces)
    common = sorted(set(sets[0]) & set(sets[1]))
    ratios: dict[str, list[float]] = {}
    faults: dict[str, tuple[list[float], list[float]]] = {}
    for key in common:
        for r, spans in enumerate(sets[0][key]["events"]):
            for i, (name, _, _) in enumerate(spans):
                a, b = sets[0][key]["cpu_s"][r][i], sets[1][key]["cpu_s"][r][i]
                if a > 0 and b > 0:
                    ratios.setdefault(name, []).append(b / a)
                for side, t in enumerate((sets[0][key], sets[1][key])):
                    if t.get("faults"):
                        faults.setdefault(name, ([], []))[side].append(t["faults"][r][i])
    print(f"{experiment}: {len(common)} configs in both {first} and {second}; per span: thread CPU {second}/{first} "
          f"median, geomean |difference|; minor faults per span (median, share > 0) in {first} | {second}")
    for name, values in ratios.items():
        v = np.array(values)
        line = f"  {name:<22} n={len(v):<4} {np.median(v):5.2f}  {(np.exp(np.mean(np.abs(np.log(v)))) - 1) * 100:5.1f}%"
        for side in (0, 1):
            f = np.array(faults.get(name, ([], []))[side])
            line += f"   {np.median(f):7.0f} {np.mean(f > 0):4.0%}" if f.size else "         -    -"
        print(line)


def _pass_picks(sets: list[dict], tasks: set[str], ranks: str, names: tuple[str, str]) -> None:
    for a, b in ((0, 1), (1, 0)):
        hits5 = hits10 = 0
        for name in tasks:
            picked = {k[2]: float(r["measured_s"]) for k, r in sets[a].items() if k[:2] == (ranks, name)}
            judged = {k[2]: float(r["measured_s"]) for k, r in sets[b].items() if k[:2] == (ranks, name)}
            gap = judged[min(picked, key=picked.__getitem__)] / min(judged.values()) - 1.0
            hits5, hits10 = hits5 + (gap <= 0.05), hits10 + (gap <= 0.10)
        print(f"  {names[a]}'s fastest plan judged on {names[b]}: {hits5}/{len(tasks)} within 5%, "
              f"{hits10}/{len(tasks)} within 10%")


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    command = sys.argv[1] if len(sys.argv) > 1 else "measure"
    if command == "measure":
        budget = float(sys.argv[2]) if len(sys.argv) > 2 else 420.0
        measure(budget, (int(sys.argv[3]),) if len(sys.argv) > 3 else (2, 4))
    elif command == "sharding":
        measure_sharding(float(sys.argv[2]) if len(sys.argv) > 2 else 420.0,
                         int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    elif command == "predict":
        predict()
    elif command == "predict-sharding":
        predict_sharding()
    elif command == "fit-host":
        fit_host(sys.argv[2] if len(sys.argv) > 2 else "sharding")
    elif command == "passes":
        passes(sys.argv[2], sys.argv[3])
    elif command == "errors":
        errors(sys.argv[2].split(","), sys.argv[3].split(","))
    elif command == "pool":
        pool(sys.argv[2], sys.argv[3].split(","), sys.argv[4] if len(sys.argv) > 4 else "e2e")
    elif command == "pass-spans":
        pass_spans(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "e2e")
    elif command == "fit-lookup":
        fit_lookup(sys.argv[2] if len(sys.argv) > 2 else "sharding")
