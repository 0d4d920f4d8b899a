"""StackSpec.tp_dgrad_overlap: each column-parallel linear's backward tp collectives overlapped with its own GEMMs
(Megatron's LinearWithGradAccumulationAndAsyncCommunication, megatron-core 0.1.0 / 0.9.0). Exact tiny tp-2 cases,
the input gradient's all-reduce shorter and longer than the weight-gradient GEMM, exposed times by hand; the
behaviour off prices every collective exposed, as before; both engines agree."""

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_cluster
from trainsim.catalog.calibration import Calibration, RuntimeParams
from trainsim.catalog.model_files import parse_model
from trainsim.cost.pricing import Pricer
from trainsim.cost.stack_effects import column_backward_s
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import Layer
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec

GAMMA = 0.25
TINY = parse_model({"name": "tiny-gpt", "num_layers": 2, "hidden": 1024, "ffn_hidden": 4096, "num_heads": 16,
                    "vocab": 32000, "max_seq_len": 1024})
ON, OFF = StackSpec(tp_dgrad_overlap=True), StackSpec()


def _two_nodes() -> ClusterSpec:
    """Two DGX A100 nodes of one GPU each: a tp-2 group over InfiniBand, its collectives slower than the GEMMs."""
    one = load_cluster("dgx-a100-80gb")
    return ClusterSpec.parse({**one.model_dump(), "gpus_per_node": 1, "num_nodes": 2}, "cluster")


def _job(stack: StackSpec, sp: bool = False, cluster: ClusterSpec | None = None) -> Job:
    par = ParallelSpec.parse({"tp": 2, "sp": sp, "micro_batch": 1, "global_batch": 2, "seq_len": 1024})
    return make_job(TINY, cluster or a100_cluster(2), par, stack)


def _pricer() -> Pricer:
    return Pricer(Calibration(runtime=RuntimeParams(overlap_slowdown=GAMMA)))


def _raw(pricer: Pricer, layer: Layer, job: Job, phase: str, column: bool | None = None) -> float:
    """Seconds of the layer's tp collectives of `phase` (those of a column-parallel linear's input, or the rest)."""
    return sum(pricer.axis_collective_s(c.collective, c.buffer_bytes, "tp", job) for c in layer.comms
               if c.axis == "tp" and c.phase == phase and (column is None or bool(c.column_input) == column))


def _gemm_s(pricer: Pricer, layer: Layer, name: str, job: Job) -> float:
    return pricer.op_time_s(next(op for op in layer.bwd if op.name == name), job)


def test_column_backward_formula_exact() -> None:
    assert column_backward_s(3.0, 5.0, 0.0, 4.0, 0.0) == 0.0  # the all-reduce hides behind the wgrad GEMM
    assert column_backward_s(3.0, 5.0, 0.0, 4.0, 0.5) == 1.5  # ... both slowed by 1.5 for its 3 s
    assert column_backward_s(7.0, 5.0, 0.0, 4.0, 0.0) == 2.0  # 2 s of it outlast the GEMM
    assert column_backward_s(7.0, 5.0, 6.0, 4.0, 0.5) == 2.0 + 2.5 + 2.0 + 2.0  # sp: the re-gather beside dgrad


def test_comms_name_the_column_linear_whose_input_they_reshard() -> None:
    block = graph_for(_job(ON)).layers[1]
    assert [(c.name, c.phase, c.column_input) for c in block.comms] == [
        ("attn.ar", "fwd", ""), ("mlp.ar", "fwd", ""), ("attn.ar", "bwd", "qkv"), ("mlp.ar", "bwd", "fc1")]
    block = graph_for(_job(ON, sp=True)).layers[1]
    tagged = [(c.name, c.phase, c.column_input) for c in block.comms if c.column_input]
    assert tagged == [("attn.ag", "fwd", "qkv"), ("mlp.ag", "fwd", "fc1"), ("attn.rs", "bwd", "qkv"),
                      ("mlp.rs", "bwd", "fc1")]
    head = graph_for(_job(ON)).layers[-1]
    assert [c.column_input for c in head.comms if c.phase == "bwd"] == ["logits"]


def test_dgrad_all_reduce_shorter_than_the_wgrad_gemm_is_hidden() -> None:
    pricer, job = _pricer(), _job(ON)
    for layer in graph_for(job).layers[1:]:  # the blocks and the head (the embedding's lookup is not a column)
        columns = {c.column_input for c in layer.comms if c.column_input}
        hidden = 0.0
        for column in columns:
            comm = sum(pricer.axis_collective_s(c.collective, c.buffer_bytes, "tp", job) for c in layer.comms
                       if c.column_input == column)
            wgrad = _gemm_s(pricer, layer, column + ".wgrad", job)
            assert 0.0 < comm < wgrad
            hidden += GAMMA * comm  # all of it under the GEMM, both slowed by gamma
        cost = pricer.layer_cost(layer, job)
        assert cost.tp_exposed_fraction[0] == 1.0
        assert cost.comm_s["tp"] == pytest.approx(_raw(pricer, layer, job, "fwd") + hidden, rel=1e-12)
        assert cost.tp_exposed_fraction[1] * _raw(pricer, layer, job, "bwd") == pytest.approx(hidden, rel=1e-12)


def test_dgrad_all_reduce_longer_than_the_wgrad_gemm_shows_the_excess() -> None:
    pricer, job = _pricer(), _job(ON, cluster=_two_nodes())
    block = graph_for(job).layers[1]
    exposed = 0.0
    for column in ("qkv", "fc1"):
        comm = sum(pricer.axis_collective_s(c.collective, c.buffer_bytes, "tp", job) for c in block.comms
                   if c.column_input == column)
        wgrad = _gemm_s(pricer, block, column + ".wgrad", job)
        assert comm > wgrad > 0.0
        exposed += (comm - wgrad) + GAMMA * wgrad
    cost = pricer.layer_cost(block, job)
    assert cost.comm_s["tp"] == pytest.approx(_raw(pricer, block, job, "fwd") + exposed, rel=1e-12)


def test_under_sp_the_reduce_scatter_hides_behind_wgrad_and_the_regather_behind_dgrad() -> None:
    pricer, job = _pricer(), _job(ON, sp=True)
    block = graph_for(job).layers[1]
    exposed = _raw(pricer, block, job, "bwd", column=False)  # the row-parallel output's gradient all-gathers
    for column in ("qkv", "fc1"):
        scatter, gather = (sum(pricer.axis_collective_s(c.collective, c.buffer_bytes, "tp", job)
                               for c in block.comms if c.column_input == column and c.phase == phase)
                           for phase in ("bwd", "fwd"))
        wgrad, dgrad = (_gemm_s(pricer, block, f"{column}.{kind}", job) for kind in ("wgrad", "dgrad"))
        assert 0.0 < scatter < wgrad and 0.0 < gather < dgrad
        exposed += GAMMA * scatter + GAMMA * gather
    cost = pricer.layer_cost(block, job)
    assert cost.comm_s["tp"] == pytest.approx(_raw(pricer, block, job, "fwd") + exposed, rel=1e-12)


def test_off_prices_every_tp_collective_exposed_as_before() -> None:
    pricer = _pricer()
    for sp in (False, True):
        job = _job(OFF, sp=sp)
        for layer in graph_for(job).layers:
            cost = pricer.layer_cost(layer, job)
            assert cost.tp_exposed_fraction == (1.0, 1.0)
            raw = _raw(pricer, layer, job, "fwd") + _raw(pricer, layer, job, "bwd")
            assert cost.comm_s.get("tp", 0.0) == pytest.approx(raw, rel=1e-15)


def test_userbuffers_under_sp_take_precedence_and_tp_1_has_nothing_to_overlap() -> None:
    pricer = _pricer()
    both = StackSpec(tp_comm_overlap=True, tp_dgrad_overlap=True)
    block_job = _job(both, sp=True)
    block = graph_for(block_job).layers[1]
    assert pricer.layer_cost(block, block_job) == pricer.layer_cost(block, _job(StackSpec(tp_comm_overlap=True),
                                                                                   sp=True))
    plain = _job(both)  # without sp no userbuffers: the async all-reduce
    assert pricer.layer_cost(graph_for(plain).layers[1], plain) == \
        pricer.layer_cost(graph_for(plain).layers[1], _job(ON))
    single = make_job(TINY, a100_cluster(1), ParallelSpec.parse({"micro_batch": 1, "global_batch": 1,
                                                                   "seq_len": 1024}), ON)
    assert not pricer.overlaps_dgrad(single)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("two_nodes", [False, True])
def test_both_engines_save_the_same_time(sp: bool, two_nodes: bool) -> None:
    """On vs off: the analytical engine's iteration time drops by micro-batches x the layers' hidden seconds; the
    simulator (overlap slow-down and link sharing off, as tests/validation/test_sim_vs_analytical.py) within 2%."""
    pricer = _pricer()
    cluster = _two_nodes() if two_nodes else None
    on, off = _job(ON, sp, cluster), _job(OFF, sp, cluster)
    hidden = 0.0
    for layer in graph_for(on).layers:
        hidden += layer.count * (pricer.layer_cost(layer, off).comm_s.get("tp", 0.0)
                                 - pricer.layer_cost(layer, on).comm_s.get("tp", 0.0))
    assert hidden != 0.0
    analytical = AnalyticalEstimator(pricer)
    sim = SimEstimator(pricer, overlap=False, sharing=False)
    times = {}
    for name, job in (("on", on), ("off", off)):
        times[name] = (analytical.estimate(job, graph_for(job)).iteration_time_s,
                       sim.estimate(job, graph_for(job)).iteration_time_s)
        assert times[name][1] == pytest.approx(times[name][0], rel=0.02)
    micro_batches = on.parallel.num_micro_batches
    assert times["off"][0] - times["on"][0] == pytest.approx(micro_batches * hidden, rel=1e-9)
    assert times["off"][1] - times["on"][1] == pytest.approx(micro_batches * hidden, rel=0.02)
