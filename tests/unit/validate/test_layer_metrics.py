"""Per-layer rows of a runs file (layer_fwd_ms, layer_bwd_ms): one transformer block, one micro-batch, one GPU."""

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_model
from trainsim.cost.pricing import Pricer
from trainsim.errors import TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.job import make_job
from trainsim.pipeline import GraphCache, graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.validate.layer_metrics import layer_time_ms
from trainsim.validate.predict_runs import predict_rows
from trainsim.validate.runs import RunRow


def _job(recompute: str = "none", tp: int = 8):
    strategy = {"tp": tp, "dp": 16 // tp, "micro_batch": 1, "global_batch": 32, "seq_len": 2048,
                "recompute": recompute}
    return make_job(load_model("gpt3-1.3b"), a100_cluster(16), ParallelSpec.parse(strategy))


def test_a_layer_is_its_blocks_ops_and_exposed_collectives_for_one_micro_batch() -> None:
    job, pricer = _job(), Pricer()
    graph = graph_for(job)
    block = next(layer for layer in graph.layers if layer.kind == "block")
    cost = pricer.layer_cost(block, job)
    assert cost.comm_fwd_s > 0  # tp 8: the block's all-reduces
    forward = layer_time_ms("layer_fwd_ms", job, graph, pricer)
    assert forward == pytest.approx((cost.fwd_s + cost.comm_fwd_s) * 1e3, rel=1e-12)
    backward = layer_time_ms("layer_bwd_ms", job, graph, pricer)
    assert backward == pytest.approx((cost.bwd_s + sum(cost.comm_s.values()) - cost.comm_fwd_s) * 1e3, rel=1e-12)
    assert 1.2 < backward / forward < 2.5  # about twice the forward's work (less where the all-reduces weigh)


def test_full_recomputation_repeats_the_forward_in_the_backward() -> None:
    plain, full = _job(), _job(recompute="full")
    pricer = Pricer()
    forward = layer_time_ms("layer_fwd_ms", full, graph_for(full), pricer)
    assert forward == pytest.approx(layer_time_ms("layer_fwd_ms", plain, graph_for(plain), pricer), rel=1e-12)
    assert layer_time_ms("layer_bwd_ms", full, graph_for(full), pricer) == pytest.approx(
        layer_time_ms("layer_bwd_ms", plain, graph_for(plain), pricer) + forward, rel=1e-12)


def test_layer_rows_are_predicted_and_a_model_without_a_block_is_a_skip_reason() -> None:
    job = _job(tp=2)
    rows = [RunRow("r1", "somewhere", metric, 5.0, {}, job) for metric in ("layer_fwd_ms", "layer_bwd_ms")]
    predictions = predict_rows(rows, AnalyticalEstimator(), graphs=GraphCache())
    assert all(p.predicted is not None and p.predicted > 0 and p.skipped is None for p in predictions)
    cnn = make_job(load_model("resnet50"), a100_cluster(8), ParallelSpec.parse({"dp": 8, "global_batch": 64}))
    with pytest.raises(TrainsimError, match="no transformer block"):
        layer_time_ms("layer_fwd_ms", cnn, graph_for(cnn), Pricer())
