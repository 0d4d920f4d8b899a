"""Plan quality for real (issue 13, acceptance item 3): each stage planner's plan run end to end with
`trainsim measure` on this machine's CPU ranks, against the exhaustive planner's plan.

    python scripts/plan_quality.py search            # each planner's `trainsim search`, timed (resumable)
    python scripts/plan_quality.py references        # the exhaustive table's best plan per mesh (nothing run)
    python scripts/plan_quality.py measure           # every distinct plan run as a pipeline, interleaved
    python scripts/plan_quality.py summary           # the table of docs/planning.md
    python scripts/plan_quality.py all               # the four in turn
    python scripts/plan_quality.py all --case moe    # the MoE model instead (files in data/plan_quality/CASE)

The job (--case gpt): the GPT-style chain with a heavy head (data/stages/models/gpt-heavy-head.yaml: 8 blocks of
hidden 96, vocabulary 6144, the head as costly as ~4.4 blocks, so Megatron's even split is poor); --case moe: mixed
layer types (moe-small.yaml: every second block 4 experts, top-1). Global batch 32 of 64 tokens in 8
micro-batches, fp32, 4 gloo ranks of one thread each.

Planners (`trainsim search --planner stage|uniform --stage-costs ...`), each with its own fresh stage database
(nothing one planner measured is free for another) and restricted to what one ParallelSpec can run:
`--equal-meshes` (every stage on one submesh shape with one intra plan, layer ranges uneven) and `--stage-tp 1`
(dp inside a stage; tp over gloo ran ~0.9 s a step here). exhaustive: Alpa's DP over every stage measured;
predtop: PredTOP's DAG Transformer on 30% (+10% validation) of each mesh's stages; mpe: MPE's chain (nodes and
edges measured) with its holistic DP; uniform: Megatron's even splits, measured.

Timing: every `trainsim search` and every `trainsim measure` holds /tmp/trainsim-timing.lock (flock) while it
runs; the 1-minute load average is recorded before and after each. search: wall time and CPU time (the search
process and its rank processes: RUSAGE_CHILDREN) per planner, kept in OUT/search-PLANNER.json (a planner with a
file is skipped; one interrupted is redone from an empty database so its time is whole). measure: for repeat r,
every distinct plan in turn (the order rotated per repeat), one `trainsim measure` each (warm-up, then timed
iterations; its median iteration time), appended to OUT/measured.csv; (plan, repeat) rows already there are
skipped. summary: per plan the median over the repeats, and eq. 4 over its stages as the exhaustive planner
measured them alone (nothing run). MoE models run in `trainsim measure` with every expert on every rank (tp=1).
"""

import argparse
import csv
import fcntl
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path("/tmp/trainsim-timing.lock")
MODELS = {  # case -> model: a heavy head (uniform split poor), or mixed layer types (dense and MoE blocks)
    "gpt": ROOT / "data/stages/models/gpt-heavy-head.yaml",
    "moe": ROOT / "data/stages/models/moe-small.yaml",
}
RANKS, GLOBAL_BATCH, MICRO_BATCHES, SEQ_LEN = 4, 32, 8, 64
PLANNERS = {  # name -> (planner, stage costs)
    "exhaustive": ("stage", "measured"),
    "predtop": ("stage", "predtop"),
    "mpe": ("stage", "mpe"),
    "uniform": ("uniform", "measured"),
    # Alpa's full profiling: every stage on every submesh evaluated, also those no plan on 4 ranks holds (what the
    # exhaustive and PredTOP searches did before the ninth session)
    "exhaustive-every": ("stage", "measured"),
    "predtop-every": ("stage", "predtop"),
}
EXTRA_FLAGS = {"exhaustive-every": ["--every-stage"], "predtop-every": ["--every-stage"]}
DEFAULT_PLANNERS = ["exhaustive", "predtop", "mpe", "uniform"]
CSV_FIELDS = ["plan", "repeat", "median_s", "p10_s", "p90_s", "iterations", "rank_cpu_max_s", "rank_cpu_sum_s",
              "load1_before", "load1_after", "wall_s", "utc"]


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@contextmanager
def timing_lock() -> Iterator[None]:
    """flock(2) on the shared timing lock (what `flock /tmp/trainsim-timing.lock CMD` takes)."""
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def trainsim(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainsim", *args]


def relative(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def search_command(name: str, model: Path, db: Path) -> list[str]:
    planner, costs = PLANNERS[name]
    return trainsim("search", "--planner", planner, "--stage-costs", costs, "--equal-meshes", "--stage-tp", "1",
                    "--model", relative(model), "--cluster", "local-cpu", "--num-gpus", str(RANKS),
                    "--global-batch", str(GLOBAL_BATCH), "--seq-len", str(SEQ_LEN),
                    "--num-micro-batches", str(MICRO_BATCHES), "--precision", "fp32", "--stage-db", relative(db),
                    "--json", *EXTRA_FLAGS.get(name, []))


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def search(out: Path, model: Path, names: list[str]) -> None:
    for name in names:
        path = out / f"search-{name}.json"
        if path.exists():
            print(f"{name}: done ({path.name})", flush=True)
            continue
        db = out / "stages" / f"{name}.sqlite"
        for stale in db.parent.glob(db.name + "*"):  # an interrupted search: start over so its time is whole
            stale.unlink()
        db.parent.mkdir(parents=True, exist_ok=True)
        command = search_command(name, model, db)
        with timing_lock():
            before, cpu0, start = load1(), children_cpu_s(), time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
            wall, cpu, after = time.perf_counter() - start, children_cpu_s() - cpu0, load1()
        if done.returncode:
            raise SystemExit(f"{name}: trainsim search failed ({done.returncode}): {done.stderr[-2000:]}")
        report = json.loads(done.stdout)
        record = {"planner": name, "command": "trainsim " + " ".join(command[3:]), "wall_s": wall, "cpu_s": cpu,
                  "load1_before": before, "load1_after": after, "utc": datetime.now(UTC).isoformat(timespec="seconds"),
                  "report": report}
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name}: {plan_label(report)} predicted {report['plan']['iteration_s']:.4f} s, profiled "
              f"{report['profiled_configurations']}, wall {wall:.0f} s, cpu {cpu:.0f} s", flush=True)


def references(out: Path, model_path: Path) -> None:
    """The exhaustive table's best plan on each (mesh, intra plan) alone (Alpa's DP over the exhaustive planner's
    database, nothing measured): how eq. 4 ranks the runnable alternatives, measured too. OUT/reference-MESH.json."""
    from trainsim.catalog import load_cluster, load_model
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
    from trainsim.search.stage_costs import StageJob
    from trainsim.search.stage_dp import alpa_dp
    from trainsim.search.stage_search import StageSearchSettings, parallel_fields, plan_parallel, search_space
    from trainsim.strategy.stage_plan import num_units

    model = load_model(str(model_path))
    assert isinstance(model, TransformerSpec)
    cluster = load_cluster("local-cpu").with_num_gpus(RANKS).on_one_node()
    settings = StageSearchSettings(planner="stage", stage_costs="measured", global_batch=GLOBAL_BATCH,
                                   num_micro_batches=MICRO_BATCHES, seq_len=SEQ_LEN, equal_meshes=True, stage_tp=1)
    job = StageJob(model=model, cluster=cluster, micro_batch=GLOBAL_BATCH // MICRO_BATCHES,
                   num_micro_batches=MICRO_BATCHES, seq_len=SEQ_LEN)
    db = StageDatabase(out / "stages" / "exhaustive.sqlite")
    costs = MeasuredStageCosts(model, job.micro_batch, SEQ_LEN, db)
    meshes, plans = search_space(model, cluster, settings)
    for mesh in meshes:
        for intra in plans[mesh]:
            found = alpa_dp(costs, num_units(model), [mesh], {mesh: [intra]}, RANKS, MICRO_BATCHES,
                            job.capacity_bytes)
            assert costs.measured_now == 0, "the exhaustive search's database lacks a stage: run search first"
            parallel = plan_parallel(found.plan, settings)
            assert parallel is not None
            name = f"reference-{mesh.describe()}-{intra.describe()}"
            report = {"plan": found.plan.to_dict(), "parallel": parallel_fields(parallel),
                      "sim_iteration_s": None, "profiled_configurations": 0, "stage_evaluations": 0}
            record = {"planner": name, "wall_s": None, "cpu_s": None, "load1_before": None, "load1_after": None,
                      "report": report}
            (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
            print(f"{name}: {plan_label(report)} predicted {found.plan.iteration_s:.4f} s", flush=True)
    db.close()


def plan_label(report: dict[str, Any]) -> str:
    """A plan in one token: stages as units[first,end) on mesh x dp, e.g. 0-7@1x2dp2+7-10@1x2dp2."""
    return "+".join(f"{s['units'][0]}-{s['units'][1]}@{s['mesh']}dp{s['dp']}" for s in report["plan"]["stages"])


def measure_flags(parallel: dict[str, Any]) -> list[str]:
    """`trainsim measure` flags running a stage plan's ParallelSpec (search's `parallel`)."""
    flags = ["--tp", str(parallel["tp"]), "--pp", str(parallel["pp"]), "--dp", str(parallel["dp"]),
             "--micro-batch", str(parallel["micro_batch"]), "--global-batch", str(parallel["global_batch"]),
             "--seq-len", str(parallel["seq_len"]), "--precision", parallel["precision"],
             "--schedule", parallel["schedule"]]
    if parallel["stage_layers"]:
        flags += ["--stage-layers", ",".join(str(n) for n in parallel["stage_layers"])]
    return flags


def searched(out: Path) -> dict[str, dict[str, Any]]:
    """The planners' records (in PLANNERS order), then the reference plans' (references)."""
    found = {}
    for name in PLANNERS:
        path = out / f"search-{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    for path in sorted(out.glob("reference-*.json")):
        record = json.loads(path.read_text())
        found[record["planner"]] = record
    return found


def distinct_plans(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """plan label -> its ParallelSpec fields, in planner order (a plan two planners chose is run once)."""
    plans: dict[str, dict[str, Any]] = {}
    for record in records.values():
        report = record["report"]
        if report["parallel"] is None:
            raise SystemExit(f"{record['planner']}: its plan is not one ParallelSpec: {plan_label(report)}")
        plans.setdefault(plan_label(report), report["parallel"])
    return plans


def done_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def measure(out: Path, model: Path, repeats: int, iterations: int, warmup: int) -> None:
    plans = distinct_plans(searched(out))
    if not plans:
        raise SystemExit("no searched plans: run `search` first")
    path = out / "measured.csv"
    have = {(row["plan"], int(row["repeat"])) for row in done_rows(path)}
    labels = list(plans)
    for repeat in range(repeats):
        order = labels[repeat % len(labels):] + labels[:repeat % len(labels)]  # interleaved, rotated
        for label in order:
            if (label, repeat) in have:
                continue
            row = measure_once(model, label, plans[label], repeat, iterations, warmup)
            new = not path.exists()
            with path.open("a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
                if new:
                    writer.writeheader()
                writer.writerow(row)
            print(f"repeat {repeat} {label}: median {row['median_s']:.4f} s (load {row['load1_before']:.2f})",
                  flush=True)


def measure_once(model: Path, label: str, parallel: dict[str, Any], repeat: int, iterations: int,
                 warmup: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        command = trainsim("measure", "--model", relative(model), *measure_flags(parallel), "--iterations",
                           str(iterations), "--warmup", str(warmup), "--threads", "1", "--out", tmp, "--json")
        with timing_lock():
            before, start = load1(), time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
            wall, after = time.perf_counter() - start, load1()
    if done.returncode:
        raise SystemExit(f"{label}: trainsim measure failed ({done.returncode}): {done.stderr[-2000:]}")
    run = json.loads(done.stdout)
    times = run["iteration_times_s"]
    deciles = statistics.quantiles(times, n=10)
    rank_cpu = [cpu / len(times) for cpu in run["settings"]["cpu_s_per_rank"]]  # per timed iteration
    return {"plan": label, "repeat": repeat, "median_s": statistics.median(times), "p10_s": deciles[0],
            "p90_s": deciles[-1], "iterations": len(times), "rank_cpu_max_s": max(rank_cpu),
            "rank_cpu_sum_s": sum(rank_cpu), "load1_before": before, "load1_after": after,
            "wall_s": round(wall, 1), "utc": datetime.now(UTC).isoformat(timespec="seconds")}


def exhaustive_table_s(out: Path, model_path: Path, report: dict[str, Any], table: str = "exhaustive") -> float | None:
    """Eq. 4 over the plan's stages as the exhaustive planner measured them alone (its database, OUT/stages/
    TABLE.sqlite; nothing run): the plan's cost on the table every planner estimates, apart from the pipeline
    runs' noise."""
    from trainsim.catalog import load_model
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.measure.stage_db import StageDatabase, model_key

    path = out / "stages" / f"{table}.sqlite"
    if not path.exists():
        return None
    model = load_model(str(model_path))
    assert isinstance(model, TransformerSpec)
    with tempfile.TemporaryDirectory() as tmp:  # a copy: opening the committed file would rewrite its header
        copy = Path(tmp) / path.name
        for part in path.parent.glob(path.name + "*"):  # the database and its write-ahead log, if any
            shutil.copyfile(part, Path(tmp) / part.name)
        return _table_time_s(StageDatabase(copy), model_key(model), report)


def _table_time_s(db: Any, key: str, report: dict[str, Any]) -> float | None:
    from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec, pipeline_time_s

    try:
        latencies = []
        for stage in report["plan"]["stages"]:
            nodes, devices = (int(n) for n in stage["mesh"].split("x"))
            spec = StageSpec(stage["units"][0], stage["units"][1], Mesh(nodes, devices),
                             IntraPlan(stage["tp"], stage["dp"], stage["sp"]))
            found = db.get(key, GLOBAL_BATCH // MICRO_BATCHES, SEQ_LEN, 1, spec)
            if found is None:
                return None
            latencies.append(found.latency_s)
    finally:
        db.close()
    return pipeline_time_s(latencies, MICRO_BATCHES)


def _medians(rows: list[dict[str, str]], column: str) -> dict[str, float]:
    return {label: statistics.median(float(r[column]) for r in rows if r["plan"] == label)
            for label in {r["plan"] for r in rows}}


def summary(out: Path, model_path: Path, table_name: str = "exhaustive") -> dict[str, Any]:
    """Per planner: its plan, eq. 4's prediction and eq. 4 over the exhaustive table, the medians over the repeats
    of the measured iteration (wall clock) and of the busiest rank's CPU time per iteration, the gaps to the
    exhaustive plan, the search's cost."""
    records = searched(out)
    rows = done_rows(out / "measured.csv")
    wall, cpu = _medians(rows, "median_s"), _medians(rows, "rank_cpu_max_s")
    repeats = {label: sum(r["plan"] == label for r in rows) for label in wall}
    base = plan_label(records[table_name]["report"]) if table_name in records else None

    def gap(medians: dict[str, float], label: str) -> float | None:
        if label not in medians or base not in medians:
            return None
        return medians[label] / medians[base] - 1.0

    table = []
    for name, record in records.items():
        report = record["report"]
        label = plan_label(report)
        table.append({
            "planner": name, "plan": label, "parallel": report["parallel"],
            "predicted_s": report["plan"]["iteration_s"], "sim_s": report["sim_iteration_s"],
            "exhaustive_table_s": exhaustive_table_s(out, model_path, report, table_name),
            "measured_median_s": wall.get(label), "gap_to_exhaustive": gap(wall, label),
            "busiest_rank_cpu_s": cpu.get(label), "cpu_gap_to_exhaustive": gap(cpu, label),
            "repeats": repeats.get(label, 0), "search_wall_s": record["wall_s"], "search_cpu_s": record["cpu_s"],
            "profiled_configurations": report["profiled_configurations"],
            "stage_evaluations": report["stage_evaluations"], "load1": [record["load1_before"], record["load1_after"]],
        })
    loads = [float(r[k]) for r in rows for k in ("load1_before", "load1_after")]
    result = {"table": table, "measure_load1_range": [min(loads), max(loads)] if loads else None,
              "measure_runs": len(rows)}
    name = "summary.json" if table_name == "exhaustive" else f"summary-{table_name}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")

    def fmt(value: float | None, text: str) -> str:
        return "-" if value is None else text.format(value)

    print("| planner | plan | predicted (eq. 4) | eq. 4, exhaustive table | measured median (wall) | vs exhaustive | "
          "busiest rank CPU | vs exhaustive | search wall / CPU | profiled stages | stage evaluations |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in table:
        print(f"| {row['planner']} | {row['plan']} | {row['predicted_s']:.3f} s | "
              f"{fmt(row['exhaustive_table_s'], '{:.3f} s')} | "
              f"{fmt(row['measured_median_s'], '{:.3f} s')} ({row['repeats']}) | "
              f"{fmt(row['gap_to_exhaustive'] and 100 * row['gap_to_exhaustive'], '{:+.1f}%')} | "
              f"{fmt(row['busiest_rank_cpu_s'], '{:.3f} s')} | "
              f"{fmt(row['cpu_gap_to_exhaustive'] and 100 * row['cpu_gap_to_exhaustive'], '{:+.1f}%')} | "
              f"{fmt(row['search_wall_s'], '{:.0f}')} / {fmt(row['search_cpu_s'], '{:.0f} s')} | "
              f"{row['profiled_configurations']} | "
              f"{row['stage_evaluations']} |")
    print(f"measure runs {len(rows)}, load average {result['measure_load1_range']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["search", "references", "measure", "summary", "all"])
    parser.add_argument("--case", choices=list(MODELS), default="gpt")
    parser.add_argument("--out", type=Path, default=None, help="default: data/plan_quality/CASE")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--table", choices=["exhaustive", "exhaustive-every"], default="exhaustive",
                        help="summary: the exhaustive search whose stage table scores every plan and whose plan is "
                        "the baseline (summary-TABLE.json when not the default)")
    parser.add_argument("--planners", nargs="*", choices=list(PLANNERS), default=DEFAULT_PLANNERS,
                        help="search only these (the cheap ones first to try the script)")
    args = parser.parse_args()
    out: Path = args.out or ROOT / "data/plan_quality" / args.case
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # PredTOP's training on one thread: a shared 2-core machine
    if args.command in ("search", "all"):
        search(out, MODELS[args.case], args.planners)
    if args.command in ("references", "all"):
        references(out, MODELS[args.case])
    if args.command in ("measure", "all"):
        measure(out, MODELS[args.case], args.repeats, args.iterations, args.warmup)
    if args.command in ("summary", "all"):
        summary(out, MODELS[args.case], args.table)


if __name__ == "__main__":
    main()
