"""The inter-operator search over (layer ranges x submeshes): Alpa's dynamic program, MPE's holistic one, and
the uniform (Megatron-style) baseline, all minimising the pipeline time of stage_plan.pipeline_time_s.

Alpa (Zheng et al. 2022, sec. 5.2, eqs. 3-5; PredTOP sec. V uses the same model): for a bound t_max on every
stage's latency,
    F(s, k, d) = min over i > k, submesh m (|m| <= d), intra plan p:  t(k..i, m, p) + F(s - 1, i, d - |m|)
    subject to t(k..i, m, p) <= t_max and memory(k..i, m, p, in flight = s) <= capacity,  F(0, K, 0) = 0,
and T* = min over t_max of min_s F(s, 0, D) + (B - 1) t_max, with t_max enumerated over the distinct stage
latencies in ascending order, stopping once (B - 1) t_max alone exceeds the best T found (Alpa's early exit).
Every device is used (d reaches 0 exactly). Alpa profiles every (range, submesh, intra plan) (its full
profiling, O(K^2 x plans) stage evaluations; `every_stage=True`); by default the table holds only the stages some
plan can hold (usable_stage: the units before and after the stage can be cut into stages whose submeshes use
exactly the devices left), which leaves the optimum unchanged (a stage no plan holds is never in the optimum, and
its latency as a t_max only repeats the DP of the next lower usable one) and spares the stages no plan can use:
on 4 devices with equal meshes, 54 of the 55 stages of a 10-unit chain on the 4-device mesh.

equal_mesh_search restricts any of these planners to plans whose stages share one submesh shape and one intra
plan (uneven layer ranges allowed): the plans one ParallelSpec (tp, dp, pp, stage_layers) expresses, so that
`trainsim measure --stage-layers` can run them end to end.

MPE (Yun and Park 2023, sec. III-B, eq. 3): the holistic graph G_H(i, j, d) is the fastest stage of units
i..j over submeshes of at most d devices that fits memory, and
    C(i, j, d) = min { G_H(i, j, d), C(i, a, d') + C(a, j, d - d') }.
The pipeline objective is not additive, so here C carries the same t_max bound and in-flight count as Alpa's
F, and the split is taken at the first stage (C(i, a, d') = G_H(i, a, d'): any chain of stages is a first stage
and the rest, so this covers every split of eq. 3). Devices used are at most D (the paper: "the cumulative GPU
count remains below the available GPU resources"). G_H comes from the chain estimate (search.mpe), so the
stages it reads cost no profiling; the stage_evaluations it reports are chain look-ups.
"""

import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainsim.errors import ConfigError, InfeasiblePlanError
from trainsim.search.stage_costs import CountedStageCosts, StageCosts, prefetch
from trainsim.strategy.stage_plan import (
    IntraPlan,
    Mesh,
    StageEstimate,
    StagePlan,
    StageSpec,
    in_flight,
    pipeline_time_s,
)

# (first, end, mesh index) -> per in-flight count s: the fastest (latency, stage, estimate) fitting memory
BestTable = dict[tuple[int, int, int], list[tuple[float, StageSpec, StageEstimate] | None]]


@dataclass(frozen=True, slots=True)
class PlanSearch:
    """A planner's answer and what finding it cost."""

    plan: StagePlan
    stage_evaluations: int
    search_time_s: float
    t_max_tried: int


def device_totals(num_units: int, sizes: list[int], devices: int) -> list[set[int]]:
    """totals[u]: the device counts (at most `devices`) that u units cut into stages (each of at least one unit,
    on one submesh of one of `sizes`) can occupy; totals[0] = {0}."""
    # by_count[j]: the sums of exactly j submesh sizes
    by_count: list[set[int]] = [{0}]
    for _ in range(num_units):
        by_count.append({t + size for t in by_count[-1] for size in sizes if t + size <= devices})
    totals = [{0}, set(by_count[1])]
    for units in range(2, num_units + 1):
        totals.append(totals[-1] | by_count[units])
    return totals[:num_units + 1]


def usable_stage(first: int, end: int, size: int, totals: list[set[int]], num_units: int, devices: int) -> bool:
    """Whether a stage of units [first, end) on a submesh of `size` devices is in some plan that uses exactly
    `devices` (Alpa's DP): the units before and after it fit the devices left (totals: device_totals)."""
    left = devices - size
    return any(left - before in totals[num_units - end] for before in totals[first] if before <= left)


def usable_filter(num_units: int, meshes: list[Mesh], devices: int,
                  equal_meshes: bool) -> Callable[[StageSpec], bool]:
    """usable_stage as a predicate on stages: with the other stages on any of `meshes` (Alpa's DP), or on the
    stage's own submesh shape (equal_mesh_search runs the DP per mesh alone)."""
    every = device_totals(num_units, sorted({mesh.size for mesh in meshes}), devices)
    alone = {mesh.size: device_totals(num_units, [mesh.size], devices) for mesh in meshes}

    def usable(stage: StageSpec) -> bool:
        totals = alone.get(stage.mesh.size) if equal_meshes else every
        return totals is not None and usable_stage(stage.first, stage.end, stage.mesh.size, totals, num_units,
                                                   devices)
    return usable


def _asked(num_units: int, meshes: list[Mesh], plans: dict[Mesh, list[IntraPlan]], devices: int,
           every_stage: bool) -> list[StageSpec]:
    """The stages the DP's table holds: every (range, submesh, intra plan), or the usable ones only."""
    totals = device_totals(num_units, sorted({mesh.size for mesh in meshes}), devices)
    return [StageSpec(first, end, mesh, intra) for first in range(num_units)
            for end in range(first + 1, num_units + 1) for mesh in meshes
            if every_stage or usable_stage(first, end, mesh.size, totals, num_units, devices)
            for intra in plans[mesh]]


def _best_table(costs: StageCosts, num_units: int, meshes: list[Mesh], plans: dict[Mesh, list[IntraPlan]],
                capacity_bytes: float, max_stages: int, num_micro_batches: int, asked: list[StageSpec]) -> BestTable:
    """For every unit range and submesh: per in-flight count, the fastest intra plan of those `asked` whose
    memory fits (None where none was asked or none fits)."""
    table: BestTable = {}
    prefetch(costs, asked)
    wanted = set(asked)
    for first in range(num_units):
        for end in range(first + 1, num_units + 1):
            for index, mesh in enumerate(meshes):
                estimates = []
                for intra in plans[mesh]:
                    stage = StageSpec(first, end, mesh, intra)
                    if stage not in wanted:
                        continue
                    estimate = costs.estimate(stage)
                    if estimate is not None:
                        estimates.append((estimate.latency_s, stage, estimate))
                estimates.sort(key=lambda entry: (entry[0], entry[1]))
                row: list[tuple[float, StageSpec, StageEstimate] | None] = [None]
                for s in range(1, max_stages + 1):
                    held = in_flight(s, num_micro_batches)
                    row.append(next((e for e in estimates if e[2].memory_bytes(held) <= capacity_bytes), None))
                table[(first, end, index)] = row
    return table


def _dp_for_t_max(table: BestTable, num_units: int, meshes: list[Mesh], devices: int, max_stages: int,
                  t_max: float, exact_devices: bool) -> tuple[float, list[tuple[StageSpec, StageEstimate]]] | None:
    """min over s of F(s, 0, D) under t_max, with the stages; None when nothing fits."""
    inf = math.inf
    sizes = [mesh.size for mesh in meshes]
    # f[s][k][d]: best sum of latencies covering units [k, K) with s stages on d devices (exactly or at most)
    f = [[[inf] * (devices + 1) for _ in range(num_units + 1)] for _ in range(max_stages + 1)]
    choice: dict[tuple[int, int, int], tuple[int, int]] = {}
    for d in range(devices + 1):
        if d == 0 or not exact_devices:
            f[0][num_units][d] = 0.0
    for s in range(1, max_stages + 1):
        for k in range(num_units - 1, -1, -1):
            for d in range(1, devices + 1):
                best, arg = inf, None
                for i in range(k + 1, num_units + 1):
                    for m, size in enumerate(sizes):
                        if size > d:
                            continue
                        rest = f[s - 1][i][d - size]
                        if rest == inf:
                            continue
                        entry = table[(k, i, m)][s]
                        if entry is None or entry[0] > t_max:
                            continue
                        total = entry[0] + rest
                        if total < best:
                            best, arg = total, (i, m)
                if arg is not None:
                    f[s][k][d] = best
                    choice[(s, k, d)] = arg
    best_s, best_total = 0, inf
    for s in range(1, max_stages + 1):
        if f[s][0][devices] < best_total:
            best_s, best_total = s, f[s][0][devices]
    if best_total == inf:
        return None
    stages: list[tuple[StageSpec, StageEstimate]] = []
    s, k, d = best_s, 0, devices
    while s > 0:
        i, m = choice[(s, k, d)]
        entry = table[(k, i, m)][s]
        assert entry is not None
        stages.append((entry[1], entry[2]))
        s, k, d = s - 1, i, d - sizes[m]
    return best_total, stages


def _search(table: BestTable, num_units: int, meshes: list[Mesh], devices: int, num_micro_batches: int,
            exact_devices: bool) -> tuple[StagePlan, int]:
    max_stages = min(num_units, devices)
    latencies = sorted({entry[0] for row in table.values() for entry in row if entry is not None})
    best: tuple[float, list[tuple[StageSpec, StageEstimate]]] | None = None
    tried = 0
    for t_max in latencies:
        if best is not None and (num_micro_batches - 1) * t_max + t_max >= best[0]:
            break  # T >= B t_max for any plan with this bottleneck: no larger t_max can win
        tried += 1
        found = _dp_for_t_max(table, num_units, meshes, devices, max_stages, t_max, exact_devices)
        if found is None:
            continue
        total = pipeline_time_s([e.latency_s for _, e in found[1]], num_micro_batches)
        if best is None or total < best[0]:
            best = (total, found[1])
    if best is None:
        raise InfeasiblePlanError("out of memory", f"no pipeline of these stages fits in memory on {devices} "
                                  "devices")
    stages = tuple(stage for stage, _ in best[1])
    estimates = tuple(estimate for _, estimate in best[1])
    return StagePlan(stages, estimates, num_micro_batches), tried


def _check(num_units: int, devices: int, num_micro_batches: int, meshes: list[Mesh]) -> None:
    for name, value in (("num_units", num_units), ("devices", devices), ("num_micro_batches", num_micro_batches)):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(name, value, "must be a positive integer")
    if not meshes:
        raise ConfigError("meshes", meshes, "name at least one submesh")


def alpa_dp(costs: StageCosts, num_units: int, meshes: list[Mesh], plans: dict[Mesh, list[IntraPlan]],
            devices: int, num_micro_batches: int, capacity_bytes: float, every_stage: bool = False) -> PlanSearch:
    """Alpa's inter-operator DP over the (unit range, submesh, intra plan) stages some plan can hold (every one
    with `every_stage`: Alpa's full profiling), all devices used."""
    return _inter_operator_dp(costs, num_units, meshes, plans, devices, num_micro_batches, capacity_bytes,
                              exact_devices=True, every_stage=every_stage)


def holistic_dp(costs: StageCosts, num_units: int, meshes: list[Mesh], plans: dict[Mesh, list[IntraPlan]],
                devices: int, num_micro_batches: int, capacity_bytes: float) -> PlanSearch:
    """MPE's holistic DP C(i, j, d) over G_H from `costs` (the chain estimate), at most `devices` used."""
    return _inter_operator_dp(costs, num_units, meshes, plans, devices, num_micro_batches, capacity_bytes,
                              exact_devices=False, every_stage=True)


def _inter_operator_dp(costs: StageCosts, num_units: int, meshes: list[Mesh], plans: dict[Mesh, list[IntraPlan]],
                       devices: int, num_micro_batches: int, capacity_bytes: float,
                       exact_devices: bool, every_stage: bool) -> PlanSearch:
    _check(num_units, devices, num_micro_batches, meshes)
    start = time.perf_counter()
    asked = _asked(num_units, meshes, plans, devices, every_stage)
    counted = costs if isinstance(costs, CountedStageCosts) else CountedStageCosts(costs)
    table = _best_table(counted, num_units, meshes, plans, capacity_bytes, min(num_units, devices),
                        num_micro_batches, asked)
    plan, tried = _search(table, num_units, meshes, devices, num_micro_batches, exact_devices=exact_devices)
    plan = _with_count(plan, counted.evaluations)
    return PlanSearch(plan, counted.evaluations, time.perf_counter() - start, tried)


def _with_count(plan: StagePlan, evaluations: int) -> StagePlan:
    return StagePlan(plan.stages, plan.estimates, plan.num_micro_batches, evaluations)


def uniform_plans(num_blocks: int, meshes: list[Mesh], devices: int) -> Iterable[tuple[list[tuple[int, int]], Mesh]]:
    """Megatron's even splits: S stages of num_blocks / S blocks, the embedding with the first, the head with
    the last, each stage on a submesh of D / S devices. Unit ranges over the chain of num_blocks + 2 units."""
    by_size = {mesh.size: mesh for mesh in meshes}
    for stages in range(1, num_blocks + 1):
        if num_blocks % stages or devices % stages or devices // stages not in by_size:
            continue
        per = num_blocks // stages
        bounds = [0] + [1 + per * s for s in range(1, stages)] + [num_blocks + 2]
        yield list(itertools.pairwise(bounds)), by_size[devices // stages]


def uniform_search(costs: StageCosts, num_blocks: int, meshes: list[Mesh], plans: dict[Mesh, list[IntraPlan]],
                   devices: int, num_micro_batches: int, capacity_bytes: float) -> PlanSearch:
    """The best even split (uniform_plans), each stage with its fastest intra plan that fits memory."""
    start = time.perf_counter()
    counted = costs if isinstance(costs, CountedStageCosts) else CountedStageCosts(costs)
    best: StagePlan | None = None
    tried = 0
    prefetch(counted, [StageSpec(first, end, mesh, intra) for ranges, mesh in uniform_plans(num_blocks, meshes, devices)
                       for first, end in ranges for intra in plans[mesh]])
    for ranges, mesh in uniform_plans(num_blocks, meshes, devices):
        tried += 1
        chosen: list[tuple[StageSpec, StageEstimate]] = []
        for position, (first, end) in enumerate(ranges):
            held = in_flight(len(ranges) - position, num_micro_batches)
            options = []
            for intra in plans[mesh]:
                stage = StageSpec(first, end, mesh, intra)
                estimate = counted.estimate(stage)
                if estimate is not None and estimate.memory_bytes(held) <= capacity_bytes:
                    options.append((estimate.latency_s, stage, estimate))
            if not options:
                break
            _, stage, estimate = min(options, key=lambda entry: (entry[0], entry[1]))
            chosen.append((stage, estimate))
        else:
            plan = StagePlan(tuple(s for s, _ in chosen), tuple(e for _, e in chosen), num_micro_batches)
            if best is None or plan.iteration_s < best.iteration_s:
                best = plan
    if best is None:
        raise InfeasiblePlanError("out of memory", f"no even split fits in memory on {devices} devices")
    best = _with_count(best, counted.evaluations)
    return PlanSearch(best, counted.evaluations, time.perf_counter() - start, tried)


# a planner over a cost source and (meshes, intra plans per mesh): alpa_dp, holistic_dp or uniform_search with the
# other arguments bound
Planner = Callable[[CountedStageCosts, list[Mesh], dict[Mesh, list[IntraPlan]]], PlanSearch]


def equal_mesh_search(planner: Planner, costs: StageCosts, meshes: list[Mesh],
                      plans: dict[Mesh, list[IntraPlan]]) -> PlanSearch:
    """The best plan whose stages all share one submesh shape and one intra plan: `planner` run once per (mesh,
    intra plan) pair with that pair alone, the lowest eq. 4 time kept (ties: the first pair in the order given).
    A pair with no feasible plan (no stage fits memory, or Alpa's exact device count not a multiple of the mesh
    size) is skipped. stage_evaluations counts the distinct stages over all runs; t_max_tried sums them."""
    _check(1, 1, 1, meshes)
    start = time.perf_counter()
    counted = costs if isinstance(costs, CountedStageCosts) else CountedStageCosts(costs)
    best: PlanSearch | None = None
    tried = 0
    for mesh in meshes:
        for intra in plans.get(mesh, []):
            try:
                found = planner(counted, [mesh], {mesh: [intra]})
            except InfeasiblePlanError:
                continue
            tried += found.t_max_tried
            if best is None or found.plan.iteration_s < best.plan.iteration_s:
                best = found
    if best is None:
        raise InfeasiblePlanError("out of memory", "no plan of stages on equal meshes with one intra plan fits in "
                                  "memory")
    plan = _with_count(best.plan, counted.evaluations)
    return PlanSearch(plan, counted.evaluations, time.perf_counter() - start, tried)
