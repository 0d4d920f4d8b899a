"""The PredTOP and MPE experiments at the scale of this machine (docs/planning.md holds the figures).

    python scripts/stage_experiments.py collect --db DB        # measure every stage of both models (resumable)
    python scripts/stage_experiments.py predtop --db DB        # MRE vs training fraction (Tables V-VI)
    python scripts/stage_experiments.py mpe --db DB            # MPE / naive MAPE, evaluation counts, search time
    python scripts/stage_experiments.py plans --db DB          # planners' plans on 4 ranks against exhaustive

Models: a GPT-style chain with a heavy head (vocabulary 6144 against hidden 96) and a GShard-style MoE (every
second block 4 experts, top-1), 8 blocks each (10 units, 55 stages), micro-batch 4 x 64 tokens, fp32, one
thread per rank. Every stage is measured alone (measure.stage) on 1, 2 and 4 local CPU ranks.
Writes JSON next to the database (DB.results.json), which the docs' tables are copied from.
"""

import argparse
import json
import time
from pathlib import Path

from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec

GPT = TransformerSpec(name="gpt-heavy-head", arch="gpt", num_layers=8, hidden=96, ffn_hidden=384, num_heads=4,
                      vocab=6144, max_seq_len=64)
MOE = TransformerSpec(name="moe-small", arch="gpt", num_layers=8, hidden=96, ffn_hidden=384, num_heads=4,
                      vocab=4096, max_seq_len=64, num_experts=4, top_k=1, moe_every=2)
MODELS = {"gpt": GPT, "moe": MOE}
MICRO_BATCH, SEQ_LEN, MICRO_BATCHES = 4, 64, 8
UNITS = 10
# (mesh, intra plan): PredTOP's Table III at the scale of 2 ranks, and dp over 4 ranks for the planners
SETTINGS = {
    "gpt": [(Mesh(1, 1), IntraPlan()), (Mesh(1, 2), IntraPlan(1, 2)), (Mesh(1, 2), IntraPlan(2, 1)),
            (Mesh(1, 4), IntraPlan(1, 4))],
    "moe": [(Mesh(1, 1), IntraPlan()), (Mesh(1, 2), IntraPlan(1, 2)), (Mesh(1, 4), IntraPlan(1, 4))],
}
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def ranges() -> list[tuple[int, int]]:
    return [(a, b) for a in range(UNITS) for b in range(a + 1, UNITS + 1)]


def measured(db: StageDatabase, name: str) -> MeasuredStageCosts:
    return MeasuredStageCosts(MODELS[name], MICRO_BATCH, SEQ_LEN, db, warmup=2, iterations=5)


def results_path(db: Path) -> Path:
    return db.with_suffix(".results.json")


def update_results(db: Path, key: str, value: object) -> None:
    path = results_path(db)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1))


def collect(db_path: Path, only: list[str]) -> None:
    db = StageDatabase(db_path)
    times = {}
    for name, settings in SETTINGS.items():
        for mesh, intra in settings:
            label = f"{name}/{mesh.describe()}/{intra.describe()}"
            if only and label not in only:
                continue
            source = measured(db, name)
            start = time.perf_counter()
            source.prefetch([StageSpec(a, b, mesh, intra) for a, b in ranges()])
            times[label] = {"seconds": time.perf_counter() - start, "measured_now": source.measured_now,
                            "stages": source.profiled_configurations}
            print(label, times[label], flush=True)
    update_results(db_path, "collect", times)


def stage_table(db: StageDatabase, name: str, mesh: Mesh, intra: IntraPlan) -> dict[tuple[int, int], float]:
    """The measured latency of every stage of a setting (collect first: nothing is measured here)."""
    source = measured(db, name)
    table = {}
    for a, b in ranges():
        found = db.get(model_key_of(name), MICRO_BATCH, SEQ_LEN, 1, StageSpec(a, b, mesh, intra))
        if found is not None:
            table[(a, b)] = found.latency_s
    del source
    return table


def model_key_of(name: str) -> str:
    from trainsim.measure.stage_db import model_key

    return model_key(MODELS[name])


PREDTOP_SETTINGS = [("gpt", Mesh(1, 1), IntraPlan()), ("gpt", Mesh(1, 2), IntraPlan(1, 2)),
                    ("gpt", Mesh(1, 2), IntraPlan(2, 1)), ("moe", Mesh(1, 1), IntraPlan()),
                    ("moe", Mesh(1, 2), IntraPlan(1, 2))]


def predtop(db_path: Path, fractions: list[float], epochs: int, patience: int, only: list[str]) -> None:
    from trainsim.search.predtop.dag import DagBuilder
    from trainsim.search.predtop.train import mre_percent, split, train

    db = StageDatabase(db_path)
    path = results_path(db_path)
    previous = json.loads(path.read_text()).get("predtop", {}) if path.exists() else {}
    out: dict[str, object] = dict(previous)
    for name, mesh, intra in PREDTOP_SETTINGS:
        label = f"{name}/{mesh.describe()}/{intra.describe()}"
        if only and label not in only:
            continue
        table = stage_table(db, name, mesh, intra)
        if len(table) < 10:
            print(label, "skipped: collect its stages first", flush=True)
            continue
        keys = sorted(table)
        builder = DagBuilder(MODELS[name], MICRO_BATCH, SEQ_LEN)
        dags = [builder.stage(a, b) for a, b in keys]
        ys = [table[k] for k in keys]
        rows = []
        for fraction in fractions:
            parts = split(len(keys), fraction, seed=0)
            row: dict[str, object] = {"fraction": fraction, "train": len(parts.train), "test": len(parts.test)}
            for kind in ("transformer", "gcn", "gat"):
                predictor = train(kind, [dags[i] for i in parts.train], [ys[i] for i in parts.train],
                                  ([dags[i] for i in parts.validation], [ys[i] for i in parts.validation]),
                                  epochs=epochs, patience=patience, seed=0)
                predicted = predictor.predict_s([dags[i] for i in parts.test])
                row[kind] = mre_percent(predicted, [ys[i] for i in parts.test])
                row[kind + "_train_s"] = predictor.train_time_s
                row[kind + "_epochs"] = predictor.epochs_run
            rows.append(row)
            print(label, {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        out[label] = {"samples": len(keys), "rows": rows}
        update_results(db_path, "predtop", out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["collect", "predtop", "mpe", "plans"])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--patience", type=int, default=50)
    parser.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS))
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.db, args.only)
    elif args.command == "predtop":
        predtop(args.db, args.fractions, args.epochs, args.patience, args.only)


if __name__ == "__main__":
    main()
