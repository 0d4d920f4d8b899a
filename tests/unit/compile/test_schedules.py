"""Pipeline schedules: golden orders, invariants, and exact makespans on the event engine.

Golden orders are written out by hand from the papers' figures and Megatron-LM's code; the makespans use
dyadic durations, so the engine's times are exact and == is the right comparison.
"""

import pytest

from trainsim.compile.schedules import SCHEDULES, Step, format_order, schedule_order, splits_backward
from trainsim.errors import ConfigError, UnknownNameError
from trainsim.ir.exec_graph import ExecGraph, SimDevice
from trainsim.measure.launch import MEASURED_SCHEDULES
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.parallel import SCHEDULES as SCHEDULE_NAMES


def _orders(name: str, p: int, v: int, m: int) -> list[str]:
    return [format_order(order) for order in schedule_order(name, p, v, m)]


# ---- golden orders --------------------------------------------------------------------------------------------
def test_1f1b_two_stages_four_micro_batches() -> None:
    # Narayanan et al. 2021, Fig. 4 (top): stage s warms up with p - s - 1 forwards.
    assert _orders("1f1b", 2, 1, 4) == ["F0 F1 B0 F2 B1 F3 B2 B3",
                                        "F0 B0 F1 B1 F2 B2 F3 B3"]


def test_1f1b_four_stages_warm_up_counts() -> None:
    assert _orders("1f1b", 4, 1, 6) == ["F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
                                        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
                                        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
                                        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"]


def test_1f1b_with_fewer_micro_batches_than_stages() -> None:
    assert _orders("1f1b", 4, 1, 2) == ["F0 F1 B0 B1"] * 3 + ["F0 B0 F1 B1"]


def test_gpipe_runs_every_forward_then_every_backward() -> None:
    assert _orders("gpipe", 2, 1, 4) == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 2


def test_interleaved_two_stages_two_chunks_four_micro_batches() -> None:
    # Megatron-LM forward_backward_pipelining_with_interleaving: rank r warms up with 2(p - r - 1) + (v - 1)p
    # forwards; micro-batches go through the chunks in groups of p; ".1" is model chunk 1.
    assert _orders("interleaved-1f1b", 2, 2, 4) == [
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3",
        "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3",
    ]


def test_interleaved_with_as_many_micro_batches_as_stages_is_all_warm_up() -> None:
    assert _orders("interleaved-1f1b", 2, 2, 2) == ["F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1"] * 2


def test_zb_h1_defers_weight_gradients_by_the_stage_index() -> None:
    # Qi et al. 2023, ZB-H1: 1F1B's F/B order, each B followed by a W, stage s holding back s of its W passes
    # to fill the cool-down bubble.
    assert _orders("zb-h1", 3, 1, 4) == [
        "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3",
        "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3",
        "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3",
    ]


# ---- invariants -------------------------------------------------------------------------------------------------
CASES = [("gpipe", 4, 1, 8), ("1f1b", 4, 1, 8), ("1f1b", 8, 1, 3), ("interleaved-1f1b", 4, 2, 8),
         ("interleaved-1f1b", 4, 3, 12), ("zb-h1", 4, 1, 8), ("zb-h1", 5, 1, 3)]


@pytest.mark.parametrize(("name", "p", "v", "m"), CASES)
def test_every_pass_runs_once_and_in_order(name: str, p: int, v: int, m: int) -> None:
    phases = ("F", "B", "W") if splits_backward(name) else ("F", "B")
    for order in schedule_order(name, p, v, m):
        assert sorted(order) == sorted(Step(ph, mb, c) for ph in phases for mb in range(m) for c in range(v))
        position = {step: i for i, step in enumerate(order)}
        for mb in range(m):
            for c in range(v):
                assert position[Step("F", mb, c)] < position[Step("B", mb, c)]
                if "W" in phases:
                    assert position[Step("B", mb, c)] < position[Step("W", mb, c)]


def _peak_in_flight(order: list[Step], release: str) -> int:
    live = peak = 0
    for step in order:
        live += step.phase == "F"
        live -= step.phase == release
        peak = max(peak, live)
    return peak


def test_in_flight_micro_batches_match_the_memory_model() -> None:
    p, m = 4, 8
    assert [_peak_in_flight(o, "B") for o in schedule_order("1f1b", p, 1, m)] == [4, 3, 2, 1]
    assert [_peak_in_flight(o, "B") for o in schedule_order("gpipe", p, 1, m)] == [m] * p
    # ZB-H1 keeps 1F1B's first-stage peak on every stage (F done, W not yet).
    assert [_peak_in_flight(o, "W") for o in schedule_order("zb-h1", p, 1, m)] == [p] * p
    # Interleaved: 2(p - r - 1) + (v - 1)p + 1 chunks in flight on rank r (Megatron-LM's warm-up + 1).
    v = 2
    assert [_peak_in_flight(o, "B") for o in schedule_order("interleaved-1f1b", p, v, m)] == \
        [2 * (p - r - 1) + (v - 1) * p + 1 for r in range(p)]


def test_errors_name_the_schedule_and_the_choices() -> None:
    with pytest.raises(UnknownNameError, match="zb-h1"):
        schedule_order("zb-h2", 2, 1, 4)
    with pytest.raises(ConfigError, match="vpp"):
        schedule_order("1f1b", 2, 2, 4)
    with pytest.raises(ConfigError, match="multiple of pp=4"):
        schedule_order("interleaved-1f1b", 4, 2, 6)
    assert SCHEDULES.names() == ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1"]


def test_the_compiler_builds_every_schedule_of_the_vocabulary_and_no_other() -> None:
    assert sorted(SCHEDULES.names()) == sorted(SCHEDULE_NAMES)
    assert set(MEASURED_SCHEDULES) <= set(SCHEDULE_NAMES)


# ---- exact makespans on the event engine ------------------------------------------------------------------------
def _pipeline_graph(name: str, p: int, v: int, m: int, f: float, b: float, w: float = 0.0) -> ExecGraph:
    """Each stage runs its steps in schedule order (a chain); F of virtual stage k waits for F of k - 1, B for B
    of k + 1 (the last virtual stage's B for its own F), W for B. Per chunk: f / v, b / v, w / v."""
    graph = ExecGraph(devices=[SimDevice(index=s, stage=s, ranks=1, capacity_bytes=1e12, static_bytes=0.0)
                               for s in range(p)], tasks=[])
    orders = schedule_order(name, p, v, m)
    tid: dict[tuple[str, int, int], int] = {}
    position, previous = [0] * p, [-1] * p
    duration = {"F": f / v, "B": b / v, "W": w / v}
    while any(position[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                step = orders[s][position[s]]
                vs = step.chunk * p + s
                wanted = {"F": ("F", vs - 1) if vs > 0 else None,
                          "B": ("B", vs + 1) if vs < p * v - 1 else ("F", vs),
                          "W": ("B", vs)}[step.phase]
                key = (wanted[0], step.micro_batch, wanted[1]) if wanted else None
                if key is not None and key not in tid:
                    break
                deps = tuple(d for d in (previous[s], tid[key] if key else -1) if d >= 0)
                task = graph.add(name=f"{step}@{s}", device=s, stream="compute", kind="compute",
                                 duration_s=duration[step.phase], deps=deps)
                tid[(step.phase, step.micro_batch, vs)] = previous[s] = task.tid
                position[s] += 1
                progressed = True
        assert progressed, "the schedule deadlocks"
    return graph


@pytest.mark.parametrize(("name", "p", "v", "m", "expected"), [
    ("gpipe", 4, 1, 8, 8 * 3 + 3 * 3),  # (m + p - 1)(f + b)
    ("1f1b", 4, 1, 8, 8 * 3 + 3 * 3),
    ("1f1b", 2, 1, 4, 4 * 3 + 1 * 3),
    ("interleaved-1f1b", 4, 2, 8, 8 * 3 + 3 * 3 / 2),  # m(f + b) + (p - 1)(f + b) / v
    ("interleaved-1f1b", 4, 4, 16, 16 * 3 + 3 * 3 / 4),
    ("interleaved-1f1b", 2, 2, 4, 4 * 3 + 1 * 3 / 2),
])
def test_makespans_follow_the_bubble_formulas(name: str, p: int, v: int, m: int, expected: float) -> None:
    out = simulate(_pipeline_graph(name, p, v, m, f=1.0, b=2.0), SimOptions())
    assert out.makespan_s == expected


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w(p: int, m: int) -> None:
    # Qi et al. 2023 sec. 3.1: with T_F = T_B = T_W, ZB-H1's bubble is a third of 1F1B's (p - 1)(F + B + W).
    out = simulate(_pipeline_graph("zb-h1", p, 1, m, f=1.0, b=1.0, w=1.0), SimOptions())
    assert out.makespan_s == m * 3 + (p - 1) * (1 + 1 - 1)
    one_f_one_b = simulate(_pipeline_graph("1f1b", p, 1, m, f=1.0, b=2.0), SimOptions())
    assert one_f_one_b.makespan_s - m * 3 == 3 * (p - 1) * 1
