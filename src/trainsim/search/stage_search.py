"""`trainsim search --planner stage|uniform --stage-costs ...`: a stage planner over one cost source, its plan,
what it cost, and the simulator's re-check.

Cost sources (STAGE_COSTS):
- analytical / profiled: the pricing service over the roofline / the profile database (no stage is run);
- measured: every stage the planner asks is run alone (measure.stage; Alpa's exhaustive profiling);
- mpe: MPE's chain over measured nodes and edges, searched by MPE's holistic DP;
- predtop: PredTOP's DAG Transformer trained per mesh on a measured fraction of the stages.
The stage planner is Alpa's DP (holistic DP for mpe); the uniform planner tries Megatron's even splits under
the same costs. `equal_meshes` restricts either to stages on one submesh shape with one intra plan (uneven layer
ranges allowed: what one ParallelSpec expresses and `trainsim measure --stage-layers` runs); `stage_tp` keeps
only the intra plans of that tensor-parallel degree. profiled_configurations counts the stages run for real;
stage_evaluations the stage estimates the planner read.

The simulator re-checks the plan: stages on equal meshes with equal intra plans are a ParallelSpec (tp, dp, pp,
and the per-stage layer counts where the split is uneven) run through `predict(engine="sim")`; a plan whose
stages differ in mesh or intra plan is a strategy tree of stages on their own submeshes (search.stage_tree).
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.cost.pricing import make_pricer
from trainsim.errors import ConfigError, TrainsimError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.job import make_job
from trainsim.pipeline import GraphCache, graph_for, predict
from trainsim.profile.paths import default_db_path
from trainsim.search.stage_costs import CountedStageCosts, PricedStageCosts, StageCosts, StageJob
from trainsim.search.stage_dp import (
    PlanSearch,
    alpa_dp,
    equal_mesh_search,
    holistic_dp,
    uniform_search,
    usable_filter,
)
from trainsim.search.stage_tree import stage_plan_job, stage_plan_lowered
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StagePlan, intra_plans, num_units, submeshes

PLANNERS = ("uniform", "stage")
STAGE_COSTS = ("analytical", "profiled", "measured", "mpe", "predtop")
PREDTOP_LAYERS = ("alpa", "units")  # search.predtop.experiment.LAYERINGS (a test checks): not imported here
PREDTOP_SAMPLERS = ("sized", "covering", "random")  # search.predtop.costs.SAMPLERS, which imports torch


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSearchSettings:
    planner: str = "stage"
    stage_costs: str = "analytical"
    global_batch: int
    num_micro_batches: int
    seq_len: int
    precision: Precision = "fp32"
    db: Path | None = None
    predtop_fraction: float = 0.3
    predtop_epochs: int = 500
    predtop_patience: int = 200
    predtop_layers: str = "alpa"  # PredTOP's stages: ranges of Alpa's clustered layers (the paper's) or of units
    predtop_sampler: str = "sized"
    sp: bool = False
    equal_meshes: bool = False
    stage_tp: int | None = None
    every_stage: bool = False  # Alpa's DP evaluates every stage (its full profiling), also those no plan can hold

    def __post_init__(self) -> None:
        if self.planner not in PLANNERS:
            raise ConfigError("planner", self.planner, "choose one of: " + ", ".join(PLANNERS))
        if self.stage_costs not in STAGE_COSTS:
            raise ConfigError("stage_costs", self.stage_costs, "choose one of: " + ", ".join(STAGE_COSTS))
        for name in ("global_batch", "num_micro_batches", "seq_len", "predtop_epochs", "predtop_patience"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(name, value, "must be a positive integer")
        if self.global_batch % self.num_micro_batches:
            raise ConfigError("num_micro_batches", self.num_micro_batches,
                              f"must divide the global batch ({self.global_batch})")
        if self.stage_tp is not None and (not isinstance(self.stage_tp, int) or self.stage_tp <= 0):
            raise ConfigError("stage_tp", self.stage_tp,
                              "must be a positive integer (the intra plans' tensor-parallel degree)")
        if not 0.0 < self.predtop_fraction <= 1.0:
            raise ConfigError("predtop_fraction", self.predtop_fraction, "must be in (0, 1]")
        if self.predtop_layers not in PREDTOP_LAYERS:
            raise ConfigError("predtop_layers", self.predtop_layers, "choose one of: " + ", ".join(PREDTOP_LAYERS))
        if self.predtop_sampler not in PREDTOP_SAMPLERS:
            raise ConfigError("predtop_sampler", self.predtop_sampler,
                              "choose one of: " + ", ".join(PREDTOP_SAMPLERS))


@dataclass(frozen=True, slots=True)
class StageSearchReport:
    planner: str
    stage_costs: str
    search: PlanSearch
    profiled_configurations: int
    search_time_s: float
    sim_iteration_s: float | None
    sim_note: str
    parallel: ParallelSpec | None = None  # the plan as one ParallelSpec (plan_parallel), None where it is not one
    cost_detail: dict[str, Any] | None = None  # what the search time went to (measured, predtop sources)

    def to_dict(self) -> dict[str, Any]:
        return {
            "planner": self.planner, "stage_costs": self.stage_costs, "plan": self.search.plan.to_dict(),
            "stage_evaluations": self.search.stage_evaluations,
            "profiled_configurations": self.profiled_configurations, "search_time_s": self.search_time_s,
            "t_max_tried": self.search.t_max_tried, "sim_iteration_s": self.sim_iteration_s,
            "sim_note": self.sim_note, "parallel": None if self.parallel is None else parallel_fields(self.parallel),
            "cost_detail": self.cost_detail,
        }


def parallel_fields(parallel: ParallelSpec) -> dict[str, Any]:
    """The strategy fields a stage plan sets (the flags `trainsim measure` runs it with)."""
    return {"tp": parallel.tp, "dp": parallel.dp, "pp": parallel.pp, "sp": parallel.sp,
            "micro_batch": parallel.micro_batch, "global_batch": parallel.global_batch, "seq_len": parallel.seq_len,
            "precision": parallel.precision, "schedule": parallel.schedule, "stage_layers": list(parallel.stage_layers)}


def _source(model: TransformerSpec, job: StageJob, settings: StageSearchSettings) -> tuple[StageCosts, Any]:
    """The cost source and what counts its profiled configurations (None: nothing is run)."""
    costs = settings.stage_costs
    if costs in ("analytical", "profiled"):
        pricer = make_pricer("roofline" if costs == "analytical" else "profiled", settings.db)
        return PricedStageCosts(job, pricer), None
    from trainsim.measure.stage_db import MeasuredStageCosts, StageDatabase

    database = StageDatabase(settings.db or default_db_path())
    measured = MeasuredStageCosts(model, job.micro_batch, job.seq_len, database)
    if costs == "measured":
        return measured, measured
    if costs == "mpe":
        from trainsim.search.mpe import MpeStageCosts

        chain = MpeStageCosts(measured, model)
        return chain, chain
    from trainsim.search.predtop.costs import PredTopStageCosts
    from trainsim.search.predtop.dag import DagBuilder, unit_costs
    from trainsim.search.predtop.experiment import HEAVY_OPS, alpa_layers

    dags = DagBuilder(model, job.micro_batch, job.seq_len)
    cuts = alpa_layers(*unit_costs(dags, HEAVY_OPS)) if settings.predtop_layers == "alpa" else None
    # sampled from the stages Alpa's DP asks for (all with every_stage)
    meshes = search_space(model, job.cluster, settings)[0]
    usable = None if settings.every_stage else usable_filter(num_units(model), meshes, job.cluster.num_gpus,
                                                              settings.equal_meshes)
    predtop = PredTopStageCosts(measured, PricedStageCosts(job), dags, num_units(model), settings.predtop_fraction,
                                epochs=settings.predtop_epochs, patience=settings.predtop_patience,
                                sampler=settings.predtop_sampler, layer_cuts=cuts, usable=usable)
    return predtop, predtop


def stage_search(model: ModelSpec, cluster: ClusterSpec, settings: StageSearchSettings) -> StageSearchReport:
    if not isinstance(model, TransformerSpec):
        raise ConfigError("model", model.name, "stage planning needs a transformer (a chain of blocks)")
    job = StageJob(model=model, cluster=cluster, micro_batch=settings.global_batch // settings.num_micro_batches,
                   num_micro_batches=settings.num_micro_batches, seq_len=settings.seq_len,
                   precision=settings.precision)
    meshes, plans = search_space(model, cluster, settings)
    start = time.perf_counter()
    source, counter = _source(model, job, settings)
    counted = CountedStageCosts(source)
    rest = (cluster.num_gpus, settings.num_micro_batches, job.capacity_bytes)
    if settings.planner == "uniform":
        def planner(c: CountedStageCosts, m: list[Mesh], p: dict[Mesh, list[IntraPlan]]) -> PlanSearch:
            return uniform_search(c, model.num_layers, m, p, *rest)
    else:
        def planner(c: CountedStageCosts, m: list[Mesh], p: dict[Mesh, list[IntraPlan]]) -> PlanSearch:
            if settings.stage_costs == "mpe":
                return holistic_dp(c, num_units(model), m, p, *rest)
            return alpa_dp(c, num_units(model), m, p, *rest, every_stage=settings.every_stage)
    found = equal_mesh_search(planner, counted, meshes, plans) if settings.equal_meshes else \
        planner(counted, meshes, plans)
    elapsed = time.perf_counter() - start
    profiled = 0 if counter is None else counter.profiled_configurations
    sim_s, note = sim_recheck(found.plan, model, cluster, settings)
    detail = getattr(counter, "cost_detail", None)
    return StageSearchReport(settings.planner, settings.stage_costs, found, profiled, elapsed, sim_s, note,
                             plan_parallel(found.plan, settings), None if detail is None else detail())


def search_space(model: TransformerSpec, cluster: ClusterSpec,
                 settings: StageSearchSettings) -> tuple[list[Mesh], dict[Mesh, list[IntraPlan]]]:
    """Alpa's submeshes and each one's intra plans (only those of tensor-parallel degree `settings.stage_tp` when it
    is set; a mesh left with none is dropped)."""
    plans: dict[Mesh, list[IntraPlan]] = {}
    for mesh in submeshes(cluster):
        tp = settings.stage_tp
        kept = [p for p in intra_plans(model, mesh, sp=settings.sp) if tp is None or p.tp == tp]
        if kept:
            plans[mesh] = kept
    if not plans:
        raise ConfigError("stage_tp", settings.stage_tp, f"no submesh of {cluster.num_gpus} devices has an intra "
                          "plan of that tensor-parallel degree")
    return list(plans), plans


def plan_parallel(plan: StagePlan, settings: StageSearchSettings) -> ParallelSpec | None:
    """The plan as a ParallelSpec when its stages share one mesh shape and intra plan: Megatron's even split is
    a plain (tp, dp, pp); an uneven one lists its blocks per stage (the embedding rides with the first stage and
    the head with the last, as both a StagePlan and ParallelSpec place them)."""
    stages = plan.stages
    first = stages[0]
    if any(s.mesh != first.mesh or s.intra != first.intra for s in stages):
        return None
    blocks = [len(b) for b in plan.stage_blocks()]
    micro = settings.global_batch // settings.num_micro_batches
    if micro % first.intra.dp:
        return None
    pp = len(stages)
    uneven = pp > 1 and len(set(blocks)) != 1
    return ParallelSpec(tp=first.intra.tp, dp=first.intra.dp, pp=pp, sp=first.intra.sp,
                        micro_batch=micro // first.intra.dp, global_batch=settings.global_batch,
                        seq_len=settings.seq_len, precision=settings.precision, schedule="1f1b",
                        stage_layers=tuple(blocks) if uneven else ())


def sim_recheck(plan: StagePlan, model: TransformerSpec, cluster: ClusterSpec,
                settings: StageSearchSettings) -> tuple[float | None, str]:
    parallel = plan_parallel(plan, settings)
    if parallel is None:
        return _tree_recheck(plan, model, cluster, settings)
    try:
        job = make_job(model, cluster.with_num_gpus(plan.devices), parallel)
        result = predict(job, "sim", graphs=GraphCache())
    except TrainsimError as exc:
        return None, f"not re-checked: {exc}"
    return result.iteration_time_s, f"sim engine on {parallel.describe()} (whole iteration: optimizer included)"


def _tree_recheck(plan: StagePlan, model: TransformerSpec, cluster: ClusterSpec,
                  settings: StageSearchSettings) -> tuple[float | None, str]:
    """A plan whose stages differ in mesh or intra plan, simulated as a strategy tree of stages on their own
    submeshes (search.stage_tree)."""
    try:
        job = stage_plan_job(plan, model, cluster, global_batch=settings.global_batch, seq_len=settings.seq_len,
                             precision=settings.precision)
        graph = graph_for(job)
        result = predict(job, "sim", graph=graph, plan=stage_plan_lowered(plan, job, graph))
    except TrainsimError as exc:
        return None, f"not re-checked: {exc}"
    meshes = " + ".join(f"{s.mesh.size} ({s.intra.describe()})" for s in plan.stages)
    return result.iteration_time_s, (f"sim engine on a strategy tree of stages on their own submeshes: {meshes} "
                                     "devices (whole iteration: optimizer included)")
