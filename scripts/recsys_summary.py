"""Error tables of the DLRM experiments (data/recsys/cpu/*_predicted.csv): geomean and max |error| per predictor,
rank count and task kind; sharder-selection success. Usage: python scripts/recsys_summary.py"""

import csv
import math
from collections import defaultdict
from pathlib import Path

OUT = Path("data/recsys/cpu")
PREDICTORS = ("roofline_alpha_beta_s", "mlp_sigmoid_s", "mlp_sigmoid_sim_s", "max_sum_s", "trace_predicted_s",
              "trace_replay_s")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values)) if values else float("nan")


def e2e() -> None:
    rows = list(csv.DictReader((OUT / "e2e_predicted.csv").open()))
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["ranks"], r["kind"])].append(r)
        groups[("all", "all")].append(r)
    print(f"{'ranks':<6}{'tasks':<8}{'n':>4}  " + "  ".join(f"{p[:-2]:>22}" for p in PREDICTORS))
    for key in sorted(groups):
        rs = groups[key]
        cells = []
        for p in PREDICTORS:
            errors = [abs(float(r[p]) - float(r["measured_s"])) / float(r["measured_s"]) for r in rs if r.get(p)]
            cells.append(f"{geomean(errors) * 100:9.1f}% / {max(errors, default=float('nan')) * 100:7.1f}%")
        print(f"{key[0]:<6}{key[1]:<8}{len(rs):>4}  " + "  ".join(f"{c:>22}" for c in cells))
    predict = sum(float(r["predict_s"]) for r in rows)
    print(f"prediction time for all {len(rows)} rows: {predict:.1f} s")


def sharding(predictor: str = "mlp_sigmoid_s") -> None:
    path = OUT / "sharding_predicted.csv"
    if not path.exists():
        return
    by_task: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in csv.DictReader(path.open()):
        by_task[r["task"]].append(r)
    hits5 = hits10 = 0
    for task, rs in sorted(by_task.items()):
        best = min(rs, key=lambda r: float(r["measured_s"]))
        pick = min(rs, key=lambda r: float(r[predictor]))
        gap = float(pick["measured_s"]) / float(best["measured_s"]) - 1.0
        hits5 += gap <= 0.05
        hits10 += gap <= 0.10
        print(f"{task}: predicted fastest {pick['sharder']} ({float(pick[predictor]) * 1e3:.1f} ms predicted, "
              f"{float(pick['measured_s']) * 1e3:.1f} ms measured); measured fastest {best['sharder']} "
              f"({float(best['measured_s']) * 1e3:.1f} ms); gap {gap * 100:.1f}%")
    print(f"success (within 5%): {hits5}/{len(by_task)}; within 10% (the paper's criterion): {hits10}/{len(by_task)}")


if __name__ == "__main__":
    e2e()
    sharding()
