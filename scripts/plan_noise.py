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
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec

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
    args = parser.parse_args()
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
