"""Table IV of Proteus (Sec. VIII-C) on this machine: the six models' small versions x S1/S2 on 2 or 4 gloo ranks,
measured with `trainsim measure --tree` and simulated with profiled op costs by three engines of the registry
(COLUMN_ENGINES; their switches in sim/baselines.py): proteus = "sim" (overlap slow-down and bandwidth sharing),
plain = "sim-plain" (Fig. 9), flexflow = "flexflow-sim" (FlexFlow-Sim: collectives inserted, priced from
bandwidth alone, no runtime behaviours, no in-flight limit).

Campaigns of three models (about seven minutes each on this shared 2-core machine), under the timing lock:

    M1=resnet50-small,inception-v3-small,vgg19-small M2=gpt2-small,gpt2-1.5b-small,dlrm-small
    for g in 2 4; do for m in $M1 $M2; do
        flock /tmp/trainsim-timing.lock python scripts/proteus_table4.py --ranks $g --models $m \
            --out results/proteus_table4
    done; done
    python scripts/proteus_table4.py --summary --out results/proteus_table4      # errors per cell and overall

The CPU columns (the busiest rank's process CPU seconds, less the harness' barriers) price ops and collectives on
the CPU clock and sum each device's streams (predict). After the campaigns, each under the lock:
`--cpu-profile --ranks 2`, `--cpu-profile --ranks 4 --models $M1`, `--cpu-collectives`, `--executor-overhead`;
then `--repredict --ranks 2`, `--repredict --ranks 4`, `--summary` (results/proteus_table4_v3 is that sequence,
with --iterations 6). `--cpu-collectives` times each call after COLLECTIVE_GAP_S of compute on the calling thread
(the executor calls them between ops) and appends the sweep to OUT/collective-sweeps.json; `--pool-collectives
SWEEPS` then prices with the median over several such sweeps (one sweep moves with the machine's load).

The optimizer states the runs leave at zero (ReLUs dead for the whole batch, untouched table rows) are counted
once per campaign, no clock, no lock: `python scripts/proteus_table4.py --state-census --iterations 6 --out OUT`
(profile/state_census.py; then --repredict).

The split executor's own Python per op (profile/executor_overhead.py) and per reshard step
(profile/reshard_overhead.py) are machine facts measured once, under the lock, into OUT's databases: `flock
/tmp/trainsim-timing.lock python scripts/proteus_table4.py --executor-overhead --out OUT`, the same with
--reshard-overhead (then --repredict per rank count and --summary).

Per model, the ops both plans run (their per-rank shapes under the computation configs: compile.splits.scaled_op)
are profiled into OUT/profile-gG.db right before the two plans are measured, so ops and runs see the same machine.
The ranks share this machine's cores, so ops are timed on the wall clock while G - 1 sibling processes run the
same microbenchmarks (the contention a rank sees from the others); collectives are timed among G local processes
(`trainsim profile`'s collective microbenchmarks). Models and trees: scripts/gen_proteus_small.py.
"""

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "data" / "strategies" / "proteus" / "small"
# model -> (micro-batch per rank, sequence length)
MODELS: dict[str, tuple[int, int]] = {
    "resnet50-small": (4, 1), "inception-v3-small": (2, 1), "vgg19-small": (4, 1),
    "gpt2-small": (2, 64), "gpt2-1.5b-small": (1, 64), "dlrm-small": (128, 1),
}
STRATEGIES = ("s1", "s2")
BUCKET_PARAMS = 262144  # measure/split_model.BUCKET_PARAMS
COLLECTIVE_SIZES = (1024, 16384, 131072, 1048576, 4194304)
CPU_CALLS_PER_SAMPLE = 16  # profile.collectives: one call in ~6 costs ~10x more on the CPU clock; samples of 16
# Compute on the calling thread before each collective of the CPU-clock sweep: a rank of these plans computes 2.1
# to 48 ms per collective (the simulated timelines: compute tasks over comm tasks, Inception-v3 S2 the least),
# and a call's CPU is the same after 2 and after 8 ms of compute (docs/strategy-tree.md, eleventh session)
COLLECTIVE_GAP_S = 0.002


def settings(model: str, ranks: int) -> dict[str, Any]:
    mb, seq = MODELS[model]
    return {"model": str(SMALL / "models" / f"{model}.yaml"), "cluster": "local-cpu", "num_gpus": ranks,
            "dp": ranks, "micro_batch": mb, "global_batch": mb * ranks, "seq_len": seq, "precision": "fp32",
            "optimizer_impl": "loop",
            # the split executor syncs gradients as torch DDP does: copied into 1 MiB buckets, scaled and back
            "stack_overrides": {"grad_reduce_overlap": True, "grad_bucket_params": BUCKET_PARAMS,
                                "grad_bucket_copies": True, "split_executor": True}}


def tree_path(model: str, strategy: str, ranks: int) -> Path:
    return SMALL / f"ranks{ranks}" / f"{model}-{strategy}.yaml"


def job_and_plan(model: str, strategy: str, ranks: int, tree_model: str = "") -> tuple[Any, Any, Any]:
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.jobfile import job_from_settings
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree_yaml import load_tree_yaml

    job = job_from_settings(settings(model, ranks))
    job = dataclasses.replace(job, cluster=job.cluster.on_one_node())
    graph = build_graph(job.model, DeviceSlice.of(job.parallel))
    plan = load_tree_yaml(tree_path(tree_model or model, strategy, ranks), graph).lower(job.parallel)
    return job, graph, plan


def split_graph(graph: Any, plan: Any, ranks: int) -> Any:
    """The OpGraph of what one rank runs under the plan's configs (each layer instance once)."""
    from trainsim.compile.splits import config_of, plan_splits, scaled_op
    from trainsim.ir.graph import OpGraph

    splits = plan_splits(plan, ranks)
    layers = []
    for a in plan.layers:
        split = splits.get(a.index)

        def scale(op: Any, split: Any = split) -> Any:
            config = config_of(split, op) if split is not None else None
            return scaled_op(op, config, ranks) if config is not None else op

        # the parameters the rank holds (split weights in parts): the optimizer step is profiled over them
        held = a.layer.param_count if split is None else split.held_params
        # and the host copies of its reshards (strategy.reshard_copies), timed as the copy kernel
        copies = () if split is None else tuple(c.op() for c in split.copies)
        layers.append(dataclasses.replace(a.layer, count=1, fwd=tuple(scale(op) for op in a.layer.fwd),
                                          bwd=tuple(scale(op) for op in a.layer.bwd) + copies, param_count=held))
    return OpGraph(graph.model_name, tuple(layers), graph.tokens_per_micro_batch, graph.samples_per_micro_batch)


def _wall_clock(device: str) -> tuple[Any, str]:
    return time.perf_counter, "wall time beside busy sibling ranks"


def _shadow(graphs: list[Any], hints: Any, stop: Any) -> None:
    """A sibling rank: the same microbenchmarks over and over, into a throwaway database."""
    import tempfile

    import torch

    from trainsim.profile.database import ProfileDB
    from trainsim.profile.ops import local_environment, profile_graph

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        repeats = 0
        while not stop.is_set():
            repeats += 2
            with ProfileDB.open(Path(tmp) / "shadow.db") as db:
                env = local_environment("cpu-local", "cpu")
                for graph in graphs:
                    profile_graph(db, env, graph, hints, "cpu", warmup=0, repeats=repeats, optimizer=False)


def profile_model(db_path: Path, model: str, ranks: int, repeats: int, wall: bool = True, probe: bool = False) -> None:
    """The ops both plans of the model run, beside ranks - 1 sibling processes; probe: the reference probe
    (measure/phase.py) timed around every sample, its timings stored beside the raw samples (op_phase)."""
    import torch

    import trainsim.profile.ops as ops
    from trainsim.measure.phase import ProbeLog, ReferenceProbe
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.job import hints_for
    from trainsim.strategy.device_slice import DeviceSlice

    torch.set_num_threads(1)
    graphs = []
    for strategy in STRATEGIES:
        _, graph, plan = job_and_plan(model, strategy, ranks)
        graphs.append(split_graph(graph, plan, ranks))
    job = job_and_plan(model, STRATEGIES[0], ranks)[0]
    hints = hints_for(job.model, DeviceSlice.of(job.parallel))  # the model's: the same for both plans
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    shadows = [ctx.Process(target=_shadow, args=(graphs, hints, stop), daemon=True) for _ in range(ranks - 1)]
    for proc in shadows:
        proc.start()
    original = ops.clock_for
    if wall:
        ops.clock_for = _wall_clock  # NB: thread CPU time would leave out the siblings' share of the cores
    log = ProbeLog(ReferenceProbe()) if probe else None
    try:
        with ProfileDB.open(db_path) as db:
            env = ops.local_environment("cpu-local", "cpu")
            for graph in graphs:
                ops.profile_graph(db, env, graph, hints, "cpu", warmup=1, repeats=repeats, probe=log)
    finally:
        ops.clock_for = original
        stop.set()
        for proc in shadows:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def profile_collectives(db_path: Path, ranks: int, clock: str = "wall", repeats: int = 5, calls: int = 1,
                        gap_s: float = 0.0) -> None:
    import torch

    from trainsim.profile.collectives import profile_collectives as run
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.ops import local_environment

    torch.set_num_threads(1)
    with ProfileDB.open(db_path) as db:
        env = local_environment("cpu-local", "cpu")
        for size in sorted({2, ranks}):
            run(db, env, sizes=COLLECTIVE_SIZES, world_size=size, warmup=2, repeats=repeats, timeout_s=240.0,
                clock=clock, calls_per_sample=calls, gap_s=gap_s)


def profile_cpu_collectives(out: Path, repeats: int = 9, calls: int = CPU_CALLS_PER_SAMPLE,
                            gap_s: float = 0.0) -> dict[str, Any]:
    """The collectives on the CPU clock (profile.collectives' "cpu": the busiest rank's process CPU seconds, gloo's
    threads included, waits left out; a sample the mean of `calls` calls, as an iteration pays the mean of its
    many) into OUT/profile-cpu.db, replacing the rows there before: the clock of the runs' cpu_s_per_rank,
    against which the CPU columns are compared. gap_s > 0: each call after that much compute on the calling
    thread, as the executor issues them (COLLECTIVE_GAP_S)."""
    import sqlite3

    db_path = out / "profile-cpu.db"
    with sqlite3.connect(db_path) as db:
        db.execute("DELETE FROM collective_times")
    load = [Path("/proc/loadavg").read_text().split()[:3]]
    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    profile_collectives(db_path, 4, clock="cpu", repeats=repeats, calls=calls, gap_s=gap_s)
    load.append(Path("/proc/loadavg").read_text().split()[:3])
    record = {"load_average_before_after": load, "clock": "cpu", "repeats": repeats, "calls_per_sample": calls,
              "gap_s": gap_s, "began_utc": began}
    (out / "cpu-collectives.json").write_text(json.dumps(record, indent=1) + "\n")
    _append_sweep(out / "collective-sweeps.json", record, db_path)
    return record


def _append_sweep(path: Path, record: dict[str, Any], db_path: Path) -> None:
    """Keep the sweep's rows (environment, collective, ranks, bytes, median, p10, p90, repeats) in OUT's list of
    sweeps, which --pool-collectives reads."""
    from trainsim.profile.database import ProfileDB

    with ProfileDB.open(db_path) as db:
        rows = [[r.env.device, r.env.versions, r.env.threads, r.env.hardware, r.backend, r.collective, r.world_size,
                 r.message_bytes, r.stats.median_s, r.stats.p10_s, r.stats.p90_s, r.stats.repeats]
                for r in db.collective_rows()]
    sweeps = json.loads(path.read_text()) if path.exists() else []
    sweeps.append({**record, "rows": rows})
    path.write_text(json.dumps(sweeps, indent=1) + "\n")


def pool_cpu_collectives(out: Path, sweeps_path: Path, gap_s: float) -> dict[str, Any]:
    """OUT/profile-cpu.db's collectives replaced by the median over the sweeps of `sweeps_path` taken with `gap_s`
    (profile.collectives.pooled_stats: one sweep's small messages move by up to 2x with the machine's load)."""
    import sqlite3

    from trainsim.profile.collectives import pooled_stats
    from trainsim.profile.database import Environment, ProfileDB, TimingStats

    sweeps = [s for s in json.loads(sweeps_path.read_text()) if abs(s["gap_s"] - gap_s) < 1e-9]
    if not sweeps:
        raise SystemExit(f"--pool-collectives: no sweep in {sweeps_path} was taken with gap_s={gap_s}")
    points: dict[tuple[Any, ...], list[TimingStats]] = {}
    for sweep in sweeps:
        for *key, median, p10, p90, repeats in sweep["rows"]:
            points.setdefault(tuple(key), []).append(TimingStats(median, p10, p90, repeats))
    with sqlite3.connect(out / "profile-cpu.db") as conn:
        conn.execute("DELETE FROM collective_times")
    with ProfileDB.open(out / "profile-cpu.db") as db:
        for (device, versions, threads, hardware, backend, collective, world, size), stats in points.items():
            db.put_collective(Environment(device, versions, threads, hardware), backend, collective, world, size,
                              pooled_stats(stats))
    record = {"pooled_from": str(sweeps_path), "gap_s": gap_s, "clock": "cpu",
              "sweeps": [{k: v for k, v in s.items() if k != "rows"} for s in sweeps]}
    (out / "cpu-collectives.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def measure(model: str, strategy: str, ranks: int, out: Path, iterations: int, warmup: int,
            phase_normalise: bool = False, run_id: str = "") -> dict[str, Any]:
    s = settings(model, ranks)
    run_id = run_id or f"{model}-{strategy}-g{ranks}"
    cmd = [sys.executable, "-m", "trainsim", "measure", "--model", s["model"], "--num-gpus", str(ranks),
           "--micro-batch", str(s["micro_batch"]), "--global-batch", str(s["global_batch"]),
           "--seq-len", str(s["seq_len"]), "--precision", "fp32", "--optimizer-impl", "loop",
           "--tree", str(tree_path(model, strategy, ranks)), "--iterations", str(iterations),
           "--warmup", str(warmup), "--threads", "1", "--out", str(out / "runs"), "--run-id", run_id, "--json",
           *(["--phase-normalise"] if phase_normalise else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-400:]}
    run = json.loads(done.stdout)
    times = run["iteration_times_s"]
    cpu = busiest_cpu_s(run["settings"], len(times))
    return {"median_s": statistics.median(times), "times_s": times, "cpu_s": cpu, "final_loss": run["final_loss"],
            "cpu_with_barriers_s": max(run["settings"]["cpu_s_per_rank"]) / len(times),
            "load_average_1m": run["settings"].get("load_average_1m"),
            **({"phase": phase_record(run["settings"])} if phase_normalise else {})}


def phase_record(settings: dict[str, Any]) -> dict[str, Any]:
    """A probed run's per-rank step CPU and probe pairs (trainsim measure --phase-normalise), which the campaign
    normalises against the fast-phase probe of all its runs and op samples."""
    return {"step_cpu_s_per_rank": settings["step_cpu_s_per_rank"],
            "step_thread_cpu_s_per_rank": settings["step_thread_cpu_s_per_rank"],
            "phase_probe_s_per_rank": settings["phase_probe_s_per_rank"],
            "run_fast_probe_s": settings["phase_normalised"]["fast_probe_s"]}


def busiest_cpu_s(settings: dict[str, Any], iterations: int) -> float:
    """The busiest rank's process CPU seconds per timed iteration, less the harness' own barriers where the run
    recorded them (barrier_cpu_s_per_rank: two gloo barriers per step, no training in them)."""
    barriers = settings.get("barrier_cpu_s_per_rank") or [0.0] * len(settings["cpu_s_per_rank"])
    return max(c - b for c, b in zip(settings["cpu_s_per_rank"], barriers, strict=True)) / iterations


# Table IV's columns -> the registry's engines (estimate/engines.py; sim/baselines.py holds their switches)
COLUMN_ENGINES = {"proteus": "sim", "plain": "sim-plain", "flexflow": "flexflow-sim"}


def predict(model: str, strategy: str, ranks: int, db_path: Path, wall: bool = True) -> dict[str, float]:
    """Every column's iteration. wall: the ranks' wall clock (the makespan), where ranks that outnumber this
    machine's cores take turns on them (compute_share = cores / ranks, at most 1: validate.measured.
    compute_share_of's fact); else the busiest rank's CPU seconds, which turns do not stretch: the busiest
    simulated device's tasks summed over its streams (sim.busy_s_by_device: process CPU time adds the training
    thread and gloo's threads), with the database's ops and collectives on the CPU clock."""
    from trainsim.catalog.calibration import load_calibration
    from trainsim.estimate.engines import make_engine
    from trainsim.sim import busy_s_by_device

    def seconds(result: Any) -> float:
        if wall:
            return float(result.iteration_time_s)
        timeline = result.timeline
        return max(busy_s_by_device(timeline.exec_graph, timeline.outcome))

    job, graph, plan = job_and_plan(model, strategy, ranks)
    share = min(1.0, len(os.sched_getaffinity(0)) / ranks) if wall else 1.0
    job = dataclasses.replace(job, cluster=job.cluster.model_copy(
        update={"device": job.cluster.device.model_copy(update={"compute_share": share})}))
    cal = load_calibration()
    out: dict[str, float] = {}
    # "serial": the catalog's CPU, whose gloo collectives never overlap compute (hardware/device.py); the three
    # engines run on the same CPU with overlap allowed, as the measured ranks launch the data-parallel
    # all-reduces from the gradient hooks (gloo's own thread) and Proteus models it: slowed by gamma
    serial = make_engine("sim", "profiled", db_path, "op", cal).estimate(job, graph, plan)
    out["serial"] = seconds(serial)
    device = job.cluster.device.model_copy(update={"comm_overlaps_compute": True})
    job = dataclasses.replace(job, cluster=job.cluster.model_copy(update={"device": device}))
    for column, engine in COLUMN_ENGINES.items():
        result = make_engine(engine, "profiled", db_path, "op", cal).estimate(job, graph, plan)
        out[column] = seconds(result)
        if column == "proteus":
            out["peak_memory_bytes"] = result.peak_memory_bytes
    return out


def phase_campaign(ranks: int, out: Path, iterations: int, warmup: int, repeats: int, models: list[str]) -> None:
    """The CPU columns with the reference probe on both sides: per model, its ops profiled on thread CPU time
    with the probe around every sample into OUT/profile-cpu.db (PHASE_OP_REPEATS samples), then both plans
    measured with `trainsim measure --phase-normalise`. No wall-clock columns. Then --repredict --phase-normalise."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"table4-g{ranks}.json"
    cells: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    started = time.time()
    for model in models:
        profile_model(out / "profile-cpu.db", model, ranks, repeats, wall=False, probe=True)
        print(f"{model}: ops profiled with the probe ({time.time() - started:.0f} s)", flush=True)
        for strategy in STRATEGIES:
            load = Path("/proc/loadavg").read_text().split()[:3]
            measured = measure(model, strategy, ranks, out, iterations, warmup, phase_normalise=True)
            cells[f"{model}/{strategy}"] = {"measured": {**measured, "load_before": load}}
            print(f"{model} {strategy}: {measured.get('cpu_s')} s CPU per step, load {load} "
                  f"({time.time() - started:.0f} s)", flush=True)
            path.write_text(json.dumps(cells, indent=1) + "\n")


def campaign(ranks: int, out: Path, iterations: int, warmup: int, repeats: int, models: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    db = out / f"profile-g{ranks}.db"
    path = out / f"table4-g{ranks}.json"
    cells: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    started = time.time()
    profile_collectives(db, ranks)
    print(f"collectives profiled ({time.time() - started:.0f} s)", flush=True)
    for model in models:
        profile_model(db, model, ranks, repeats)
        print(f"{model}: ops profiled ({time.time() - started:.0f} s)", flush=True)
        for strategy in STRATEGIES:
            cells[f"{model}/{strategy}"] = {"measured": measure(model, strategy, ranks, out, iterations, warmup)}
            print(f"{model} {strategy}: {cells[f'{model}/{strategy}']['measured'].get('median_s')} "
                  f"({time.time() - started:.0f} s)", flush=True)
            path.write_text(json.dumps(cells, indent=1) + "\n")  # what is measured survives an interruption
    repredict(path, ranks, db)


def repredict(path: Path, ranks: int, db: Path, cpu_db: Path | None = None, phase_db: Path | None = None,
              fast_s: float = 0.0, reference: str = "mean") -> None:
    """Simulate every measured cell of a campaign file with the campaign's profile database (no timing), with
    the CPU-time database where there is one, and with the phase-normalised one (phase_profile) for the cells
    measured with the probe, whose runs are normalised against the same fast-phase probe fast_s."""
    from trainsim.measure.phase import busiest_phase_normalised_s

    cells = json.loads(path.read_text())
    for key, cell in cells.items():
        model, strategy = key.split("/")
        run_file = path.parent / "runs" / f"{model}-{strategy}-g{ranks}.json"
        if "cpu_s" not in cell["measured"] and run_file.exists():  # cells measured before cpu_s was kept
            run = json.loads(run_file.read_text())
            cell["measured"]["cpu_s"] = busiest_cpu_s(run["settings"], len(run["iteration_times_s"]))
        if db.exists():  # a phase campaign has no wall-clock database
            cell["predicted"] = predict(model, strategy, ranks, db)
        if cpu_db is not None and cpu_db.exists():
            cell["predicted_cpu"] = predict(model, strategy, ranks, cpu_db, wall=False)
        phase = cell["measured"].get("phase")
        if phase is not None and phase_db is not None:
            steps, pairs = phase["step_cpu_s_per_rank"], phase["phase_probe_s_per_rank"]
            gloo = [[s - t for s, t in zip(rank_steps, rank_threads, strict=True)]
                    for rank_steps, rank_threads in zip(steps, phase["step_thread_cpu_s_per_rank"], strict=True)]
            # the training thread scaled, gloo's threads (whose collectives do not follow the probe) as measured
            cell["measured"]["cpu_phase_s"] = busiest_phase_normalised_s(steps, pairs, fast_s, gloo, reference)
            cell["measured"]["cpu_phase_whole_s"] = busiest_phase_normalised_s(steps, pairs, fast_s,
                                                                                reference=reference)
            cell["measured"]["phase_fit"] = phase_slope(phase, reference)
            cell["predicted_cpu_phase_whole"] = cell["predicted_cpu_phase"] = predict(model, strategy, ranks, phase_db,
                                                                                      wall=False)
    path.write_text(json.dumps(cells, indent=1) + "\n")


def _normalise_overheads(out: Path, db: Any, fast_s: float, reference: str) -> dict[str, list[float]]:
    """The split executor's per-op and per-reshard costs measured with the probe (--executor-overhead and
    --reshard-overhead with --phase-normalise), each rank's figure scaled to the fast phase: per op by the rank's
    steps (sum of training-thread CPU x fast / probe over the sum of the CPU), per reshard step by fast / the
    mean probe of its rounds. Returns the factors by signature impl; none without probed figures."""
    from trainsim.measure.phase import pair_means_s
    from trainsim.profile.executor_overhead import executor_signature
    from trainsim.profile.reshard_overhead import PHASES, reshard_signature

    factors: dict[Any, list[float]] = {}
    executor = out / "executor-overhead.json"
    if executor.exists():
        for family, figures in json.loads(executor.read_text())["families"].items():
            if "phase" not in figures:
                continue
            phase = figures["phase"]
            per_rank = [sum(t * fast_s / p for t, p in zip(steps, pair_means_s(pairs, reference), strict=True))
                        / sum(steps)
                        for steps, pairs in zip(phase["step_thread_cpu_s_per_rank"], phase["phase_probe_s_per_rank"],
                                                strict=True)]
            for step_phase in ("fwd", "bwd"):
                factors[executor_signature(family, step_phase)] = per_rank
    reshard = out / "reshard-overhead.json"
    if reshard.exists() and "probe_s_per_rank" in (record := json.loads(reshard.read_text())):
        per_rank = [fast_s / p for p in record["probe_s_per_rank"]]
        for key in record["per_step_s"]:
            collective, step_phase = key.rsplit(" ", 1)
            assert step_phase in PHASES, key
            factors[reshard_signature(collective, step_phase)] = per_rank
    for row in list(db.op_rows()):
        if row.signature in factors:
            key = (row.env.device, row.env.versions, row.env.threads, *dataclasses.astuple(row.signature)[:4],
                   row.signature.shape_text)
            samples = db.op_samples(key)
            db.replace_op_samples(key, [s * f for s, f in zip(samples, factors[row.signature], strict=True)])
    return {sig.impl + " " + sig.phase: f for sig, f in factors.items()}


def pearson(xs: list[float], ys: list[float]) -> float:
    """The correlation coefficient of xs and ys (NaN when either is constant)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs (with logs: how many percent the step moves per percent of probe;
    phase normalisation assumes 1)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else float("nan")


def op_phase_fit(db: Any, reference: str) -> dict[str, dict[str, float]]:
    """Per op kind (and over all), how op samples follow the probe around them: the correlation and the
    least-squares slope of log sample on log probe, each op's logs taken about their own means (within-op)."""
    from trainsim.measure.phase import pair_means_s

    by_kind: dict[str, tuple[list[float], list[float]]] = {}
    for key, samples, pairs in db.op_phase_rows():
        if len(samples) < 3 or min(samples) <= 0:
            continue
        log_probe = [math.log(p) for p in pair_means_s(pairs, reference)]
        log_sample = [math.log(v) for v in samples]
        mean_probe, mean_sample = statistics.fmean(log_probe), statistics.fmean(log_sample)
        for kind in (key[3], "all"):
            xs, ys = by_kind.setdefault(kind, ([], []))
            xs += [x - mean_probe for x in log_probe]
            ys += [y - mean_sample for y in log_sample]
    return {kind: {"samples": len(xs), "corr": pearson(xs, ys), "slope": slope(xs, ys)}
            for kind, (xs, ys) in sorted(by_kind.items())}


def phase_slope(phase: dict[str, Any], reference: str = "mean") -> dict[str, float]:
    """Over a probed run's steps (every rank's), the correlation of log training-thread CPU with log probe and
    the least-squares slope (phase normalisation scales by the probe, i.e. assumes a slope of 1)."""
    from trainsim.measure.phase import pair_means_s

    log_probe = [math.log(p) for pairs in phase["phase_probe_s_per_rank"] for p in pair_means_s(pairs, reference)]
    log_step = [math.log(t) for steps in phase["step_thread_cpu_s_per_rank"] for t in steps]
    return {"corr": pearson(log_probe, log_step), "slope": slope(log_probe, log_step)}


def phase_profile(out: Path, quantile: float, reference: str = "mean") -> tuple[Path, float]:
    """OUT/profile-cpu-phase.db: OUT/profile-cpu.db with every probed op's samples phase-normalised, against one
    fast-phase probe (the low quantile of every probe timing of the campaign: its op samples and its runs on 2 and
    4 ranks), so the op costs and the runs' steps are scaled alike. Returns the database and that probe."""
    import sqlite3

    from trainsim.measure.phase import FAST_PHASE_QUANTILE, fast_reference_s
    from trainsim.profile.database import ProfileDB

    timings: list[float] = []
    for ranks in (2, 4):
        cells_path = out / f"table4-g{ranks}.json"
        if cells_path.exists():
            for cell in json.loads(cells_path.read_text()).values():
                phase = cell["measured"].get("phase")
                if phase is not None:
                    timings += [t for pairs in phase["phase_probe_s_per_rank"] for pair in pairs for t in pair]
    with ProfileDB.open(out / "profile-cpu.db") as db:
        db_timings = db.probe_timings_s()
        op_fit = op_phase_fit(db, reference)
    timings += db_timings
    fast_s = sorted(timings)[min(len(timings) - 1, int(quantile * len(timings)))] if quantile != FAST_PHASE_QUANTILE \
        else fast_reference_s(timings)
    phase_db = out / "profile-cpu-phase.db"
    phase_db.unlink(missing_ok=True)
    with sqlite3.connect(out / "profile-cpu.db") as source, sqlite3.connect(phase_db) as copy:
        source.backup(copy)  # a consistent copy of the WAL database
    with ProfileDB.open(phase_db) as db:
        rewritten = db.normalise_op_phases(fast_s, reference)
        overheads = _normalise_overheads(out, db, fast_s, reference)
    record = {"reference_probe_s": fast_s, "quantile": quantile, "probe_reference": reference,
              "probe_timings": len(timings),
              "op_probe_median_s": statistics.median(db_timings) if db_timings else None,
              "ops_normalised": rewritten,
              "overhead_factors": overheads, "op_fit": op_fit}
    (out / "phase.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record), flush=True)
    return phase_db, fast_s


def profile_cpu(out: Path, models: list[str], ranks_list: tuple[int, ...] = (2, 4)) -> None:
    """Every cell's ops on the calling thread's CPU time (`trainsim profile`'s clock with one thread: what an op
    costs without the slices other processes take), beside G - 1 busy sibling processes running the same
    microbenchmarks (as the run's other ranks share the last-level cache and the memory bus): the costs that the
    ranks' CPU seconds per iteration are compared with. Collectives: --cpu-collectives (profile_cpu_collectives)."""
    db_path = out / "profile-cpu.db"
    for ranks in ranks_list:
        for model in models:
            profile_model(db_path, model, ranks, repeats=5, wall=False)
            print(f"cpu-time profile: {model} on {ranks} ranks", flush=True)


def profile_executor(out: Path, ranks: int = 2, probe: bool = False) -> dict[str, Any]:
    """The split executor's own cost per op and phase (profile/executor_overhead.py: a negligible model of each
    family through `trainsim measure --tree` on `ranks` gloo ranks, thread CPU time), into every database of
    the campaign (the same machine fact for the wall and the CPU-time predictions)."""
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.executor_overhead import FAMILIES, measure_executor_overhead, store_executor_overhead
    from trainsim.profile.ops import local_environment

    load = [Path("/proc/loadavg").read_text().split()[:3]]
    results = [measure_executor_overhead(family, world_size=ranks, iterations=20, phase_probe=probe)
               for family in FAMILIES]
    load.append(Path("/proc/loadavg").read_text().split()[:3])
    env = local_environment("cpu-local", "cpu")
    for name in ("profile-cpu.db", "profile-g2.db", "profile-g4.db"):
        if (out / name).exists():
            if probe:  # the probed figures replace any stored (inherited) ones rather than merge with them
                _delete_overhead_rows(out / name, "split-executor-cnn", "split-executor-transformer",
                                      "split-executor-dlrm")
            with ProfileDB.open(out / name) as db:
                for result in results:
                    store_executor_overhead(db, env, result)
    record = {"load_average_before_after": load, "world_size": ranks,
              "families": {r.family: {"per_op_s": r.per_op_s, "ops": r.ops, "kernel_s": r.kernel_s,
                                      "autograd_per_op_s": r.autograd_per_op_s, "iterations": r.iterations,
                                      **({"phase": r.probed_steps} if r.probed_steps else {})}
                           for r in results}}
    (out / "executor-overhead.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _delete_overhead_rows(db_path: Path, *impls: str) -> None:
    import sqlite3

    with sqlite3.connect(db_path) as db:
        db.executemany("DELETE FROM op_times WHERE kind='overhead' AND impl=?", [(impl,) for impl in impls])


def profile_reshards(out: Path, ranks: int = 2, probe: bool = False) -> dict[str, Any]:
    """The split executor's host cost per reshard step (profile/reshard_overhead.py: each collective's autograd
    function against its flat-buffer call on `ranks` gloo ranks, thread CPU time), into every database of the
    campaign (a machine fact, as the executor's cost per op)."""
    import torch

    from trainsim.profile.database import ProfileDB
    from trainsim.profile.ops import local_environment
    from trainsim.profile.reshard_overhead import (
        RESHARD_COLLECTIVES,
        RESHARD_IMPL,
        measure_reshard_overhead,
        store_reshard_overhead,
    )

    torch.set_num_threads(1)  # the environment recorded: the probe's ranks run one thread, as the measured ranks
    load = [Path("/proc/loadavg").read_text().split()[:3]]
    result = measure_reshard_overhead(world_size=ranks, probed=probe)
    load.append(Path("/proc/loadavg").read_text().split()[:3])
    env = local_environment("cpu-local", "cpu")
    for name in ("profile-cpu.db", "profile-g2.db", "profile-g4.db"):
        if (out / name).exists():
            if probe:
                _delete_overhead_rows(out / name, *(f"{RESHARD_IMPL}-{c}" for c in RESHARD_COLLECTIVES))
            with ProfileDB.open(out / name) as db:
                store_reshard_overhead(db, env, result)
    record = {"load_average_before_after": load, "world_size": ranks, "elements": result.elements,
              "calls": result.calls, "rounds": result.rounds,
              "per_step_s": {f"{c} {p}": v for (c, p), v in result.per_step_s.items()},
              "executor_bare_start_s": {f"{c} {p}": v for (c, p), v in result.calls_s.items()},
              **({"probe_s_per_rank": result.probe_s} if result.probe_s else {})}
    (out / "reshard-overhead.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def state_census(out: Path, models: list[str], ranks_list: tuple[int, ...], steps: int, warmup: int) -> dict[str, Any]:
    """Per model and rank count, the optimizer states the runs leave at zero (profile/state_census.py: the split
    executor's training numerics on the runs' samples and initialisation in one process, no clock), into every
    database of OUT: a fact of the runs' data, priced by the optimizer's zero-state step (cost/profiled.py)."""
    from trainsim.measure.split_model_files import dataflow_beside
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.state_census import count_zero_states

    record: dict[str, Any] = {}
    for ranks in ranks_list:
        for model in models:
            job = job_and_plan(model, STRATEGIES[0], ranks)[0]
            census = count_zero_states(job, steps, warmup, dataflow=dataflow_beside(settings(model, ranks)["model"]))
            for name in ("profile-cpu.db", "profile-g2.db", "profile-g4.db"):
                if (out / name).exists():
                    with ProfileDB.open(out / name) as db:
                        db.put_state_census(census)
            record[f"{model}/g{ranks}"] = {"samples": census.samples, "steps": steps,
                                           "zero_state_share": census.zero_state_share}
            print(f"{model} on {ranks} ranks: {census.zero_state_share:.4f} of the states zero", flush=True)
    (out / "state-census.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def summary(out: Path) -> dict[str, Any]:
    """Per cell (model, strategy, ranks) the error of each switch; per switch the average and maximum."""
    rows = []
    for ranks in (2, 4):
        path = out / f"table4-g{ranks}.json"
        if not path.exists():
            continue
        for key, cell in json.loads(path.read_text()).items():
            for clock, measured_key, predicted_key in (("wall", "median_s", "predicted"),
                                                       ("cpu", "cpu_s", "predicted_cpu"),
                                                       ("cpu-phase", "cpu_phase_s", "predicted_cpu_phase"),
                                                       ("cpu-phase-whole", "cpu_phase_whole_s",
                                                        "predicted_cpu_phase_whole")):
                measured = cell["measured"].get(measured_key)
                if not measured or predicted_key not in cell:
                    continue
                model, strategy = key.split("/")
                predicted = cell[predicted_key]
                errors = {b: abs(predicted[b] - measured) / measured
                          for b in ("proteus", "plain", "flexflow", "serial") if b in predicted}
                rows.append({"clock": clock, "model": model, "strategy": strategy, "ranks": ranks,
                             "measured_s": measured, **{f"{b}_s": predicted[b] for b in errors},
                             **{f"{b}_error": e for b, e in errors.items()}})
    overall = {clock: {b: {"average": statistics.fmean(r[f"{b}_error"] for r in rows if r["clock"] == clock),
                           "maximum": max(r[f"{b}_error"] for r in rows if r["clock"] == clock)}
                       for b in ("proteus", "plain", "flexflow", "serial")
                       if all(f"{b}_error" in r for r in rows if r["clock"] == clock)}
               for clock in ("wall", "cpu", "cpu-phase", "cpu-phase-whole") if any(r["clock"] == clock for r in rows)}
    result = {"cells": rows, "overall": overall}
    (out / "table4-summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'clock':<6}{'model':<20}{'plan':<5}{'ranks':>6}{'measured':>10}{'proteus':>9}{'plain':>9}{'flexflow':>9}"
          f"{'serial':>9}")
    for r in rows:
        print(f"{r['clock']:<6}{r['model']:<20}{r['strategy']:<5}{r['ranks']:>6}{r['measured_s'] * 1e3:>8.0f}ms"
              + "".join(f"{r.get(f'{b}_error', float('nan')) * 100:>8.1f}%"
                        for b in ("proteus", "plain", "flexflow", "serial")))
    for clock, per in overall.items():
        for b, v in per.items():
            print(f"{clock} {b}: average {v['average'] * 100:.1f}%, maximum {v['maximum'] * 100:.1f}%")
    (out / "table4.md").write_text(markdown(rows, overall))
    if "cpu-phase" in overall:
        (out / "table4-phase.md").write_text(phase_markdown(rows))
    return result


def inherit_facts(out: Path, source: Path) -> dict[str, Any]:
    """Copy the machine facts measured once (the split executor's cost per op and per reshard step, op kind
    "overhead" with impl split-executor*, and the census of zero optimizer states) from the CPU-time database
    `source` into OUT/profile-cpu.db (no timing): a phase campaign re-profiles the ops, not these."""
    import sqlite3

    from trainsim.profile.database import ProfileDB

    with ProfileDB.open(out / "profile-cpu.db"):
        pass  # the schema
    with sqlite3.connect(out / "profile-cpu.db") as db:
        db.execute("ATTACH DATABASE ? AS src", (str(source),))
        ops = db.execute("INSERT OR REPLACE INTO op_times SELECT * FROM src.op_times WHERE kind='overhead' AND "
                         "impl LIKE 'split-executor%'").rowcount
        census = db.execute("INSERT OR REPLACE INTO state_census SELECT * FROM src.state_census").rowcount
    record = {"from": str(source), "executor_rows": ops, "census_rows": census}
    (out / "inherited-facts.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def phase_markdown(rows: list[dict[str, Any]]) -> str:
    """A phase campaign's cells: measured raw -> normalised, each column's signed error raw -> normalised."""
    keyed = {(r["model"], r["strategy"], r["ranks"], r["clock"]): r for r in rows}
    lines = ["| cell | measured raw -> normalised | proteus | plain | flexflow |", "|---|---:|---:|---:|---:|"]
    for model, strategy, ranks in dict.fromkeys((r["model"], r["strategy"], r["ranks"]) for r in rows):
        raw, phase = keyed.get((model, strategy, ranks, "cpu")), keyed.get((model, strategy, ranks, "cpu-phase"))
        if raw is None or phase is None:
            continue
        errors = [f"{signed(raw, b):+.1f}% -> {signed(phase, b):+.1f}%" for b in ("proteus", "plain", "flexflow")]
        lines.append(f"| {model} {strategy.upper()} g{ranks} | {raw['measured_s'] * 1e3:.1f} -> "
                     f"{phase['measured_s'] * 1e3:.1f} ms | " + " | ".join(errors) + " |")
    return "\n".join(lines) + "\n"


def signed(row: dict[str, Any], column: str) -> float:
    return (row[f"{column}_s"] - row["measured_s"]) / row["measured_s"] * 100


def markdown(rows: list[dict[str, Any]], overall: dict[str, Any]) -> str:
    """docs/strategy-tree.md's table: per model and plan, the measured time and each switch's error per clock."""
    lines = ["| model | plan | ranks | measured wall | proteus | plain | flexflow | serial | measured CPU | proteus "
             "| plain | flexflow | serial |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    switches = ("proteus", "plain", "flexflow", "serial")
    keyed = {(r["model"], r["strategy"], r["ranks"], r["clock"]): r for r in rows}
    for model, strategy, ranks in dict.fromkeys((r["model"], r["strategy"], r["ranks"]) for r in rows):
        cells = [model, strategy.upper(), str(ranks)]
        for clock in ("wall", "cpu"):
            r = keyed.get((model, strategy, ranks, clock))
            cells += [f"{r['measured_s'] * 1e3:.0f} ms", *(f"{r[f'{b}_error'] * 100:.1f}%" if f"{b}_error" in r
                                                           else "-" for b in switches)] if r else ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    for stat in ("average", "maximum"):
        cells = [f"**{stat}**", "", ""]
        for clock in ("wall", "cpu"):
            per = overall.get(clock)
            cells += [""] + ([f"**{per[b][stat] * 100:.1f}%**" if b in per else "-" for b in switches]
                             if per else ["-"] * 4)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ranks", type=int, choices=(2, 4))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "proteus_table4")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="op samples per profiling pass")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--repredict", action="store_true", help="simulate the measured cells again, measure nothing")
    parser.add_argument("--executor-overhead", action="store_true", help="measure the split executor's cost per "
                        "op (a negligible model per family) into OUT's databases (no runs)")
    parser.add_argument("--reshard-overhead", action="store_true", help="measure the split executor's cost per "
                        "reshard step into OUT's databases (no runs)")
    parser.add_argument("--cpu-collectives", action="store_true", help="profile the collectives of 2 and 4 "
                        "ranks on the CPU clock into OUT/profile-cpu.db (replaces its collectives; no runs)")
    parser.add_argument("--collective-gap-ms", type=float, default=COLLECTIVE_GAP_S * 1e3, help="with "
                        "--cpu-collectives: compute before each call (0: back to back, the sweep before)")
    parser.add_argument("--collective-repeats", type=int, default=9, help="with --cpu-collectives: samples of "
                        "16 calls per collective and size (their median)")
    parser.add_argument("--pool-collectives", type=Path, metavar="SWEEPS", help="replace OUT/profile-cpu.db's "
                        "collectives by the median over the sweeps in SWEEPS (a collective-sweeps.json) taken with "
                        "--collective-gap-ms (no timing)")
    parser.add_argument("--state-census", action="store_true", help="count the optimizer states the runs leave "
                        "at zero (one process, no clock) into OUT's databases (--iterations, --warmup: the runs')")
    parser.add_argument("--phase-normalise", action="store_true", help="with --ranks: a campaign of the CPU "
                        "columns with the reference probe around every op sample and every step (phase_campaign); "
                        "with --repredict: also predict from the phase-normalised ops against the normalised runs")
    parser.add_argument("--phase-quantile", type=float, default=0.05, help="with --repredict --phase-normalise: "
                        "the quantile of the campaign's probe timings both sides are scaled to (0.05: measure.phase's "
                        "fast phase; 0.5: the campaign's median probe)")
    parser.add_argument("--phase-reference", choices=("mean", "before"), default="mean", help="with --repredict "
                        "--phase-normalise: a step's or sample's probe: the mean of the two around it, or the one "
                        "before it alone (measure.phase.pair_means_s)")
    parser.add_argument("--inherit-facts", type=Path, metavar="CPU_DB", help="copy the split executor's per-op "
                        "and per-reshard costs and the zero-state census from CPU_DB into OUT/profile-cpu.db")
    parser.add_argument("--cpu-profile", action="store_true", help="profile every cell's ops on thread CPU time "
                        "into OUT/profile-cpu.db (load-independent; no runs)")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    if args.summary:
        summary(args.out)
        return
    if args.inherit_facts:
        print(json.dumps(inherit_facts(args.out, args.inherit_facts), indent=1))
        return
    if args.executor_overhead:
        print(json.dumps(profile_executor(args.out, probe=args.phase_normalise), indent=1))
        return
    if args.cpu_collectives:
        print(json.dumps(profile_cpu_collectives(args.out, args.collective_repeats,
                                                    gap_s=args.collective_gap_ms / 1e3), indent=1))
        return
    if args.pool_collectives:
        print(json.dumps(pool_cpu_collectives(args.out, args.pool_collectives, args.collective_gap_ms / 1e3), indent=1))
        return
    if args.reshard_overhead:
        print(json.dumps(profile_reshards(args.out, probe=args.phase_normalise), indent=1))
        return
    if args.state_census:
        state_census(args.out, args.models.split(","), (args.ranks,) if args.ranks else (2, 4),
                     args.warmup + args.iterations, args.warmup)
        return
    if args.cpu_profile:
        profile_cpu(args.out, args.models.split(","), (args.ranks,) if args.ranks else (2, 4))
        return
    if args.ranks is None:
        parser.error("--ranks 2 or 4 (or --summary)")
    if args.repredict:
        phase_db, fast_s = (phase_profile(args.out, args.phase_quantile, args.phase_reference)
                            if args.phase_normalise else (None, 0.0))
        repredict(args.out / f"table4-g{args.ranks}.json", args.ranks, args.out / f"profile-g{args.ranks}.db",
                  args.out / "profile-cpu.db", phase_db, fast_s, args.phase_reference)
        return
    if args.phase_normalise:
        phase_campaign(args.ranks, args.out, args.iterations, args.warmup, args.repeats, args.models.split(","))
        return
    campaign(args.ranks, args.out, args.iterations, args.warmup, args.repeats, args.models.split(","))


if __name__ == "__main__":
    main()
