"""The cluster's shared links as the compiled plan's resources (compile/place_links.py, hardware/links.py): transfers of
different communication groups and devices that cross one NIC share it in the simulator, identical devices that
fill their nodes simulate as with links of their own, and the resources do not grow with dp."""

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import a100_cluster, link_shares_by_rank
from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import Calibration
from trainsim.compile.build import compile_job
from trainsim.compile.place_links import _merge_alike
from trainsim.cost.pricing import Pricer
from trainsim.hardware.cluster import ClusterSpec
from trainsim.hardware.links import link_capacity, link_kind, link_runs
from trainsim.ir.exec_graph import ExecGraph, Task
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree
from trainsim.strategy.tree_yaml import load_tree_yaml

GPT = load_model("gpt3-125m")
PRICER = Pricer(Calibration())
ROOT = Path(__file__).resolve().parents[3]
SHARING = SimOptions(overlap_slowdown=0.0, bandwidth_sharing=True, launch_overhead_s=0.0)


def _job(cluster: ClusterSpec, **strategy: object) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 4 * cluster.num_gpus, **strategy})
    return make_job(GPT, cluster, par)


def _compile(job: Job) -> ExecGraph:
    return compile_job(job, default_plan(graph_for(job), job.parallel), PRICER)


def _nodes_of_four(num_nodes: int) -> ClusterSpec:
    """A100 nodes of 4 GPUs behind one NIC each."""
    return a100_cluster(8).model_copy(update={"gpus_per_node": 4, "num_nodes": num_nodes, "nics_per_node": 1})


def _first(graph: ExecGraph, device: int, prefix: str) -> Task:
    return next(t for t in graph.tasks if t.device == device and t.name.startswith(prefix))


def _alone_together(graph: ExecGraph, tasks: list[Task]) -> ExecGraph:
    """These compiled transfers with their resources, shares and capacities, all started at once."""
    out = ExecGraph(devices=graph.devices, tasks=[], resource_capacity=dict(graph.resource_capacity))
    for t in tasks:
        out.add(name=t.name, device=t.device, stream=t.stream, kind="comm", duration_s=t.duration_s,
                resources=t.resources, link_shares=t.link_shares, phase="comm", category=t.category)
    return out


def _shares(task: Task) -> dict[str, float]:
    return dict(zip(task.resources, task.link_shares, strict=True))


def test_two_groups_contend_for_one_nic() -> None:
    """pp 2 x dp 6 on 3 nodes of 4 GPUs with one NIC: stage 0 holds ranks 0-5 (nodes 0 and 1), stage 1 ranks 6-11
    (nodes 1 and 2), so node 1's NIC carries both stages' data-parallel groups: each takes 2 shares of its 4.
    - One gradient bucket of each stage: 4 shares of 4, both at full speed.
    - Stage 1's pipeline send of a gradient leaves nodes 1 and 2 and lands on nodes 0 and 1 (stage 0's ranks):
      beside the two stages' buckets, node 0's NIC receives 8 shares of 4 (stage 0's bucket and the send), node 1's
      6 of 4 and node 2's sends 8 of 4, so all three run at half speed until the send ends. With a NIC share per
      device (before), stage 0's bucket ran at full speed beside stage 1's transfers."""
    graph = _compile(_job(_nodes_of_four(3), pp=2, dp=6))
    first0 = _first(graph, 0, "dp all-reduce bucket0")
    bucket1, send = _first(graph, 1, "dp all-reduce bucket0"), _first(graph, 1, "send grad")
    assert _shares(first0)["node1.nic.tx"] == _shares(bucket1)["node1.nic.tx"] == 2.0
    assert _shares(first0)["node0.nic.tx"] == _shares(bucket1)["node2.nic.tx"] == 4.0
    assert _shares(send) == {"node1.nic.tx": 2.0, "node2.nic.tx": 4.0, "node0.nic.rx": 4.0, "node1.nic.rx": 2.0}
    assert graph.resource_capacity["node1.nic.tx"] == 4.0
    a, d1, s = first0.duration_s, bucket1.duration_s, send.duration_s
    assert s < min(a, d1)
    assert simulate(_alone_together(graph, [first0, bucket1]), SHARING).end_s == [a, d1]
    three = _alone_together(graph, [first0, bucket1, send])
    assert simulate(three, SHARING).end_s == pytest.approx([a + s, d1 + s, 2 * s], rel=1e-12)
    assert simulate(_per_device(three), SHARING).end_s == pytest.approx([a, d1 + s, 2 * s], rel=1e-12)


def test_transfers_on_different_rails_do_not_contend_and_on_one_rail_do() -> None:
    """pp 2 x tp 4 x dp 4 on DGX A100 nodes (a NIC per GPU: 8 rails), rank 0 a straggler, so replica 0 (ranks 0-3
    of stage 0, on node 0's rails 0-3) is a device class of its own and replicas 1-3 (node 0's rails 4-7 and node 1)
    the other. Class 0's share of a gradient bucket and its pipeline send both leave on rails 0-3: together each
    runs at half speed (a + s, 2 s). The other class's send leaves on rails 4-7 beside class 0's bucket: both at
    full speed. (With the node's NICs as one pool, class 0's two transfers took 4 + 4 of its 8 shares: full
    speed.)"""
    cluster = a100_cluster(32).model_copy(update={"compute_slowdown": {0: 1.5}})
    graph = _compile(_job(cluster, pp=2, tp=4, dp=4))
    assert [(d.stage, d.ranks) for d in graph.devices] == [(0, 4), (1, 4), (0, 12), (1, 12)]
    bucket, send = _first(graph, 0, "dp all-reduce bucket0"), _first(graph, 0, "send act")
    other_send = _first(graph, 2, "send act")
    rails_0_3, rails_4_7 = "node0.nic0.tx (+3 alike)", "node0.nic4.tx (+11 alike)"
    assert _shares(bucket)[rails_0_3] == _shares(send)[rails_0_3] == 1.0
    assert _shares(other_send)[rails_4_7] == 1.0 and rails_0_3 not in other_send.resources
    assert graph.resource_capacity[rails_0_3] == graph.resource_capacity[rails_4_7] == 1.0
    a, s = bucket.duration_s, send.duration_s
    assert s < a and other_send.duration_s == s
    assert simulate(_alone_together(graph, [bucket, send]), SHARING).end_s == pytest.approx([a + s, 2 * s], rel=1e-12)
    assert simulate(_alone_together(graph, [bucket, other_send]), SHARING).end_s == [a, s]


def test_the_tp_and_dp_groups_of_a_hybrid_plan_share_the_nic_they_cross() -> None:
    """tp 4 over nodes of 2 GPUs with one NIC and dp 2: a tensor-parallel all-reduce and a gradient bucket of one
    device both cross each node's NIC with all its ranks (2 shares of 2 each): together each runs at half speed."""
    cluster = a100_cluster(8).model_copy(update={"gpus_per_node": 2, "num_nodes": 4, "nics_per_node": 1})
    graph = _compile(_job(cluster, tp=4, dp=2))
    tp = next(t for t in graph.tasks if t.category == "tp_comm")
    dp = _first(graph, 0, "dp all-reduce bucket0")
    assert {r for r in tp.resources if ".nic." in r} == {r for r in dp.resources if ".nic." in r}
    out = simulate(_alone_together(graph, [tp, dp]), SHARING)
    short, long = sorted((tp.duration_s, dp.duration_s))
    assert sorted(out.end_s) == pytest.approx([2 * short, long + short], rel=1e-12)


def test_a_sub_group_collective_takes_only_the_links_of_its_ranks() -> None:
    """tp 4 over nodes of 2 GPUs with one NIC, dp 2, the MLP over pairs of tp ranks
    (data/strategies/megatron/gpt-tp4-mlp-tp2.yaml): each tp group spans 2 nodes, its pairs (ranks 0-1, 2-3) one
    node each. The MLP's all-reduce over a pair is one task for both pairs of a group (the device stands for every
    rank; SPMD: the pairs run at once): it crosses only the NVLink ports of its ranks, no NIC, so beside a gradient
    bucket (which crosses each node's NIC with all its ranks) both run at full speed. The attention's all-reduce
    over the whole group of 4 crosses the NICs: beside the bucket each runs at half speed. (Before, the pair's
    all-reduce named the whole group's links and slowed the bucket as the attention's does.)"""
    cluster = a100_cluster(8).model_copy(update={"gpus_per_node": 2, "num_nodes": 4, "nics_per_node": 1})
    job = _job(cluster, tp=4, dp=2)
    tree = load_tree_yaml(ROOT / "data" / "strategies" / "megatron" / "gpt-tp4-mlp-tp2.yaml", graph_for(job))
    graph = compile_job(job, tree.lower(job.parallel), PRICER, "op")
    pair = _first(graph, 0, "mlp.ar all-reduce")
    whole = _first(graph, 0, "attn.ar all-reduce")
    bucket = _first(graph, 0, "dp all-reduce bucket0")
    assert pair.resources == ("stage0.fabric.tx", "stage0.fabric.rx") and pair.link_shares == ()
    assert {r for r in whole.resources if ".nic." in r} == {r for r in bucket.resources if ".nic." in r} != set()
    assert pair.duration_s == PRICER.collective_s("all-reduce", 512 * 768 * 2, cluster.group_layout(2, 1), job)
    assert whole.duration_s == PRICER.collective_s("all-reduce", 512 * 768 * 2, cluster.group_layout(4, 1), job)
    assert simulate(_alone_together(graph, [pair, bucket]), SHARING).end_s == [pair.duration_s, bucket.duration_s]
    out = simulate(_alone_together(graph, [whole, bucket]), SHARING)
    short, long = sorted((whole.duration_s, bucket.duration_s))
    assert sorted(out.end_s) == pytest.approx([2 * short, long + short], rel=1e-12)


def test_at_layer_level_a_layers_collectives_merge_per_sub_group() -> None:
    """The same plan at task level "layer": a block's tp collectives merge into one task per axis and sub-group,
    the pairs' ("tp comm x2") on the NVLink ports only, the whole group's ("tp comm") across the NICs."""
    cluster = a100_cluster(8).model_copy(update={"gpus_per_node": 2, "num_nodes": 4, "nics_per_node": 1})
    job = _job(cluster, tp=4, dp=2)
    tree = load_tree_yaml(ROOT / "data" / "strategies" / "megatron" / "gpt-tp4-mlp-tp2.yaml", graph_for(job))
    graph = compile_job(job, tree.lower(job.parallel), PRICER, "layer")
    block = [t for t in graph.tasks if t.device == 0 and t.micro_batch == 0 and t.layer == "L1.block"
             and t.category == "tp_comm"]
    assert [t.name for t in block] == ["tp comm mb0 L1.block", "tp comm x2 mb0 L1.block"] * 2  # forward, backward
    pairs, whole = block[1], block[0]
    assert pairs.resources == ("stage0.fabric.tx", "stage0.fabric.rx")
    assert any(".nic." in r for r in whole.resources)
    assert pairs.duration_s == PRICER.collective_s("all-reduce", 512 * 768 * 2, cluster.group_layout(2, 1), job)


@pytest.mark.parametrize("level", ["op", "layer"])
def test_a_reshard_over_neighbouring_data_parallel_ranks_takes_only_their_links(level: str) -> None:
    """dp 4 over nodes of 2 GPUs with one NIC, blocks.0's MLP carved from pairs of data-parallel ranks (fc1 split
    by outputs, fc2 by its reduction dimension, 2 ways): the reshards between them span a pair of neighbouring
    ranks inside a node, so they name no NIC (the gradient buckets over all 4 ranks do)."""
    cluster = a100_cluster(8).model_copy(update={"gpus_per_node": 2, "num_nodes": 2, "nics_per_node": 1})
    job = _job(cluster, dp=4)
    tree = (StrategyTree.from_graph(graph_for(job)).split("blocks.0.mlp.fc1", "compute", "out", 2)
            .split("blocks.0.mlp.fc2", "compute", "reduce", 2))
    graph = compile_job(job, tree.lower(job.parallel), PRICER, level)  # type: ignore[arg-type]
    reshards = [t for t in graph.tasks if t.category == "comm" and t.layer == "L1.block"]
    assert reshards and all(t.resources == ("stage0.fabric.tx", "stage0.fabric.rx") for t in reshards)
    assert any(".nic." in r for r in _first(graph, 0, "dp all-reduce bucket0").resources)


def _per_device(graph: ExecGraph) -> ExecGraph:
    """The graph with each device's own copy of every link, a whole link per transfer (a NIC share per device)."""
    tasks = [dataclasses.replace(t, resources=tuple(f"dev{t.device}.{r}" for r in t.resources), link_shares=())
             for t in graph.tasks]
    return ExecGraph(devices=graph.devices, tasks=tasks)


@pytest.mark.parametrize("strategy", [{"pp": 2, "dp": 8}, {"pp": 2, "dp": 8, "zero": 3}, {"tp": 2, "dp": 8}])
def test_devices_that_fill_their_nodes_simulate_as_with_links_of_their_own(strategy: dict[str, int]) -> None:
    """Each stage on whole nodes of one NIC: its transfers take the NIC's whole capacity, so the shared links give
    exactly the per-device iteration (the same end of every task)."""
    graph = _compile(_job(a100_cluster(16).model_copy(update={"nics_per_node": 1}), **strategy))
    assert any(".nic." in r for t in graph.tasks for r in t.resources)
    assert simulate(graph, SHARING).end_s == simulate(_per_device(graph), SHARING).end_s


def test_alike_links_are_one_resource_whatever_the_dp() -> None:
    """The NICs of a stage's nodes are merged into one resource per direction: as many resources at dp 4 as at
    dp 32."""
    counts = []
    for dp in (4, 32):
        job = _job(load_cluster("dgx-a100-80gb").with_num_gpus(2 * dp * 2), tp=2, pp=2, dp=dp)
        graph = _compile(job)
        names = {r for t in graph.tasks for r in t.resources}
        counts.append(len(names))
        nics = [n for n in names if ".nic" in n]
        assert len(nics) == 4  # tx and rx of each stage's nodes: every rail of every node alike
        assert all(graph.resource_capacity[n] == 1.0 for n in nics)  # a DGX A100 NIC serves one GPU
    assert counts[0] == counts[1]


def test_a_group_across_leaves_names_their_up_links() -> None:
    """tp 4 x dp 8 over 4 nodes, one node per leaf, up-links oversubscribed 2:1: each gradient bucket crosses every
    leaf's up-links with the stage's 8 ranks under it (of 8), and each of the 32 GPUs' own NIC (1 of 1)."""
    cluster = a100_cluster(32).model_copy(update={"nodes_per_leaf": 1, "leaf_oversubscription": 2.0})
    graph = _compile(_job(cluster, tp=4, dp=8))
    shares = _shares(_first(graph, 0, "dp all-reduce bucket0"))
    assert shares["leaf0.uplink.tx (+3 alike)"] == 8.0
    assert shares["node0.nic0.tx (+31 alike)"] == 1.0
    assert graph.resource_capacity["leaf0.uplink.tx (+3 alike)"] == 8.0
    assert graph.resource_capacity["node0.nic0.tx (+31 alike)"] == 1.0



@pytest.mark.parametrize(("gpus_per_node", "strategy"), [
    (4, {"tp": 4, "pp": 2, "dp": 2}), (2, {"tp": 4, "pp": 2, "dp": 2}),
    (4, {"tp": 2, "pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved-1f1b"})],
    ids=["tp-in-node", "tp-across-nodes", "interleaved"])
def test_template_runs_place_the_links_the_per_task_path_places(monkeypatch: pytest.MonkeyPatch, gpus_per_node: int,
                                                                 strategy: dict[str, object]) -> None:
    """place_links skips the compiler's template runs whose blocks name no link to place and reads the others per
    task (ir/template_runs.py): the graph it gives is the one it gives reading every task."""
    from trainsim.compile import build, place_links

    cluster = a100_cluster(8).model_copy(update={"gpus_per_node": gpus_per_node, "num_nodes": 16 // gpus_per_node,
                                                 "nics_per_node": 1})
    job = _job(cluster, **strategy)
    monkeypatch.setattr(build, "place_links", lambda _job, graph: graph)  # the graph before links are placed
    with_runs, per_task = _compile(job), _compile(job)
    runs = list(with_runs.columns().template_runs)
    assert runs
    per_task.columns().template_runs.clear()
    assert place_links.place_links(job, with_runs).tasks == place_links.place_links(job, per_task).tasks
    assert with_runs.resource_capacity == per_task.resource_capacity
    assert any(t.link_shares for t in with_runs.tasks)  # shared links were placed
    # within the runs: the tensor-parallel collectives' NICs where tp spans nodes, none where it does not
    placed_in_runs = any(t.link_shares for run in runs for t in with_runs.tasks[run.first:run.end])
    assert placed_in_runs == (gpus_per_node < int(str(strategy["tp"])))


def _merge_link_by_link(physical: dict[str, dict[str, int]], job: Job) -> tuple[dict[str, dict[str, float]],
                                                                              dict[str, float]]:
    """The reference merge, a name per link: links grouped by (kind, capacity, the tokens and shares crossing
    them) in the order the tokens (sorted) first name them, each group named for its first link."""
    users: dict[str, list[tuple[str, int]]] = {}
    for token, links in physical.items():
        for link, share in links.items():
            users.setdefault(link, []).append((token, share))
    alike: dict[tuple[str, float, tuple[tuple[str, int], ...]], list[str]] = {}
    for link, used in users.items():
        alike.setdefault((link_kind(link), link_capacity(link, job.cluster), tuple(sorted(used))), []).append(link)
    merged: dict[str, dict[str, float]] = {token: {} for token in physical}
    capacity: dict[str, float] = {}
    for (_, cap, used), links in alike.items():
        name = links[0] if len(links) == 1 else f"{links[0]} (+{len(links) - 1} alike)"
        capacity[name] = cap
        for token, share in used:
            merged[token][name] = float(share)
    return merged, capacity


_MERGE_CLUSTERS = [a100_cluster(128).model_copy(update={"nodes_per_leaf": 3, "leaf_oversubscription": 2.0}),
                   load_cluster("dgx1-v100").with_num_gpus(128).model_copy(update={"nodes_per_leaf": 5,
                                                                                    "leaf_oversubscription": 2.0}),
                   load_cluster("titanxp-pcie-8").model_copy(update={"num_nodes": 16, "nodes_per_leaf": 7,
                                                                      "leaf_oversubscription": 3.0})]
_RUNS = st.lists(st.tuples(st.integers(0, 20), st.integers(1, 40)), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(cluster=st.sampled_from(_MERGE_CLUSTERS), stages=st.lists(st.tuples(_RUNS, st.booleans()), min_size=1,
                                                                 max_size=3),
       levels=st.lists(st.sampled_from(["nic.tx", "nic.rx", "uplink.tx", "uplink.rx", "fabric.tx", "fabric.rx"]),
                       min_size=1, max_size=6, unique=True))
def test_merging_runs_of_links_is_merging_link_by_link(cluster: ClusterSpec, stages: list[tuple[list[tuple[int, int]],
                                                                                                  bool]],
                                                        levels: list[str]) -> None:
    """Differential: the merge over runs of links (never a name per link) gives the reference's merged names,
    shares, capacities and their order, for stages of ranks in order, with gaps, overlapping each other's links or
    out of order."""
    job = _job(cluster)
    blocks = []
    for gaps, reverse in stages:
        runs, rank = [], 0
        for gap, count in gaps:
            runs.append((rank + gap, count))
            rank += gap + count
        blocks.append(runs[::-1] if reverse else runs)
    tokens = sorted(f"stage{d}.{level}" for d in range(len(blocks)) for level in levels)
    split = [token.split(".") for token in tokens]
    per_link = {token: link_shares_by_rank(blocks[int(d[5:])], level, direction, cluster)
                for token, (d, level, direction) in zip(tokens, split, strict=True)}
    runs_of = {token: link_runs(blocks[int(d[5:])], level, direction, cluster)
               for token, (d, level, direction) in zip(tokens, split, strict=True)}
    want, got = _merge_link_by_link(per_link, job), _merge_alike(runs_of, job)
    assert [list(m.items()) for m in want[0].values()] == [list(m.items()) for m in got[0].values()]
    assert list(want[1].items()) == list(got[1].items())
