"""Coverage of `trainsim validate` on rows shaped like published multi-node runs: draw rows of the runs.csv schema
(tests/unit/validate/published_rows.py), predict each through the path validate takes (validate/predict_runs.py
predict_rows, one engine), and count the outcomes: predicted, refused (the reason, by its first words),
exception, non-finite, insane (a model-FLOPs MFU above 1), slow (over 2 s analytical, 20 s
simulated), over_limit (stopped at 30 s / 120 s).

    python scripts/row_coverage.py --examples 400 [--engine sim --examples 20] [--seed 1] [--show 5]

Run under the timing lock (flock /tmp/trainsim-timing.lock ...) when the slow counts matter."""

import argparse
import collections
import math
import re
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType

from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.unit.validate.published_rows import published_rows, rule_breaking_rows

from trainsim.estimate.engines import make_engine
from trainsim.pipeline import GraphCache
from trainsim.validate.predict_runs import predict_rows
from trainsim.validate.runs import RunRow


class _OverLimit(BaseException):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _OverLimit()


def classify(fields: dict[str, str], engine: str, slow_s: float, limit_s: float) -> tuple[str, str]:
    """(outcome, detail) of one row."""
    estimator = make_engine(engine, "roofline", None)
    row = RunRow(fields["run_id"], fields["source"], fields["metric"], float(fields["value"]), fields)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    start = time.perf_counter()
    try:
        [prediction] = predict_rows([row], estimator, graphs=GraphCache())
    except _OverLimit:
        return "over_limit", f">{limit_s:.0f} s"
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return "exception", f"{type(exc).__name__}: {str(exc)[:120]} ({Path(frame.filename).name}:{frame.lineno})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    elapsed_s = time.perf_counter() - start
    if prediction.skipped is not None:
        return "refused", prediction.skipped
    value = prediction.predicted
    if value is None or not math.isfinite(value) or value <= 0:
        return "non_finite", repr(value)
    if fields["metric"] == "mfu" and fields.get("flops_convention") != "megatron-eq3" and value > 1:
        return "insane", f"mfu {value:.3g} > 1"
    if elapsed_s > slow_s:
        return "slow", f"{elapsed_s:.1f} s, {fields['num_gpus']} GPUs"
    return "predicted", ""


def _reason(detail: str) -> str:
    """A refusal's kind: its message without the numbers and names that vary from row to row."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'|\"[^\"]*\"", "'X'", detail))[:110]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--engine", default="analytical")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--broken", action="store_true", help="rows that break one rule (must all be refused)")
    parser.add_argument("--show", type=int, default=3, help="example rows printed per failure kind")
    args = parser.parse_args()
    slow_s, limit_s = (20.0, 120.0) if args.engine == "sim" else (2.0, 30.0)
    outcomes: collections.Counter[str] = collections.Counter()
    reasons: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    shown: dict[str, list[str]] = collections.defaultdict(list)
    strategy = rule_breaking_rows().map(lambda pair: pair[0]) if args.broken else published_rows()

    @seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(strategy)
    def run(fields: dict[str, str]) -> None:
        outcome, detail = classify(fields, args.engine, slow_s, limit_s)
        outcomes[outcome] += 1
        kind = _reason(detail) if outcome == "refused" else detail[:110]
        reasons[outcome][kind] += 1
        if outcome != "predicted" and len(shown[kind]) < args.show:
            cells = ("arch", "num_layers", "hidden", "num_heads", "num_kv_heads", "vocab", "seq_len", "gpu",
                     "cluster", "num_gpus", "gpus_per_node", "tp", "pp", "dp", "cp", "ep", "sp", "vpp",
                     "micro_batch", "global_batch", "zero", "recompute", "precision", "metric", "notes")
            shown[kind].append(" ".join(f"{c}={fields.get(c, '')}" for c in cells))

    run()
    total = sum(outcomes.values())
    print(f"{args.engine}: {total} rows, seed {args.seed}{' (rule-breaking)' if args.broken else ''}")
    for outcome, count in outcomes.most_common():
        print(f"  {outcome:<11} {count:>5} ({100 * count / total:.1f}%)")
        if outcome == "predicted":
            continue
        for kind, n in reasons[outcome].most_common():
            print(f"      {n:>4}  {kind}")
            for example in shown.get(kind, []):
                print(f"            {example}")


if __name__ == "__main__":
    main()
