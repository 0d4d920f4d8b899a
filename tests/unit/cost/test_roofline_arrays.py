"""cost.roofline_arrays prices many ops at once exactly as cost.compute.op_time_s prices each (==, not approx):
GEMMs, attention (flash2, flash3 on a device with and without it, math), convolutions, norms, elementwise ops
and losses, in bf16, fp8, fp32 and tf32, on an A100, an H100 and a GB200, big and tiny (below the GEMM floor),
from the catalog's transformer, CNN and DLRM graphs; and a Pricer fed them (Pricer.add_op_times) prices every
layer as one that asks the roofline op by op."""

import pytest

from trainsim.catalog.calibration import load_calibration
from trainsim.catalog.loader import load_cluster, load_model
from trainsim.cost.compute import op_time_s
from trainsim.cost.pricing import Pricer
from trainsim.cost.roofline_arrays import op_times_s
from trainsim.ir.graph import Op
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import load_stack

CLUSTERS = ("dgx-a100-80gb", "dgx-h100-80gb", "gb200-nvl72")


def _ops(model: str, cluster: str, **strategy: object) -> list[Op]:
    loaded = load_cluster(cluster)
    job = make_job(load_model(model), loaded.with_num_gpus(8 if loaded.gpus_per_node >= 8 else loaded.gpus_per_node),
                   ParallelSpec(**strategy))  # type: ignore[arg-type]
    return [op for layer in graph_for(job).layers for op in layer.fwd + layer.bwd]


def _hand_made() -> list[Op]:
    """GEMMs and attention of every dtype and kernel, big and below the floor, a 3-dimensional GEMM (no skinny
    term), a zero-FLOP GEMM (work floored at 1)."""
    ops = []
    for dtype in ("bf16", "fp16", "fp8", "fp32", "tf32"):
        for flops, shape in ((1e12, (1, 4096, 4096, 4096)), (1e3, (1, 2, 2, 2)), (5e9, (8, 1024, 64, 128)),
                             (0.0, (1, 1, 1, 1)), (2e8, (64, 64, 64))):
            ops.append(Op("g", "matmul", "m", "fwd", dtype, flops, flops / 10 + 1.0, shape))  # type: ignore[arg-type]
            for kernel in ("flash2", "flash3", "math"):
                ops.append(Op("a", "attention", "m", "fwd", dtype, flops, flops / 50 + 1.0,  # type: ignore[arg-type]
                              shape, kernel=kernel))
    ops.append(Op("c", "conv", "m", "fwd", "bf16", 3e10, 1e8, (32, 64, 56, 56)))
    ops.append(Op("n", "norm", "m", "fwd", "bf16", 1e6, 3e7, (4, 1024)))
    return ops


@pytest.mark.parametrize("half_kv_tokens", [None, 1100.0])  # None: the package fit's
@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_op_as_op_time_s(cluster: str, half_kv_tokens: float | None) -> None:
    device, cal = load_cluster(cluster).device, load_calibration()
    if half_kv_tokens is not None:  # a fused kernel's key loop priced (cost.compute.key_loop_efficiency)
        cal = cal.model_copy(update={"compute": cal.compute.model_copy(
            update={"attention_half_kv_tokens": half_kv_tokens})})
    ops = (_hand_made() + _ops("gpt3-1.3b", cluster, tp=2, sp=True) + _ops("llama3.1-8b", cluster, precision="fp8")
           + _ops("llama3.1-8b", cluster, attention="math") + _ops("mixtral-8x7b", cluster, ep=2)
           + _ops("resnet50", cluster) + _ops("dlrm-mlperf-terabyte", cluster))
    assert {op.kind for op in ops} >= {"matmul", "attention", "conv", "norm", "elementwise", "loss"}
    assert op_times_s(ops, device, cal) == [op_time_s(op, device, cal) for op in ops]


def test_no_gemm_and_no_op() -> None:
    device, cal = load_cluster("dgx-h100-80gb").device, load_calibration()
    norms = [op for op in _hand_made() if op.kind == "norm"]
    assert op_times_s(norms, device, cal) == [op_time_s(norms[0], device, cal)]
    assert op_times_s([], device, cal) == []


@pytest.mark.parametrize("stack", ("generic", "megatron-core"))
def test_a_pricer_fed_them_prices_every_layer_alike(stack: str) -> None:
    cluster = load_cluster("dgx-h100-80gb")
    job = make_job(load_model("llama3.1-8b"), cluster.with_num_gpus(8), ParallelSpec(tp=4, sp=True, precision="fp8"),
                   load_stack(stack))
    graph = graph_for(job)
    fed, plain = Pricer(), Pricer()
    for layer in graph.layers:
        ops = layer.fwd + layer.bwd
        fed.add_op_times(layer, cluster.device, tuple(op_times_s(ops, cluster.device, fed.cal)))
        assert fed.has_op_times(layer, cluster.device)
        assert fed.layer_cost(layer, job) == plain.layer_cost(layer, job)
