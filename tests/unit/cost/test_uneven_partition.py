"""The pricing service's partitions of a pipeline split and the memory of their stages: an even split is the
partition it always was; an uneven one holds the strategy's blocks per stage and the per-chunk blocks, and
its stages' memory follows the schedule (1F1B: stage i holds p - i micro-batches)."""

import pytest

from conftest import a100_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.cost.memory import stage_memory, stage_memory_base
from trainsim.cost.pricing import Pricer
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

GPT = parse_model({"name": "gpt-16", "num_layers": 16, "hidden": 512, "ffn_hidden": 2048, "num_heads": 8,
                   "vocab": 4096, "max_seq_len": 1024})


def _blocks(stage: list) -> float:
    return sum(part.count for part in stage if part.layer.kind == "block")


def test_an_even_split_is_the_partition_per_pp() -> None:
    pricer = Pricer()
    job = make_job(GPT, a100_cluster(4), ParallelSpec(pp=4, global_batch=8, seq_len=1024))
    graph = graph_for(job)
    assert pricer.plan_split(graph, job.parallel) is None
    partition = pricer.plan_partition(graph, job.parallel)
    assert partition is pricer.partition(graph, 4)
    assert partition.chunk_blocks == ()


def test_an_uneven_split_holds_the_strategys_blocks() -> None:
    pricer = Pricer()
    par = ParallelSpec(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch=8, seq_len=1024,
                       embedding_in_split=True, loss_in_split=True)
    job = make_job(GPT, a100_cluster(2), par)
    graph = graph_for(job)
    # 16 + 2 = 18 over 4 virtual stages: 5, 5, 4, 4, less the embedding and the loss: 4, 5, 4, 3
    assert pricer.plan_split(graph, job.parallel) == (4, 5, 4, 3)
    partition = pricer.plan_partition(graph, job.parallel)
    assert partition.chunk_blocks == ((4, 4), (5, 3))
    assert [_blocks(stage) for stage in partition.stages] == [8.0, 8.0]
    assert pricer.plan_partition(graph, job.parallel) is partition


def test_the_first_stage_holds_p_micro_batches_under_1f1b() -> None:
    pricer = Pricer()
    par = ParallelSpec(pp=4, global_batch=16, seq_len=1024, first_stage_layers=2, last_stage_layers=6)
    job = make_job(GPT, a100_cluster(4), par)
    graph = graph_for(job)
    partition = pricer.plan_partition(graph, job.parallel)
    assert [_blocks(stage) for stage in partition.stages] == [2.0, 4.0, 4.0, 6.0]
    device = job.cluster.device
    # stage i holds p - i = 4, 3, 2, 1 micro-batches: 8, 12, 8, 6 block-activations (+ embedding / head)
    for index, stage in enumerate(partition.stages):
        per_micro_batch = stage_memory_base(stage, job.parallel).per_micro_batch
        held = stage_memory(stage, index, job.parallel, device)["activations"]
        assert held == pytest.approx((4 - index) * per_micro_batch, rel=1e-12)
    # the last stage's 6 blocks, head and loss buffer outweigh the first stage's 4 micro-batches of 2 blocks
    memory = pricer.memory(partition.stages, job)
    assert memory.peak_stage == 3
    assert memory.breakdown["activations"] == pytest.approx(
        stage_memory_base(partition.stages[3], job.parallel).per_micro_batch, rel=1e-12)
