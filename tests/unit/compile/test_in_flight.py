"""The in-flight micro-batch limit (Proteus' max_ongoing_micro_batch) in the step order and the simulation."""

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.in_flight import limit_in_flight
from trainsim.compile.schedules import gpipe, one_f_one_b
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.sim.engine import simulate
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

TINY = parse_model({"name": "tiny-gpt", "num_layers": 2, "hidden": 512, "ffn_hidden": 2048, "num_heads": 8,
                    "vocab": 8000, "max_seq_len": 512})


def test_gpipe_with_two_in_flight_interleaves_backwards() -> None:
    order = limit_in_flight(gpipe(1, 1, 4)[0], 2)
    assert [(s.phase, s.micro_batch) for s in order] == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                                         ("F", 3), ("B", 2), ("B", 3)]


def test_a_limit_at_or_above_the_schedules_keeps_its_order() -> None:
    for stage_order in one_f_one_b(4, 1, 8):
        assert limit_in_flight(stage_order, 4) == stage_order
    assert limit_in_flight(gpipe(1, 1, 4)[0], 0) == gpipe(1, 1, 4)[0]


def test_negative_limit_is_refused() -> None:
    with pytest.raises(ConfigError):
        limit_in_flight(gpipe(1, 1, 2)[0], -1)


def test_max_in_flight_two_moves_the_first_backward_to_the_end_of_the_second_forward() -> None:
    """GPipe, 4 micro-batches on one stage: B0 starts after F3 ends; with at most 2 in flight, after F1 ends."""
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 4, "schedule": "gpipe"})
    job = make_job(TINY, a100_cluster(1), par)
    tree = StrategyTree.from_parallel(graph_for(job), job.parallel)
    starts = {}
    for limit in (None, 2):
        t = tree if limit is None else tree.schedule("", max_in_flight=limit)
        graph = compile_job(job, t.lower(job.parallel), Pricer(Calibration()))
        out = simulate(graph)
        first = {}
        last = {}
        for task in graph.tasks:
            if task.micro_batch >= 0 and task.category == "compute":
                key = (task.phase, task.micro_batch)
                first.setdefault(key, out.start_s[task.tid])
                last[key] = out.end_s[task.tid]
        starts[limit] = (first, last)
    (plain_first, plain_last), (lim_first, lim_last) = starts[None], starts[2]
    assert plain_first[("bwd", 0)] == pytest.approx(plain_last[("fwd", 3)])
    assert lim_first[("bwd", 0)] == pytest.approx(lim_last[("fwd", 1)])
    assert lim_first[("fwd", 2)] >= lim_last[("bwd", 0)]
    assert lim_first[("bwd", 0)] < plain_first[("bwd", 0)]
