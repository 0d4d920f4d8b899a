"""The stage DPs on hand-computed cases, and against the best uniform plan under the same stage costs."""

import random

import pytest

from trainsim.errors import ConfigError, InfeasiblePlanError
from trainsim.search.stage_costs import CountedStageCosts, FunctionStageCosts
from trainsim.search.stage_dp import (
    alpa_dp,
    device_totals,
    equal_mesh_search,
    holistic_dp,
    uniform_search,
    usable_stage,
)
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StagePlan, StageSpec, pipeline_time_s

ONE, TWO = Mesh(1, 1), Mesh(1, 2)
MESHES = [ONE, TWO]
PLANS = {ONE: [IntraPlan()], TWO: [IntraPlan(1, 2)]}
UNIT_S = [1.0, 3.0, 1.0, 1.0]  # a 4-unit chain: latency of each unit on one device


def chain_costs(two_device_factor: float, state_per_unit: float = 5.0, act_per_unit: float = 1.0):
    """Stage latency = the sum of its units (x factor on 2 devices, dp=2 halves activations)."""
    def estimate(stage: StageSpec) -> StageEstimate:
        units = range(stage.first, stage.end)
        latency = sum(UNIT_S[u] for u in units) * (two_device_factor if stage.mesh.size == 2 else 1.0)
        acts = act_per_unit * len(units) / stage.intra.dp
        return StageEstimate(latency, state_per_unit * len(units), acts)
    return FunctionStageCosts(estimate)


def test_pipeline_time_is_predtop_eq4():
    assert pipeline_time_s([4.0, 2.0], 4) == 6.0 + 3 * 4.0
    with pytest.raises(ConfigError):
        pipeline_time_s([], 4)


def test_alpa_dp_two_stages_hand_optimum():
    # 2 devices, B = 4. One stage on 2 devices: 6 x 0.9 = 5.4, T = 4 x 5.4 = 21.6. Two stages of one device:
    # [0,1)+[1,4) (1, 5): 21; [0,2)+[2,4) (4, 2): 6 + 3 x 4 = 18; [0,3)+[3,4) (5, 1): 21. Optimum 18.
    found = alpa_dp(chain_costs(0.9), 4, MESHES, PLANS, 2, 4, capacity_bytes=100.0)
    plan = found.plan
    assert [(s.first, s.end, s.mesh) for s in plan.stages] == [(0, 2, ONE), (2, 4, ONE)]
    assert plan.iteration_s == pytest.approx(18.0)
    # the stages some plan on exactly 2 devices holds, each evaluated once: on 1 device the 3 that start at unit 0
    # and end before 4 and the 3 that end at 4 (the other device takes the rest); on 2 devices [0,4) alone
    assert found.stage_evaluations == 7 == plan.stage_evaluations
    # Alpa's full profiling (every_stage): 10 ranges x 2 meshes, the same plan
    full = alpa_dp(chain_costs(0.9), 4, MESHES, PLANS, 2, 4, capacity_bytes=100.0, every_stage=True)
    assert full.stage_evaluations == 20 and full.plan.stages == plan.stages


def test_alpa_dp_one_stage_when_two_devices_scale():
    # factor 0.6: one stage on 2 devices, 3.6 x 4 = 14.4 < 18
    plan = alpa_dp(chain_costs(0.6), 4, MESHES, PLANS, 2, 4, capacity_bytes=100.0).plan
    assert [(s.first, s.end, s.mesh) for s in plan.stages] == [(0, 4, TWO)]
    assert plan.iteration_s == pytest.approx(14.4)


def test_alpa_dp_memory_counts_in_flight_micro_batches():
    # [0,2) first of two stages holds 2 micro-batches: 10 + 2 x 2 = 14 bytes; [1,4) last: 15 + 3 = 18;
    # one stage on 2 devices: 20 + 4 / 2 = 22. Capacity 13.9: nothing fits.
    with pytest.raises(InfeasiblePlanError):
        alpa_dp(chain_costs(0.9), 4, MESHES, PLANS, 2, 4, capacity_bytes=13.9)
    # capacity 14: [0,2)+[2,4) fits again (the second holds one micro-batch: 10 + 2 = 12)
    plan = alpa_dp(chain_costs(0.9), 4, MESHES, PLANS, 2, 4, capacity_bytes=14.0).plan
    assert plan.iteration_s == pytest.approx(18.0)
    assert plan.peak_memory_bytes() == pytest.approx(14.0)


def test_alpa_uses_every_device_holistic_at_most():
    # 2 devices, a 2-device mesh 3x slower than one device: Alpa must use both devices (two stages, 18);
    # MPE's C(i, j, d) may leave one idle, but one stage on one device is T = 4 x 6 = 24, so it also splits.
    alpa = alpa_dp(chain_costs(3.0), 4, MESHES, PLANS, 2, 4, capacity_bytes=100.0).plan
    mpe = holistic_dp(chain_costs(3.0), 4, MESHES, PLANS, 2, 4, capacity_bytes=100.0).plan
    assert alpa.iteration_s == mpe.iteration_s == pytest.approx(18.0)
    # with B = 1 the pipeline is the sum of its stages: one device alone (6) ties two stages (6); 2 devices
    # x 3 is 18. Both find 6.
    assert holistic_dp(chain_costs(3.0), 4, MESHES, PLANS, 2, 1, capacity_bytes=100.0).plan.iteration_s == 6.0
    # 3 devices: Alpa must place 3 devices (a 1 + 2 split has a 3x slow stage); MPE may use 2.
    three = alpa_dp(chain_costs(3.0), 4, MESHES, PLANS, 3, 4, capacity_bytes=100.0).plan
    assert three.devices == 3
    assert holistic_dp(chain_costs(3.0), 4, MESHES, PLANS, 3, 4, capacity_bytes=100.0).plan.iteration_s <= \
        three.iteration_s


def test_uniform_search_even_splits():
    # chain of 2 blocks (4 units): 1 stage on 2 devices (dp 2) or 2 stages [0,2)+[2,4)
    found = uniform_search(chain_costs(0.9), 2, MESHES, PLANS, 2, 4, capacity_bytes=100.0)
    assert [(s.first, s.end) for s in found.plan.stages] == [(0, 2), (2, 4)]
    assert found.plan.iteration_s == pytest.approx(18.0)


@pytest.mark.parametrize("seed", range(12))
def test_dp_never_worse_than_best_uniform(seed: int):
    rng = random.Random(seed)
    blocks = 4
    units = blocks + 2
    unit_s = [rng.uniform(0.1, 3.0) for _ in range(units)]
    edge = rng.uniform(-0.05, 0.2)
    meshes = [Mesh(1, 1), Mesh(1, 2), Mesh(1, 4)]
    plans = {meshes[0]: [IntraPlan()], meshes[1]: [IntraPlan(1, 2), IntraPlan(2, 1)],
             meshes[2]: [IntraPlan(1, 4), IntraPlan(2, 2), IntraPlan(4, 1)]}
    speedup = {(1, 1): 1.0, (1, 2): rng.uniform(1.1, 2.0), (2, 1): rng.uniform(1.1, 2.0),
               (1, 4): rng.uniform(1.5, 4.0), (2, 2): rng.uniform(1.5, 4.0), (4, 1): rng.uniform(1.5, 4.0)}

    def estimate(stage: StageSpec) -> StageEstimate:
        span = range(stage.first, stage.end)
        latency = (sum(unit_s[u] for u in span) + edge * (len(span) - 1)) / speedup[(stage.intra.dp, stage.intra.tp)]
        return StageEstimate(latency, 3.0 * len(span) / stage.intra.tp, 1.0 * len(span) / stage.mesh.size)

    costs = CountedStageCosts(FunctionStageCosts(estimate))
    b = rng.choice([1, 2, 4, 8])
    capacity = rng.uniform(8.0, 30.0)
    try:
        uniform = uniform_search(costs, blocks, meshes, plans, 4, b, capacity).plan.iteration_s
    except InfeasiblePlanError:
        uniform = float("inf")
    try:
        best = alpa_dp(costs, units, meshes, plans, 4, b, capacity).plan
    except InfeasiblePlanError:
        assert uniform == float("inf")
        return
    assert best.iteration_s <= uniform + 1e-12
    assert best.devices == 4
    assert best.peak_memory_bytes() <= capacity
    # brute force over every split into stages on meshes summing to 4 devices
    assert best.iteration_s == pytest.approx(_brute_force(estimate, units, meshes, plans, 4, b, capacity))


def _brute_force(estimate, units, meshes, plans, devices, b, capacity) -> float:
    best = float("inf")

    def walk(first: int, left: int, chosen: list[tuple[StageSpec, StageEstimate]]) -> None:
        nonlocal best
        if first == units:
            if left == 0:
                count = len(chosen)
                if all(e.memory_bytes(min(count - i, b)) <= capacity for i, (_, e) in enumerate(chosen)):
                    best = min(best, pipeline_time_s([e.latency_s for _, e in chosen], b))
            return
        for end in range(first + 1, units + 1):
            for mesh in meshes:
                if mesh.size <= left:
                    for intra in plans[mesh]:
                        stage = StageSpec(first, end, mesh, intra)
                        walk(end, left - mesh.size, [*chosen, (stage, estimate(stage))])

    walk(0, devices, [])
    return best


def _alpa(devices: int, b: int, capacity: float):
    return lambda costs, meshes, plans: alpa_dp(costs, 4, meshes, plans, devices, b, capacity)


def _holistic(devices: int, b: int, capacity: float):
    return lambda costs, meshes, plans: holistic_dp(costs, 4, meshes, plans, devices, b, capacity)


def test_equal_mesh_search_hand_optimum():
    # 3 devices, a 2-device mesh twice as fast, B = 4, units [1, 3, 1, 1]. Alpa over mixed meshes: [0,2) on 2
    # devices (2) + [2,4) on 1 (2): T = 4 + 3 x 2 = 10. Equal meshes: 3 devices are no multiple of 2, so three
    # stages of 1 device: [0,1) [1,2) [2,4) (1, 3, 2): T = 6 + 3 x 3 = 15 (the other splits have a 4 stage: 18).
    mixed = alpa_dp(chain_costs(0.5), 4, MESHES, PLANS, 3, 4, capacity_bytes=100.0).plan
    assert [(s.first, s.end, s.mesh) for s in mixed.stages] == [(0, 2, TWO), (2, 4, ONE)]
    assert mixed.iteration_s == pytest.approx(10.0)
    found = equal_mesh_search(_alpa(3, 4, 100.0), chain_costs(0.5), MESHES, PLANS)
    assert [(s.first, s.end, s.mesh) for s in found.plan.stages] == [(0, 1, ONE), (1, 2, ONE), (2, 4, ONE)]
    assert found.plan.iteration_s == pytest.approx(15.0)
    # three 1-device stages: [0,1) [0,2), [2,4) [3,4), and [1,2) [1,3) [2,3) between (7); no stage on the 2-device
    # mesh is in a plan of exactly 3 devices, so none is evaluated
    assert found.stage_evaluations == 7 == found.plan.stage_evaluations
    # MPE's DP may leave a device idle: one stage of 6 x 0.5 on 2 devices, T = 4 x 3 = 12, beats three of 1 (15)
    holistic = equal_mesh_search(_holistic(3, 4, 100.0), chain_costs(0.5), MESHES, PLANS).plan
    assert [(s.first, s.end, s.mesh) for s in holistic.stages] == [(0, 4, TWO)]
    assert holistic.iteration_s == pytest.approx(12.0)


def test_equal_mesh_search_refuses_when_nothing_fits():
    with pytest.raises(InfeasiblePlanError):
        equal_mesh_search(_alpa(3, 4, 1.0), chain_costs(0.5), MESHES, PLANS)
    with pytest.raises(ConfigError):
        equal_mesh_search(_alpa(3, 4, 100.0), chain_costs(0.5), [], PLANS)


@pytest.mark.parametrize("seed", range(8))
def test_equal_mesh_search_is_the_brute_force_optimum_over_one_mesh_and_intra_plan(seed: int):
    # differential: the best over every (mesh, intra plan) of the brute-force optimum with that pair alone; never
    # better than the unrestricted DP, never worse than the best even split (an even split is on equal meshes)
    rng = random.Random(100 + seed)
    blocks, units = 4, 6
    unit_s = [rng.uniform(0.1, 3.0) for _ in range(units)]
    meshes = [Mesh(1, 1), Mesh(1, 2), Mesh(1, 4)]
    plans = {meshes[0]: [IntraPlan()], meshes[1]: [IntraPlan(1, 2), IntraPlan(2, 1)],
             meshes[2]: [IntraPlan(1, 4), IntraPlan(2, 2)]}
    speedup = {(1, 1): 1.0, (1, 2): rng.uniform(1.1, 2.0), (2, 1): rng.uniform(1.1, 2.0),
               (4, 1): rng.uniform(1.5, 4.0), (2, 2): rng.uniform(1.5, 4.0)}  # (dp, tp)

    def estimate(stage: StageSpec) -> StageEstimate:
        span = range(stage.first, stage.end)
        latency = sum(unit_s[u] for u in span) / speedup[(stage.intra.dp, stage.intra.tp)]
        return StageEstimate(latency, 3.0 * len(span) / stage.intra.tp, 1.0 * len(span) / stage.mesh.size)

    b, capacity = rng.choice([2, 4, 8]), rng.uniform(8.0, 30.0)
    costs = FunctionStageCosts(estimate)
    expected = min(_brute_force(estimate, units, [mesh], {mesh: [intra]}, 4, b, capacity)
                   for mesh in meshes for intra in plans[mesh])
    try:
        found = equal_mesh_search(lambda c, m, p: alpa_dp(c, units, m, p, 4, b, capacity), costs, meshes,
                                  plans).plan
    except InfeasiblePlanError:
        assert expected == float("inf")
        return
    assert found.iteration_s == pytest.approx(expected)
    assert len({(s.mesh, s.intra) for s in found.stages}) == 1
    assert found.iteration_s >= alpa_dp(costs, units, meshes, plans, 4, b, capacity).plan.iteration_s - 1e-12
    try:
        uniform = uniform_search(costs, blocks, meshes, plans, 4, b, capacity).plan.iteration_s
    except InfeasiblePlanError:
        uniform = float("inf")
    assert found.iteration_s <= uniform + 1e-12


def test_stage_plan_checks_and_blocks():
    e = StageEstimate(1.0, 0.0, 0.0)
    plan = StagePlan((StageSpec(0, 2, ONE, IntraPlan()), StageSpec(2, 6, ONE, IntraPlan())), (e, e), 2)
    assert plan.stage_blocks() == [[0], [1, 2, 3]]
    with pytest.raises(ConfigError):
        StagePlan((StageSpec(0, 2, ONE, IntraPlan()), StageSpec(3, 6, ONE, IntraPlan())), (e, e), 2)
    with pytest.raises(ConfigError):
        StageSpec(0, 2, TWO, IntraPlan())  # tp x dp must fill the mesh
    with pytest.raises(ConfigError):
        StageEstimate(float("nan"), 0.0, 0.0)
    with pytest.raises(ConfigError):
        Mesh(0, 1)


def test_usable_stages_on_hand_cases():
    # 1-device meshes on 4 devices, 10 units (4 stages): 7 from unit 0 (end <= 7), 7 to the head (first >= 3), 35
    # between; 2-device meshes: 9 + 9 (two stages); the 4-device mesh: the whole chain only
    def count(size: int, sizes: list[int]) -> int:
        totals = device_totals(10, sizes, 4)
        return sum(usable_stage(a, b, size, totals, 10, 4) for a in range(10) for b in range(a + 1, 11))
    assert (count(1, [1]), count(2, [2]), count(4, [4])) == (49, 18, 1)
    # mixed meshes of 1, 2 and 4 devices: a 2-device stage may sit between two 1-device ones
    assert (count(1, [1, 2, 4]), count(2, [1, 2, 4]), count(4, [1, 2, 4])) == (52, 54, 1)
    assert device_totals(3, [2], 4) == [{0}, {2}, {2, 4}, {2, 4}]


@pytest.mark.parametrize("seed", range(12))
def test_usable_stages_leave_the_plan_unchanged(seed):
    rng = random.Random(seed)
    units, devices = rng.randint(3, 7), rng.choice([2, 3, 4])
    meshes = [ONE, TWO, Mesh(1, 4)][: rng.randint(1, 3)]
    plans = {m: [IntraPlan(1, m.size)] for m in meshes}
    unit_s = [rng.uniform(0.5, 3.0) for _ in range(units)]
    speed = {1: 1.0, 2: rng.uniform(0.5, 1.0), 4: rng.uniform(0.3, 1.0)}

    def estimate(stage: StageSpec) -> StageEstimate:
        latency = sum(unit_s[stage.first:stage.end]) * speed[stage.mesh.size] * rng.uniform(0.9, 1.1)
        return StageEstimate(latency, 1.0, 1.0)
    table = {StageSpec(a, b, m, plans[m][0]): estimate(StageSpec(a, b, m, plans[m][0]))
             for a in range(units) for b in range(a + 1, units + 1) for m in meshes}
    costs = FunctionStageCosts(lambda stage: table[stage])
    try:
        full = alpa_dp(costs, units, meshes, plans, devices, 4, capacity_bytes=100.0, every_stage=True)
    except InfeasiblePlanError:
        with pytest.raises(InfeasiblePlanError):
            alpa_dp(costs, units, meshes, plans, devices, 4, capacity_bytes=100.0)
        return
    pruned = alpa_dp(costs, units, meshes, plans, devices, 4, capacity_bytes=100.0)
    assert pruned.plan.iteration_s == pytest.approx(full.plan.iteration_s)
    assert pruned.stage_evaluations <= full.stage_evaluations == len(table)
