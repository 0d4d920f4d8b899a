"""Where a stage's latency and memory come from, for the stage planners (search.stage_dp).

A StageCosts answers estimate(stage) with a StageEstimate, or None where the stage cannot run that way (dp not
dividing the micro-batch). Sources:
- PricedStageCosts: the pricing service (cost.pricing.Pricer.stage_cost) that the analytical engine uses, over
  the roofline ("analytical") or the profile database ("profiled");
- TableStageCosts: a fixed table (tests, or latencies measured once and kept);
- the measured, MPE and PredTOP sources live in measure.stage, search.mpe and search.predtop.

CountedStageCosts caches any source and counts the distinct stages asked (the planners' stage_evaluations).
same_dag_median_costs takes the stage-to-stage spread out of a measured table (plans scored without it).
"""

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from trainsim.cost.memory import stage_memory_base
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError, TrainsimError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import GraphCache
from trainsim.strategy.parallel import ParallelSpec, Recompute
from trainsim.strategy.precision import Precision
from trainsim.strategy.stage_plan import Mesh, StageEstimate, StageSpec, unit_kind
from trainsim.strategy.stages import StagePart


class StageCosts(Protocol):
    def estimate(self, stage: StageSpec) -> StageEstimate | None: ...


def prefetch(costs: StageCosts, stages: list[StageSpec]) -> None:
    """Tell a source that batches its work (a measured one: one set of ranks per mesh size) what is coming."""
    ahead = getattr(costs, "prefetch", None)
    if ahead is not None:
        ahead(stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageJob:
    """What every stage of one pipeline shares: the model, the pipeline's micro-batch (sequences, split over a
    stage's dp), the number of micro-batches, sequence length, precision and recompute."""

    model: TransformerSpec
    cluster: ClusterSpec
    micro_batch: int  # sequences per pipeline micro-batch (global batch / num_micro_batches)
    num_micro_batches: int
    seq_len: int
    precision: Precision = "fp32"
    recompute: Recompute = "none"

    def __post_init__(self) -> None:
        for name in ("micro_batch", "num_micro_batches", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(name, value, "must be a positive integer")

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_micro_batches

    @property
    def capacity_bytes(self) -> float:
        device = self.cluster.device
        return device.hbm_bytes - device.runtime_reserved_bytes

    def mesh_cluster(self, mesh: Mesh) -> ClusterSpec:
        return self.cluster.model_copy(update={"gpus_per_node": mesh.devices_per_node, "num_nodes": mesh.nodes})

    def stage_job(self, stage: StageSpec) -> Job | None:
        """The job of one stage alone (pp = 1, one micro-batch of micro_batch / dp sequences per device), or
        None when the stage's dp does not divide the micro-batch."""
        intra = stage.intra
        if self.micro_batch % intra.dp:
            return None
        par = ParallelSpec(tp=intra.tp, dp=intra.dp, sp=intra.sp, pp=1, micro_batch=self.micro_batch // intra.dp,
                           global_batch=self.micro_batch, seq_len=self.seq_len, precision=self.precision,
                           recompute=self.recompute, schedule="1f1b")
        try:
            return make_job(self.model, self.mesh_cluster(stage.mesh), par)
        except TrainsimError:
            return None


def stage_parts(model: TransformerSpec, graph: OpGraph, first: int, end: int) -> list[StagePart]:
    """The graph's layers (by kind) the units [first, end) hold, with their counts."""
    by_kind: dict[str, Layer] = {layer.kind: layer for layer in graph.layers}
    counts: dict[str, int] = {}
    for unit in range(first, end):
        kind = unit_kind(model, unit)
        counts[kind] = counts.get(kind, 0) + 1
    parts = []
    for kind in ("embedding", "block", "moe_block", "head"):
        if counts.get(kind):
            if kind not in by_kind:
                raise ConfigError("stage", kind, f"the model's graph has no {kind} layer")
            parts.append(StagePart(by_kind[kind], float(counts[kind])))
    return parts


@dataclass(slots=True)
class PricedStageCosts:
    """Stage latency and memory from the pricing service: Pricer.stage_cost (forward, backward, recompute,
    feature communication, host overhead) and cost.memory.stage_memory_base (states, one micro-batch's saved
    activations, working buffers)."""

    job: StageJob
    pricer: Pricer = field(default_factory=Pricer)
    graphs: GraphCache = field(default_factory=GraphCache)

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        job = self.job.stage_job(stage)
        if job is None:
            return None
        graph = self.graphs.get(job)
        parts = stage_parts(self.job.model, graph, stage.first, stage.end)
        cost = self.pricer.stage_cost(parts, job)
        base = stage_memory_base(parts, job.parallel, job.stack)
        return StageEstimate(cost.total_s, sum(base.states) + max(base.working, base.step), base.per_micro_batch)


@dataclass(slots=True)
class TableStageCosts:
    """Stage estimates from a table keyed by (first, end, mesh size, tp): for tests and kept measurements."""

    table: Mapping[tuple[int, int, int, int], StageEstimate]

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        return self.table.get((stage.first, stage.end, stage.mesh.size, stage.intra.tp))


@dataclass(slots=True)
class FunctionStageCosts:
    """Stage estimates from a function (first, end, mesh, intra) -> StageEstimate | None."""

    function: Callable[[StageSpec], StageEstimate | None]

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        return self.function(stage)


@dataclass(slots=True)
class CountedStageCosts:
    """Any source, each distinct stage asked once; `evaluations` counts them."""

    source: StageCosts
    cache: dict[StageSpec, StageEstimate | None] = field(default_factory=dict)

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        if stage not in self.cache:
            self.cache[stage] = self.source.estimate(stage)
        return self.cache[stage]

    @property
    def evaluations(self) -> int:
        return len(self.cache)

    def prefetch(self, stages: list[StageSpec]) -> None:
        prefetch(self.source, [stage for stage in stages if stage not in self.cache])


def same_dag_median_costs(source: StageCosts, model: TransformerSpec, stages: list[StageSpec]) -> FunctionStageCosts:
    """`source` with each of `stages`' latency replaced by the median over those of `stages` on the same mesh and
    intra plan with the same unit kinds in the same order (the same DAG: blocks [1,3) and [5,7) of a dense model);
    memory as `source` gives it. A measured table without the spread between runs of the same computation (the
    groups of search.predtop.experiment.noise_floor); stages outside `stages` are None."""
    def key(stage: StageSpec) -> tuple[object, ...]:
        return (stage.mesh, stage.intra, *(unit_kind(model, u) for u in range(stage.first, stage.end)))
    found = {stage: estimate for stage in stages if (estimate := source.estimate(stage)) is not None}
    groups: dict[tuple[object, ...], list[float]] = {}
    for stage, estimate in found.items():
        groups.setdefault(key(stage), []).append(estimate.latency_s)
    table = {stage: StageEstimate(statistics.median(groups[key(stage)]), e.state_bytes, e.activation_bytes)
             for stage, e in found.items()}
    return FunctionStageCosts(table.get)
