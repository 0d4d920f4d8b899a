"""A reshard's host work (compile.split_timing): the copies of its parts as memory-bound ops, and the split
executor's measured cost per collective step."""

import dataclasses
from pathlib import Path

import pytest

from conftest import PROFILE_ENV, a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.splits import plan_splits
from trainsim.cost.compute import RooflineCosts
from trainsim.cost.pricing import Pricer
from trainsim.cost.profiled import ProfiledCosts, ProfiledStepCosts
from trainsim.cost.step import FittedStepCosts
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import COPY_OP, Op
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.profile.database import ProfileDB
from trainsim.profile.reshard_overhead import reshard_signature
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

ONE_BLOCK = parse_model({"name": "one-block-gpt", "num_layers": 1, "hidden": 1024, "ffn_hidden": 4096,
                         "num_heads": 16, "vocab": 32000, "max_seq_len": 1024})
BF16 = 2  # bytes per element (the job's default precision)
GELU_BYTES = 1024 * 4096 * BF16  # the gelu output a device holds (its 1024 of the group's 2048 tokens)
OUT_BYTES = 2 * 1024 * 1024 * BF16  # fc2's partial sum of all 2048 tokens


def _fc2_reduce_split() -> tuple[Job, StrategyTree]:
    """fc2 split on its reduction dimension over 2 data-parallel devices (test_splits.py's first case)."""
    job = make_job(ONE_BLOCK, a100_cluster(2), ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, "dp": 2}))
    return job, StrategyTree.from_parallel(graph_for(job), job.parallel).split("blocks.0.mlp.fc2", "compute",
                                                                               "reduce", 2)


def _tasks(graph: ExecGraph, marker: str) -> list[tuple[str, float]]:
    return [(t.name.split(" mb")[0].split(" ", 2)[-1], t.duration_s) for t in graph.tasks if marker in t.name]


def _copy(phase: str, copy_bytes: float) -> Op:
    return Op(COPY_OP, "elementwise", "reshard", phase, "bf16", 0.0, 2.0 * copy_bytes,  # type: ignore[arg-type]
              (round(copy_bytes / BF16),))


def test_a_reshards_host_copies_are_memory_bound_tasks_of_the_bytes_the_executor_copies() -> None:
    """Into fc2, an all-to-all from tokens to features of the 8 MiB gelu output a device holds: cut along the
    features (8 MiB) and the received parts concatenated (8 MiB), after gelu; backward, after fc2's input
    gradient: cut along the tokens (a view) and concatenated (8 MiB). Into residual2, fc2's 4 MiB partial sum is
    cloned for the in-place all-reduce, after fc2; its backward copies nothing. Each a copy op priced by the
    op-cost model (here the roofline: 2 x the bytes over the memory bandwidth), before its collective."""
    job, tree = _fc2_reduce_split()
    splits = plan_splits(tree.lower(job.parallel), 2)
    copies = [(c.after, c.phase, c.copy_bytes) for split in splits.values() for c in split.copies]
    assert copies == [("gelu", "fwd", 2 * GELU_BYTES), ("fc2.dgrad", "bwd", GELU_BYTES), ("fc2", "fwd", OUT_BYTES)]
    pricer = Pricer(Calibration())
    graph = compile_job(job, tree.lower(job.parallel), pricer, "op")
    assert _tasks(graph, "reshard copy") == [
        ("gelu reshard copy", pricer.op_time_s(_copy("fwd", 2 * GELU_BYTES), job)),
        ("fc2 reshard copy", pricer.op_time_s(_copy("fwd", OUT_BYTES), job)),
        ("fc2.dgrad reshard copy", pricer.op_time_s(_copy("bwd", GELU_BYTES), job))]
    roofline = RooflineCosts(pricer.cal).op_time_s(_copy("fwd", OUT_BYTES), job.cluster.device)
    assert _tasks(graph, "fc2 reshard copy")[0][1] == roofline
    by_name = {t.name.split(" mb")[0]: t for t in graph.tasks}
    copy = next(t for name, t in by_name.items() if name.endswith("gelu reshard copy"))
    gather = next(t for name, t in by_name.items() if name.startswith("all-to-all x2 into fc2"))
    assert copy.tid in gather.deps  # the copy runs before the collective it lays out


def test_the_split_executors_measured_cost_per_reshard_step_follows_each_collective(tmp_path: Path) -> None:
    """With a profile holding the executor's cost per step (all-to-all 100 us forward, 300 us backward;
    all-reduce 50 us forward), a split-executor job gets one host task per compiled reshard step at that cost;
    a job of another stack none."""
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        for (collective, phase), seconds in {("all-to-all", "fwd"): 1e-4, ("all-to-all", "bwd"): 3e-4,
                                             ("all-reduce", "fwd"): 5e-5}.items():
            db.add_op_samples(PROFILE_ENV, reshard_signature(collective, phase), [seconds])
    cal = Calibration()
    steps = ProfiledStepCosts(ProfiledCosts(path, "cpu-local", RooflineCosts(cal)), FittedStepCosts(cal))
    pricer = Pricer(cal, step_costs=steps)
    job, tree = _fc2_reduce_split()
    split_job = dataclasses.replace(job, stack=job.stack.model_copy(update={"split_executor": True}))
    graph = compile_job(split_job, tree.lower(job.parallel), pricer, "op")
    assert _tasks(graph, "reshard host") == [("gelu reshard host", pytest.approx(1e-4)),
                                             ("fc2 reshard host", pytest.approx(5e-5)),
                                             ("fc2.dgrad reshard host", pytest.approx(3e-4))]
    assert _tasks(compile_job(job, tree.lower(job.parallel), pricer, "op"), "reshard host") == []
