"""Hand-computed schedules for the event simulator: every start and end time is asserted exactly.

The durations are dyadic (0.5, 1, 2, ...) and the engine re-times with stretch factors (1 + gamma, users /
capacity), so the expected times are exact binary fractions and == is the right comparison.
"""

import pytest

from trainsim.ir.exec_graph import ExecGraph, SimDevice
from trainsim.sim import SimOptions, SimOutcome, simulate


def _graph(num_devices: int, **capacity: float) -> ExecGraph:
    devices = [SimDevice(index=i, stage=i, ranks=1, capacity_bytes=1e12, static_bytes=0.0) for i in range(num_devices)]
    return ExecGraph(devices=devices, tasks=[], resource_capacity=dict(capacity))


def _times(graph: ExecGraph, out: SimOutcome) -> dict[str, tuple[float, float]]:
    return {task.name: (out.start_s[task.tid], out.end_s[task.tid]) for task in graph.tasks}


# ---- (a) 2-stage 1F1B, 4 micro-batches ------------------------------------------------------------------------
FWD_S, BWD_S, MICRO_BATCHES = 1.0, 2.0, 4
# 1F1B order on each compute stream (Narayanan et al. 2021): stage s warms up with p - s - 1 forwards.
ORDER = {0: ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"], 1: ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]}


def _one_f_one_b(p2p_s: float) -> ExecGraph:
    """Stage 0 on device 0, stage 1 on device 1. A forward send (activations, stage 0 -> 1) runs on the
    sender's feature stream after its forward; a backward send (gradients, 1 -> 0) after stage 1's backward.
    The 1F1B order is a chain of control dependencies on each compute stream."""
    graph = _graph(2)
    tid: dict[str, int] = {}

    def add(name: str, device: int, stream: str, kind: str, duration: float, deps: list[str], mb: int) -> None:
        phase = "comm" if kind == "comm" else ("fwd" if name[0] == "F" else "bwd")
        task = graph.add(name=name, device=device, stream=stream, kind=kind, duration_s=duration,
                         deps=tuple(tid[d] for d in deps), phase=phase, micro_batch=mb, stage=device,
                         category="pp_comm" if kind == "comm" else "compute")
        tid[name] = task.tid

    previous: dict[int, str] = {}
    # Emit in an order where every dependency already exists: walk both stage orders by readiness.
    pending = {0: list(ORDER[0]), 1: list(ORDER[1])}
    while pending[0] or pending[1]:
        for stage in (0, 1):
            while pending[stage]:
                op, mb = pending[stage][0][0], int(pending[stage][0][1])
                deps = [previous[stage]] if stage in previous else []
                if op == "F" and stage == 1:
                    deps.append(f"send_act{mb}")
                if op == "B" and stage == 0:
                    deps += [f"send_grad{mb}"]
                if any(d not in tid for d in deps):
                    break
                name = f"{op}{stage}_{mb}"
                add(name, stage, "compute", "compute", FWD_S if op == "F" else BWD_S, deps, mb)
                previous[stage] = name
                pending[stage].pop(0)
                if op == "F" and stage == 0:
                    add(f"send_act{mb}", 0, "feature", "comm", p2p_s, [name], mb)
                if op == "B" and stage == 1:
                    add(f"send_grad{mb}", 1, "feature", "comm", p2p_s, [name], mb)
    return graph


def test_1f1b_two_stages_four_micro_batches_with_half_second_p2p() -> None:
    graph = _one_f_one_b(0.5)
    out = simulate(graph, SimOptions())
    expected = {
        "F0_0": (0.0, 1.0), "send_act0": (1.0, 1.5), "F0_1": (1.0, 2.0), "send_act1": (2.0, 2.5),
        "F1_0": (1.5, 2.5), "B1_0": (2.5, 4.5), "send_grad0": (4.5, 5.0),
        "F1_1": (4.5, 5.5), "B1_1": (5.5, 7.5), "send_grad1": (7.5, 8.0),
        "B0_0": (5.0, 7.0), "F0_2": (7.0, 8.0), "send_act2": (8.0, 8.5),
        "B0_1": (8.0, 10.0), "F0_3": (10.0, 11.0), "send_act3": (11.0, 11.5),
        "F1_2": (8.5, 9.5), "B1_2": (9.5, 11.5), "send_grad2": (11.5, 12.0),
        "F1_3": (11.5, 12.5), "B1_3": (12.5, 14.5), "send_grad3": (14.5, 15.0),
        "B0_2": (12.0, 14.0), "B0_3": (15.0, 17.0),
    }
    assert _times(graph, out) == expected
    assert out.makespan_s == 17.0
    names = [graph.tasks[t].name for t in out.critical_path]
    assert names == ["F0_0", "send_act0", "F1_0", "B1_0", "F1_1", "B1_1", "send_grad1", "B0_1", "F0_3",
                     "send_act3", "F1_3", "B1_3", "send_grad3", "B0_3"]


def test_1f1b_two_stages_four_micro_batches_with_free_p2p_matches_textbook() -> None:
    graph = _one_f_one_b(0.0)
    out = simulate(graph, SimOptions())
    expected = {
        "F0_0": (0.0, 1.0), "F0_1": (1.0, 2.0), "F1_0": (1.0, 2.0), "B1_0": (2.0, 4.0),
        "F1_1": (4.0, 5.0), "B1_1": (5.0, 7.0), "B0_0": (4.0, 6.0), "F0_2": (6.0, 7.0),
        "B0_1": (7.0, 9.0), "F1_2": (7.0, 8.0), "B1_2": (8.0, 10.0), "F0_3": (9.0, 10.0),
        "F1_3": (10.0, 11.0), "B1_3": (11.0, 13.0), "B0_2": (10.0, 12.0), "B0_3": (13.0, 15.0),
    }
    times = _times(graph, out)
    assert {name: times[name] for name in expected} == expected
    # (m + p - 1) (F + B): the 1F1B makespan with p = 2 stages and m = 4 micro-batches.
    assert out.makespan_s == (MICRO_BATCHES + 2 - 1) * (FWD_S + BWD_S)


# ---- (b) a gradient all-reduce overlapping the backward pass ---------------------------------------------------
def _backward_with_all_reduce() -> ExecGraph:
    """B2 (2 s) -> B1 (2 s) on the compute stream; AR2 (1 s, after B2) and AR1 (1 s, after B1) on the gradient
    stream. AR2 overlaps B1."""
    graph = _graph(1)
    b2 = graph.add(name="B2", device=0, stream="compute", kind="compute", duration_s=2.0, phase="bwd",
                   category="compute")
    b1 = graph.add(name="B1", device=0, stream="compute", kind="compute", duration_s=2.0, deps=(b2.tid,),
                   phase="bwd", category="compute")
    graph.add(name="AR2", device=0, stream="gradient", kind="comm", duration_s=1.0, deps=(b2.tid,), phase="comm",
              category="dp_comm")
    graph.add(name="AR1", device=0, stream="gradient", kind="comm", duration_s=1.0, deps=(b1.tid,), phase="comm",
              category="dp_comm")
    return graph


def test_all_reduce_overlapping_backward_without_slowdown() -> None:
    graph = _backward_with_all_reduce()
    out = simulate(graph, SimOptions(overlap_slowdown=0.0))
    assert _times(graph, out) == {"B2": (0.0, 2.0), "B1": (2.0, 4.0), "AR2": (2.0, 3.0), "AR1": (4.0, 5.0)}
    assert out.exposed_s == {"compute": 0.0, "dp_comm": 1.0}  # AR1 runs alone: only it is exposed


def test_all_reduce_overlapping_backward_with_slowdown() -> None:
    # gamma = 0.5: B1 and AR2 both run at 1/1.5 from t=2. AR2's 1 s of work ends at 2 + 1.5 = 3.5; B1 has then
    # done 1.5 / 1.5 = 1 s of its 2 s and finishes the rest alone: 3.5 + 1 = 4.5. AR1 follows: 4.5 .. 5.5.
    graph = _backward_with_all_reduce()
    out = simulate(graph, SimOptions(overlap_slowdown=0.5))
    assert _times(graph, out) == {"B2": (0.0, 2.0), "B1": (2.0, 4.5), "AR2": (2.0, 3.5), "AR1": (4.5, 5.5)}


def test_launch_overhead_adds_to_compute_tasks_only() -> None:
    graph = _backward_with_all_reduce()
    out = simulate(graph, SimOptions(launch_overhead_s=0.25))
    assert _times(graph, out) == {"B2": (0.0, 2.25), "B1": (2.25, 4.5), "AR2": (2.25, 3.25), "AR1": (4.5, 5.5)}


# ---- (c) two transfers sharing one link ------------------------------------------------------------------------
def _two_transfers(first_s: float, second_s: float, delay_s: float, **capacity: float) -> ExecGraph:
    """T1 on device 0 and T2 on device 1 cross the same link; T2 waits for a `delay_s` compute task."""
    graph = _graph(2, **capacity)
    graph.add(name="T1", device=0, stream="feature", kind="comm", duration_s=first_s, resources=("node0.nic",))
    deps: tuple[int, ...] = ()
    if delay_s:
        deps = (graph.add(name="C", device=1, stream="compute", kind="compute", duration_s=delay_s).tid,)
    graph.add(name="T2", device=1, stream="feature", kind="comm", duration_s=second_s, deps=deps,
              resources=("node0.nic",))
    return graph


def test_two_transfers_starting_together_share_the_link() -> None:
    graph = _two_transfers(1.0, 1.0, 0.0)
    assert _times(graph, simulate(graph, SimOptions(bandwidth_sharing=True))) == {"T1": (0.0, 2.0),
                                                                                    "T2": (0.0, 2.0)}
    assert _times(graph, simulate(graph, SimOptions())) == {"T1": (0.0, 1.0), "T2": (0.0, 1.0)}


def test_staggered_transfers_are_retimed_at_each_start_and_end() -> None:
    # T1 alone for 0.5 s (0.5 left), then both at half speed: T1 ends at 0.5 + 1.0 = 1.5 while T2 has done
    # 0.5; T2 then runs alone for its last 0.5: ends at 2.0.
    graph = _two_transfers(1.0, 1.0, 0.5)
    out = simulate(graph, SimOptions(bandwidth_sharing=True))
    assert _times(graph, out) == {"T1": (0.0, 1.5), "C": (0.0, 0.5), "T2": (0.5, 2.0)}


def test_unequal_transfers_and_link_capacity() -> None:
    # 1 s and 3 s together: half speed until T1 ends at 2.0 (T2 has 2 s left), then T2 alone: 4.0.
    graph = _two_transfers(1.0, 3.0, 0.0)
    assert _times(graph, simulate(graph, SimOptions(bandwidth_sharing=True))) == {"T1": (0.0, 2.0),
                                                                                    "T2": (0.0, 4.0)}
    # A link of capacity 2 carries both at full speed.
    graph = _two_transfers(1.0, 3.0, 0.0, **{"node0.nic": 2.0})
    assert _times(graph, simulate(graph, SimOptions(bandwidth_sharing=True))) == {"T1": (0.0, 1.0),
                                                                                    "T2": (0.0, 3.0)}


# ---- (d) a collective whose ranks arrive at different times ----------------------------------------------------
def _late_rank() -> ExecGraph:
    """Device 0: A (1 s) then its all-reduce rank AR0; device 1: B (3 s) then AR1 (2 s each, one collective).
    X (0.5 s) on device 0's gradient stream is ready with AR0 but has a lower priority; C (1 s) follows B on
    device 1's compute stream and overlaps AR1."""
    graph = _graph(2)
    a = graph.add(name="A", device=0, stream="compute", kind="compute", duration_s=1.0)
    b = graph.add(name="B", device=1, stream="compute", kind="compute", duration_s=3.0)
    graph.add(name="AR0", device=0, stream="gradient", kind="comm", duration_s=2.0, deps=(a.tid,), sync_key="ar",
              category="dp_comm")
    graph.add(name="AR1", device=1, stream="gradient", kind="comm", duration_s=2.0, deps=(b.tid,), sync_key="ar",
              category="dp_comm")
    graph.add(name="X", device=0, stream="gradient", kind="comm", duration_s=0.5, deps=(a.tid,), priority=1)
    graph.add(name="C", device=1, stream="compute", kind="compute", duration_s=1.0, deps=(b.tid,))
    return graph


def test_collective_waits_for_the_late_rank_and_ends_together() -> None:
    graph = _late_rank()
    out = simulate(graph, SimOptions())
    # AR0 takes device 0's gradient stream at 1.0 and waits (X is blocked behind it) until AR1 is ready at 3.0.
    assert _times(graph, out) == {"A": (0.0, 1.0), "B": (0.0, 3.0), "AR0": (3.0, 5.0), "AR1": (3.0, 5.0),
                                  "X": (5.0, 5.5), "C": (3.0, 4.0)}
    assert out.dispatch_s[2] == 1.0 and out.dispatch_s[3] == 3.0
    assert [graph.tasks[t].name for t in out.critical_path] == ["B", "AR1", "AR0", "X"]


def test_collective_progresses_at_its_slowest_rank() -> None:
    # gamma = 1: on device 1, AR1 and C overlap from 3.0, both at half speed. C (1 s) ends at 5.0, when the
    # collective has done 1 of its 2 s; it finishes the rest at full speed: 6.0 on both ranks, although
    # device 0 computes nothing meanwhile.
    graph = _late_rank()
    out = simulate(graph, SimOptions(overlap_slowdown=1.0))
    assert _times(graph, out) == {"A": (0.0, 1.0), "B": (0.0, 3.0), "AR0": (3.0, 6.0), "AR1": (3.0, 6.0),
                                  "X": (6.0, 6.5), "C": (3.0, 5.0)}


@pytest.mark.parametrize("sharing", [False, True])
def test_collective_counts_once_on_a_shared_link(sharing: bool) -> None:
    # Both ranks name the same link: the collective is one user of it, so it is not slowed by itself.
    graph = _graph(2)
    for d in (0, 1):
        graph.add(name=f"AR{d}", device=d, stream="gradient", kind="comm", duration_s=1.0, sync_key="ar",
                  resources=("node0.nvlink",))
    graph.add(name="P2P", device=0, stream="feature", kind="comm", duration_s=1.0, resources=("node0.nvlink",))
    out = simulate(graph, SimOptions(bandwidth_sharing=sharing))
    end = 2.0 if sharing else 1.0
    assert _times(graph, out) == {"AR0": (0.0, end), "AR1": (0.0, end), "P2P": (0.0, end)}
