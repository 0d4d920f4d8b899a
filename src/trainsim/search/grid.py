"""The analytical engine over a whole grid of plans at once: the search's fast path.

AnalyticalEstimator.price walks one plan through Python: its partition, its stages' prices, the bubble, the
gradient reduction, the optimizer step and the memory, ~100 us a plan even with every price cached. A grid of
plans of one model on one cluster shares almost all of that: its plans differ in a few integers (tp, pp, vpp,
dp, micro-batch, recompute, ZeRO). GridEngine prices what the plans share once, as the plain engine does (the
same Pricer, the same formulas, the same order of operations), and what they do not share as numpy arrays over
the plans:

- once per pipeline partition (graph, pp, vpp) and layer context (graph, tp, cp, ep, dp, sp, precision):
  each distinct stage's forward, backward, weight-gradient and feature-communication seconds, what its
  recompute would repeat, its ZeRO-3 exposure, its pipeline sends, its host overhead, its parameters, saved
  activations and working buffers (Pricer's public prices of layers, collectives and stages);
- per plan, as arrays: the stage times (recompute, ZeRO-3), the bottleneck stage, the bubble, the exposed
  gradient reduction, the optimizer step, the iteration time, and each stage's memory under the schedule and
  its peak (cost.memory's formulas).

The plans the fast path does not cover (an uneven pipeline split, a stage list; a cluster or stack other than
the first plan's; a step-cost model whose host overhead reads the plan) go to the plain engine one by one, so
every plan gets the figures AnalyticalEstimator.price gives it: tests/unit/search/test_grid.py holds them equal.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from trainsim.cost.pricing import LayerCost, Pricer
from trainsim.cost.step import FittedStepCosts
from trainsim.errors import TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator, PlanPrice
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.strategy.precision import Precision, policy_for
from trainsim.strategy.stages import StagePart, is_even_split

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
SCHEDULE_CODES = {"1f1b": 0, "interleaved-1f1b": 1, "gpipe": 2, "zb-h1": 3}
OPTIMIZER_CODES = {"fused": 0, "foreach": 1, "loop": 2}
COMM_SLOTS = 4  # feature-communication axes of a stage (tp, cp, ep) and its pipeline sends


@dataclass(slots=True)
class _StageRow:
    """One distinct stage of a partition under one layer context: everything of its price that does not depend
    on recompute, ZeRO or the micro-batch count (Pricer._price_stage's and cost.memory's inputs)."""

    compute_s: float  # forward + backward
    forward_s: float
    backward_s: float
    wgrad_s: float
    comm_s: tuple[float, ...]  # in Pricer._price_stage's order (feature axes, then pp), padded with zeros
    comm_total_s: float  # sum(comm_s) as StageCost sums it
    recompute_s: tuple[float, float, float]  # per RECOMPUTE_CODES
    fsdp_s: float  # ZeRO-3 exposure (with the bucketed tail where the stack buckets)
    overhead_s: float
    params: float
    saved_bytes: tuple[float, float, float]  # per RECOMPUTE_CODES
    largest_saved_bytes: float  # the largest layer's saved activations without recompute
    max_layer_params: float
    head_saved_bytes: float  # the head's logits gradient, 0 without a head
    grad: tuple[float, float, float] = (0.0, 0.0, 0.0)  # all-reduce, reduce-scatter, all-gather of its gradients


@dataclass(slots=True)
class _Combo:
    """A partition under one layer context: its distinct stages' rows and how its stages map to them."""

    first_row: int  # index of its first _StageRow in the engine's table
    local: tuple[int, ...]  # per stage: which of its distinct rows (0-based) it takes
    max_params: float  # the stage with the most parameters (the optimizer step's)


@dataclass(frozen=True, slots=True)
class GridPrices:
    """Per plan, in the order given: what the planner ranks plans by. errors: plans the engine refused."""

    iteration_time_s: Floats
    tokens_per_s: Floats
    peak_memory_bytes: Floats
    oom: NDArray[np.bool_]
    errors: dict[int, TrainsimError] = field(default_factory=dict)


class GridEngine:
    """Prices many plans at once with the analytical engine's closed form (see the module doc).
    estimator: the plain engine whose pricer (and caches) this engine shares and whose price() makes a plan's
    full PlanPrice (plan_price)."""

    def __init__(self, estimator: AnalyticalEstimator | None = None) -> None:
        self.estimator = estimator or AnalyticalEstimator()
        self.pricer: Pricer = self.estimator.pricer

    def plan_price(self, job: Job, graph: OpGraph) -> PlanPrice:
        """The plain engine's full price of one plan (its Result via .result())."""
        return self.estimator.price(job, graph)

    def price(self, plans: Sequence[tuple[Job, OpGraph]]) -> GridPrices:
        n = len(plans)
        time_s = np.zeros(n)
        peak = np.zeros(n)
        oom = np.zeros(n, dtype=np.bool_)
        errors: dict[int, TrainsimError] = {}
        fast, slow = _Batch(self, plans).split() if n else (None, list[int]())
        if fast is not None:
            fast.compute(time_s, peak, oom)
        for index in slow:
            job, graph = plans[index]
            try:
                priced = self.estimator.price(job, graph)
            except TrainsimError as exc:
                errors[index] = exc
                continue
            time_s[index], peak[index], oom[index] = priced.iteration_time_s, priced.peak_memory_bytes, priced.oom
        tokens = np.array([job.tokens_per_iteration for job, _ in plans], dtype=np.float64)
        with np.errstate(divide="ignore"):
            tokens_per_s = tokens / time_s
        return GridPrices(time_s, tokens_per_s, peak, oom, errors)


class _Batch:
    """The plans of one price() call: gathers the fast ones' settings and prices what they share."""

    def __init__(self, engine: GridEngine, plans: Sequence[tuple[Job, OpGraph]]) -> None:
        self.pricer = engine.pricer
        self.plans = plans
        self.job0 = plans[0][0]
        self.rows: list[_StageRow] = []
        self.combos: list[_Combo] = []
        self._combo_of: dict[tuple[object, ...], int] = {}
        self._layer_costs: dict[tuple[object, ...], dict[int, LayerCost]] = {}
        self.precisions: list[Precision] = []  # the precisions of the plans, each once
        # NB: FittedStepCosts' host overhead per micro-batch reads none of its arguments: one price per stage
        self.fitted_overhead = isinstance(self.pricer.step_costs, FittedStepCosts)

    def split(self) -> tuple["_Fast | None", list[int]]:
        """The fast plans' settings as arrays, and the indices of the plans left to the plain engine."""
        cluster, stack = self.job0.cluster, self.job0.stack
        slow: list[int] = []
        index_of: list[int] = []
        columns: list[tuple[int, ...]] = []
        for index, (job, graph) in enumerate(self.plans):
            par = job.parallel
            if (job.cluster is not cluster and job.cluster != cluster) or \
                    (job.stack is not stack and job.stack != stack) or not is_even_split(par):
                slow.append(index)
                continue
            key = (id(graph), par.tp, par.cp, par.ep, par.dp, par.pp, par.vpp, par.sp, par.precision)
            combo = self._combo_of.get(key)
            if combo is None:
                combo = self._combo(key, job, graph)
            if combo < 0:
                slow.append(index)
                continue
            index_of.append(index)
            columns.append((combo, par.pp, par.vpp, par.dp * par.cp, par.zero, par.num_micro_batches,
                            RECOMPUTE_CODES[par.recompute], SCHEDULE_CODES[par.schedule],
                            OPTIMIZER_CODES[par.optimizer_impl], self._precision(par.precision)))
        if not index_of:
            return None, slow
        return _Fast(self, np.array(index_of, dtype=np.int64), np.array(columns, dtype=np.int64)), slow

    def _precision(self, precision: Precision) -> int:
        if precision not in self.precisions:
            self.precisions.append(precision)
        return self.precisions.index(precision)

    def _combo(self, key: tuple[object, ...], job: Job, graph: OpGraph) -> int:
        """The combo of a new key: -1 where the plain engine must price the plan (an uneven split, a graph whose
        partition or prices raise, a step-cost model whose overhead reads the plan)."""
        pricer, par = self.pricer, job.parallel
        try:
            if pricer.plan_split(graph, par) is not None or not self.fitted_overhead:
                number = -1
            else:
                number = self._new_combo(job, graph)
        except TrainsimError:
            number = -1
        self._combo_of[key] = number
        return number

    def _new_combo(self, job: Job, graph: OpGraph) -> int:
        pricer = self.pricer
        partition = pricer.plan_partition(graph, job.parallel)
        if partition.chunk_blocks:
            return -1
        first_row = len(self.rows)
        local = {head: number for number, head in enumerate(partition.distinct)}
        for head in partition.distinct:
            self.rows.append(self._stage_row(partition.stages[head], job))
        max_params = max(pricer.stage_params(stage) for stage in partition.stages)
        self.combos.append(_Combo(first_row, tuple(local[head] for head in partition.first), max_params))
        return len(self.combos) - 1

    def _stage_row(self, stage: list[StagePart], job: Job) -> _StageRow:
        """A stage's price parts, each as Pricer's _stage_work, _stage_recompute_s, _price_stage,
        micro_batch_overhead_s and cost.memory compute it (the same sums in the same order)."""
        pricer, par = self.pricer, job.parallel
        forward = backward = wgrad = 0.0
        feature: dict[str, float] = {}
        selective = full = 0.0
        for part in stage:
            cost = pricer.layer_cost(part.layer, job)
            forward += part.count * cost.fwd_s
            backward += part.count * cost.bwd_s
            wgrad += part.count * cost.wgrad_s
            for axis, seconds in cost.comm_s.items():
                feature[axis] = feature.get(axis, 0.0) + part.count * seconds
            if part.layer.kind not in ("embedding", "head"):
                full += part.count * (cost.fwd_s + cost.comm_fwd_s)
            selective += part.count * cost.selective_s
        comm = dict(feature)
        if par.pp > 1:
            comm["pp"] = pricer.pipeline_send_s(stage, job)
        values = tuple(comm.values())
        saved = tuple(sum(part.count * part.layer.saved_bytes[mode] for part in stage)
                      for mode in RECOMPUTE_CODES)
        largest = max((part.layer for part in stage), key=lambda layer: layer.saved_bytes["none"])
        heads = [part.layer for part in stage if part.layer.kind == "head"]
        row = _StageRow(
            compute_s=forward + backward, forward_s=forward, backward_s=backward, wgrad_s=wgrad,
            comm_s=values + (0.0,) * (COMM_SLOTS - len(values)), comm_total_s=sum(values),
            recompute_s=(0.0, selective, full), fsdp_s=pricer.zero3_exposed_s(stage, job),
            overhead_s=pricer.micro_batch_overhead_s(stage, job),
            params=pricer.stage_params(stage), saved_bytes=(saved[0], saved[1], saved[2]),
            largest_saved_bytes=largest.saved_bytes["none"],
            max_layer_params=max(part.layer.param_count for part in stage),
            head_saved_bytes=heads[0].saved_bytes["none"] if heads else 0.0)
        if par.dp * par.cp > 1:
            policy = policy_for(par.precision)
            row.grad = (pricer.axis_collective_s("all-reduce", row.params * policy.grad_bytes, "grad", job),
                        pricer.axis_collective_s("reduce-scatter", row.params * policy.grad_bytes, "grad", job),
                        pricer.axis_collective_s("all-gather", row.params * policy.weight_bytes, "grad", job))
        return row


class _Fast:
    """The fast plans as arrays (one entry per plan) and the closed form over them."""

    def __init__(self, batch: _Batch, index: Ints, columns: Ints) -> None:
        self.batch = batch
        self.index = index
        (self.combo, self.pp, self.vpp, self.shards_dp, self.zero, self.m, self.recompute, self.schedule,
         self.optimizer, self.precision) = (columns[:, k] for k in range(columns.shape[1]))
        policies = [policy_for(name) for name in batch.precisions]
        self.weight_bytes = np.array([policy.weight_bytes for policy in policies], dtype=np.float64)[self.precision]
        self.grad_bytes = np.array([policy.grad_bytes for policy in policies], dtype=np.float64)[self.precision]
        self.state_bytes = np.array([policy.master_bytes + policy.optimizer_state_bytes for policy in policies],
                                    dtype=np.float64)[self.precision]

    def compute(self, time_out: Floats, peak_out: Floats, oom_out: NDArray[np.bool_]) -> None:
        batch = self.batch
        pricer, job0 = batch.pricer, batch.job0
        rows, combos = batch.rows, batch.combos
        n = len(self.index)
        width = max(len(combo.local) for combo in combos)
        # per combo: each stage's row (padded with -1)
        stage_rows = np.full((len(combos), width), -1, dtype=np.int64)
        for number, combo in enumerate(combos):
            stage_rows[number, :len(combo.local)] = [combo.first_row + local for local in combo.local]
        table = _RowTable(rows)
        plan_rows = stage_rows[self.combo]  # n x width
        valid = plan_rows >= 0
        safe_rows = np.where(valid, plan_rows, 0)
        m = self.m.astype(np.float64)
        zero3 = self.zero >= 3

        # --- one micro-batch on every stage (Pricer._price_stage, StageCost.total_s) ---
        recompute = table.recompute[safe_rows, self.recompute[:, None]]
        fsdp = np.where(zero3[:, None], table.fsdp[safe_rows], 0.0)
        totals = table.compute[safe_rows] + recompute + table.comm_total[safe_rows] + fsdp + \
            table.overhead[safe_rows]
        totals_or_floor = np.where(valid, totals, -np.inf)
        bottleneck = np.argmax(totals_or_floor, axis=1)  # the first slowest stage, as max(range(p), key=...)
        plans = np.arange(n)
        slow_row = safe_rows[plans, bottleneck]
        slow_total = totals[plans, bottleneck]
        slow_recompute = recompute[plans, bottleneck]
        slow_fsdp = fsdp[plans, bottleneck]
        stage_sum = np.cumsum(np.where(valid, totals, 0.0), axis=1)[:, -1]  # Python's sum: left to right

        # --- the bubble (even split) and zero bubble ---
        bubble = (stage_sum - slow_total) / self.vpp
        zb = self.schedule == SCHEDULE_CODES["zb-h1"]
        if zb.any():
            factor = np.maximum(0.0, 1.0 - 2.0 * table.wgrad[slow_row] / slow_total)
            bubble = np.where(zb, bubble * factor, bubble)

        # --- the exposed gradient reduction of the bottleneck and of the first stage ---
        grad = np.maximum(self._grad_exposed(table, slow_row, slow_recompute),
                          self._grad_exposed(table, safe_rows[:, 0], recompute[:, 0]))

        # --- the optimizer step and the host overheads ---
        optimizer = self._optimizer_s(combos)
        iteration_overhead = pricer.iteration_overhead_s(job0)

        # --- the breakdown, summed in AnalyticalEstimator.price's order (estimate.result.iteration_time_s) ---
        total = m * table.compute[slow_row]
        total = total + m * slow_recompute
        for slot in range(COMM_SLOTS):
            total = total + m * table.comm[slow_row, slot]
        dp_comm = grad + m * slow_fsdp
        total = total + dp_comm
        total = total + bubble
        total = total + optimizer
        total = total + (iteration_overhead + m * table.overhead[slow_row])
        share = job0.cluster.device.compute_share
        if share < 1.0:
            total = total + np.maximum(0.0, (total - bubble) / share - total)
        time_out[self.index] = total

        peak, capacity = self._peak_memory(table, safe_rows, valid)
        peak_out[self.index] = peak
        oom_out[self.index] = peak > capacity

    def _grad_exposed(self, table: "_RowTable", row: Ints, recompute: Floats) -> Floats:
        """Pricer.gradient_sync_exposed_s of one stage per plan."""
        batch = self.batch
        pricer, job0 = batch.pricer, batch.job0
        params = table.params[row]
        buckets = params / job0.stack.grad_bucket_params
        gamma = pricer.overlap_slowdown(job0)
        reduce = np.where(self.zero == 0, table.grad[row, 0], table.grad[row, 1])
        if pricer.overlaps("grad_reduce_overlap", job0):
            exposed = _bucketed_s(reduce, table.backward[row] + recompute, buckets, gamma)
        else:
            exposed = reduce
        gather = table.grad[row, 2]
        if pricer.overlaps("param_gather_overlap", job0):
            gather = _bucketed_s(gather, table.forward[row], buckets, gamma)
        exposed = np.where(self.zero > 0, exposed + gather, exposed)
        return np.where((self.shards_dp == 1) | (self.zero >= 3), 0.0, exposed)

    def _optimizer_s(self, combos: list[_Combo]) -> Floats:
        """Pricer.optimizer_step_s per plan: one step-cost call per distinct (parameters, shards, precision)."""
        batch = self.batch
        pricer, device = batch.pricer, batch.job0.cluster.device
        shards = np.where(self.zero >= 1, self.shards_dp, 1)
        max_params = np.array([combo.max_params for combo in combos])[self.combo]
        keys = np.stack([max_params, shards.astype(np.float64), self.precision.astype(np.float64)], axis=1)
        distinct, inverse = np.unique(keys, axis=0, return_inverse=True)
        seconds = np.array([pricer.step_costs.optimizer_step_s(params / int(shard), batch.precisions[int(code)],
                                                               device)
                            for params, shard, code in distinct.tolist()])
        return seconds[inverse.reshape(-1)]

    def _peak_memory(self, table: "_RowTable", rows: Ints, valid: NDArray[np.bool_]) -> tuple[Floats, float]:
        """Pricer.memory of every plan: each stage's memory at its peak (cost.memory.stage_memory_base,
        stage_in_flight, stage_memory_values) and the largest."""
        batch = self.batch
        device = batch.job0.cluster.device
        width = rows.shape[1]
        weight_bytes = self.weight_bytes[:, None]
        grad_bytes = self.grad_bytes[:, None]
        state_bytes = self.state_bytes[:, None]
        shards = self.shards_dp[:, None]
        opt_shards = np.where(self.zero >= 1, self.shards_dp, 1)[:, None]
        zero = self.zero[:, None]
        params = table.params[rows]
        weights = params * weight_bytes / np.where(zero >= 3, shards, 1)
        gradients = params * grad_bytes / np.where(zero >= 2, shards, 1)
        optimizer = params * state_bytes / opt_shards
        per_micro_batch = table.saved[rows, self.recompute[:, None]]
        working = np.where(self.recompute[:, None] != 0, table.largest_saved[rows], 0.0)
        working = np.where(zero >= 3, working + 2 * table.max_layer_params[rows] * weight_bytes, working)
        working = working + table.head_saved[rows]  # 0 where the stage has no head: x + 0.0 is x
        impl = self.optimizer[:, None]
        step = np.where(impl == OPTIMIZER_CODES["foreach"], 4.0 * params / opt_shards,
                        np.where(impl == OPTIMIZER_CODES["loop"], 4.0 * table.max_layer_params[rows] / opt_shards,
                                 0.0))
        # micro-batches each stage holds at its peak (strategy.stages.in_flight_micro_batches)
        stage = np.arange(width)[None, :]
        pp, vpp, m = self.pp[:, None], self.vpp[:, None], self.m[:, None]
        schedule = self.schedule[:, None]
        interleaved = np.minimum(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp) / vpp
        in_flight = np.where(schedule == SCHEDULE_CODES["gpipe"], m.astype(np.float64),
                             np.where(schedule == SCHEDULE_CODES["interleaved-1f1b"], interleaved,
                                      np.minimum(m, pp - stage).astype(np.float64)))
        activations = per_micro_batch * in_flight
        stepping = step > activations + working
        activations = np.where(stepping, 0.0, activations)
        working = np.where(stepping, 0.0, working)
        step = np.where(stepping, step, 0.0)
        totals = weights + gradients + optimizer + activations + working + step + device.runtime_reserved_bytes
        totals = np.where(valid, totals, -np.inf)
        return totals[np.arange(len(self.index)), np.argmax(totals, axis=1)], device.hbm_bytes


class _RowTable:
    """The stage rows as columns."""

    def __init__(self, rows: list[_StageRow]) -> None:
        def column(name: str) -> Floats:
            return np.array([getattr(row, name) for row in rows], dtype=np.float64)

        self.compute = column("compute_s")
        self.forward = column("forward_s")
        self.backward = column("backward_s")
        self.wgrad = column("wgrad_s")
        self.comm = column("comm_s")
        self.comm_total = column("comm_total_s")
        self.recompute = column("recompute_s")
        self.fsdp = column("fsdp_s")
        self.overhead = column("overhead_s")
        self.params = column("params")
        self.saved = column("saved_bytes")
        self.largest_saved = column("largest_saved_bytes")
        self.max_layer_params = column("max_layer_params")
        self.head_saved = column("head_saved_bytes")
        self.grad = column("grad")


def _bucketed_s(total: Floats, window: Floats, buckets: Floats, gamma: float) -> Floats:
    """cost.stack_effects.bucketed_s over arrays."""
    n = np.maximum(1.0, buckets)
    exposed = np.maximum(total / n, total - window * (n - 1.0) / n)
    return np.where(total <= 0.0, 0.0, exposed + gamma * (total - exposed))


