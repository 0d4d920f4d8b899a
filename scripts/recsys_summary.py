"""Error tables of the DLRM experiments (data/recsys/cpu/*_predicted.csv): geomean and max |error| per predictor,
rank count and task kind; sharder-selection success. Usage: python scripts/recsys_summary.py

  python scripts/recsys_summary.py groups A/predicted.csv B/predicted.csv [pred_s,...]   # per ranks x kind x batch
  python scripts/recsys_summary.py load-turns A/predicted.csv B/predicted.csv   # turns by ranks or by the load
  python scripts/recsys_summary.py shard-picks CAMPAIGN.csv SHARD_DIR   # `trainsim shard --json` picks, measured
"""

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

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


def sharding(predictors: tuple[str, ...] = ("mlp_sigmoid_s", "roofline_alpha_beta_s", "max_sum_s")) -> None:
    """Per rank count: each predictor's pick against the measured fastest (success: within 5%; the paper's
    criterion: within 10%), the chance of a random pick meeting it, and the measured spread of each config over
    its iterations (the noise the picks are judged under)."""
    path = OUT / "sharding_predicted.csv"
    if not path.exists():
        return
    by_task: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in csv.DictReader(path.open()):
        by_task[(r["ranks"], r["task"])].append(r)
    spreads = _iteration_spreads()
    for ranks in sorted({k[0] for k in by_task}):
        tasks = {k: v for k, v in by_task.items() if k[0] == ranks}
        print(f"{ranks} ranks, {len(tasks)} heavy tasks x 6 sharders")
        fastest = _fastest_iterations()
        for predictor in predictors:
            for statistic in ("median", "fastest"):
                hits5 = hits10 = 0
                for (_, name), rs in sorted(tasks.items()):
                    measured = {r["sharder"]: float(r["measured_s"]) if statistic == "median"
                                else fastest[(ranks, name, r["sharder"])] for r in rs}
                    best = min(measured, key=lambda k: measured[k])
                    pick = min(rs, key=lambda r: float(r[predictor]))
                    gap = measured[pick["sharder"]] / measured[best] - 1.0
                    hits5 += gap <= 0.05
                    hits10 += gap <= 0.10
                    if predictor == predictors[0] and statistic == "median":
                        print(f"  {name}: predicted fastest {pick['sharder']} ({float(pick[predictor]) * 1e3:.1f} ms "
                              f"predicted, {measured[pick['sharder']] * 1e3:.1f} ms measured); measured fastest "
                              f"{best} ({measured[best] * 1e3:.1f} ms); gap {gap * 100:.1f}%")
                print(f"  {predictor[:-2]} vs the {statistic} iteration: within 5% {hits5}/{len(tasks)}, "
                      f"within 10% {hits10}/{len(tasks)}")
        chance5 = sum(sum(float(r["measured_s"]) <= 1.05 * min(float(q["measured_s"]) for q in rs) for r in rs)
                      / len(rs) for rs in tasks.values())
        chance10 = sum(sum(float(r["measured_s"]) <= 1.10 * min(float(q["measured_s"]) for q in rs) for r in rs)
                       / len(rs) for rs in tasks.values())
        print(f"  a random pick: within 5% {chance5:.1f}/{len(tasks)}, within 10% {chance10:.1f}/{len(tasks)} "
              "(expected)")
        values = [v for (r, _), v in spreads.items() if r == ranks]
        if values:
            print(f"  measured spread of a config over its iterations ((max - min) / median): median "
                  f"{np.median(values) * 100:.0f}%, p90 {np.percentile(values, 90) * 100:.0f}%")
        times = sum(float(r["predict_s"]) for rs in tasks.values() for r in rs)
        print(f"  selection time: predicting all {sum(len(v) for v in tasks.values())} plans {times:.1f} s")


def _fastest_iterations() -> dict[tuple[str, str, str], float]:
    """(ranks, task, sharder) -> the fastest measured iteration (other processes only ever add time)."""
    path = OUT / "sharding_traces.jsonl"
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        t = json.loads(line)
        out[(str(t["ranks"]), t["task"], t["sharder"])] = min(t["iterations_s"])
    return out


def _iteration_spreads() -> dict[tuple[str, str], float]:
    path = OUT / "sharding_traces.jsonl"
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        t = json.loads(line)
        its = t["iterations_s"]
        out[(str(t["ranks"]), f"{t['task']}/{t['sharder']}")] = (max(its) - min(its)) / float(np.median(its))
    return out


def groups(paths: list[Path], predictors: tuple[str, ...]) -> None:
    """Predicted campaigns (scripts/recsys_quiet.py predict's *_predicted.csv) side by side: per file, rank count,
    task kind and local batch, each predictor's geomean / max |error| against the measured median iteration and
    its median signed error; the host's 1-minute load over the group's runs."""
    print(f"{'ranks':<6}{'kind':<8}{'batch':>6}{'n':>4}{'load':>11}  " + "".join(f"{p[:-2]:>24}" for p in predictors))
    for path in paths:
        rows = list(csv.DictReader(path.open()))
        keyed: dict[tuple[str, str, str], list[dict[str, str]]] = defaultdict(list)
        for r in rows:
            for kind in (r["kind"], "all"):
                for batch in (r["local_batch"], "all"):
                    keyed[(r["ranks"], kind, batch)].append(r)
        print(str(path))
        for key in sorted(keyed, key=lambda k: (k[0], k[1] == "all", k[1], k[2] == "all", k[2].zfill(6))):
            rs, cells = keyed[key], []
            for p in predictors:
                errors = [float(r[p]) / float(r["measured_s"]) - 1.0 for r in rs if r.get(p)]
                cells.append(f"{geomean([abs(e) for e in errors]) * 100:5.1f}/{max(map(abs, errors)) * 100:4.0f}% "
                             f"({float(np.median(errors)) * 100:+4.0f})")
            loads = [float(r[k]) for r in rs for k in ("load_before", "load_after")]
            print(f"{key[0]:<6}{key[1]:<8}{key[2]:>6}{len(rs):>4}{min(loads):>5.1f}-{max(loads):<5.1f}  "
                  + "".join(f"{c:>24}" for c in cells))


def load_turns(paths: list[Path], predictors: tuple[str, ...] = ("host_s", "insitu_trace_predicted_s"),
               cores: int = 2) -> None:
    """An analysis, not a predictor: a predictor's iteration without turns on shared cores (its ranks / cores
    stretch taken back out), then stretched by ranks / cores (what the predictors do) or by the host's measured
    1-minute load / cores (every runnable thread taking its turn: the mean of the load before and after the run,
    which counts the ranks themselves); geomean |error| (median signed) against the measured median iteration."""
    for path in paths:
        rows = list(csv.DictReader(path.open()))
        for predictor in predictors:
            cells, ratios, loads = [], [], []
            for label in ("no turns", "ranks/cores", "load/cores"):
                errors = []
                for r in rows:
                    share = min(1.0, cores / int(r["ranks"]))
                    bare = float(r[predictor]) * share
                    load = (float(r["load_before"]) + float(r["load_after"])) / 2
                    stretch = {"no turns": 1.0, "ranks/cores": 1.0 / share, "load/cores": max(1.0, load / cores)}
                    errors.append(bare * stretch[label] / float(r["measured_s"]) - 1.0)
                    if label == "no turns":
                        ratios.append(float(r["measured_s"]) / bare)
                        loads.append(load)
                cells.append(f"{label} {geomean([abs(e) for e in errors]) * 100:.1f}% "
                             f"({float(np.median(errors)) * 100:+.0f}%)")
            correlation = float(np.corrcoef(loads, ratios)[0, 1])
            print(f"{path} {predictor}: " + ", ".join(cells) + f"; measured / no turns median "
                  f"{float(np.median(ratios)):.2f}, its correlation with the load {correlation:.2f}")


def shard_picks(campaign_csv: Path, shard_dir: Path) -> None:
    """`trainsim shard --synthetic heavy --seed S ... --json` outputs (SHARD_DIR/seed<S>.json) against a sharding
    campaign's measured plans (`trainsim measure --sharder all`): per task the pick, its measured gap to the
    measured fastest (median and fastest iteration), and the selection time the command reports."""
    by_task: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
    for r in csv.DictReader(campaign_csv.open()):
        by_task[r["seed"]][r["sharder"]] = r
    hits = {"measured_s": [0, 0], "fastest_s": [0, 0]}
    selection_s = []
    for seed in sorted(by_task, key=int):
        path = shard_dir / f"seed{seed}.json"
        if not path.exists():
            continue
        out = json.loads(path.read_text())
        selection_s.append(float(out["selection_s"]))
        cells = []
        for target, counts in hits.items():
            measured = {name: float(r[target]) for name, r in by_task[seed].items()}
            gap = measured[out["best"]] / min(measured.values()) - 1.0
            counts[0] += gap <= 0.05
            counts[1] += gap <= 0.10
            cells.append(f"{target[:-2]} gap {gap * 100:.1f}% (fastest {min(measured, key=lambda k: measured[k])})")
        print(f"heavy{seed}: picks {out['best']}; " + "; ".join(cells) + f"; selection {out['selection_s']:.2f} s")
    for target, (five, ten) in hits.items():
        print(f"against the {target[:-2]} iteration: within 5% {five}/{len(selection_s)}, within 10% {ten}/"
              f"{len(selection_s)}")
    print(f"selection time (the command's own): {sum(selection_s):.1f} s for {len(selection_s)} tasks")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["shard-picks"]:
        shard_picks(Path(sys.argv[2]), Path(sys.argv[3]))
        sys.exit(0)

    if sys.argv[1:2] == ["load-turns"]:
        load_turns([Path(a) for a in sys.argv[2:]])
        sys.exit(0)

    if sys.argv[1:2] == ["groups"]:
        csvs = [Path(a) for a in sys.argv[2:] if a.endswith(".csv")]
        named = [a for a in sys.argv[2:] if not a.endswith(".csv")]
        groups(csvs, tuple(named[0].split(",")) if named else (
            "roofline_alpha_beta_s", "mlp_sigmoid_s", "max_sum_s", "trace_predicted_s", "host_s", "insitu_s",
            "insitu_trace_predicted_s", "trace_replay_s"))
        sys.exit(0)
    if "sharding" not in sys.argv[1:]:
        e2e()
    sharding()
