"""Why PredTOP's plan on a plan-quality job is poor: one mesh's PredTOP fit, every stage's prediction against
the exhaustive planner's table, and the DP's plan on that mesh alone scored by eq. 4 over that table.

    python scripts/predtop_diagnose.py --case moe --mesh 1 --src predtop     # the seventh session's fit, exactly
    python scripts/predtop_diagnose.py --case moe --mesh 1 --layers alpa --sampler sized
    python scripts/predtop_diagnose.py --case moe --mesh 1 --layers alpa --sampler sized --features table1

Reads data/plan_quality/CASE/stages/{exhaustive,predtop}.sqlite (copies; nothing is run: it asserts so; `--dir`
for another run's files, e.g. data/plan_quality/moe-v8).
`--src predtop` trains on the stages the PredTOP planner measured itself (the run's sample, so the run's fit
is reproduced exactly, seed and sampler given); `--src exhaustive` (default) reads the sample from the exhaustive
table (any sampler, layering or seed). The ablations below change the method for this diagnosis only (they are
not options of `trainsim search`; docs/planning.md, eighth session, gives their figures):
- `--features table1`: Table I's four features only (the cost columns log FLOPs, log bytes, log depth zeroed);
  `nodepth`: the log-depth column zeroed (the depth encoding of sec. IV-A stays).
- `--target absolute`: the paper's plain MAE (eq. 3) instead of the log-latency MAE; `--pool sum`: eq. 2's add
  pooling without the 1 / mean node count scale.
- `--select train`: early stopping and the kept weights watch the training stages instead of the separate 10%
  (what the model can fit when the epoch is not picked on 4-6 validation stages).
"""

import argparse
import functools
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trainsim.search.predtop.dag as dag_module
import trainsim.search.predtop.train as train_module
from trainsim.catalog import load_cluster, load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
from trainsim.search.predtop.costs import SAMPLERS, PredTopStageCosts, all_ranges
from trainsim.search.predtop.dag import DagBuilder, unit_costs
from trainsim.search.predtop.experiment import HEAVY_OPS, LAYERINGS, alpa_layers
from trainsim.search.stage_costs import PricedStageCosts, StageJob
from trainsim.search.stage_dp import alpa_dp
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StagePlan, StageSpec, num_units, pipeline_time_s

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"moe": "moe-small", "gpt": "gpt-heavy-head"}
MICRO_BATCH, SEQ_LEN, DEVICES, MICRO_BATCHES = 4, 64, 4, 8
DROPPED = {"all": 0, "table1": 3, "nodepth": 1}  # trailing feature columns zeroed (dag._features' cost columns)


def ablate(features: str, pool: str) -> None:
    """Patch the DAG features or the pooling scale for this process (diagnosis only)."""
    drop = DROPPED[features]
    if drop:
        original = dag_module._features
        dag_module._features = lambda node, depth: original(node, depth)[:-drop] + [0.0] * drop  # type: ignore[assignment]
    if pool == "sum":
        prepare = train_module.prepare

        def unscaled(*args: Any, **kwargs: Any) -> train_module.Predictor:
            predictor = prepare(*args, **kwargs)
            predictor.model.get_buffer("pool_scale").fill_(1.0)
            return predictor
        train_module.prepare = unscaled  # type: ignore[assignment]


def trainer(target: str, select: str) -> Any:
    if select == "val":
        return functools.partial(train_module.train, target=target)

    def on_training_stages(kind: str, dags: list, latencies: list[float], validation: Any, **kwargs: Any) -> Any:
        del validation
        return train_module.train(kind, dags, latencies, (dags, latencies), target=target, **kwargs)
    return on_training_stages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=list(MODELS), default="moe")
    parser.add_argument("--mesh", type=int, choices=(1, 2, 4), default=1, help="devices of the 1 x N mesh (dp N)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--src", choices=("exhaustive", "predtop"), default="exhaustive")
    parser.add_argument("--layers", choices=list(LAYERINGS), default="units")
    parser.add_argument("--sampler", choices=list(SAMPLERS), default="covering")
    parser.add_argument("--kind", choices=("transformer", "gcn", "gat"), default="transformer")
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--patience", type=int, default=200)
    parser.add_argument("--features", choices=list(DROPPED), default="all")
    parser.add_argument("--target", choices=list(train_module.TARGETS), default="log")
    parser.add_argument("--pool", choices=("mean", "sum"), default="mean")
    parser.add_argument("--select", choices=("val", "train"), default="val")
    parser.add_argument("--dir", type=Path, default=None, help="the plan-quality files (default: "
                        "data/plan_quality/CASE); its stages/exhaustive.sqlite and stages/predtop.sqlite are read")
    args = parser.parse_args()
    ablate(args.features, args.pool)
    model = load_model(str(ROOT / f"data/stages/models/{MODELS[args.case]}.yaml"))
    assert isinstance(model, TransformerSpec)
    with tempfile.TemporaryDirectory() as tmp:
        files = args.dir or ROOT / f"data/plan_quality/{args.case}"
        for name in ("predtop", "exhaustive"):
            shutil.copy(files / "stages" / f"{name}.sqlite", Path(tmp) / f"{name}.sqlite")
        source = MeasuredStageCosts(model, MICRO_BATCH, SEQ_LEN, StageDatabase(Path(tmp) / f"{args.src}.sqlite"))
        truth = MeasuredStageCosts(model, MICRO_BATCH, SEQ_LEN, StageDatabase(Path(tmp) / "exhaustive.sqlite"))
        report(args, model, source, truth)


def report(args: argparse.Namespace, model: TransformerSpec, source: MeasuredStageCosts,
           truth: MeasuredStageCosts) -> None:
    job = StageJob(model=model, cluster=load_cluster("local-cpu").with_num_gpus(DEVICES).on_one_node(),
                   micro_batch=MICRO_BATCH, num_micro_batches=MICRO_BATCHES, seq_len=SEQ_LEN, precision="fp32")
    units = num_units(model)
    dags = DagBuilder(model, MICRO_BATCH, SEQ_LEN)
    cuts = alpa_layers(*unit_costs(dags, HEAVY_OPS)) if args.layers == "alpa" else None
    predtop = PredTopStageCosts(source, PricedStageCosts(job), dags, units, 0.3, kind=args.kind, epochs=args.epochs,
                                patience=args.patience, seed=args.seed, sampler=args.sampler,
                                trainer=trainer(args.target, args.select), layer_cuts=cuts)
    mesh, intra = Mesh(1, args.mesh), IntraPlan(1, args.mesh)
    stages = [StageSpec(a, b, mesh, intra) for a, b in all_ranges(units)]
    cpu = time.process_time()
    predtop.prefetch(stages)
    assert source.measured_now == 0, "a sampled stage was missing from the database and was run"
    fitted = predtop.predictors[(mesh, intra)]
    assert fitted is not None
    print(f"{vars(args)}\nCPU {time.process_time() - cpu:.1f} s, epochs run {fitted.epochs_run}, profiled "
          f"{predtop.profiled_configurations}, best validation loss {fitted.best_validation_loss:.4f}")
    roles = predtop.roles(mesh, intra)
    errors: dict[str, list[float]] = {}
    for stage in stages:
        if stage not in predtop.predicted:
            continue
        measured = truth.estimate(stage)
        assert measured is not None
        predicted_ms, measured_ms = predtop.predicted[stage] * 1e3, measured.latency_s * 1e3
        role = roles.get(stage, "test")
        errors.setdefault(role, []).append(abs(predicted_ms / measured_ms - 1))
        own = source.estimate(stage) if stage in roles else None
        print(f"[{stage.first},{stage.end}) {role:5s} predicted {predicted_ms:6.1f} ms, exhaustive table "
              f"{measured_ms:6.1f} ms ({100 * (predicted_ms / measured_ms - 1):+6.1f}%)"
              + (f", sampled {own.latency_s * 1e3:6.1f} ms" if own is not None else ""))
    print("MRE: " + ", ".join(f"{role} {100 * sum(e) / len(e):.1f}% ({len(e)})" for role, e in errors.items()))
    rest = ([mesh], {mesh: [intra]}, DEVICES, MICRO_BATCHES, job.capacity_bytes)
    chosen, best = alpa_dp(predtop, units, *rest).plan, alpa_dp(truth, units, *rest).plan

    def table_s(plan: StagePlan) -> float:
        return pipeline_time_s([truth.estimate(s).latency_s for s in plan.stages], MICRO_BATCHES)  # type: ignore[union-attr]
    print(f"PredTOP plan {[(s.first, s.end) for s in chosen.stages]}: predicted {chosen.iteration_s:.4f} s, "
          f"exhaustive table {table_s(chosen):.4f} s; exhaustive plan {[(s.first, s.end) for s in best.stages]} "
          f"{table_s(best):.4f} s: {100 * (table_s(chosen) / table_s(best) - 1):+.1f}%")


if __name__ == "__main__":
    main()
