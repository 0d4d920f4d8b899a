"""Does the Table IV analogue's error come from short op samples? (docs/strategy-tree.md, the noise analysis.)

Per model on G ranks, in one campaign so that every variant sees the same load: the ops both plans run are
profiled four ways, then S1 and S2 are measured (scripts/proteus_table4.py's runs), and each variant's costs
are simulated (the proteus switch) against the same runs:

- wall-short: wall clock beside G - 1 busy sibling processes, samples of 0.2 ms (the Table IV campaign's);
- wall-long:  the same with samples of at least 20 ms (several scheduler slices: a rank's share of the core);
- cpu-short:  the calling thread's CPU time, samples of 0.2 ms (`trainsim profile`'s clock), no siblings;
- cpu-long:   thread CPU time, samples of at least 20 ms.

Wall variants are compared with the measured median iteration, CPU variants with the busiest rank's CPU
seconds per iteration. Collective curves are the Table IV campaign's (results/proteus_table4/profile-gG.db),
the same for every variant. NB: a sample repeats the op back to back after one cache flush, so a longer sample
is also a warmer one. Under the timing lock, about 3 minutes per model:

    flock -x /tmp/trainsim-timing.lock python scripts/proteus_table4_samples.py --ranks 2 \
        --models vgg19-small,gpt2-small --out results/proteus_table4_samples
"""

import argparse
import functools
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import proteus_table4 as t

LONG_SAMPLE_S = 0.02
VARIANTS = ("wall-short", "wall-long", "cpu-short", "cpu-long")


def _with_samples(long: bool) -> Any:
    """Patch profile.ops.time_callable's sample length; returns the original to restore."""
    import trainsim.profile.ops as ops

    original = ops.time_callable
    if long:
        ops.time_callable = functools.partial(original, min_sample_s=LONG_SAMPLE_S, max_inner=100_000)
    return original


def profile_variant(db: Path, model: str, ranks: int, variant: str, repeats: int) -> None:
    import torch

    import trainsim.profile.ops as ops
    from trainsim.profile.database import ProfileDB
    from trainsim.profile.job import hints_for
    from trainsim.strategy.device_slice import DeviceSlice

    original = _with_samples(variant.endswith("long"))
    try:
        if variant.startswith("wall"):
            t.profile_model(db, model, ranks, repeats)
            return
        torch.set_num_threads(1)  # ops.clock_for: thread CPU time with one thread
        for strategy in t.STRATEGIES:
            job, graph, plan = t.job_and_plan(model, strategy, ranks)
            with ProfileDB.open(db) as handle:
                ops.profile_graph(handle, ops.local_environment("cpu-local", "cpu"), t.split_graph(graph, plan, ranks),
                                  hints_for(job.model, DeviceSlice.of(job.parallel)), "cpu", warmup=1,
                                  repeats=repeats)
    finally:
        ops.time_callable = original


def copy_collectives(source: Path, target: Path) -> None:
    connection = sqlite3.connect(target)
    connection.execute("ATTACH DATABASE ? AS src", (str(source),))
    connection.execute("INSERT OR REPLACE INTO collective_times SELECT * FROM src.collective_times")
    connection.commit()
    connection.close()


def summary(out: Path, ranks: int) -> None:
    """Per variant the average error over the measured cells; the CPU variants also against the busiest rank's
    training-thread CPU seconds per iteration (measure's thread_cpu_s_per_rank: no gloo or sampler threads)."""
    cells = json.loads((out / f"samples-g{ranks}.json").read_text())
    errors: dict[str, list[float]] = {}
    for key, cell in cells.items():
        model, strategy = key.split("/")
        run = json.loads((out / "runs" / f"{model}-{strategy}-g{ranks}.json").read_text())
        threads = run["settings"].get("thread_cpu_s_per_rank")
        truth = {"wall": cell["measured"]["median_s"], "cpu": cell["measured"]["cpu_s"],
                 "thread": max(threads) / len(run["iteration_times_s"]) if threads else None}
        row = [f"{key:<22}", f"wall {truth['wall'] * 1e3:.0f} ms, cpu {truth['cpu'] * 1e3:.0f} ms" + (
            f", thread {truth['thread'] * 1e3:.0f} ms" if truth["thread"] else "")]
        for variant, seconds in cell["predicted"].items():
            clocks = ("wall",) if variant.startswith("wall") else ("cpu", "thread")
            for clock in clocks:
                if truth[clock]:
                    error = abs(seconds - truth[clock]) / truth[clock]
                    errors.setdefault(f"{variant} vs {clock}", []).append(error)
                    row.append(f"{variant} vs {clock} {error * 100:.1f}%")
        print("  ".join(row))
    for name, values in errors.items():
        print(f"{name}: average {sum(values) / len(values) * 100:.1f}% over {len(values)} cells")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2, choices=(2, 4))
    parser.add_argument("--models", default="vgg19-small,gpt2-small")
    parser.add_argument("--out", type=Path, default=t.ROOT / "results" / "proteus_table4_samples")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--summary", action="store_true", help="errors of the measured cells, measure nothing")
    args = parser.parse_args()
    if args.summary:
        summary(args.out, args.ranks)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    collectives = t.ROOT / "results" / "proteus_table4" / f"profile-g{args.ranks}.db"
    path = args.out / f"samples-g{args.ranks}.json"
    cells: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for model in args.models.split(","):
        started = time.time()
        dbs = {v: args.out / f"{model}-g{args.ranks}-{v}.db" for v in VARIANTS}
        for variant, db in dbs.items():
            db.unlink(missing_ok=True)
            profile_variant(db, model, args.ranks, variant, args.repeats)
            copy_collectives(collectives, db)
        for strategy in t.STRATEGIES:
            measured = t.measure(model, strategy, args.ranks, args.out, 4, 1)
            # every Table IV column (proteus, plain, flexflow, serial) per variant; the errors are the proteus one's
            columns = {v: t.predict(model, strategy, args.ranks, db) for v, db in dbs.items()}
            predicted = {v: values["proteus"] for v, values in columns.items()}
            errors = {}
            for v, seconds in predicted.items():
                truth = measured.get("median_s" if v.startswith("wall") else "cpu_s")
                errors[v] = abs(seconds - truth) / truth if truth else None
            cells[f"{model}/{strategy}"] = {"measured": measured, "predicted": predicted, "columns": columns,
                                            "errors": errors}
            print(model, strategy, {v: f"{e * 100:.1f}%" for v, e in errors.items() if e is not None}, flush=True)
            path.write_text(json.dumps(cells, indent=1) + "\n")
        print(f"{model}: {time.time() - started:.0f} s", flush=True)
    for v in VARIANTS:
        values = [c["errors"][v] for c in cells.values() if c["errors"].get(v) is not None]
        if values:
            print(f"{v}: average {sum(values) / len(values) * 100:.1f}% over {len(values)} cells")


if __name__ == "__main__":
    main()
