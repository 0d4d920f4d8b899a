"""Per-device timelines where the ranks of a stage differ (compile/device_classes.py): stragglers and other
devices in the cluster get timelines of their own, their collectives wait for the slowest class, identical ranks
are simulated once, and a cluster whose ranks are all alike compiles to today's graph."""

import dataclasses
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import a100_cluster
from trainsim.catalog import load_cluster, load_device, load_model
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.loader import cluster_from_mapping
from trainsim.compile.build import compile_job
from trainsim.compile.device_classes import device_classes
from trainsim.cost.pricing import Pricer
from trainsim.errors import UnknownNameError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.exec_graph import ExecGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.sim import SimOptions, SimOutcome, simulate
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec

GPT = load_model("gpt3-125m")
PRICER = Pricer(Calibration())
OPTIONS = SimOptions(overlap_slowdown=0.0, bandwidth_sharing=False, launch_overhead_s=0.0)


def _job(num_gpus: int, cluster: ClusterSpec | None = None, **strategy: object) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 4 * num_gpus, **strategy})
    return make_job(GPT, cluster or a100_cluster(num_gpus), par)


def _with(job: Job, **update: object) -> Job:
    return dataclasses.replace(job, cluster=job.cluster.model_copy(update=update))


def _run(job: Job) -> tuple[ExecGraph, SimOutcome]:
    graph = compile_job(job, default_plan(graph_for(job), job.parallel), PRICER)
    return graph, simulate(graph, OPTIONS)


def test_two_asymmetric_devices_in_one_stage_get_two_timelines_and_their_collective_waits_for_the_slower() -> None:
    """dp 2, rank 1 a straggler at 2x: two simulated devices, each with every task; rank 1's compute takes twice
    rank 0's; each gradient bucket's all-reduce is one collective of both, starting when the slow rank's gradient
    is ready (the fast rank's waits for it)."""
    plain = _job(2, dp=2)
    base, _ = _run(plain)
    graph, outcome = _run(_with(plain, compute_slowdown={1: 2.0}))
    assert len(graph.devices) == 2 and [d.ranks for d in graph.devices] == [1, 1]
    n = len(base.tasks)
    assert len(graph.tasks) == 2 * n
    for task in base.tasks:
        fast, slow = graph.tasks[task.tid], graph.tasks[n + task.tid]
        assert (fast.device, slow.device, fast.name, slow.name) == (0, 1, task.name, task.name)
        assert fast.duration_s == task.duration_s
        assert slow.duration_s == (2.0 * task.duration_s if task.kind == "compute" else task.duration_s)
    buckets = [t for t in graph.tasks if t.category == "dp_comm" and t.device == 0]
    assert buckets
    for fast in buckets:
        slow = graph.tasks[n + fast.tid]
        assert fast.sync_key == slow.sync_key != ""
        ready_fast = max(outcome.end_s[d] for d in fast.deps)
        ready_slow = max(outcome.end_s[d] for d in slow.deps)
        assert outcome.start_s[fast.tid] == outcome.start_s[slow.tid] >= ready_slow > ready_fast
    first = graph.tasks[n + buckets[0].tid]  # the first bucket starts as soon as the slow rank's gradient is
    assert outcome.start_s[first.tid] == pytest.approx(max(outcome.end_s[d] for d in first.deps), abs=1e-12)
    assert outcome.makespan_s > simulate(base, OPTIONS).makespan_s


def test_a_rank_of_another_device_runs_its_compute_at_that_devices_prices() -> None:
    """Rank 1 a V100 in an A100 cluster: its class's compute tasks last what the job compiled for a V100 gives,
    its memory capacity is the V100's."""
    plain = _job(2, dp=2)
    v100 = load_device("v100-sxm2-32gb")
    graph, _ = _run(_with(plain, rank_devices={1: v100}))
    on_v100, _ = _run(_with(plain, device=v100))
    n = len(on_v100.tasks)
    compute = [task for task in on_v100.tasks if task.kind == "compute"]
    for task in compute:
        assert graph.tasks[n + task.tid].duration_s == task.duration_s
    assert sum(graph.tasks[n + t.tid].duration_s for t in compute) > 1.2 * sum(graph.tasks[t.tid].duration_s
                                                                              for t in compute)
    assert graph.devices[1].capacity_bytes == v100.hbm_bytes
    assert graph.devices[0].capacity_bytes == plain.cluster.device.hbm_bytes


def test_ranks_alike_compile_to_the_same_graph_as_today() -> None:
    """Overrides equal to the cluster's own device and no slow-down change nothing: same tasks, same numbers."""
    plain = _job(4, dp=2, pp=2)
    base, before = _run(plain)
    graph, after = _run(_with(plain, compute_slowdown={0: 1.0, 3: 1.0}, rank_devices={2: plain.cluster.device}))
    assert len(graph.devices) == len(base.devices) == 2
    assert [dataclasses.astuple(t) for t in graph.tasks] == [dataclasses.astuple(t) for t in base.tasks]
    assert after.end_s == before.end_s


def test_identical_replicas_are_simulated_once() -> None:
    """dp 64 with stragglers in replicas 1 and 3: two classes (62 replicas and 2), not one device per rank."""
    job = _with(_job(64, dp=64), compute_slowdown={1: 1.5, 3: 1.5})
    classes = device_classes(job)
    assert [len(c.replicas) for c in classes] == [62, 2]
    assert classes[1].replicas == (1, 3)
    graph, _ = _run(job)
    assert [d.ranks for d in graph.devices] == [62, 2]


def test_a_tensor_parallel_group_is_as_slow_as_its_straggler() -> None:
    """tp 2 x dp 2: rank 1 is replica 0's second TP rank; replica 0 (ranks 0 and 1) is the slow class, its TP
    collectives stay inside it (no shared key with replica 1's)."""
    job = _with(_job(4, tp=2, dp=2), compute_slowdown={1: 1.5})
    classes = device_classes(job)
    assert [c.replicas for c in classes] == [(0,), (1,)]
    graph, _ = _run(job)
    n = len(graph.tasks) // 2
    assert [d.ranks for d in graph.devices] == [2, 2]
    tp = [t for t in graph.tasks[:n] if t.category == "tp_comm"]
    assert tp and all(graph.tasks[n + t.tid].sync_key == t.sync_key == "" for t in tp)
    slow_first = next(t for t in graph.tasks[:n] if t.kind == "compute")
    assert slow_first.duration_s == pytest.approx(1.5 * graph.tasks[n + slow_first.tid].duration_s)


def test_a_straggler_in_stage_0_delays_its_own_pipeline_column_only() -> None:
    """pp 2 x dp 2, rank 1 (stage 0, replica 1) slow: 2 classes x 2 stages; stage 1 of the slow column receives
    later than stage 1 of the other column."""
    job = _with(_job(4, dp=2, pp=2), compute_slowdown={1: 3.0})
    graph, outcome = _run(job)
    assert [(d.stage, d.index) for d in graph.devices] == [(0, 0), (1, 1), (0, 2), (1, 3)]
    first = {d: min(outcome.start_s[t.tid] for t in graph.tasks if t.device == d and t.kind == "compute"
                    and t.phase == "fwd" and t.layer) for d in (1, 3)}
    assert first[3] > first[1]


def test_bad_stragglers_and_rank_devices_are_refused() -> None:
    entry = {"name": "c", "device": "a100-sxm4-80gb", "gpus_per_node": 8, "intra_node": "nvlink3",
             "inter_node": "ib-hdr-200"}
    for bad in ({"compute_slowdown": {1: 0.0}}, {"compute_slowdown": {1: float("nan")}},
                {"compute_slowdown": {-1: 2.0}}, {"rank_devices": {2**24: "v100-sxm2-32gb"}}):
        with pytest.raises((ValidationError, ValueError)):
            ClusterSpec.model_validate(dict(load_cluster("dgx-a100-80gb").model_dump(), **bad))
    with pytest.raises(UnknownNameError, match="no-such-gpu"):
        cluster_from_mapping({**entry, "rank_devices": {1: "no-such-gpu"}})
    cluster = cluster_from_mapping({**entry, "rank_devices": {1: "v100-sxm2-32gb"}})
    assert cluster.rank_devices[1].name == "v100-sxm2-32gb"


def test_the_memory_verdict_reads_the_device_nearest_its_capacity() -> None:
    """Rank 1 a 16 GB V100 among 80 GB A100s: the same peak, and the job's memory figure is the V100's."""
    from trainsim.estimate.simulation import SimEstimator

    plain = _job(2, dp=2)
    small = load_device("v100-sxm2-16gb")
    result = SimEstimator(PRICER).estimate(_with(plain, rank_devices={1: small}), graph_for(plain))
    assert result.memory_capacity_bytes == small.hbm_bytes


CLUSTER_YAML = """name: dgx-a100-straggler
device: a100-sxm4-80gb
gpus_per_node: 8
num_nodes: 2
intra_node: nvlink3-nvswitch
inter_node: ib-hdr-200
nics_per_node: 8
{extra}
"""


def test_predict_reads_stragglers_and_rank_devices_from_a_cluster_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trainsim.cli.main import app

    flags = ["predict", "--model", "gpt3-125m", "--num-gpus", "16", "--tp", "2", "--pp", "2", "--micro-batch", "1",
             "--global-batch", "32", "--seq-len", "512", "--engine", "sim", "--json"]
    times = []
    for extra in ("", "compute_slowdown: {5: 1.5}\nrank_devices: {9: a100-sxm4-40gb}"):
        path = tmp_path / "cluster.yaml"
        path.write_text(CLUSTER_YAML.format(extra=extra))
        result = CliRunner().invoke(app, [*flags, "--cluster", str(path)])
        assert result.exit_code == 0, result.output
        times.append(json.loads(result.stdout)["iteration_time_s"])
    assert times[1] > times[0]
    path.write_text(CLUSTER_YAML.format(extra="compute_slowdown: {5: -1.5}"))
    result = CliRunner().invoke(app, [*flags, "--cluster", str(path)])
    assert result.exit_code == 2 and "compute_slowdown" in result.output and "Traceback" not in result.output


def test_classes_on_one_node_share_its_nic_by_their_ranks() -> None:
    """Collective prices already give each GPU its share of its node's NICs (comm/collectives.py: NICs x
    bandwidth / GPUs per node), so a class's transfer takes one share per rank of it behind the node's NIC, which
    every class on the node names (compile/place_links.py): splitting ranks that are alike into two classes on the same
    nodes (a twin device of the same specs) simulates to exactly the one-device iteration, with bandwidth sharing
    and an overlap slow-down on. pp 2 x dp 16 over nodes of one NIC: the gradient buckets and the pipeline's
    sends cross it."""
    from trainsim.catalog.overlap import model_family
    from trainsim.estimate.simulation import SimEstimator

    cluster = a100_cluster(32).model_copy(update={"nics_per_node": 1})
    plain = _job(32, cluster, dp=16, pp=2)
    twin = cluster.device.model_copy(update={"name": "a100-twin"})
    split = _with(plain, rank_devices={1: twin, 3: twin})
    gamma = {(name, model_family(GPT)): 0.3 for name in (cluster.device.name, twin.name)}
    sim = SimEstimator(PRICER, overlap_factors=gamma)
    run = sim.run(split, graph_for(split))
    assert len(run.graph.devices) == 4  # stage 0 and 1, then the twin class's stage 0 and 1

    def nic_shares(device: int) -> dict[str, float]:
        return {r: s for t in run.graph.tasks if t.device == device and t.category == "dp_comm"
                for r, s in zip(t.resources, t.link_shares, strict=True) if ".nic." in r}

    # stage 0: ranks 0-15 on nodes 0 and 1; the twin class holds ranks 1 and 3, behind node 0's NIC
    assert nic_shares(2) == {"node0.nic.tx": 2.0, "node0.nic.rx": 2.0}
    assert nic_shares(0) == {"node0.nic.tx": 6.0, "node1.nic.tx": 8.0, "node0.nic.rx": 6.0, "node1.nic.rx": 8.0}
    assert run.graph.resource_capacity["node0.nic.tx"] == 8.0
    assert run.outcome.makespan_s == sim.run(plain, graph_for(plain)).outcome.makespan_s
