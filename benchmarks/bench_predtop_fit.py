"""Cost and result of PredTOP's fits in `trainsim search --stage-costs predtop`, from a stored stage table (no
stage is run).

    python benchmarks/bench_predtop_fit.py [--table DB] [--model YAML] [--seeds 0 1 2] [--profile OUT.prof]

The plan-quality GPT job's search (scripts/plan_quality.py: 4 CPU ranks, equal meshes, dp inside a stage; PredTOP's
sized sample of Alpa's layers, 30% + 10% of each mesh's usable stages), with every sampled stage's latency read
from DB (default: the tenth session's exhaustive table of that job, data/plan_quality/gpt-v10r, which holds every
usable stage). Per seed and mesh it prints the fit's CPU time (the training thread's), its wall time, the epochs
run, the best validation loss and the test MRE (eq. 5) over the usable stages not profiled, to full precision:
a change that only makes the fits cheaper must leave the last three equal (float noise aside). CPU time is the
figure to compare (the machine is shared; report `uptime` beside it).
"""

import argparse
import cProfile
import shutil
import tempfile
import time
from pathlib import Path

from trainsim.catalog import load_cluster, load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
from trainsim.search.predtop.costs import PredTopStageCosts, all_ranges
from trainsim.search.predtop.dag import DagBuilder, unit_costs
from trainsim.search.predtop.experiment import HEAVY_OPS, alpa_layers
from trainsim.search.stage_costs import PricedStageCosts, StageJob
from trainsim.search.stage_dp import usable_filter
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec, num_units

ROOT = Path(__file__).resolve().parent.parent
MESHES = (Mesh(1, 1), Mesh(1, 2), Mesh(1, 4))  # scripts/plan_quality.py: 4 ranks of one node
RANKS, MICRO_BATCH, SEQ_LEN, MICRO_BATCHES = 4, 4, 64, 8  # global batch 32 in 8 micro-batches of 64 tokens


def fit_once(model: TransformerSpec, db: StageDatabase, seed: int) -> list[str]:
    """One search's fits (every mesh asked for all its usable stages), a line per mesh trained."""
    truth = MeasuredStageCosts(model, MICRO_BATCH, SEQ_LEN, db)
    job = StageJob(model=model, cluster=load_cluster("local-cpu").with_num_gpus(RANKS).on_one_node(),
                   micro_batch=MICRO_BATCH, num_micro_batches=MICRO_BATCHES, seq_len=SEQ_LEN)
    units = num_units(model)
    dags = DagBuilder(model, MICRO_BATCH, SEQ_LEN)
    usable = usable_filter(units, list(MESHES), RANKS, True)
    predtop = PredTopStageCosts(truth, PricedStageCosts(job), dags, units, seed=seed,
                                layer_cuts=alpa_layers(*unit_costs(dags, HEAVY_OPS)), usable=usable)
    lines = []
    for mesh in MESHES:
        intra = IntraPlan(1, mesh.size)
        stages = [StageSpec(a, b, mesh, intra) for a, b in all_ranges(units)]
        stages = [s for s in stages if usable(s) and predtop.in_layers(s)]
        cpu, wall = time.process_time(), time.perf_counter()
        predtop.prefetch(stages)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        predictor = predtop.predictors[(mesh, intra)]
        assert truth.measured_now == 0, "a stage was missing from the table and was run"
        if predictor is None:
            continue
        roles = predtop.roles(mesh, intra)
        test = [s for s in stages if s not in roles]
        errors = [abs(predtop.predicted[s] - found.latency_s) / found.latency_s
                  for s in test if (found := truth.estimate(s)) is not None]
        lines.append(f"seed {seed} {mesh.describe()}: fit cpu {predictor.train_cpu_s:.2f} s wall "
                     f"{predictor.train_time_s:.2f} s (fit + predict cpu {cpu:.2f} s); epochs {predictor.epochs_run}; "
                     f"best validation loss {predictor.best_validation_loss!r}; test MRE "
                     f"{100 * sum(errors) / len(errors):.9f}% over {len(errors)} stages")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", type=Path, default=ROOT / "data/plan_quality/gpt-v10r/stages/exhaustive.sqlite")
    parser.add_argument("--model", type=Path, default=ROOT / "data/stages/models/gpt-heavy-head.yaml")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--profile", type=Path, help="write a cProfile of the fits here")
    args = parser.parse_args()
    model = load_model(str(args.model))
    assert isinstance(model, TransformerSpec)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "stages.db"
        shutil.copyfile(args.table, copy)
        db = StageDatabase(copy)
        profiler = cProfile.Profile() if args.profile else None
        for seed in args.seeds:
            if profiler is not None:
                profiler.enable()
            lines = fit_once(model, db, seed)
            if profiler is not None:
                profiler.disable()
            print("\n".join(lines), flush=True)
        db.close()
        if profiler is not None:
            profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
