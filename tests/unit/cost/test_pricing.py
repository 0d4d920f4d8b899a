"""Pricer.layer_cost's forward, backward, selective-recompute and weight-gradient sums equal the sums over the
layer's ops priced one by one (Pricer.op_time_s; ==, in the ops' order), for layers priced op by op and layers
fed their roofline times (Pricer.add_op_times), bf16 and fp8 (the unfused path)."""

import pytest

from trainsim.catalog.loader import load_cluster, load_model
from trainsim.cost.pricing import Pricer
from trainsim.cost.roofline_arrays import op_times_s
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

PLANS = (("llama3.1-8b", {"tp": 2, "sp": True}), ("gpt3-1.3b", {"tp": 2}), ("mixtral-8x7b", {"ep": 2}),
         ("llama3.1-8b", {"tp": 4, "precision": "fp8"}))


@pytest.mark.parametrize(("model", "strategy"), PLANS)
@pytest.mark.parametrize("fed", [False, True])
def test_selective_and_wgrad_sums_as_the_filters(model: str, strategy: dict[str, object], fed: bool) -> None:
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(8)
    job = make_job(load_model(model), cluster, ParallelSpec(**strategy))  # type: ignore[arg-type]
    pricer, reference = Pricer(), Pricer()
    picked = {"selective": 0, "wgrad": 0}
    for layer in graph_for(job).layers:
        if fed:
            pricer.add_op_times(layer, cluster.device, tuple(op_times_s(layer.fwd + layer.bwd, cluster.device,
                                                                        pricer.cal)))
        cost = pricer.layer_cost(layer, job)
        forward = [reference.op_time_s(op, job) for op in layer.fwd]
        backward = [reference.op_time_s(op, job) for op in layer.bwd]
        selective = sum([s for op, s in zip(layer.fwd, forward, strict=True) if op.recompute_selective])
        wgrad = sum([s for op, s in zip(layer.bwd, backward, strict=True) if op.name.endswith(".wgrad")])
        assert (cost.selective_s, cost.wgrad_s) == (selective, wgrad)
        assert (cost.fwd_s, cost.bwd_s) == (sum(forward), sum(backward))
        picked["selective"] += selective > 0.0
        picked["wgrad"] += wgrad > 0.0
    if model != "mixtral-8x7b":
        assert picked["selective"] > 0
    assert picked["wgrad"] > 0  # the sums are not all empty
