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


COMM_PLANS = (*PLANS, ("llama3.1-8b", {"tp": 2, "cp": 2, "sp": True}), ("llama3.1-8b", {"tp": 2, "zero": 1}))


@pytest.mark.parametrize(("model", "strategy"), COMM_PLANS)
def test_layer_collectives_as_axis_collective_s(model: str, strategy: dict[str, object]) -> None:
    """layer_cost's feature collectives (the groups and cluster key read once a layer) == axis_collective_s
    collective by collective, exposed fractions applied, summed per axis and forward in the comms' order."""
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    job = make_job(load_model(model), cluster, ParallelSpec(**strategy))  # type: ignore[arg-type]
    pricer, reference = Pricer(), Pricer()
    counted = 0
    for layer in graph_for(job).layers:
        cost = pricer.layer_cost(layer, job)
        fractions = {"tp": cost.tp_exposed_fraction, "cp": cost.cp_exposed_fraction}
        totals = {axis: {"fwd": 0.0, "bwd": 0.0} for axis in ("tp", "cp")}
        priced = [(c, reference.axis_collective_s(c.collective, c.buffer_bytes, c.axis, job))
                  for c in layer.comms if c.axis != "pp"]
        for c, seconds in priced:
            if c.axis in totals:
                totals[c.axis][c.phase] += seconds
        assert fractions["tp"] == reference.tp_exposed_fraction(layer, totals["tp"], job)
        assert fractions["cp"] == reference.cp_exposed_fraction(layer, totals["cp"], job)
        comm: dict[str, float] = {}
        comm_fwd = 0.0
        for c, seconds in priced:
            if c.axis in fractions:
                seconds *= fractions[c.axis][0 if c.phase == "fwd" else 1]
            comm[c.axis] = comm.get(c.axis, 0.0) + seconds
            comm_fwd += seconds if c.phase == "fwd" else 0.0
        assert (cost.comm_s, cost.comm_fwd_s) == (comm, comm_fwd)
        counted += len(priced)
    assert counted > 0


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_gradient_buckets_as_axis_collective_s(zero: int) -> None:
    """Each gradient bucket's collective (the gradient group and cluster key read once a queue) ==
    axis_collective_s over the "grad" axis bucket by bucket."""
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(16)
    job = make_job(load_model("llama3.1-8b"), cluster, ParallelSpec(tp=2, zero=zero))
    pricer, reference = Pricer(), Pricer()
    runs = ((1_000_000.0, 3), (250_000.0, 1), (7.0, 2))
    for collective in ("all-reduce", "reduce-scatter", "all-gather"):
        got = pricer._bucket_seconds(collective, 2.0, runs, job)  # pyright: ignore[reportPrivateUsage]
        assert got == [(reference.axis_collective_s(collective, params * 2.0, "grad", job), count)
                       for params, count in runs]


@pytest.mark.parametrize("dp", [1, 8])
def test_both_engines_pay_the_gradient_bucket_copies(dp: int) -> None:
    """A stack that copies its gradients into flat buckets (torch DDP's default, StackSpec.grad_bucket_copies)
    pays the copies of the stage with the most parameters in the step's overhead, in the analytical engine as in
    the simulator (which runs them before the optimizer step); nothing without data-parallel ranks to sync."""
    from trainsim.estimate.analytical import AnalyticalEstimator
    from trainsim.estimate.simulation import SimEstimator
    from trainsim.strategy.stack import make_stack

    pricer = Pricer()
    par = ParallelSpec.parse({"tp": 2, "micro_batch": 1, "global_batch": 2 * dp, "seq_len": 2048})
    overheads = []
    for stack in ({"preset": "nanotron"}, {"preset": "nanotron", "grad_bucket_copies": False}):
        job = make_job(load_model("gpt3-1.3b"), load_cluster("dgx-a100-80gb").with_num_gpus(2 * dp), par,
                       make_stack(stack))
        graph = graph_for(job)
        analytical = AnalyticalEstimator(pricer).estimate(job, graph).breakdown["overhead"]
        simulated = SimEstimator(pricer, overlap=False, sharing=False).estimate(job, graph).breakdown["overhead"]
        assert analytical == pytest.approx(simulated, rel=1e-6)
        overheads.append(analytical)
    stages = pricer.plan_partition(graph_for(job), job.parallel).stages
    copies = pricer.grad_copies_s(pricer.max_stage_params(stages), make_job(
        load_model("gpt3-1.3b"), load_cluster("dgx-a100-80gb").with_num_gpus(2 * dp), par, make_stack("nanotron")))
    assert overheads[0] - overheads[1] == pytest.approx(copies, rel=1e-9)
    assert (copies > 0.0) == (dp > 1)
