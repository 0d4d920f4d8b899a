"""Why sharder predictions rank right or wrong: per term (lookups forward and backward, the pooled all-to-all,
the interaction + top MLP, host spans), the measured per-rank spans of data/recsys/cpu/sharding_traces.jsonl
against the priced iteration's terms, and per task the rank correlation of the measured iteration with the
predicted one and with each term's slowest rank.

    python scripts/recsys_sharding_terms.py [lookup_mlp.json]
"""

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from recsys_experiments import CAP, CLUSTER, OUT, local_curves, task

from trainsim.cost.embedding_lookup import MlpLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import price_sharded_iteration
from trainsim.embedding.sharders import shard
from trainsim.frontends.catalog.sharded_dlrm import sharded_job

TERMS = {"lookup fwd": ("embeddings fwd",), "lookup bwd": ("embeddings bwd",), "pooled a2a fwd": ("pooled-a2a-fwd",),
         "top fwd+bwd": ("top_mlp fwd", "top_mlp bwd"), "host: index a2a launch": ("index-a2a launch",)}


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


def main() -> None:
    lookups = MlpLookup.load(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT / "lookup_mlp.json")
    pricer = Pricer(comm_costs=local_curves())
    traces = {(t["task"], t["sharder"]): t for t in map(json.loads, (OUT / "sharding_traces.jsonl").open())}
    rows = list(csv.DictReader((OUT / "sharding.csv").open()))
    ratios: dict[str, list[float]] = defaultdict(list)
    by_task: dict[str, list[tuple[float, dict[str, float], dict[str, float]]]] = defaultdict(list)
    for row in rows:
        ranks, seed, batch = int(row["ranks"]), int(row["seed"]), int(row["local_batch"])
        model, tables = task(row["kind"], ranks, seed)
        plan = shard(tables, row["sharder"], ranks, cap_bytes=CAP, seed=seed)
        sjob = sharded_job(model, plan, CLUSTER, batch)
        it = price_sharded_iteration(sjob.graph, plan, sjob.job, pricer, lookups)
        predicted = {"lookup fwd": [w.lookup_fwd_s for w in it.ranks], "lookup bwd": [w.lookup_bwd_s for w in it.ranks],
                     "pooled a2a fwd": [it.pooled_fwd_a2a_s] * ranks,
                     "top fwd+bwd": [w.top_fwd_s + w.top_bwd_s for w in it.ranks],
                     "host: index a2a launch": [0.0] * ranks}
        events = traces[(row["task"], row["sharder"])]["events"]
        measured = {term: [sum(e - s for n, s, e in spans if n in names) for spans in events]
                    for term, names in TERMS.items()}
        for term in TERMS:
            for p, m in zip(predicted[term], measured[term], strict=True):
                if p > 0 and m > 0:
                    ratios[term].append(m / p)
        by_task[row["task"]].append((float(row["measured_s"]), {t: max(v) for t, v in measured.items()},
                                     {t: max(v) for t, v in predicted.items()}))
    print(f"{'term':<24} {'n':>4} {'measured / predicted: median':>30} {'p10':>8} {'p90':>8}")
    for term, values in ratios.items():
        print(f"{term:<24} {len(values):>4} {np.median(values):30.2f} {np.percentile(values, 10):8.2f} "
              f"{np.percentile(values, 90):8.2f}")
    print("per task, Spearman of the measured iteration over its sharders with: the slowest rank's measured / "
          "predicted term")
    for name, entries in sorted(by_task.items()):
        whole = [e[0] for e in entries]
        cells = [f"{t} {spearman(whole, [e[1][t] for e in entries]):+.2f}/"
                 f"{spearman(whole, [e[2][t] for e in entries]):+.2f}"
                 for t in ("lookup fwd", "lookup bwd", "pooled a2a fwd")]
        print(f"  {name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
