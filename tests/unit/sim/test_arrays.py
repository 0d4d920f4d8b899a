"""GraphArrays (sim/arrays.py): the successor lists the engine releases tasks by."""

import random

import pytest

from trainsim.catalog import load_cluster, load_model
from trainsim.compile.build import compile_job
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.exec_graph import ExecGraph, SimDevice
from trainsim.ir.template_runs import holding, ordered_runs
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.sim.arrays import GraphArrays
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec


def _plain_successors(deps: list[tuple[int, ...]]) -> list[list[int]]:
    """The reference: every edge walked in tid order."""
    out: list[list[int]] = [[] for _ in deps]
    for tid, task_deps in enumerate(deps):
        for dep in task_deps:
            out[dep].append(tid)
    return out


def _check(graph: ExecGraph) -> int:
    """GraphArrays' successors are the reference's, None standing for [tid + 1] where tid + 1 waits for tid alone
    and nothing else does; returns how many are None."""
    deps = [task.deps for task in graph.tasks]
    arrays = GraphArrays(graph, 0.0)
    got = arrays.successors
    expected = _plain_successors(deps)
    for tid, (row, want) in enumerate(zip(got, expected, strict=True)):
        if row is None:
            assert want == [tid + 1] and deps[tid + 1] == (tid,), tid
            # the engine walks a None link in a run alone checking only the device
            assert arrays.leader_of[tid + 1] < 0 and tid + 1 not in arrays.shared_links, tid
        else:
            assert row == want, tid
    return got.count(None)


def _random_graph(seed: int) -> ExecGraph:
    """Chain links, tasks waiting for several earlier or later tasks, tasks nothing waits for, a first task with
    dependencies."""
    rng = random.Random(seed)
    n = 60
    graph = ExecGraph(devices=[SimDevice(index=0, stage=0, ranks=1, capacity_bytes=1e9, static_bytes=0.0)], tasks=[])
    for tid in range(n):
        if tid and rng.random() < 0.6:
            deps: tuple[int, ...] = (tid - 1,)
        else:
            deps = tuple(rng.sample([t for t in range(n) if t != tid], rng.randrange(0, 4)))
        graph.add(name=f"t{tid}", device=0, stream="compute", kind="compute", duration_s=1.0, deps=deps)
    return graph


def test_successors_equal_every_edge_walked_on_random_graphs() -> None:
    linked = sum(_check(_random_graph(seed)) for seed in range(30))
    assert linked > 0  # chain links were found


@pytest.mark.parametrize("strategy", [
    {"tp": 2, "pp": 4, "dp": 2, "global_batch": 16, "zero": 1},  # 1F1B with exchanges (receivers wait for later tids)
    {"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch": 16, "recompute": "full"},
    {"tp": 1, "pp": 1, "dp": 8, "global_batch": 16, "zero": 3},
], ids=["1f1b", "interleaved", "zero3"])
def test_successors_equal_every_edge_walked_on_compiled_jobs(strategy: dict[str, object]) -> None:
    job = make_job(load_model("gpt3-1.3b"), load_cluster("dgx-a100-80gb").with_num_gpus(16 if strategy["pp"] != 1
                                                                                         else 8),
                   ParallelSpec.parse({"micro_batch": 1, "seq_len": 2048, **strategy}))
    estimator = SimEstimator()
    graph = compile_job(job, default_plan(graph_for(job), job.parallel), estimator.pricer, estimator.task_level)
    assert _check(graph) > 0  # chain links were found


def test_chain_links_into_collectives_and_shared_links_are_listed() -> None:
    """A task waiting for the task before it alone is a chain link (None), except where it is a collective rank or a
    flow on a link another device's flow names: then its predecessor lists it ([tid + 1])."""
    devices = [SimDevice(index=d, stage=d, ranks=1, capacity_bytes=1e9, static_bytes=0.0) for d in range(2)]
    graph = ExecGraph(devices=devices, tasks=[], resource_capacity={"link": 1.0})
    graph.add(name="a", device=0, stream="compute", kind="compute", duration_s=1.0)
    graph.add(name="b", device=0, stream="compute", kind="compute", duration_s=1.0, deps=(0,))
    graph.add(name="rank0", device=0, stream="gradient", kind="comm", duration_s=1.0, deps=(1,), sync_key="k")
    graph.add(name="rank1", device=1, stream="gradient", kind="comm", duration_s=1.0, sync_key="k")
    graph.add(name="send0", device=1, stream="feature", kind="comm", duration_s=1.0, deps=(3,), resources=("link",))
    graph.add(name="send1", device=0, stream="feature", kind="comm", duration_s=1.0, resources=("link",))
    arrays = GraphArrays(graph, 0.0)
    assert arrays.successors[:4] == [None, [2], [], [4]]
    assert arrays.shared_links == {4, 5}
    assert _check(graph) == 1


_FIELDS = ("is_compute", "work", "num_deps", "stream_of", "successors", "categories", "category_of", "leader_of",
           "members", "flow_resources", "flow_weights", "resource_names", "resource_capacity", "shared_links")


def _lists(arrays: GraphArrays) -> dict[str, object]:
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in ((name, getattr(arrays, name)) for name in _FIELDS)}


def _compiled(strategy: dict[str, object]) -> ExecGraph:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 2048, **strategy})
    job = make_job(load_model("gpt3-1.3b"), load_cluster("dgx-a100-80gb").with_num_gpus(par.tp * par.pp * par.dp),
                   par)
    estimator = SimEstimator()
    return compile_job(job, default_plan(graph_for(job), job.parallel), estimator.pricer, estimator.task_level)


def _without_runs(graph: ExecGraph, launch_overhead_s: float) -> GraphArrays:
    """The per-task path: the same columns without the compiler's template runs."""
    columns = graph.columns()
    runs, columns.template_runs = columns.template_runs, []
    try:
        return GraphArrays(graph, launch_overhead_s)
    finally:
        columns.template_runs = runs


@pytest.mark.parametrize("strategy", [
    {"tp": 2, "pp": 4, "dp": 2, "global_batch": 16, "zero": 1},
    {"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch": 16, "recompute": "full"},
    {"tp": 2, "pp": 4, "dp": 2, "global_batch": 16, "schedule": "zb-h1"},
    {"tp": 1, "pp": 1, "dp": 8, "global_batch": 16, "zero": 3},
    {"tp": 16, "pp": 2, "dp": 1, "global_batch": 8},  # tensor-parallel collectives across nodes: NICs shared
], ids=["1f1b", "interleaved", "zb-h1", "zero3", "tp-across-nodes"])
def test_template_runs_give_the_per_task_lists(strategy: dict[str, object]) -> None:
    """GraphArrays made with the compiler's template runs (ir/template_runs.py) equals the per-task path's."""
    graph = _compiled(strategy)
    columns = graph.columns()
    runs = columns.template_runs
    assert runs or strategy.get("zero") == 3  # ZeRO-3's gathers cut into every step: no templates
    # a fresh compile's runs all hold their blocks' values (the shortcut is taken everywhere)
    assert holding(ordered_runs(columns, len(columns)), columns.device, columns.stream, columns.kind,
                   columns.category) == runs
    assert _lists(GraphArrays(graph, 1e-6)) == _lists(_without_runs(graph, 1e-6))


@pytest.mark.parametrize("change", ["kind", "stream", "category", "device", "deps", "deps-equal", "runs-overlap",
                                    "resources", "link_shares", "sync_key"])
def test_template_runs_changed_since_are_not_relied_on(change: str) -> None:
    """A column changed in place within a template run (or runs out of order) gives the per-task path's lists."""
    graph = _compiled({"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch": 16})
    columns = graph.columns()
    run = columns.template_runs[3]
    tid = run.first + 2  # a chain link inside the run
    linked = next(t for t in range(run.first + 1, run.end) if columns.resources[t])  # a transfer inside it
    if change == "resources":
        columns.resources[linked] = (*columns.resources[linked], "a link of its own")
    elif change == "link_shares":
        columns.link_shares[linked] = (2.0,) * len(columns.resources[linked])
    elif change == "sync_key":
        columns.sync_key[linked] = "a collective of one"
    elif change == "kind":
        columns.kind[tid] = "comm" if columns.kind[tid] == "compute" else "compute"
    elif change == "stream":
        columns.stream[tid] = "gradient"
    elif change == "category":
        columns.category[tid] = "a category of its own"
    elif change == "device":
        columns.device[tid] = (columns.device[tid] + 1) % len(graph.devices)
    elif change == "deps":
        columns.deps[tid] = (tid - 1, 0)
    elif change == "deps-equal":
        columns.deps[tid] = (tid - 1,)  # a new tuple holding the same: a listed link, no None
    else:
        columns.template_runs.insert(0, columns.template_runs[4])
    assert _lists(GraphArrays(graph, 0.0)) == _lists(_without_runs(graph, 0.0)) or change == "deps-equal"
    if change == "deps-equal":
        with_runs, per_task = GraphArrays(graph, 0.0), _without_runs(graph, 0.0)
        assert with_runs.successors[tid - 1] == [tid] and per_task.successors[tid - 1] is None
        assert [s or [t + 1] for t, s in enumerate(with_runs.successors)] == \
            [s or [t + 1] for t, s in enumerate(per_task.successors)]
