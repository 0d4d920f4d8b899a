"""The host cost of the reshards a strategy tree adds beyond Megatron's collectives (ir.graph.Comm.reshard,
Pricer.reshard_host_s): which collectives are marked, and the measured cost per call added once per call in each
phase, by both engines alike. No torch: the database is filled by hand."""

from pathlib import Path

import pytest

from conftest import PROFILE_ENV, TINY_GPT
from trainsim.catalog import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.compile.shape_layers import shape_layers
from trainsim.estimate.engines import make_engine
from trainsim.ir.graph import Comm, OpGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.profile.database import ProfileDB
from trainsim.profile.ops import overhead_signature
from trainsim.profile.reshard_overhead import PHASES, RESHARD_COLLECTIVES, reshard_signature
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.megatron import mark_reshards
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree_yaml import load_tree_yaml

MEGATRON_SPLITS = (("embedding.tokens", "reduce"), ("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "out"),
                   ("blocks.*.attn.out", "reduce"), ("blocks.*.mlp.fc1", "out"), ("blocks.*.mlp.act", "out"),
                   ("blocks.*.mlp.fc2", "reduce"), ("head.proj", "out"), ("head.loss", "out"))
# host seconds per call: all-gather forward 70 us, backward 110 us; the others distinct, never asked for here
PER_CALL_S = {("all-gather", "fwd"): 7e-5, ("all-gather", "bwd"): 1.1e-4}


def _comm(name: str, collective: str, phase: str) -> Comm:
    return Comm(name, collective, "tp", phase, 1024.0)  # type: ignore[arg-type]


def test_collectives_beyond_megatrons_are_marked_and_a_replacement_at_the_same_site_is_not() -> None:
    """Megatron's block: attn.ar forward and backward. A norm1 by features adds its two statistics and the
    attention's gather forward, a statistic backward, and turns the backward attn.ar into attn.rs (the same
    module running another collective): 4 reshards."""
    megatron = [_comm("attn.ar", "all-reduce", "fwd"), _comm("attn.ar", "all-reduce", "bwd")]
    tree = [_comm("norm1.sum", "all-reduce", "fwd"), _comm("norm1.sum_sq", "all-reduce", "fwd"),
            _comm("attn.ag", "all-gather", "fwd"), _comm("attn.ar", "all-reduce", "fwd"),
            _comm("attn.rs", "reduce-scatter", "bwd"), _comm("norm1.sum_dy", "all-reduce", "bwd")]
    marked = mark_reshards(tree, megatron)
    assert [c.name for c in marked if c.reshard] == ["norm1.sum", "norm1.sum_sq", "attn.ag", "norm1.sum_dy"]
    assert not any(c.reshard for c in mark_reshards(megatron, megatron))


def _job(cluster: str = "local-cpu") -> Job:
    return make_job(parse_model(TINY_GPT), load_cluster(cluster).with_num_gpus(2),
                    ParallelSpec(micro_batch=2, seq_len=16, precision="fp32", tp=2, global_batch=4))


def _plan(job: Job, graph: OpGraph, tmp_path: Path, extra: tuple[tuple[str, str], ...] = ()) -> LoweredPlan:
    """Megatron's splits of every op of `graph` as a tree, plus `extra` (path, dim) over tp."""
    lines = "".join(f'    - {{path: "{path}", item: compute, dim: {dim}, parts: 2, axis: tp}}\n'
                    for path, dim in MEGATRON_SPLITS + extra)
    path = tmp_path / "tree.yaml"
    path.write_text(f"strategy_tree:\n  map:\n    - {{tp: 2}}\n  split:\n{lines}")
    return load_tree_yaml(path, graph).lower(job.parallel)


def _db(path: Path, with_reshards: bool) -> Path:
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, overhead_signature(), [1e-6])  # a measured environment either way
        if with_reshards:
            for i, (collective, phase) in enumerate((c, p) for c in RESHARD_COLLECTIVES for p in PHASES):
                db.add_op_samples(PROFILE_ENV, reshard_signature(collective, phase),
                                  [PER_CALL_S.get((collective, phase), 1e-3 * (i + 1))])
    return path


@pytest.mark.parametrize("engine", ["analytical", "sim"])
def test_one_reshard_adds_its_host_cost_once_per_call_in_each_phase(tmp_path: Path, engine: str) -> None:
    """The final norm by tokens: its slice of the last block's output is handed to the vocabulary projection,
    which gathers it (forward: one all-gather) and the slice's backward gathers its gradient (one all-gather);
    the projection's reduce-scatter in place of Megatron's all-reduce is no reshard. Each of the 2 micro-batches
    pays 70 + 110 us more, in both engines; Megatron's tree pays nothing."""
    job = _job()
    graph = graph_for(job)
    bare, measured = _db(tmp_path / "bare.db", False), _db(tmp_path / "measured.db", True)
    split = _plan(job, graph, tmp_path, (("head.norm", "seq"),))
    shaped = [(c.collective, c.phase) for a in shape_layers(job, split).layers for c in a.layer.comms if c.reshard]
    assert shaped == [("all-gather", "fwd"), ("all-gather", "bwd")]

    def predict(db: Path, plan: LoweredPlan) -> float:
        return make_engine(engine, "profiled", db).estimate(job, graph, plan).iteration_time_s

    added = predict(measured, split) - predict(bare, split)
    assert added == pytest.approx(2 * (7e-5 + 1.1e-4), rel=1e-9)
    megatron = _plan(job, graph, tmp_path)
    assert predict(measured, megatron) == pytest.approx(predict(bare, megatron), rel=1e-12)


def test_a_device_without_the_measurement_pays_nothing(tmp_path: Path) -> None:
    """A GPU cluster's own profile lacks this CPU's rows, and the fitted costs price nothing for it: 0."""
    job = _job("dgx-h100-80gb")
    graph = graph_for(job)
    split = _plan(job, graph, tmp_path, (("head.norm", "seq"),))
    measured = _db(tmp_path / "measured.db", True)
    with_rows = make_engine("sim", "profiled", measured).estimate(job, graph, split).iteration_time_s
    without = make_engine("sim", "profiled", _db(tmp_path / "bare.db", False)).estimate(job, graph, split)
    assert with_rows == pytest.approx(without.iteration_time_s, rel=1e-12)
    fitted = make_engine("sim", "roofline")
    megatron = fitted.estimate(job, graph, _plan(job, graph, tmp_path)).breakdown["overhead"]
    assert fitted.estimate(job, graph, split).breakdown["overhead"] == pytest.approx(megatron, rel=1e-12)
