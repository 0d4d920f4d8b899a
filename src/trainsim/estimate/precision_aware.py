"""The precision-aware distributed training-time predictor (engine "precision-aware").

The paper (sec. III) predicts one iteration as

    T(d, t, p) = T_comp(d, t, p) + T_dp(d) + T_tp(t) + T_pp(p)                                    (Eq. 1)

1. partition the model into GPU-specific subgraphs by DP, TP and PP (Algorithm 1);
2. give every operator of a subgraph its precision (the cast torch.amp picks under mixed precision, the fixed
   dtype otherwise): here the op dtypes of the OpGraph built with the job's precision;
3. profile every operator, forward and backward, with the job's shapes (trainsim profile -> ProfiledCosts; the
   calibrated roofline answers without a profile database) and add them up per subgraph: T_comp;
4. T_dp = V_dp / B_link (Eq. 2), V_dp the gradient bytes of the subgraph's trainable parameters at their
   operators' precision; T_tp = V_tp / B_link (Eq. 3), V_tp the partial-gradient bytes of the weights TP
   sliced; T_pp = T_comp x (PP - 1) (Eq. 4), the pipeline bubble.

Kept as the paper states it, including where trainsim's other engines model more (overlap, ring factors,
activation all-reduces of TP, 1F1B bubbles): this engine is the paper's model, for comparison.
"""

from dataclasses import dataclass
from pathlib import Path

from trainsim.catalog.calibration import Calibration, load_calibration
from trainsim.cost.compute import OpCostModel, RooflineCosts
from trainsim.cost.memory import estimate_memory, optimizer_shards
from trainsim.cost.pricing import axis_layout
from trainsim.cost.profiled import ProfiledCosts, ProfiledStepCosts
from trainsim.cost.rank_classes import (
    RankKind,
    default_kind,
    device_classes,
    rank_device,
    ranks_differ,
    stage_capacities,
)
from trainsim.cost.step import FittedStepCosts, StepCosts
from trainsim.estimate.result import Result, make_result
from trainsim.hardware.device import BYTES_PER_DTYPE, DeviceSpec
from trainsim.ir.graph import Layer, OpGraph
from trainsim.job import Job
from trainsim.strategy.front_end_splits import refuse_whole_model_cp, refuse_whole_model_tp
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stages import StagePart, plan_stages


@dataclass(frozen=True, slots=True)
class Subgraph:
    """One GPU's share of the model (Algorithm 1): the layers of pipeline stage `stage` on data-parallel replica
    `dp_rank` and tensor-parallel rank `tp_rank`, with weights sliced when `sliced` (TP > 1)."""

    stage: int
    dp_rank: int
    tp_rank: int
    parts: tuple[StagePart, ...]
    sliced: bool


def partition(graph: OpGraph, par: ParallelSpec) -> list[Subgraph]:
    """Algorithm 1: for each stage s (layers(M)/PP each, line 4-7), each DP replica d (line 8) and each TP rank
    t (line 9), copy the stage's layers (line 10) and slice their weights when TP > 1 (line 12-15).

    NB: `graph` is the per-device graph the catalog front-end built with the job's tp (and sp/cp/ep): its
    weights are the slices slice_weight(w, t, TP) of line 15 already, identical for every t; the stage
    assignment is strategy.stages.plan_stages (the strategy's split: even by default, embedding first, head last).
    """
    stages = plan_stages(graph, par)
    subgraphs: list[Subgraph] = []
    for s in range(par.pp):
        for d in range(par.dp):
            for t in range(par.tp):
                subgraphs.append(Subgraph(s, d, t, tuple(stages[s]), par.tp > 1))
    return subgraphs


def _weight_bytes_per_param(layer: Layer) -> int:
    """Bytes of one gradient element of the layer's weights: the precision of the operators that own them.
    NB: the matmuls own a layer's weights when it has any (norm weights are a rounding error); otherwise the
    layer's first operator (embedding lookups, norms)."""
    ops = layer.fwd
    owner = next((op for op in ops if op.kind in ("matmul", "conv", "embedding")), ops[0] if ops else None)
    return BYTES_PER_DTYPE[owner.dtype] if owner is not None else 4


def gradient_bytes(parts: tuple[StagePart, ...]) -> float:
    """V_dp of Eq. 2: gradient bytes of every trainable parameter of the subgraph, at operator precision."""
    return sum(part.count * part.layer.param_count * _weight_bytes_per_param(part.layer) for part in parts)


def sliced_gradient_bytes(parts: tuple[StagePart, ...], tp: int) -> float:
    """V_tp of Eq. 3: the partial-gradient bytes of the weights Algorithm 1 sliced (line 15).

    NB: a layer holds R replicated + S sliced parameters: full = R + S, local = R + S / tp, so the local
    slice is S / tp = (full - local) / (tp - 1)."""
    if tp <= 1:
        return 0.0
    return sum(part.count * (part.layer.full_param_count - part.layer.param_count) / (tp - 1)
               * _weight_bytes_per_param(part.layer) for part in parts)


class PrecisionAwareEstimator:
    """Seed-001 predictor. db: a profile database (ProfiledCosts answers the ops it holds); op_costs: any
    OpCostModel instead; neither: the calibrated roofline. optimizer: add the Adam step (profiled when the
    database holds it) - NB an addition to Eq. 1, whose measured 'training time' includes the step."""

    name = "precision-aware"

    def __init__(self, calibration: Calibration | None = None, op_costs: OpCostModel | None = None,
                 db: Path | None = None, optimizer: bool = True) -> None:
        self.cal = calibration or load_calibration()
        if op_costs is None and db is not None:
            op_costs = ProfiledCosts(db, fallback=RooflineCosts(self.cal))
        self.op_costs: OpCostModel = op_costs or RooflineCosts(self.cal)
        fitted = FittedStepCosts(self.cal)
        self.step_costs: StepCosts = ProfiledStepCosts(op_costs, fitted) if isinstance(op_costs, ProfiledCosts) \
            else fitted
        self.optimizer = optimizer

    def subgraph_time_s(self, subgraph: Subgraph, job: Job, device: DeviceSpec | None = None) -> float:
        """One micro-batch through the subgraph on `device` (default: the cluster's): the sum of its operators'
        forward and backward times."""
        device = device or job.cluster.device
        return sum(part.count * sum(self.op_costs.op_time_s(op, device) for op in part.layer.fwd + part.layer.bwd)
                   for part in subgraph.parts)

    def _link_bw(self, axis: str, job: Job) -> float:
        """B_link of Eq. 2-3: the link the axis' group crosses (inside an NVLink domain: the GPU fabric;
        across domains: one GPU's share of the NICs)."""
        layout = axis_layout(axis, job.parallel, job.cluster)
        cluster = job.cluster
        return cluster.intra_node.bw_bytes_per_s if layout.num_domains == 1 else cluster.nic_bw_per_gpu_bytes_per_s

    def estimate(self, job: Job, graph: OpGraph, plan: LoweredPlan | None = None) -> Result:
        """graph: the job's per-device graph with per-op precision from the job's precision policy; plan:
        ignored (Algorithm 1 splits the layers evenly)."""
        par = job.parallel
        where = f"the {self.name} engine"
        refuse_whole_model_tp(graph.frontend, par.tp, where)
        refuse_whole_model_cp(graph.frontend, par.cp, where)
        subgraphs = partition(graph, par)
        kinds = _stage_kinds(job)
        per_stage: dict[int, float] = {}
        slowest_kind: dict[int, RankKind] = {}
        for sub in subgraphs:
            if sub.stage not in per_stage:  # d and t copies of a stage are identical: cost each stage once
                # NB: where ranks differ (cost.rank_classes), a stage's copies run at its slowest rank's pace:
                # Algorithm 1's subgraph on that rank's device, times its slow-down
                times = {kind: kind[1] * self.subgraph_time_s(sub, job, rank_device(job, kind[0]))
                         for kind in kinds[sub.stage]}
                slowest_kind[sub.stage] = max(times, key=times.__getitem__)
                per_stage[sub.stage] = times[slowest_kind[sub.stage]]
        # NB: the paper sums operator times per subgraph; GPUs run their subgraphs concurrently, so the slowest
        # one sets T_comp. One iteration runs the global batch: num_micro_batches profiled micro-batches.
        slowest = max(subgraphs, key=lambda sub: per_stage[sub.stage])
        t_comp = par.num_micro_batches * per_stage[slowest.stage]
        # Eq. 2: T_dp = V_dp / B_link (NB: zero without data parallelism; the dp x cp ranks share gradients)
        t_dp = gradient_bytes(slowest.parts) / self._link_bw("dp", job) if par.dp * par.cp > 1 else 0.0
        # Eq. 3: T_tp = V_tp / B_link
        t_tp = sliced_gradient_bytes(slowest.parts, par.tp) / self._link_bw("tp", job) if par.tp > 1 else 0.0
        # Eq. 4: T_pp = T_comp x (PP - 1)
        t_pp = t_comp * (par.pp - 1)
        breakdown = {"compute": t_comp, "dp_comm": t_dp, "tp_comm": t_tp, "bubble": t_pp}
        stages = plan_stages(graph, par)
        if self.optimizer:
            name, slowdown = slowest_kind[slowest.stage]
            breakdown["optimizer"] = slowdown * self._optimizer_step_s(slowest.parts, job, rank_device(job, name))
        capacities = stage_capacities(job, device_classes(job)) if ranks_differ(job) else ()
        memory = estimate_memory(stages, par, job.cluster.device, job.stack, capacities)
        return make_result(self.name, job, graph, breakdown, memory, notes=self._notes(job))

    def _optimizer_step_s(self, parts: tuple[StagePart, ...], job: Job, device: DeviceSpec) -> float:
        """The Adam step over the subgraph's parameters: measured when the profile holds it, else the roofline
        step (cost/step.py)."""
        par = job.parallel
        params = sum(part.count * part.layer.param_count for part in parts)
        return self.step_costs.optimizer_step_s(params / optimizer_shards(par), par.precision, device)

    def _notes(self, job: Job) -> list[str]:
        par = job.parallel
        notes = ["precision-aware predictor: T = T_comp + T_dp + T_tp + T_pp (Eq. 1-4)"
                 + (" + optimizer step" if self.optimizer else "")]
        if par.recompute != "none" or par.cp > 1 or par.ep > 1 or par.zero > 0:
            notes.append("the precision-aware predictor models neither recompute nor cp, ep or ZeRO communication: T "
                         "leaves them out (the graph's shapes and the memory estimate do follow them)")
        describe = getattr(self.op_costs, "describe", None)
        if callable(describe):
            notes.append(str(describe()))
        return notes


def _stage_kinds(job: Job) -> list[tuple[RankKind, ...]]:
    """Per pipeline stage, the kinds of its ranks (cost.rank_classes): the cluster's device alone where the
    ranks are alike."""
    default = default_kind(job)
    if not ranks_differ(job):
        return [(default,)] * job.parallel.pp
    classes = device_classes(job)
    return [tuple(sorted({kind for cls in classes for kind in cls.kinds(stage, default)}))
            for stage in range(job.parallel.pp)]
