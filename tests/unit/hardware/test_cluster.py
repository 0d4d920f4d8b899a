"""Clusters as built: NVLink domains apart from servers (NVL72 trays), jobs over part of a rack or several racks,
leaves (scalable units), and one-line errors for bad cluster fields."""

import pytest

from trainsim.catalog import load_cluster
from trainsim.catalog.loader import cluster_from_mapping
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import GroupLayout


def test_256_gpus_on_nvl72_racks_are_4_racks_of_64() -> None:
    # 64 trays of 4 spread evenly over the fewest racks that hold them: 4 racks x 16 of their 18 trays.
    job = load_cluster("gb200-nvl72").with_num_gpus(256)
    assert (job.num_nodes, job.gpus_per_node, job.num_gpus) == (64, 4, 256)
    assert (job.gpus_per_domain, job.num_domains) == (64, 4)
    # dp over all 256 ranks: 64 on each rack; tp=4 inside a tray; tp=8 over two trays of one rack.
    assert job.group_layout(256, 1) == GroupLayout(size=256, ranks_per_node=4, num_nodes=64, ranks_per_domain=64,
                                                   num_domains=4, num_leaves=1)
    assert job.group_layout(4, 1) == GroupLayout(size=4, ranks_per_node=4, num_nodes=1)
    tp8 = job.group_layout(8, 1)
    assert (tp8.num_nodes, tp8.num_domains, tp8.ranks_per_domain) == (2, 1, 8)
    # dp=32 with tp=8: 8 ranks on each rack.
    dp = job.group_layout(32, 8)
    assert (dp.ranks_per_domain, dp.num_domains, dp.ranks_per_node) == (8, 4, 1)


def test_trays_that_do_not_spread_evenly_fill_racks_in_order() -> None:
    job = load_cluster("gb200-nvl72").with_num_gpus(76)  # 19 trays: 72 + 4
    assert (job.gpus_per_domain, job.num_domains) == (72, 2)
    assert job.group_layout(76, 1).ranks_per_domain == 72
    part = load_cluster("gb200-nvl72").with_num_gpus(8)  # two trays of one rack
    assert (part.num_nodes, part.num_domains, part.gpus_per_domain) == (2, 1, 8)


def test_a_dgx_server_is_its_own_domain() -> None:
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(32)
    layout = cluster.group_layout(16, 2)
    assert (layout.ranks_per_node, layout.num_nodes) == (4, 4)
    assert (layout.ranks_per_domain, layout.num_domains) == (4, 4)


def test_groups_beyond_a_scalable_unit_cross_leaves() -> None:
    pod = load_cluster("dgx-h100-superpod").with_num_gpus(1024)  # 128 servers, 4 SUs of 32
    assert pod.group_layout(128, 8).num_leaves == 4  # dp over every server
    assert pod.group_layout(32, 8).num_leaves == 1  # one SU
    assert pod.group_layout(8, 1).num_leaves == 1  # inside a server


def test_a_submesh_lays_its_groups_out_from_their_ranks() -> None:
    """A pipeline stage on ranks 6-11 of two 8-GPU servers (tp 2 x dp 3): its tp groups {6,7} {8,9} {10,11} stay
    inside a server; its dp groups {6,8,10} and {7,9,11} span both, at 1 rank on the narrower; a tp group of ranks
    5-6 (a block starting at 5) crosses."""
    stage = load_cluster("dgx-h100-80gb").with_num_gpus(16).model_copy(update={"submesh": (6, 6)})
    assert stage.group_layout(2, 1) == GroupLayout(2, 2, 1, 2, 1, 1)
    assert stage.group_layout(3, 2) == GroupLayout(3, 1, 2, 1, 2, 1)
    assert stage.group_layout(6, 1) == GroupLayout(6, 2, 2, 2, 2, 1)
    shifted = stage.model_copy(update={"submesh": (5, 6)})
    assert shifted.group_layout(2, 1) == GroupLayout(2, 1, 2, 1, 2, 1)
    aligned = stage.model_copy(update={"submesh": (8, 8)})  # a whole server: as the cluster's own formula
    whole = load_cluster("dgx-h100-80gb").with_num_gpus(8)
    for size, stride in ((2, 1), (4, 2), (8, 1)):
        assert aligned.group_layout(size, stride) == whole.group_layout(size, stride)


def test_a_submesh_past_the_cluster_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"submesh \(12, 8\) must be .* inside the cluster's 16 GPUs"):
        cluster_from_mapping({**BASE, "num_nodes": 2, "submesh": (12, 8)})


@pytest.mark.parametrize("num_gpus", [6, 74, 258])
def test_nvl72_refuses_partial_trays(num_gpus: int) -> None:
    message = r"^num_gpus=\d+ is invalid: must be at most or a multiple of gpus_per_node=4"
    with pytest.raises(ConfigError, match=message):
        load_cluster("gb200-nvl72").with_num_gpus(num_gpus)


BASE = {"name": "c", "device": "h100-sxm5-80gb", "gpus_per_node": 8, "intra_node": "nvlink4-nvswitch",
        "inter_node": "ib-ndr-400", "nics_per_node": 8}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("nvlink_domain_gpus", 12, "nvlink_domain_gpus=12 must be a multiple of gpus_per_node=8"),
    ("nvlink_domain_gpus", 0, "nvlink_domain_gpus=0 is invalid: Input should be greater than 0"),
    ("nodes_per_leaf", -1, "nodes_per_leaf=-1 is invalid: Input should be greater than 0"),
    ("leaf_oversubscription", 0.5, "leaf_oversubscription=0.5 is invalid: Input should be greater than or equal to 1"),
    ("leaf_oversubscription", float("inf"), "leaf_oversubscription=inf is invalid: Input should be a finite number"),
])
def test_bad_cluster_fields_are_one_line_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        cluster_from_mapping({**BASE, field: value})
    text = str(error.value)
    assert "\n" not in text and message in text


@pytest.mark.parametrize("zero", [0, 3])
def test_a_256_gpu_job_on_nvl72_racks_is_predicted_by_both_engines(zero: int) -> None:
    from trainsim.catalog import load_model
    from trainsim.job import make_job
    from trainsim.pipeline import predict
    from trainsim.strategy.parallel import ParallelSpec

    cluster = load_cluster("gb200-nvl72").with_num_gpus(256)
    par = ParallelSpec(tp=4, pp=2, zero=zero, micro_batch=1, global_batch=256, seq_len=2048)
    job = make_job(load_model("llama3.1-8b"), cluster, par)
    assert job.parallel.dp == 32
    analytical = predict(job, "analytical")
    sim = predict(job, "sim")
    assert analytical.iteration_time_s > 0
    # The engines agree on this job (the overlap slow-down and bandwidth sharing are fitted near off).
    assert sim.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.05)
