"""Is a gap between two plans real? Both plans run alternately with `trainsim measure`, and the stages that decide
them measured alone alternately, every run under the timing lock (issue 13, plan quality).

    python scripts/plan_noise.py --case moe --rounds 4 --out data/plan_quality/moe-v10/noise.jsonl \
        --plans 0-4@1x1dp1+4-7@1x1dp1+7-9@1x1dp1+9-10@1x1dp1 0-4@1x1dp1+4-6@1x1dp1+6-8@1x1dp1+8-10@1x1dp1 \
        --stages 0-4@1x1 4-7@1x1 7-9@1x1 9-10@1x1 4-6@1x1 6-8@1x1 8-10@1x1

Plans are plan_quality.py's labels (stages units[first,end) on mesh x dp, every stage on one mesh shape with dp
inside); each round runs every plan once (the order rotated per round) with plan_quality.measure_once, then every
stage once (measure.stage: CPU time of one micro-batch's forward and backward, median of `--stage-iterations`,
the way the exhaustive planner measured them). One JSON row per run, with the load average before it.
"""

import argparse
import json
import re
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from plan_quality import GLOBAL_BATCH, MICRO_BATCHES, MODELS, SEQ_LEN, load1, measure_once, timing_lock

from trainsim.catalog import load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage import measure_stages
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec, pipeline_time_s

PLAN_STAGE = re.compile(r"(\d+)-(\d+)@1x(\d+)dp(\d+)")
STAGE = re.compile(r"(\d+)-(\d+)@1x(\d+)")
MICRO_BATCH = GLOBAL_BATCH // MICRO_BATCHES


def parallel_of(label: str, model: TransformerSpec) -> dict[str, Any]:
    """The ParallelSpec fields of a plan label whose stages share one 1 x m mesh with dp m."""
    stages = [tuple(map(int, m.groups())) for m in PLAN_STAGE.finditer(label)]
    dps = {dp for _, _, _, dp in stages}
    text = "+".join(f"{a}-{b}@1x{m}dp{d}" for a, b, m, d in stages)
    if not stages or len(dps) != 1 or len({m for _, _, m, _ in stages}) != 1 or text != label:
        raise SystemExit(f"plan {label!r}: stages must be FIRST-END@1xMdpM on one mesh shape")
    last = 1 + model.num_layers  # the head's unit
    # blocks per stage: units 1 .. L are blocks; the embedding (unit 0) and the head (unit L + 1) add none
    blocks = [min(b, last) - max(a, 1) for a, b, _, _ in stages]
    dp = dps.pop()  # a micro-batch split over the stage's dp ranks (search's `parallel`)
    return {"tp": 1, "dp": dp, "pp": len(stages), "micro_batch": MICRO_BATCH // dp, "global_batch": GLOBAL_BATCH,
            "seq_len": SEQ_LEN, "precision": "fp32", "schedule": "1f1b", "stage_layers": blocks}


def stage_of(label: str) -> StageSpec:
    match = STAGE.fullmatch(label)
    if match is None:
        raise SystemExit(f"stage {label!r}: must be FIRST-END@1xM")
    first, end, m = map(int, match.groups())
    return StageSpec(first, end, Mesh(1, m), IntraPlan(1, m))


def round_table(rows: list[dict[str, Any]], plans: list[str]) -> list[dict[str, Any]]:
    """Per round: each plan's wall median and busiest-rank CPU time from its run, and eq. 4 over that round's stages
    measured alone (None where a stage of the plan was not measured), each against the first plan's."""
    out = []
    rounds = {row.get("repeat", row.get("round")) for row in rows}
    for r in sorted(r for r in rounds if r is not None):
        stages = {row["stage"]: row["latency_ms"] for row in rows if row["kind"] == "stage" and row["round"] == r}
        runs = {row["plan"]: row for row in rows if row["kind"] == "plan" and row["repeat"] == r}
        entry: dict[str, Any] = {"round": r}
        for label in plans:
            parts = [f"{a}-{b}@1x{m}" for a, b, m, _ in (map(int, g.groups()) for g in PLAN_STAGE.finditer(label))]
            eq4 = (pipeline_time_s([stages[p] for p in parts], MICRO_BATCHES) if all(p in stages for p in parts)
                   else None)
            run = runs.get(label, {})
            entry[label] = {"wall_s": run.get("median_s"), "cpu_s": run.get("rank_cpu_max_s"), "eq4_ms": eq4}
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=list(MODELS), default="moe")
    parser.add_argument("--plans", nargs="*", default=[])
    parser.add_argument("--stages", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--stage-iterations", type=int, default=4)  # the exhaustive planner's median of 4
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary", action="store_true", help="print the rounds already in --out (nothing run)")
    args = parser.parse_args()
    if args.summary:
        rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
        first, *rest = args.plans
        for entry in round_table(rows, args.plans):
            base = entry[first]
            cells = [f"round {entry['round']}: {first} wall {base['wall_s']:.3f} s, CPU {base['cpu_s']:.3f} s, "
                     f"eq. 4 {base['eq4_ms'] or float('nan'):.1f} ms"]
            for label in rest:
                e = entry[label]
                cells.append(f"{label}: wall {100 * (e['wall_s'] / base['wall_s'] - 1):+.1f}%, CPU "
                             f"{100 * (e['cpu_s'] / base['cpu_s'] - 1):+.1f}%, eq. 4 "
                             + (f"{100 * (e['eq4_ms'] / base['eq4_ms'] - 1):+.1f}%" if e["eq4_ms"] and base["eq4_ms"]
                                else "-"))
            print("; ".join(cells))
        return
    model = load_model(str(MODELS[args.case]))
    assert isinstance(model, TransformerSpec)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(row), flush=True)
        with args.out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    for r in range(args.rounds):
        order = args.plans[r % max(1, len(args.plans)):] + args.plans[:r % max(1, len(args.plans))]
        for label in order:
            row = measure_once(MODELS[args.case], label, parallel_of(label, model), r, args.iterations, args.warmup)
            emit({"kind": "plan", **row})
        for label in args.stages:
            stage = stage_of(label)
            with timing_lock():
                before = load1()
                timing = measure_stages(model, [stage], MICRO_BATCH, SEQ_LEN, args.warmup, args.stage_iterations)[0]
            emit({"kind": "stage", "stage": label, "round": r, "latency_ms": 1e3 * timing.latency_s,
                  "samples_ms": [round(1e3 * s, 3) for s in timing.samples_s],
                  "spread_ms": 1e3 * (max(timing.samples_s) - min(timing.samples_s)),
                  "median_check_ms": 1e3 * statistics.median(timing.samples_s), "load1_before": before,
                  "utc": datetime.now(UTC).isoformat(timespec="seconds")})


if __name__ == "__main__":
    main()
