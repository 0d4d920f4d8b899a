"""The event engine: determinism, invariants, memory, deadlock detection, critical path, input checks."""

import random
from itertools import pairwise

import pytest

from trainsim.catalog import load_cluster, load_model
from trainsim.compile.build import compile_job
from trainsim.errors import ConfigError, TrainsimError
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.exec_graph import ExecGraph, SimDevice
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.sim import DeadlockError, SimOptions, SimOutcome, busy_s_by_device, simulate
from trainsim.sim.critical_path import critical_path
from trainsim.sim.engine import Engine
from trainsim.sim.synthetic import one_f_one_b_order, synthetic_pipeline
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec

ALL_ON = SimOptions(overlap_slowdown=0.3, bandwidth_sharing=True, launch_overhead_s=1e-5)


def _graph(num_devices: int = 1, static_bytes: float = 0.0, capacity_bytes: float = 1e12) -> ExecGraph:
    devices = [SimDevice(index=i, stage=i, ranks=1, capacity_bytes=capacity_bytes, static_bytes=static_bytes,
                         static_breakdown={"weights": static_bytes}) for i in range(num_devices)]
    return ExecGraph(devices=devices, tasks=[])


def _compute(graph: ExecGraph, name: str, duration_s: float, *deps: int, device: int = 0, **fields: object) -> int:
    return graph.add(name=name, device=device, stream="compute", kind="compute", duration_s=duration_s,
                     deps=deps, **fields).tid


# ---- determinism and invariants -------------------------------------------------------------------------------
def test_same_input_gives_identical_outcome() -> None:
    first = simulate(synthetic_pipeline(stages=4, micro_batches=8, layers_per_stage=3, seed=7), ALL_ON)
    again = simulate(synthetic_pipeline(stages=4, micro_batches=8, layers_per_stage=3, seed=7), ALL_ON)
    assert first == again
    assert first.start_s == again.start_s and first.critical_path == again.critical_path


@pytest.mark.parametrize("options", [SimOptions(), ALL_ON], ids=["plain", "all-on"])
def test_schedule_invariants_on_a_synthetic_pipeline(options: SimOptions) -> None:
    graph = synthetic_pipeline(stages=4, micro_batches=8, layers_per_stage=3, seed=3)
    out = simulate(graph, options)
    by_stream: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for task in graph.tasks:
        start, end = out.start_s[task.tid], out.end_s[task.tid]
        assert 0.0 <= out.ready_s[task.tid] <= out.dispatch_s[task.tid] <= start <= end
        assert all(out.end_s[dep] <= start for dep in task.deps)
        assert end - start >= task.duration_s * (1 - 1e-12)  # runtime behaviours only slow tasks down
        by_stream.setdefault((task.device, task.stream), []).append((out.dispatch_s[task.tid], end))
    for spans in by_stream.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(spans))
    ranks = [t.tid for t in graph.tasks if t.sync_key]
    assert len({out.start_s[t] for t in ranks}) == 1 and len({out.end_s[t] for t in ranks}) == 1
    assert out.makespan_s == max(out.end_s)
    for memory in out.memory:  # every activation is freed by its backward
        assert memory.timeline_bytes[-1] == pytest.approx(memory.static_bytes)


def test_dynamic_path_with_idle_links_matches_the_plain_schedule() -> None:
    # Differential: bandwidth sharing on links too wide to ever slow anything runs the re-timing machinery
    # and must reproduce the plain schedule exactly.
    graph = synthetic_pipeline(stages=4, micro_batches=8, layers_per_stage=3, seed=5)
    plain = simulate(graph, SimOptions())
    names = {r for task in graph.tasks for r in task.resources}
    graph.resource_capacity = dict.fromkeys(names, 1e9)
    wide = simulate(graph, SimOptions(bandwidth_sharing=True))
    assert wide.start_s == plain.start_s and wide.end_s == plain.end_s


# ---- runs alone: a chain on an idle device as one event --------------------------------------------------------
def _same_outcome(graph: ExecGraph, options: SimOptions) -> tuple[SimOutcome, SimOutcome]:
    """The engine with runs alone and the step-by-step reference; every field but the event count equal (==)."""
    engine = Engine(graph, options)
    fast = engine.run()
    reference = Engine(graph, options, runs_alone=False).run()
    for name in ("start_s", "end_s", "dispatch_s", "ready_s", "makespan_s", "memory", "critical_path", "exposed_s",
                 "exposed_by_device_s"):
        assert getattr(fast, name) == getattr(reference, name), name
    # the makespan the loop keeps (its last END's time) is the scan's, and so is the critical path walked from it
    assert fast.makespan_s == max(fast.end_s, default=0.0)
    assert fast.critical_path == critical_path(engine.end, engine.cause)
    return fast, reference


SOME_ON = [SimOptions(), ALL_ON, SimOptions(overlap_slowdown=0.2), SimOptions(bandwidth_sharing=True),
           SimOptions(launch_overhead_s=3e-5, memory_timeline=False)]


@pytest.mark.parametrize("options", SOME_ON, ids=["plain", "all-on", "gamma", "sharing", "launch-no-timeline"])
@pytest.mark.parametrize("seed", [1, 2])
def test_runs_alone_equal_the_step_by_step_engine_on_a_pipeline(options: SimOptions, seed: int) -> None:
    graph = synthetic_pipeline(stages=4, micro_batches=8, layers_per_stage=3, seed=seed)
    fast, reference = _same_outcome(graph, options)
    assert fast.events < reference.events / 2  # the tensor-parallel chains ran alone


def _random_graph(seed: int) -> ExecGraph:
    """Chains of compute and comm tasks on three devices, with tasks that other devices' tasks release on every
    stream mid-chain, collectives, zero durations, durations on a coarse grid (ties), shared and private links."""
    rng = random.Random(seed)
    graph = _graph(num_devices=3, static_bytes=10.0)
    graph.resource_capacity = {"shared": 1.0, "narrow": 0.5, "wide": 2.0}
    chains: list[list[int]] = [[] for _ in range(3)]
    for step in range(60):
        d = rng.randrange(3)
        deps = (chains[d][-1],) if chains[d] else ()
        if rng.random() < 0.15 and chains[(d + 1) % 3]:  # waits for another device as well
            deps = (*deps, rng.choice(chains[(d + 1) % 3]))
        comm = rng.random() < 0.45
        links = rng.choice([(), (f"d{d}.private",), ("shared",), ("narrow",), ("wide",), (f"d{d}.private", "wide")])
        task = graph.add(name=f"c{d}.{step}", device=d, stream="feature" if comm else "compute",
                         kind="comm" if comm else "compute", duration_s=rng.choice([0.0, 0.5, 1.0, 1.5, 0.25]),
                         deps=deps, resources=links if comm else (), category=rng.choice(["compute", "tp_comm", ""]),
                         alloc_bytes=rng.choice([0.0, 5.0]), free_bytes=rng.choice([0.0, 2.0]))
        chains[d].append(task.tid)
        if rng.random() < 0.2:  # a side task on another stream or device, released by this chain task
            side = rng.randrange(3)
            graph.add(name=f"side{step}", device=side, stream=rng.choice(["gradient", "feature"]), kind="comm",
                      duration_s=rng.choice([0.5, 1.0, 2.0]), deps=(task.tid,),
                      resources=rng.choice([(), ("shared",), (f"d{side}.private",)]), category="dp_comm")
        if rng.random() < 0.08:  # a collective of two devices after their chains' tasks so far
            a, b = rng.sample(range(3), 2)
            for member in (a, b):
                if chains[member]:
                    graph.add(name=f"ar{step}.{member}", device=member, stream="gradient", kind="comm",
                              duration_s=1.0, deps=(chains[member][-1],), sync_key=f"ar{step}", category="dp_comm",
                              resources=("wide",))
    return graph


@pytest.mark.parametrize("options", SOME_ON, ids=["plain", "all-on", "gamma", "sharing", "launch-no-timeline"])
def test_runs_alone_equal_the_step_by_step_engine_on_random_graphs(options: SimOptions) -> None:
    for seed in range(40):
        _same_outcome(_random_graph(seed), options)


def _two_groups_on_one_nic(seed: int) -> ExecGraph:
    """Two devices (two pipeline groups) whose sends share one NIC: chains of compute, each compute followed by a
    send on the NIC with a random work, so that some sends overlap another on the NIC (and the other device's
    compute, for the overlap slow-down) and some run alone; zero works and a coarse grid make ties."""
    rng = random.Random(seed)
    graph = _graph(num_devices=2, static_bytes=1.0)
    graph.resource_capacity = {"nic": 1.0}
    for d in range(2):
        last = -1
        for step in range(12):
            deps = (last,) if last >= 0 else ()
            last = _compute(graph, f"f{d}.{step}", rng.choice([0.5, 1.0, 2.0]), *deps, device=d,
                            alloc_bytes=rng.choice([0.0, 3.0]))
            send = graph.add(name=f"send{d}.{step}", device=d, stream="feature", kind="comm",
                             duration_s=rng.choice([0.0, 0.25, 0.5, 1.5]), deps=(last,), resources=("nic",),
                             category="pp_comm", free_bytes=rng.choice([0.0, 1.0]))
            if rng.random() < 0.5:
                last = send.tid  # the next compute waits for the send
    return graph


def test_sends_pushed_at_their_start_on_a_shared_nic_exact() -> None:
    # two sends of 1 s start together on a NIC of capacity 1: each takes half of it and ends at 2 s; a third one,
    # alone on the NIC from 2.5 s, ends at its start + its work (pushed at its start, never re-timed)
    graph = _graph(num_devices=2)
    graph.resource_capacity = {"nic": 1.0}
    for d in range(2):
        graph.add(name=f"s{d}", device=d, stream="feature", kind="comm", duration_s=1.0, resources=("nic",))
    late = _compute(graph, "c", 2.5, device=1)
    graph.add(name="s2", device=1, stream="feature", kind="comm", duration_s=1.0, deps=(late,), resources=("nic",))
    out = simulate(graph, SimOptions(bandwidth_sharing=True))
    assert out.end_s == [2.0, 2.0, 2.5, 3.5]


@pytest.mark.parametrize("options", SOME_ON, ids=["plain", "all-on", "gamma", "sharing", "launch-no-timeline"])
def test_sends_pushed_at_their_start_equal_the_step_by_step_engine(options: SimOptions) -> None:
    # Differential: a send's END pushed as it starts (and pushed again, under the same sequence number, where a
    # start later in the same dispatch pass changes its rate) against the step-by-step reference, which times
    # every flow started in a pass in its re-time pass
    contended = 0
    for seed in range(30):
        graph = _two_groups_on_one_nic(seed)
        fast, _ = _same_outcome(graph, options)
        sends = [(fast.start_s[t.tid], fast.end_s[t.tid]) for t in graph.tasks if t.resources]
        contended += sum(1 for a in sends for b in sends if a != b and a[0] < b[1] and b[0] < a[1])
    assert contended > 0  # some sends overlapped another on the NIC


COMPILED_JOBS = [  # (model, GPUs, task level, strategy): the passes that shape chains (interleaving, ZeRO, splits)
    ("gpt3-1.3b", 32, "layer", {"tp": 8, "pp": 4, "dp": 1, "vpp": 2, "schedule": "interleaved-1f1b",
                                "global_batch": 16, "recompute": "full"}),
    ("gpt3-1.3b", 16, "op", {"tp": 2, "pp": 2, "dp": 4, "global_batch": 16, "zero": 1, "recompute": "selective"}),
    ("gpt3-1.3b", 8, "layer", {"tp": 1, "pp": 1, "dp": 8, "global_batch": 16, "zero": 3}),
    ("gpt3-1.3b", 16, "layer", {"tp": 2, "pp": 4, "dp": 2, "global_batch": 16, "schedule": "zb-h1"}),
]


@pytest.mark.parametrize(("model", "gpus", "level", "strategy"), COMPILED_JOBS, ids=["vpp", "op-zero1", "zero3", "zb"])
def test_runs_alone_equal_the_step_by_step_engine_on_compiled_jobs(model: str, gpus: int, level: str,
                                                                   strategy: dict[str, object]) -> None:
    job = make_job(load_model(model), load_cluster("dgx-a100-80gb").with_num_gpus(gpus),
                   ParallelSpec.parse({"micro_batch": 1, "seq_len": 2048, **strategy}))
    estimator = SimEstimator(task_level="op" if level == "op" else "layer")
    graph = compile_job(job, default_plan(graph_for(job), job.parallel), estimator.pricer, estimator.task_level)
    options = estimator.options_for(job)
    assert options.overlap_slowdown > 0.0 and options.bandwidth_sharing  # the re-timing paths are exercised
    fast, reference = _same_outcome(graph, options)
    assert fast.events < reference.events


def test_one_f_one_b_order() -> None:
    assert one_f_one_b_order(2, 0, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
                                          ("B", 3)]
    assert one_f_one_b_order(4, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


# ---- stream choice -------------------------------------------------------------------------------------------
def test_ready_tasks_run_by_ready_time_then_priority_then_tid() -> None:
    graph = _graph()
    gate = _compute(graph, "gate", 1.0)
    late = graph.add(name="late", device=0, stream="feature", kind="comm", duration_s=1.0, deps=(gate,), priority=-5)
    low = graph.add(name="low", device=0, stream="feature", kind="comm", duration_s=1.0, priority=2)
    high_b = graph.add(name="high_b", device=0, stream="feature", kind="comm", duration_s=1.0, priority=1)
    high_a = graph.add(name="high_a", device=0, stream="feature", kind="comm", duration_s=1.0, priority=1)
    out = simulate(graph, SimOptions())
    # ready at 0: high_b, high_a (priority 1, by tid), then low (priority 2); `late` is ready at 1 only.
    assert [out.start_s[t.tid] for t in (high_b, high_a, low, late)] == [0.0, 1.0, 2.0, 3.0]


def test_zero_duration_tasks_chain_within_one_instant() -> None:
    graph = _graph()
    a = _compute(graph, "a", 0.0)
    b = _compute(graph, "b", 0.0, a)
    c = _compute(graph, "c", 1.0, b)
    out = simulate(graph, SimOptions())
    assert (out.start_s, out.end_s) == ([0.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    assert out.critical_path == [a, b, c]


def test_empty_graph() -> None:
    out = simulate(_graph(), SimOptions())
    assert out.makespan_s == 0.0 and out.critical_path == [] and not out.oom


# ---- memory ---------------------------------------------------------------------------------------------------
def _memory_graph(capacity_bytes: float) -> ExecGraph:
    graph = _graph(static_bytes=100.0, capacity_bytes=capacity_bytes)
    fwd = _compute(graph, "fwd", 1.0, alloc_bytes=50.0)
    bwd = _compute(graph, "bwd", 1.0, fwd, alloc_bytes=30.0, free_bytes=80.0)
    _compute(graph, "opt", 1.0, bwd, alloc_bytes=10.0, free_bytes=10.0)
    return graph


def test_memory_peak_timeline_and_breakdown() -> None:
    memory = simulate(_memory_graph(1000.0), SimOptions()).memory[0]
    # One point per instant: at 0 fwd allocates 50; at 1 bwd adds 30; at 2 bwd frees 80 and opt takes 10
    # (ends are processed before starts at an instant); at 3 opt frees its 10.
    assert memory.timeline() == [(0.0, 150.0), (1.0, 180.0), (2.0, 110.0), (3.0, 100.0)]
    assert (memory.peak_bytes, memory.peak_time_s) == (180.0, 1.0)
    assert memory.breakdown_at_peak == {"weights": 100.0, "activations": 80.0}
    assert not memory.oom


def test_oom_is_a_verdict_not_a_crash() -> None:
    out = simulate(_memory_graph(150.0), SimOptions())
    assert out.oom and out.memory[0].oom and out.peak_memory_bytes == 180.0
    assert out.makespan_s == 3.0  # the iteration still runs to the end


def test_memory_timeline_can_be_skipped() -> None:
    memory = simulate(_memory_graph(1000.0), SimOptions(memory_timeline=False)).memory[0]
    assert memory.timeline() == [] and memory.peak_bytes == 180.0


# ---- exposed time ---------------------------------------------------------------------------------------------
def test_exposed_time_per_category_and_device() -> None:
    graph = _graph(num_devices=2)
    c0 = _compute(graph, "c0", 2.0, device=0, category="compute")
    graph.add(name="ar0", device=0, stream="gradient", kind="comm", duration_s=3.0, category="dp_comm")  # 2 hidden
    graph.add(name="p2p", device=1, stream="feature", kind="comm", duration_s=1.0, deps=(c0,), category="pp_comm")
    graph.add(name="ar1", device=1, stream="gradient", kind="comm", duration_s=1.5, category="dp_comm")
    out = simulate(graph, SimOptions())
    assert out.exposed_by_device_s == [{"compute": 0.0, "dp_comm": 1.0, "pp_comm": 0.0},
                                       {"compute": 0.0, "dp_comm": 1.5, "pp_comm": 1.0}]
    assert out.exposed_s == {"compute": 0.0, "dp_comm": 1.5, "pp_comm": 1.0}


# ---- critical path --------------------------------------------------------------------------------------------
def test_critical_path_follows_dependencies() -> None:
    graph = _graph(num_devices=2)
    a = _compute(graph, "a", 1.0)
    b = graph.add(name="b", device=0, stream="feature", kind="comm", duration_s=2.0, deps=(a,)).tid
    _compute(graph, "side", 0.5, device=1)
    c = _compute(graph, "c", 1.0, b, a, device=1)
    assert simulate(graph, SimOptions()).critical_path == [a, b, c]


def test_critical_path_follows_the_stream_predecessor() -> None:
    graph = _graph()
    x = _compute(graph, "x", 1.0, priority=0)
    y = _compute(graph, "y", 1.0, priority=1)
    assert simulate(graph, SimOptions()).critical_path == [x, y]


# ---- failures -------------------------------------------------------------------------------------------------
def test_dependency_cycle_raises_with_the_stuck_tasks() -> None:
    graph = _graph()
    _compute(graph, "start", 1.0)
    graph.add(name="ping", device=0, stream="compute", kind="compute", duration_s=1.0, deps=(2,))
    graph.add(name="pong", device=0, stream="compute", kind="compute", duration_s=1.0, deps=(1,))
    with pytest.raises(TrainsimError, match=r"2 of 3 tasks cannot run.*ping \(waits for pong\)"):
        simulate(graph, SimOptions())


def test_collectives_in_different_orders_deadlock() -> None:
    graph = _graph(num_devices=2)
    for device, order in ((0, ("x", "y")), (1, ("y", "x"))):
        for priority, key in enumerate(order):
            graph.add(name=f"{key}{device}", device=device, stream="gradient", kind="comm", duration_s=1.0,
                      sync_key=key, priority=priority)
    with pytest.raises(DeadlockError) as caught:
        simulate(graph, SimOptions())
    assert "x0 (collective 'x': 1 of 2 ranks arrived)" in caught.value.stuck
    assert "x1 (ready; its stream is held by y1)" in caught.value.stuck


@pytest.mark.parametrize(("field", "value", "message"), [
    ("deps", (9,), "must name another task"),
    ("deps", (-1,), "must name another task"),
    ("deps", (0,), "must name another task"),  # itself
    ("stream", "tensor", "choose one of"),
    ("duration_s", -1.0, "finite and >= 0"),
    ("device", 3, "must be a simulated device"),
])
def test_bad_tasks_are_rejected(field: str, value: object, message: str) -> None:
    graph = _graph()
    fields: dict[str, object] = {"name": "t", "device": 0, "stream": "compute", "kind": "compute", "duration_s": 1.0}
    graph.add(**{**fields, field: value})
    with pytest.raises(ConfigError, match=message):
        simulate(graph, SimOptions())


def test_bad_resource_capacity_and_collective_on_one_stream_are_rejected() -> None:
    graph = _graph()
    graph.add(name="t", device=0, stream="feature", kind="comm", duration_s=1.0, resources=("nic",))
    graph.resource_capacity = {"nic": 0.0}
    with pytest.raises(ConfigError, match="resource_capacity"):
        simulate(graph, SimOptions())
    graph = _graph()
    for rank in range(2):
        graph.add(name=f"ar{rank}", device=0, stream="gradient", kind="comm", duration_s=1.0, sync_key="ar")
    with pytest.raises(ConfigError, match="cannot share a device's stream"):
        simulate(graph, SimOptions())


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="overlap_slowdown"):
        SimOptions(overlap_slowdown=-0.1)
    with pytest.raises(ConfigError, match="launch_overhead_s"):
        SimOptions(launch_overhead_s=float("nan"))


def test_outcome_prints_briefly() -> None:
    out = simulate(_memory_graph(1000.0), SimOptions())
    assert isinstance(out, SimOutcome)
    # events: dispatch at 0, fwd's end, dispatch at 1, the end of bwd and opt run alone as one, dispatch at 3
    assert repr(out) == ("SimOutcome(tasks=3, makespan_s=3, events=5, peak_memory_bytes=180, oom=False, "
                         "critical_path=3 tasks)")


# ---- busy time: a device's streams summed (the CPU clock of a rank whose streams are threads) ------------------
def test_busy_time_sums_the_streams_and_leaves_out_a_collectives_wait() -> None:
    # device 0: 1.0 s of compute with a 0.5 s all-reduce beside it on the gradient stream, partnered with device
    # 1, which computes 2.0 s first: device 0's all-reduce waits from 0 to 2.0, runs 2.0-2.5
    graph = _graph(num_devices=2)
    _compute(graph, "c0", 1.0)
    _compute(graph, "c1", 2.0, device=1)
    graph.add(name="ar0", device=0, stream="gradient", kind="comm", duration_s=0.5, sync_key="ar")
    graph.add(name="ar1", device=1, stream="gradient", kind="comm", duration_s=0.5, deps=(1,), sync_key="ar")
    out = simulate(graph, SimOptions())
    assert out.makespan_s == 2.5
    assert busy_s_by_device(graph, out) == [1.5, 2.5]  # 1.0 + 0.5 (not the 2.0 s wait); 2.0 + 0.5


def test_busy_time_counts_the_overlap_slowdown() -> None:
    # gamma 0.5: 1.0 s of compute beside a 1.0 s transfer, both at 1/1.5 speed while together: both end at 1.5 s
    graph = _graph()
    _compute(graph, "c", 1.0)
    graph.add(name="ar", device=0, stream="gradient", kind="comm", duration_s=1.0)
    out = simulate(graph, SimOptions(overlap_slowdown=0.5))
    assert out.makespan_s == pytest.approx(1.5)
    assert busy_s_by_device(graph, out) == [pytest.approx(3.0)]
