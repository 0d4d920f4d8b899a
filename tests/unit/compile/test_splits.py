"""Computation configs applied by the compiler (compile.splits): scaled op costs and the inserted resharding."""

import dataclasses

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.compile.build import compile_job
from trainsim.compile.splits import scaled_op
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, Task
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig
from trainsim.strategy.tree import StrategyTree

ONE_BLOCK = parse_model({"name": "one-block-gpt", "num_layers": 1, "hidden": 1024, "ffn_hidden": 4096,
                         "num_heads": 16, "vocab": 32000, "max_seq_len": 1024})
BF16 = 2  # bytes per element (the job's default precision)


def _job(dp: int = 2) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, "dp": dp})
    return make_job(ONE_BLOCK, a100_cluster(dp), par)


def _compile(job: Job, tree: StrategyTree, level: str = "op") -> tuple[ExecGraph, Pricer]:
    pricer = Pricer(Calibration())
    return compile_job(job, tree.lower(job.parallel), pricer, level), pricer  # type: ignore[arg-type]


def _feature(graph: ExecGraph) -> list[Task]:
    return [t for t in graph.tasks if t.category == "comm" and t.stream == "feature"]


def test_reduction_split_of_one_matmul_on_two_devices_inserts_an_all_reduce_priced_by_the_pricer() -> None:
    """fc2 (1024 tokens x 4096 -> 1024) split on its reduction dimension over the 2 data-parallel devices: each
    needs half the features of all 2 x 1024 tokens (an all-to-all of the 8 MiB gelu output it holds), writes a
    partial sum of the 2 x 1024 x 1024 output, and the residual add reads whole sums: an all-reduce of 4 MiB over
    2 ranks. Backward: the output gradient is read replicated (nothing to do) and fc2's input gradient is
    feature-split, the all-to-all back."""
    job = _job()
    tree = StrategyTree.from_parallel(graph_for(job), job.parallel).split("blocks.0.mlp.fc2", "compute", "reduce", 2)
    graph, pricer = _compile(job, tree)
    layout = job.cluster.group_layout(2, 1)
    gelu_bytes, out_bytes = 1024 * 4096 * BF16, 2 * 1024 * 1024 * BF16
    fwd = [(t.name.split(" mb")[0], t.duration_s) for t in _feature(graph) if "grad" not in t.name]
    assert fwd == [
        ("all-to-all x2 into fc2", pricer.collective_s("all-to-all", gelu_bytes, layout, job)),
        ("all-reduce x2 into residual2", pricer.collective_s("all-reduce", out_bytes, layout, job))]
    bwd = [t.name.split(" mb")[0] for t in _feature(graph) if "grad" in t.name]
    assert bwd == ["all-to-all x2 grad of fc2 input"]
    # the all-reduce follows fc2's compute (and the clone of its partial sum: test_split_timing.py) and precedes
    # residual2's in the chain
    by_tid = {t.tid: t for t in graph.tasks}
    reduce_task = next(t for t in _feature(graph) if t.name.startswith("all-reduce"))
    copy = by_tid[reduce_task.deps[0]]
    assert copy.name.endswith("fc2 reshard copy") and by_tid[copy.deps[0]].name.endswith("fc2")
    assert any(reduce_task.tid in t.deps and t.name.endswith("residual2") for t in graph.tasks)


def test_reduction_split_halves_fc2_and_the_weight_gradient_synced() -> None:
    job = _job()
    plain_tree = StrategyTree.from_parallel(graph_for(job), job.parallel)
    split_tree = plain_tree.split("blocks.0.mlp.fc2", "compute", "reduce", 2)
    (plain, pricer), (split, _) = _compile(job, plain_tree), _compile(job, split_tree)
    fc2 = next(op for layer in graph_for(job).layers for op in layer.fwd if op.name == "fc2")
    time = {g: next(t.duration_s for t in graph.tasks if t.name.endswith("L1.block fc2"))
            for g, graph in (("plain", plain), ("split", split))}
    # each device multiplies all 2048 tokens by half the weight: the same FLOPs, reshaped
    assert time["split"] == pytest.approx(pricer.op_time_s(fc2, job), rel=0.25)
    dp_plain = sum(t.duration_s for t in plain.tasks if t.category == "dp_comm")
    dp_split = sum(t.duration_s for t in split.tasks if t.category == "dp_comm")
    assert dp_split < dp_plain  # half of fc2's 4M-parameter gradient is no longer synced


def test_megatron_mlp_as_splits_all_gathers_before_and_all_reduces_after() -> None:
    """Column split of fc1 and row split of fc2 (Megatron-LM's MLP) carved from the data-parallel pair: gather
    the batch for fc1, add fc2's partial sums for the residual (fwd); reduce-scatter fc1's input gradient (bwd)."""
    job = _job()
    tree = (StrategyTree.from_parallel(graph_for(job), job.parallel)
            .split("blocks.0.mlp.fc1", "compute", "out", 2).split("blocks.0.mlp.fc2", "compute", "reduce", 2))
    graph, _ = _compile(job, tree)
    assert [t.name.split(" mb")[0] for t in _feature(graph)] == [
        "all-gather x2 into fc1", "all-reduce x2 into residual2", "reduce-scatter x2 grad of fc1 input"]


def test_no_compute_split_compiles_to_the_plain_graph() -> None:
    job = _job()
    pricer = Pricer(Calibration())
    plain = compile_job(job, default_plan(graph_for(job), job.parallel), pricer)
    tree = compile_job(job, StrategyTree.from_parallel(graph_for(job), job.parallel).lower(job.parallel), pricer)
    assert [(t.name, t.duration_s, t.deps) for t in plain.tasks] == [(t.name, t.duration_s, t.deps)
                                                                     for t in tree.tasks]


def test_layer_level_prices_the_same_collectives_merged() -> None:
    job = _job()
    tree = StrategyTree.from_parallel(graph_for(job), job.parallel).split("blocks.0.mlp.fc2", "compute", "reduce", 2)
    op_graph, _ = _compile(job, tree, "op")
    layer_graph, _ = _compile(job, tree, "layer")
    assert sum(t.duration_s for t in _feature(layer_graph)) == pytest.approx(
        sum(t.duration_s for t in _feature(op_graph)))


@pytest.mark.parametrize(("path", "dim", "parts", "field"), [
    ("blocks.0.mlp.act", "reduce", 2, "reduce"),
    ("blocks.0.mlp.fc2", "out", 3, "split.compute"),
    ("blocks.0.mlp.fc2", "hidden", 2, "split.compute.hidden"),
])
def test_bad_computation_configs_are_refused(path: str, dim: str, parts: int, field: str) -> None:
    job = _job()
    tree = StrategyTree.from_parallel(graph_for(job), job.parallel).split(path, "compute", dim, parts)
    with pytest.raises(ConfigError) as exc:
        _compile(job, tree)
    assert field in exc.value.field


def test_a_weight_stored_finer_than_computed_is_gathered_and_its_gradient_reduce_scattered() -> None:
    """fc1's 4096 x 1024 bf16 weight (8 MiB) stored split 2 ways along its outputs, computed whole (data
    parallel): an all-gather of 8 MiB before the forward and before the input gradient, a reduce-scatter of the
    gradient after the weight gradient; fc1 leaves the data-parallel sync and half its weight the model states."""
    job = _job()
    plain_tree = StrategyTree.from_parallel(graph_for(job), job.parallel)
    tree = plain_tree.split("blocks.0.mlp.fc1", "weight", "out", 2)
    graph, pricer = _compile(job, tree)
    plain, _ = _compile(job, plain_tree)
    layout = job.cluster.group_layout(2, 1)
    weight_bytes = 4096 * 1024 * BF16
    comms = [(t.name.split(" mb")[0], t.duration_s) for t in _feature(graph)]
    gather_s = pricer.collective_s("all-gather", weight_bytes, layout, job)
    assert comms == [("all-gather x2 weight of fc1", gather_s), ("all-gather x2 weight of fc1", gather_s),
                     ("reduce-scatter x2 weight grad of fc1",
                      pricer.collective_s("reduce-scatter", weight_bytes, layout, job))]
    by_tid = {t.tid: t for t in graph.tasks}
    gathers = [t for t in _feature(graph) if t.name.startswith("all-gather")]
    assert by_tid[gathers[0].deps[0]].name.endswith("norm2")  # before fc1's forward
    assert by_tid[gathers[1].deps[0]].name.endswith("gelu.bwd")  # before fc1's input gradient
    wgrad = next(t for t in graph.tasks if t.name.endswith("fc1.wgrad"))
    scatter = next(t for t in _feature(graph) if t.name.startswith("reduce-scatter"))
    assert scatter.deps[0] == wgrad.tid
    assert sum(graph.devices[0].static_breakdown.values()) < sum(plain.devices[0].static_breakdown.values())
    dp_plain = sum(t.duration_s for t in plain.tasks if t.category == "dp_comm")
    dp_split = sum(t.duration_s for t in graph.tasks if t.category == "dp_comm")
    assert dp_split < dp_plain


def test_a_weight_memory_config_coarser_than_the_computation_is_refused() -> None:
    job = _job()
    tree = (StrategyTree.from_parallel(graph_for(job), job.parallel)
            .split("blocks.0.mlp.fc1", "compute", "out", 2).split("blocks.0.mlp.fc1", "weight", "out", 1))
    with pytest.raises(ConfigError) as exc:
        _compile(job, tree)
    assert "split.weight" in exc.value.field


def test_an_uneven_split_prices_the_busiest_devices_part() -> None:
    """fc1's 4096 outputs over 3 data-parallel devices: parts of 1366, 1365 and 1365 (as torch.chunk cuts them).
    The device simulated is the busiest, whose 1366 columns the next collective waits for: its forward GEMM is
    3 x 1024 tokens by 1366 by 1024 and does 1366 x 3 / 4096 of the even share's FLOPs, and so do its input- and
    weight-gradient GEMMs; a split that divides evenly keeps the graph's op (test above)."""
    job = _job(dp=3)
    graph = graph_for(job)
    fc1 = next(op for layer in graph.layers for op in layer.fwd if op.name == "fc1")
    scaled = scaled_op(fc1, OpConfig(batch=1, seq=1, out=3, reduce=1), 3)
    assert scaled.shape == (3, 1024, 1366, 1024)
    assert scaled.flops == fc1.flops * 1366 * 3 / 4096
    tree = StrategyTree.from_parallel(graph, job.parallel).split("blocks.0.mlp.fc1", "compute", "out", 3)
    compiled, pricer = _compile(job, tree)
    times = {t.name.split(" ")[-1]: t.duration_s for t in compiled.tasks if t.micro_batch == 0 and t.stream ==
             "compute" and "fc1" in t.name and "reshard" not in t.name}  # (its reshards' copies: test_split_timing)
    backward = {b.name: b for layer in graph.layers for b in layer.bwd if b.name.startswith("fc1.")}
    config = OpConfig(batch=1, seq=1, out=3, reduce=1)
    assert times == {"fc1": pricer.op_time_s(scaled, job),
                     **{name: pricer.op_time_s(scaled_op(op, config, 3), job) for name, op in backward.items()}}
    assert times["fc1"] > pricer.op_time_s(dataclasses.replace(scaled, flops=fc1.flops), job)


def test_an_output_channel_split_of_a_convolution_sheds_half_its_whole_weight() -> None:
    """ResNet-50's layer4.0.conv1 (1x1, 1024 -> 512 channels) split 2 ways by output channels on 2 devices: each
    holds and syncs 512 x 1024 / 2 = 262,144 of its 524,288 weights (Cout x Cin x kh x kw; FLOPs / (2 x output
    elements) alone is the 1,024 multiply-adds of one output element). conv2 (3x3, 512 -> 512) reads the channel
    split and splits its reduction (propagation): half of its 512 x 512 x 9 weights too."""
    from trainsim.catalog.loader import load_model
    from trainsim.compile.splits import plan_splits
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.strategy.device_slice import DeviceSlice

    par = ParallelSpec.parse({"micro_batch": 4, "seq_len": 1, "dp": 2, "global_batch": 8})
    job = make_job(load_model("resnet50"), a100_cluster(2), par)
    graph = build_graph(job.model, DeviceSlice.of(par))
    plan = StrategyTree.from_parallel(graph, par).split("layer4.0.conv1", "compute", "out", 2).lower(par)
    index, layer = next((a.index, a.layer) for a in plan.layers if a.layer.name == "layer4.0")
    split = plan_splits(plan, 2)[index]
    shed = 512 * 1024 // 2 + 512 * 512 * 9 // 2
    assert split.held_params == layer.param_count - shed
    assert split.grad_params == layer.param_count - shed


def test_the_optimizer_steps_the_weights_a_device_holds() -> None:
    """fc2 split on its reduction dimension over 2 devices: each holds half of its 4096 x 1024 weight, and the
    optimizer step is priced over the parameters held, 2,097,152 fewer than the plain job's."""
    job = _job()
    plain_tree = StrategyTree.from_parallel(graph_for(job), job.parallel)
    (plain, pricer), (split, _) = (_compile(job, plain_tree),
                                   _compile(job, plain_tree.split("blocks.0.mlp.fc2", "compute", "reduce", 2)))
    params = sum(layer.count * layer.param_count for layer in graph_for(job).layers)
    step = {name: next(t.duration_s for t in graph.tasks if t.name == "optimizer step")
            for name, graph in (("plain", plain), ("split", split))}
    assert step["plain"] == pricer.optimizer_step_of_params_s(params, job)
    assert step["split"] == pricer.optimizer_step_of_params_s(params - 4096 * 1024 // 2, job)
    assert step["split"] < step["plain"]


def _one_bucket(job: Job) -> Job:
    return dataclasses.replace(job, stack=job.stack.model_copy(update={"grad_bucket_params": 1e12}))


def _dp_syncs(graph: ExecGraph) -> list[tuple[str, float]]:
    return [(t.name.split(" bucket")[0], t.duration_s) for t in graph.tasks if t.category == "dp_comm"]


def test_a_weight_part_that_one_device_holds_leaves_the_gradient_all_reduce() -> None:
    """fc2 (4096 -> 1024) split on its reduction dimension over both data-parallel devices: each holds its own
    half of the weight, which no other device holds, so its gradient is summed nowhere (torch DDP and the split
    executor leave it out); the one bucket's all-reduce over 2 ranks carries the model's other parameters."""
    job = _one_bucket(_job())
    tree = StrategyTree.from_parallel(graph_for(job), job.parallel).split("blocks.0.mlp.fc2", "compute", "reduce", 2)
    graph, pricer = _compile(job, tree)
    params = sum(layer.count * layer.param_count for layer in graph_for(job).layers)
    grad_bytes = (params - 4096 * 1024) * BF16
    assert _dp_syncs(graph) == [("dp all-reduce", pricer.collective_s("all-reduce", grad_bytes,
                                                                      job.cluster.group_layout(2, 1), job))]


def test_a_weight_part_that_two_of_four_devices_hold_is_all_reduced_over_those_two() -> None:
    """The same split in 2 parts over 4 devices: each half of fc2's weight is held by 2 devices, and its
    gradient (2,097,152 parameters) is all-reduced over those 2 in a bucket of its own; the rest over all 4."""
    job = _one_bucket(_job(dp=4))
    tree = StrategyTree.from_parallel(graph_for(job), job.parallel).split("blocks.0.mlp.fc2", "compute", "reduce", 2)
    graph, pricer = _compile(job, tree)
    params = sum(layer.count * layer.param_count for layer in graph_for(job).layers)
    half = 4096 * 1024 // 2
    assert sorted(_dp_syncs(graph)) == sorted([
        ("dp all-reduce", pricer.collective_s("all-reduce", (params - 2 * half) * BF16,
                                              job.cluster.group_layout(4, 1), job)),
        ("dp all-reduce", pricer.collective_s("all-reduce", half * BF16, job.cluster.group_layout(2, 1), job))])


def test_split_parts_are_synced_over_the_devices_holding_them() -> None:
    """ResNet-50's layer4.0.conv1 out/2 (its 524,288 weights) and conv2 (512 x 512 x 9) reading the channel
    split: on 2 devices their halves are synced nowhere (1 device each), on 4 over 2; the rest of the layer over
    the whole group. DLRM's tables split by columns over the group: none of their gradients is synced."""
    from trainsim.catalog.loader import load_model
    from trainsim.compile.splits import plan_splits
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.strategy.device_slice import DeviceSlice

    for dp in (2, 4):
        par = ParallelSpec.parse({"micro_batch": 4, "seq_len": 1, "dp": dp, "global_batch": 4 * dp})
        job = make_job(load_model("resnet50"), a100_cluster(dp), par)
        graph = build_graph(job.model, DeviceSlice.of(par))
        plan = StrategyTree.from_parallel(graph, par).split("layer4.0.conv1", "compute", "out", 2).lower(par)
        index, layer = next((a.index, a.layer) for a in plan.layers if a.layer.name == "layer4.0")
        whole = 512 * 1024 + 512 * 512 * 9
        assert plan_splits(plan, dp)[index].grad_params_by_ranks == {dp: layer.param_count - whole, dp // 2: whole / 2}


def test_dlrm_tables_split_by_columns_over_the_group_sync_no_gradient() -> None:
    """dlrm-small's S2 on 2 devices (8 tables of 20,000 x 16 split by columns in 2): each device holds half of
    every table's columns, 1,280,000 parameters that no other device holds: summed over 1 rank (no collective),
    and nothing of the tables over the group."""
    from pathlib import Path

    from trainsim.catalog.loader import load_model
    from trainsim.compile.splits import plan_splits
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree_yaml import load_tree_yaml

    small = Path(__file__).resolve().parents[3] / "data" / "strategies" / "proteus" / "small"
    par = ParallelSpec.parse({"micro_batch": 128, "seq_len": 1, "dp": 2, "global_batch": 256})
    job = make_job(load_model(str(small / "models" / "dlrm-small.yaml")), a100_cluster(2), par)
    graph = build_graph(job.model, DeviceSlice.of(par))
    plan = load_tree_yaml(small / "ranks2" / "dlrm-small-s2.yaml", graph).lower(par)
    index = next(a.index for a in plan.layers if a.layer.name == "embeddings")
    by_ranks = plan_splits(plan, 2)[index].grad_params_by_ranks
    assert by_ranks[1] == 20000 * 16 * 8 / 2
    assert by_ranks[2] == pytest.approx(0.0, abs=1e-6)
