"""PredTOP's planner re-scored from the stage databases in the repo, with no new timing runs.

    python scripts/predtop_plans.py --cases cpu-gpt cpu-moe h100-gpt h100-moe --samplers covering random \
        --seeds 0 1 2 --label=-val10 --out docs/data/predtop_plans.jsonl

Each case is a model, its stage database (every stage measured alone), the meshes and the pipeline's
micro-batches. PredTOP's source reads its sampled stages from a copy of the database (`profiled` counts them,
MeasuredStageCosts.measured_now must stay 0: nothing is run), trains one predictor per mesh and intra plan and
Alpa's DP picks the plan on the predictions. Every plan (PredTOP's, the exhaustive one: Alpa's DP over every
measured stage, and the best uniform split) is scored by PredTOP eq. 4 over its stages' measured latencies.
Training time is the process's CPU time of the search (DAGs, training, prediction, DP; nice -n 19 on a shared
machine, so wall time would be noise). Results are appended per (case, sampler + label, seed) and skipped when
there; `--label` names a variant of the method (the key's sampler part), so a changed default gets new rows. Each
row keeps every stage's prediction next to its measurement (`stages`: per mesh, [first, end, predicted ms,
measured ms, role], role train / val / test) to tell which stage a plan went wrong on.
"""

import argparse
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from trainsim.catalog import load_cluster, load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase
from trainsim.search.predtop.costs import PredTopStageCosts, all_ranges
from trainsim.search.predtop.dag import DagBuilder, unit_costs
from trainsim.search.predtop.experiment import HEAVY_OPS, LAYERINGS, alpa_layers
from trainsim.search.predtop.models import MODEL_KINDS
from trainsim.search.stage_costs import (
    CountedStageCosts,
    FunctionStageCosts,
    PricedStageCosts,
    StageCosts,
    StageJob,
    same_dag_median_costs,
)
from trainsim.search.stage_dp import PlanSearch, alpa_dp, equal_mesh_search, uniform_search, usable_filter
from trainsim.strategy.stage_plan import (
    IntraPlan,
    Mesh,
    StagePlan,
    StageSpec,
    num_units,
    pipeline_time_s,
)

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    model: Path
    db: Path
    micro_batch: int
    seq_len: int
    threads: int  # 0: timed on a GPU (scripts/gpu/stages_gpu.py)
    meshes: tuple[Mesh, ...]
    devices: int
    cluster: str
    num_micro_batches: int = 8
    equal_meshes: bool = False  # the plan-quality runs' restriction (`trainsim search --equal-meshes`)


CPU_MESHES = (Mesh(1, 1), Mesh(1, 2), Mesh(1, 4))
CASES = {  # the CPU plan-quality cases of docs/planning.md; the H100 stages (1 GPU each) as a 4-stage pipeline
    "cpu-gpt": Case(ROOT / "data/stages/models/gpt-heavy-head.yaml", ROOT / "data/stages/cpu/stages_cpu.db", 4, 64,
                    1, CPU_MESHES, 4, "local-cpu"),
    "cpu-moe": Case(ROOT / "data/stages/models/moe-small.yaml", ROOT / "data/stages/cpu/stages_cpu.db", 4, 64, 1,
                    CPU_MESHES, 4, "local-cpu"),
    "h100-gpt": Case(ROOT / "data/stages/models/gpt-gpu.yaml", ROOT / "data/stages/h100/stages_gpu.db", 8, 512, 0,
                     (Mesh(1, 1),), 4, "dgx-h100-80gb"),
    "h100-moe": Case(ROOT / "data/stages/models/moe-gpu.yaml", ROOT / "data/stages/h100/stages_gpu.db", 8, 512, 0,
                     (Mesh(1, 1),), 4, "dgx-h100-80gb"),
    # the plan-quality jobs run for real (scripts/plan_quality.py): the exhaustive planner's own stage table, plans
    # of equal meshes with dp inside a stage (what one ParallelSpec runs)
    "pq-moe": Case(ROOT / "data/stages/models/moe-small.yaml", ROOT / "data/plan_quality/moe/stages/exhaustive.sqlite",
                   4, 64, 1, CPU_MESHES, 4, "local-cpu", equal_meshes=True),
    # the tenth session's exhaustive table, each stage measured in 3 passes in rotated order (measured_rounds)
    "pq-moe-r3": Case(ROOT / "data/stages/models/moe-small.yaml",
                      ROOT / "data/plan_quality/moe-v10r/stages/exhaustive.sqlite", 4, 64, 1, CPU_MESHES, 4,
                      "local-cpu", equal_meshes=True),
    "pq-gpt": Case(ROOT / "data/stages/models/gpt-heavy-head.yaml",
                   ROOT / "data/plan_quality/gpt/stages/exhaustive.sqlite", 4, 64, 1, CPU_MESHES, 4, "local-cpu",
                   equal_meshes=True),
}


def measured_t_s(plan: StagePlan, truth: MeasuredStageCosts, micro_batches: int) -> float:
    """Eq. 4 over the plan's stages' measured latencies (each stage measured alone)."""
    latencies = []
    for s in plan.stages:
        found = truth.estimate(StageSpec(s.first, s.end, s.mesh, s.intra))
        assert found is not None, f"stage {s.describe()} not in the database"
        latencies.append(found.latency_s)
    return pipeline_time_s(latencies, micro_batches)


def describe(plan: StagePlan) -> list[str]:
    return [f"[{s.first},{s.end}) {s.mesh.describe()} dp{s.intra.dp}" for s in plan.stages]


def per_stage(predtop: PredTopStageCosts, truth: MeasuredStageCosts) -> dict[str, list[list[object]]]:
    """Per mesh and intra plan: [first, end, predicted ms, measured ms, role] of every stage the DP asked, role
    train (fit), val (early stopping) or test (not profiled), in unit order."""
    roles: dict[StageSpec, str] = {}
    for mesh, intra in predtop.predictors:
        roles.update(predtop.roles(mesh, intra))
    out: dict[str, list[list[object]]] = {}
    for stage in sorted(predtop.predicted, key=lambda s: (s.mesh.describe(), s.first, s.end)):
        found = truth.estimate(stage)
        out.setdefault(f"{stage.mesh.describe()}/{stage.intra.describe()}", []).append(
            [stage.first, stage.end, round(predtop.predicted[stage] * 1e3, 4),
             None if found is None else round(found.latency_s * 1e3, 4), roles.get(stage, "test")])
    return out


def plan_search(costs: StageCosts, case: Case, units: int, capacity_bytes: float) -> PlanSearch:
    """Alpa's DP over the case's meshes (each stage its own mesh), or restricted to equal meshes."""
    intra = {mesh: [IntraPlan(1, mesh.size)] for mesh in case.meshes}
    rest = (case.devices, case.num_micro_batches, capacity_bytes)
    if not case.equal_meshes:
        return alpa_dp(costs, units, list(case.meshes), intra, *rest)

    def planner(c: CountedStageCosts, m: list[Mesh], p: dict[Mesh, list[IntraPlan]]) -> PlanSearch:
        return alpa_dp(c, units, m, p, *rest)
    return equal_mesh_search(planner, costs, list(case.meshes), intra)


def run_case(name: str, samplers: list[str], seeds: list[int], epochs: int, patience: int, fraction: float,
             label: str, kind: str, layers: str, every_stage: bool, done: set[str],
             emit) -> None:  # type: ignore[no-untyped-def]
    case = CASES[name]
    model = load_model(str(case.model))
    assert isinstance(model, TransformerSpec)
    units = num_units(model)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "stages.db"
        for part in case.db.parent.glob(case.db.name + "*"):  # the database and its write-ahead log, if any
            shutil.copyfile(part, Path(tmp) / ("stages.db" + part.name.removeprefix(case.db.name)))
        db = StageDatabase(copy)
        truth = MeasuredStageCosts(model, case.micro_batch, case.seq_len, db, threads=case.threads)
        cluster = load_cluster(case.cluster).with_num_gpus(case.devices).on_one_node()
        job = StageJob(model=model, cluster=cluster, micro_batch=case.micro_batch,
                       num_micro_batches=case.num_micro_batches, seq_len=case.seq_len)
        intra = {mesh: [IntraPlan(1, mesh.size)] for mesh in case.meshes}
        args = (list(case.meshes), intra, case.devices, case.num_micro_batches, job.capacity_bytes)
        exhaustive = plan_search(truth, case, units, job.capacity_bytes)
        profiled_all = truth.profiled_configurations
        base = measured_t_s(exhaustive.plan, truth, case.num_micro_batches)
        uniform = uniform_search(truth, model.num_layers, *args)
        rows: dict[str, object] = {
            "exhaustive": _row(exhaustive, base, base, profiled_all),
            "uniform": _row(uniform, measured_t_s(uniform.plan, truth, case.num_micro_batches), base, None)}
        if f"{name}/reference" not in done:
            emit({"key": f"{name}/reference", **rows})
        dags = DagBuilder(model, case.micro_batch, case.seq_len)
        cuts = alpa_layers(*unit_costs(dags, HEAVY_OPS)) if layers == "alpa" else None
        # the sample is drawn from the stages the DP can use (as `trainsim search` does), or from every stage
        usable = None if every_stage else usable_filter(units, list(case.meshes), case.devices, case.equal_meshes)
        for sampler in samplers:
            for seed in seeds:
                key = (f"{name}/{sampler}{label}{'' if kind == 'transformer' else '-' + kind}"
                       f"{'-alpa' if layers == 'alpa' else ''}{'' if every_stage else '-usable'}/{seed}")
                if key in done:
                    continue
                source = MeasuredStageCosts(model, case.micro_batch, case.seq_len, db, threads=case.threads)
                predtop = PredTopStageCosts(source, PricedStageCosts(job), dags, units, fraction, epochs=epochs,
                                            patience=patience, seed=seed, sampler=sampler, kind=kind,
                                            layer_cuts=cuts, usable=usable)
                cpu = time.process_time()
                found = plan_search(predtop, case, units, job.capacity_bytes)
                cpu_s = time.process_time() - cpu
                assert source.measured_now == 0, "a stage was missing from the database and was run"
                row = _row(found, measured_t_s(found.plan, truth, case.num_micro_batches), base,
                           predtop.profiled_configurations)
                row.update(cpu_s=cpu_s, train_wall_s=predtop.train_time_s, train_cpu_s=predtop.train_cpu_s,
                           epochs_run={f"{m.describe()}/{i.describe()}": p.epochs_run if p else None
                                       for (m, i), p in predtop.predictors.items()},
                           predicted_t_s=found.plan.iteration_s, epochs=epochs, patience=patience,
                           fraction=fraction, kind=kind, layers=layers, stages=per_stage(predtop, truth))
                emit({"key": key, **row})
        db.close()


def _row(found: PlanSearch, t_s: float, base_s: float, profiled: int | None) -> dict[str, object]:
    return {"plan": describe(found.plan), "measured_t_s": t_s, "vs_exhaustive": t_s / base_s - 1.0,
            "profiled": profiled, "stage_evaluations": found.stage_evaluations}


PLAN_STAGE = re.compile(r"\[(\d+),(\d+)\) (\d+)x(\d+) dp(\d+)")


def parse_plan(plan: list[str]) -> list[StageSpec]:
    """describe()'s strings back to stages."""
    out = []
    for text in plan:
        match = PLAN_STAGE.fullmatch(text)
        assert match is not None, text
        first, end, nodes, per_node, dp = map(int, match.groups())
        out.append(StageSpec(first, end, Mesh(nodes, per_node), IntraPlan(1, dp)))
    return out


def same_dag_report(rows: dict[str, dict]) -> list[str]:  # type: ignore[type-arg]
    """Each row's plan scored by eq. 4 over the same-DAG median table, against the DP's optimum on that table."""
    lines = []
    for name, case in CASES.items():
        keys = [k for k in rows if k.startswith(f"{name}/") and "plan" in rows[k]]
        if not keys:
            continue
        model = load_model(str(case.model))
        assert isinstance(model, TransformerSpec)
        db = StageDatabase(case.db)
        truth = MeasuredStageCosts(model, case.micro_batch, case.seq_len, db, threads=case.threads)
        table = same_dag_median_costs(truth, model, [StageSpec(a, b, mesh, IntraPlan(1, mesh.size))
                                                     for mesh in case.meshes for a, b in all_ranges(num_units(model))])
        cluster = load_cluster(case.cluster).with_num_gpus(case.devices).on_one_node()
        job = StageJob(model=model, cluster=cluster, micro_batch=case.micro_batch,
                       num_micro_batches=case.num_micro_batches, seq_len=case.seq_len)
        intra = {mesh: [IntraPlan(1, mesh.size)] for mesh in case.meshes}
        best = alpa_dp(table, num_units(model), list(case.meshes), intra, case.devices, case.num_micro_batches,
                       job.capacity_bytes)
        best_t = best.plan.iteration_s
        reference = rows[f"{name}/reference"]

        def vs_best(plan: list[str], table: FunctionStageCosts = table, case: Case = case,
                    best_t: float = best_t) -> str:
            latencies = [table.estimate(s).latency_s for s in parse_plan(plan)]  # type: ignore[union-attr]
            return f"{100 * (pipeline_time_s(latencies, case.num_micro_batches) / best_t - 1):+.1f}%"
        lines.append(f"{name}: same-DAG optimum {describe(best.plan)} {best_t:.4f} s; measured exhaustive plan "
                     f"{vs_best(reference['exhaustive']['plan'])}, uniform {vs_best(reference['uniform']['plan'])}")
        lines.extend(f"  {key}: {vs_best(rows[key]['plan'])}" for key in keys)
        db.close()
    return lines


def explain(rows: dict[str, dict], key: str) -> list[str]:  # type: ignore[type-arg]
    """Per mesh: MRE of the training, validation and test stages, and the stages of PredTOP's and the exhaustive
    plan with their predicted and measured ms (the errors that chose the plan)."""
    row = rows[key]
    ref = rows[f"{key.split('/')[0]}/reference"]["exhaustive"]
    picked = {*row["plan"], *ref["plan"]}
    lines = [f"{key}: plan {row['plan']} ({100 * row['vs_exhaustive']:+.1f}%), exhaustive {ref['plan']}"]
    for setting, stages in row["stages"].items():
        errors: dict[str, list[float]] = {}
        for _first, _end, predicted, measured, role in stages:
            errors.setdefault(role, []).append(abs(predicted - measured) / measured)
        lines.append(f"  {setting}: MRE " + ", ".join(
            f"{role} {100 * sum(e) / len(e):.1f}% ({len(e)})" for role, e in sorted(errors.items())))
        mesh, intra = setting.split("/")
        for first, end, predicted, measured, role in stages:
            if f"[{first},{end}) {mesh} dp{intra.split('dp')[1]}" in picked:
                lines.append(f"    [{first},{end}) {role}: predicted {predicted:.1f} ms, measured {measured:.1f} ms "
                             f"({100 * (predicted / measured - 1):+.1f}%)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--samplers", nargs="+", default=["covering"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--patience", type=int, default=200)
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--kind", default="transformer", choices=list(MODEL_KINDS),
                        help="the predictor (GCN and GAT: the paper's variants, sec. VIII-B); in the key when not "
                        "the DAG Transformer")
    parser.add_argument("--layers", default="units", choices=list(LAYERINGS),
                        help="PredTOP's stages: ranges of units (the rows before the eighth session) or of Alpa's "
                        "clustered layers (the paper's; `trainsim search`'s default now); in the key when alpa")
    parser.add_argument("--every-stage", action="store_true",
                        help="sample from every stage of each mesh (the rows before the ninth session); by default "
                        "from the stages the DP can use (key suffix -usable)")
    parser.add_argument("--label", default="", help="appended to the sampler in the row's key (a method variant)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--explain", nargs="+", default=[], help="print the per-stage errors of these rows' keys")
    parser.add_argument("--same-dag", action="store_true",
                        help="print every row's plan scored over the same-DAG median latencies (no fit)")
    args = parser.parse_args()
    rows = {}
    if args.out.exists():
        rows = {(r := json.loads(line))["key"]: r for line in args.out.read_text().splitlines() if line.strip()}
    if args.same_dag:
        print("\n".join(same_dag_report(rows)))
        return
    if args.explain:
        for key in args.explain:
            print("\n".join(explain(rows, key)))
        return
    done = set(rows)

    def emit(row: dict[str, object]) -> None:
        print(json.dumps({k: v for k, v in row.items() if k not in ("plan", "stages")}), row.get("plan", ""),
              flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")

    for name in args.cases:
        run_case(name, args.samplers, args.seeds, args.epochs, args.patience, args.fraction, args.label, args.kind,
                 args.layers, args.every_stage, done, emit)


if __name__ == "__main__":
    main()
