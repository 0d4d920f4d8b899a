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
import statistics
import tempfile
from pathlib import Path
from typing import Any

from trainsim.catalog import load_cluster
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
from trainsim.search.mpe import MpeStageCosts, exhaustive_evaluations, mpe_evaluations
from trainsim.search.stage_costs import CountedStageCosts, FunctionStageCosts, PricedStageCosts, StageJob
from trainsim.search.stage_dp import alpa_dp, holistic_dp, uniform_search
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec, pipeline_time_s

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
    return MeasuredStageCosts(MODELS[name], MICRO_BATCH, SEQ_LEN, db, warmup=1, iterations=4)


def results_path(db: Path) -> Path:
    return db.with_suffix(".results.json")


def update_results(db: Path, key: str, value: object) -> None:
    path = results_path(db)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1))


def collect(db_path: Path, only: list[str]) -> None:
    """Every stage of every setting, through trainsim stages' collection (search.predtop.experiment.collect)."""
    from trainsim.search.predtop.experiment import Corpus, Setting
    from trainsim.search.predtop.experiment import collect as collect_settings

    db = StageDatabase(db_path)
    times = {}
    for name, settings in SETTINGS.items():
        chosen = [Setting(m, i) for m, i in settings if not only or f"{name}/{m.describe()}/{i.describe()}" in only]
        report = collect_settings(db, Corpus(MODELS[name], MICRO_BATCH, SEQ_LEN), chosen, warmup=1, iterations=4)
        for label, row in report.settings.items():
            times[f"{name}/{label}"] = row
            print(f"{name}/{label}", row, flush=True)
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
    """MRE vs training fraction per setting (search.predtop.experiment.evaluate; `trainsim stages evaluate`
    does the same per model; scripts/predtop_sweep.py runs it many fits at once)."""
    from trainsim.search.predtop.experiment import Corpus, Setting, TrainOptions, dag_builder, evaluate, setting_data

    db = StageDatabase(db_path)
    path = results_path(db_path)
    out: dict[str, object] = dict(json.loads(path.read_text()).get("predtop", {})) if path.exists() else {}
    for name, mesh, intra in PREDTOP_SETTINGS:
        label = f"{name}/{mesh.describe()}/{intra.describe()}"
        if only and label not in only:
            continue
        corpus = Corpus(MODELS[name], MICRO_BATCH, SEQ_LEN)
        data = setting_data(db, corpus, Setting(mesh, intra), dag_builder(corpus))
        result = evaluate([data], fractions=fractions, options=TrainOptions(epochs, patience))
        out[label] = result[data.label]
        print(label, result[data.label].get("table", result[data.label]), flush=True)
        update_results(db_path, "predtop", out)


def table_costs(db: StageDatabase, name: str) -> FunctionStageCosts:
    """Measured stages read from the database (collect first): the exhaustive source, nothing run."""
    from trainsim.search.stage_costs import FunctionStageCosts

    key = model_key_of(name)
    return FunctionStageCosts(lambda stage: db.get(key, MICRO_BATCH, SEQ_LEN, 1, stage))


def _mape(pairs: list[tuple[float, float]]) -> float:
    return 100.0 * statistics.fmean(abs(p - y) / y for p, y in pairs if y > 0)


MPE_SETTINGS = [(Mesh(1, 1), IntraPlan()), (Mesh(1, 2), IntraPlan(1, 2)), (Mesh(1, 4), IntraPlan(1, 4))]


def mpe(db_path: Path) -> None:
    db = StageDatabase(db_path)
    out: dict[str, dict[str, object]] = {}
    for name in MODELS:
        for mesh, intra in MPE_SETTINGS:
            truth = table_costs(db, name)
            chain = MpeStageCosts(truth, MODELS[name])
            naive = MpeStageCosts(truth, MODELS[name], edges=False)
            rows = {"mpe": [], "naive": [], "mpe_mem": [], "naive_mem": []}
            for a, b in ranges():
                stage = StageSpec(a, b, mesh, intra)
                real = truth.estimate(stage)
                if real is None or b - a < 2:
                    continue
                for label, source in (("mpe", chain), ("naive", naive)):
                    got = source.estimate(stage)
                    assert got is not None
                    rows[label].append((got.latency_s, real.latency_s))
                    rows[label + "_mem"].append((got.memory_bytes(1), real.memory_bytes(1)))
            label = f"{name}/{mesh.describe()}/{intra.describe()}"
            out[label] = {key: _mape(pairs) for key, pairs in rows.items() if pairs}
            out[label]["stages"] = len(rows["mpe"])
            out[label]["mpe_runs"] = chain.profiled_configurations
            print(label, out[label], flush=True)
    out["paper_counts"] = paper_counts()
    update_results(db_path, "mpe", out)


def paper_counts() -> dict[str, object]:
    """Stage evaluations of the exhaustive search and of MPE's chains for MPE's GPT-2 1.5B case (48 blocks:
    the paper's 50 layers), per (mesh, intra plan) counted by running the sources over every stage, x 14
    configurations (the paper's figure for one node of 8 GPUs)."""
    from trainsim.search.stage_costs import FunctionStageCosts
    from trainsim.strategy.stage_plan import StageEstimate

    counts = {}
    for layers in (24, 48, 96):
        model = TransformerSpec(name="count", arch="gpt", num_layers=layers, hidden=64, ffn_hidden=256, num_heads=4,
                                vocab=512, max_seq_len=64)
        units = layers + 2
        one = FunctionStageCosts(lambda stage: StageEstimate(1.0, 0.0, 0.0))
        exhaustive = CountedStageCosts(one)
        dedup, plain = MpeStageCosts(one, model), MpeStageCosts(one, model, dedup=False)
        for a in range(units):
            for b in range(a + 1, units + 1):
                stage = StageSpec(a, b, Mesh(1, 1), IntraPlan())
                for source in (exhaustive, dedup, plain):
                    source.estimate(stage)
        counts[f"{units} layers"] = {
            "configs": 14, "exhaustive": 14 * exhaustive.evaluations, "mpe": 14 * plain.profiled_configurations,
            "mpe_dedup": 14 * dedup.profiled_configurations,
            "formula_exhaustive": exhaustive_evaluations(units, 14), "formula_mpe": mpe_evaluations(units, 14)}
    return counts


PLAN_MESHES = [Mesh(1, 1), Mesh(1, 2), Mesh(1, 4)]


def _measured_latency_s(truth: FunctionStageCosts, stage: dict[str, Any]) -> float:
    """A plan's stage (its JSON form) as the measured table prices it."""
    estimate = truth.estimate(StageSpec(stage["units"][0], stage["units"][1], Mesh(*map(int, stage["mesh"].split("x"))),
                                        IntraPlan(stage["tp"], stage["dp"])))
    assert estimate is not None, f"stage {stage} is not in the measured table"
    return estimate.latency_s


def plans(db_path: Path, epochs: int, patience: int, fraction: float, only: list[str]) -> None:
    """Each planner on 4 ranks (dp-only intra plans); every chosen plan timed by eq. 4 over its stages' measured
    latencies (the database's exhaustive table). MPE and PredTOP measure their stages afresh here;
    scripts/predtop_plans.py re-scores PredTOP from the database alone (nothing run)."""
    from trainsim.search.predtop.costs import PredTopStageCosts
    from trainsim.search.predtop.dag import DagBuilder

    db = StageDatabase(db_path)
    collected = json.loads(results_path(db_path).read_text()).get("collect", {})
    intra = {mesh: [IntraPlan(1, mesh.size)] for mesh in PLAN_MESHES}
    path = results_path(db_path)
    out: dict[str, object] = dict(json.loads(path.read_text()).get("plans", {})) if path.exists() else {}
    for name, model in MODELS.items():
        if only and name not in only:
            continue
        truth = table_costs(db, name)
        cluster = load_cluster("local-cpu").with_num_gpus(4).on_one_node()
        job = StageJob(model=model, cluster=cluster, micro_batch=MICRO_BATCH, num_micro_batches=MICRO_BATCHES,
                       seq_len=SEQ_LEN)
        args = (PLAN_MESHES, intra, 4, MICRO_BATCHES, job.capacity_bytes)

        rows: dict[str, dict[str, object]] = {}
        exhaustive = alpa_dp(truth, UNITS, *args)
        collect_s = sum(collected.get(f"{name}/{m.describe()}/{p[0].describe()}", {}).get("seconds", 0.0)
                        for m, p in intra.items())
        rows["exhaustive"] = {"plan": exhaustive.plan.to_dict(), "profiled": exhaustive.stage_evaluations,
                              "cost_s": collect_s + exhaustive.search_time_s}
        uniform = uniform_search(truth, model.num_layers, *args)
        rows["uniform"] = {"plan": uniform.plan.to_dict(), "profiled": uniform.stage_evaluations, "cost_s": None}
        with tempfile.TemporaryDirectory() as tmp:
            fresh = StageDatabase(Path(tmp) / "fresh.sqlite")
            chain = MpeStageCosts(MeasuredStageCosts(model, MICRO_BATCH, SEQ_LEN, fresh, warmup=1, iterations=4),
                                  model)
            found = holistic_dp(chain, UNITS, *args)
            rows["mpe"] = {"plan": found.plan.to_dict(), "profiled": chain.profiled_configurations,
                           "cost_s": found.search_time_s}
            predictor = PredTopStageCosts(MeasuredStageCosts(model, MICRO_BATCH, SEQ_LEN, fresh, warmup=2,
                                                             iterations=4),
                                          PricedStageCosts(job), DagBuilder(model, MICRO_BATCH, SEQ_LEN), UNITS,
                                          fraction, epochs=epochs, patience=patience)
            found = alpa_dp(predictor, UNITS, *args)
            rows["predtop"] = {"plan": found.plan.to_dict(), "profiled": predictor.profiled_configurations,
                               "cost_s": found.search_time_s, "train_s": predictor.train_time_s}
            fresh.close()
        base = pipeline_time_s([e.latency_s for e in exhaustive.plan.estimates], MICRO_BATCHES)
        for key, row in rows.items():
            stages = row["plan"]["stages"]  # type: ignore[index]
            measured_s = pipeline_time_s([_measured_latency_s(truth, s) for s in stages], MICRO_BATCHES)
            row["measured_s"] = measured_s
            row["vs_exhaustive"] = measured_s / base - 1.0
            print(name, key, {k: v for k, v in row.items() if k != "plan"},
                  [(s["units"], s["mesh"]) for s in stages], flush=True)
        out[name] = rows
    update_results(db_path, "plans", out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["collect", "predtop", "mpe", "plans"])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--epochs", type=int, default=500)  # PredTOP sec. IV-B6, IV-B8: 500 epochs, patience 200
    parser.add_argument("--patience", type=int, default=200)
    parser.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS))
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.db, args.only)
    elif args.command == "plans":
        plans(args.db, args.epochs, args.patience, 0.3, args.only)
    elif args.command == "mpe":
        mpe(args.db)
    elif args.command == "predtop":
        predtop(args.db, args.fractions, args.epochs, args.patience, args.only)


if __name__ == "__main__":
    main()
