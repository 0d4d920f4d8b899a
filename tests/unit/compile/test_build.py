"""The execution-graph compiler and the simulation engine ("sim"): exact tiny jobs, graph structure, memory,
ZeRO, data-parallel buckets, scale, and the Result they produce."""

import dataclasses
from collections import Counter

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.comm import nccl_tuning as nccl
from trainsim.comm.collectives import collective_time_s
from trainsim.compile.build import compile_job
from trainsim.compile.context import SpecBlock, StageWriter, TaskLevel
from trainsim.cost.pricing import Pricer, axis_layout
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import make_engine
from trainsim.estimate.result import Result, Timeline
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.exec_graph import ExecGraph, Task
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec
from trainsim.strategy.stages import partition_stages

TINY = parse_model({"name": "tiny-gpt", "num_layers": 4, "hidden": 1024, "ffn_hidden": 4096, "num_heads": 16,
                    "vocab": 32000, "max_seq_len": 1024})


def _job(num_gpus: int, *, stack: StackSpec | None = None, **strategy: object) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, **strategy})
    return make_job(TINY, a100_cluster(num_gpus), par, stack)


def _sim(cal: Calibration | None = None, **flags: object) -> SimEstimator:
    return SimEstimator(Pricer(cal or Calibration()), overlap=False, sharing=False, **flags)  # type: ignore[arg-type]


def _timeline(result: Result) -> Timeline:
    assert result.timeline is not None
    return result.timeline


def _stage_times(pricer: Pricer, job: Job) -> tuple[list[float], list[float]]:
    f, b = [0.0] * job.parallel.pp, [0.0] * job.parallel.pp
    for a in default_plan(graph_for(job), job.parallel).layers:
        cost = pricer.layer_cost(a.layer, job)
        f[a.stage] += cost.fwd_s
        b[a.stage] += cost.bwd_s
    return f, b


# ---- exact tiny jobs ---------------------------------------------------------------------------------------------
def test_two_stage_1f1b_makespan_is_hand_computed_from_layer_costs() -> None:
    """2 stages, 4 micro-batches, 1F1B, no TP/DP; stage 1 (4 blocks' half + the 32k-vocabulary head) is the slower.

    Stage 1 never idles after its first forward: its steps F_j B_j each follow a batched exchange (activation j
    in, gradient j - 1 out) that costs one send s. Stage 0's first forward and its last backward frame it:
    T = (f0 + b0) + 4 (f1 + b1) + 5 s + optimizer (the larger stage's Adam step, after the barrier).
    """
    sim = _sim()
    job = _job(2, pp=2, global_batch=4)
    est = sim.pricer
    f, b = _stage_times(est, job)
    assert f[1] + b[1] > f[0] + b[0]
    block = next(layer for layer in graph_for(job).layers if layer.kind == "block")
    s = collective_time_s("send-recv", block.output_bytes, axis_layout("pp", job.parallel, job.cluster),
                          job.cluster, sim.pricer.cal)
    optimizer = est.optimizer_step_s(partition_stages(graph_for(job), 2), job)
    expected = (f[0] + b[0]) + 4 * (f[1] + b[1]) + 5 * s + optimizer
    result = sim.estimate(job, graph_for(job))
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert sum(result.breakdown.values()) == pytest.approx(result.iteration_time_s, rel=1e-12)
    graph = _timeline(result).exec_graph
    names = Counter(t.name.split(" ")[0] for t in graph.tasks if t.category == "pp_comm")
    # mb0's activation and mb3's gradient travel alone; the rest go as 3 batched exchanges (a copy per stage).
    assert names == {"send": 2, "exchange": 6}


def test_fsdp_without_overlap_serializes_gathers_and_scatters() -> None:
    """ZeRO-3 without prefetch (fsdp_prefetch_depth 0) on one stage: every gather and reduce-scatter is exposed,
    so the iteration is compute + m x sum over layers of (2 gathers + 1 reduce-scatter) + the optimizer step."""
    cal = Calibration()
    sim = _sim(cal)
    job = _job(2, stack=StackSpec(fsdp_prefetch_depth=0), zero=3, global_batch=4)  # dp=2, m=2
    est = sim.pricer
    f, b = _stage_times(est, job)
    layout = job.cluster.group_layout(2, 1)
    comm = 0.0
    for layer in graph_for(job).layers:
        weights, grads = layer.param_count * 2, layer.param_count * 2  # bf16
        gather = collective_time_s("all-gather", weights, layout, job.cluster, cal)
        scatter = collective_time_s("reduce-scatter", grads, layout, job.cluster, cal)
        comm += layer.count * (2 * gather + scatter)
    m = job.parallel.num_micro_batches
    optimizer = est.optimizer_step_s(partition_stages(graph_for(job), 1), job)
    result = sim.estimate(job, graph_for(job))
    assert result.iteration_time_s == pytest.approx(m * (f[0] + b[0]) + m * comm + optimizer, rel=1e-12)
    # ... and the analytical engine's formula is the same sum.
    analytical = AnalyticalEstimator(est).estimate(job, graph_for(job))
    assert analytical.iteration_time_s == pytest.approx(result.iteration_time_s, rel=1e-12)


def test_fsdp_prefetch_hides_gathers_under_compute() -> None:
    exposed_job = _job(2, stack=StackSpec(fsdp_prefetch_depth=0), zero=3, global_batch=4)
    hidden_job = _job(2, stack=StackSpec(fsdp_prefetch_depth=1), zero=3, global_batch=4)
    exposed = _sim().estimate(exposed_job, graph_for(exposed_job)).iteration_time_s
    hidden = _sim().estimate(hidden_job, graph_for(hidden_job)).iteration_time_s
    assert hidden < exposed


def test_gradient_buckets_without_overlap_follow_the_backward_pass() -> None:
    """ZeRO 0, a stack without grad_reduce_overlap: the buckets all-reduce after the last backward, back to back."""
    cal = Calibration()
    sim = _sim(cal)
    stack = StackSpec(grad_reduce_overlap=False)
    job = _job(4, stack=stack, global_batch=8)  # dp=4, m=2
    result = sim.estimate(job, graph_for(job))
    graph, outcome = _timeline(result).exec_graph, _timeline(result).outcome
    buckets = [t for t in graph.tasks if t.category == "dp_comm"]
    assert len(buckets) >= 2
    last_backward = max(outcome.end_s[t.tid] for t in graph.tasks if t.phase == "bwd")
    assert min(outcome.start_s[t.tid] for t in buckets) == last_backward
    comm = sum(t.duration_s for t in buckets)
    f, b = _stage_times(sim.pricer, job)
    optimizer = sim.pricer.optimizer_step_s(partition_stages(graph_for(job), 1), job)
    assert result.iteration_time_s == pytest.approx(2 * (f[0] + b[0]) + comm + optimizer, rel=1e-12)
    # Buckets hold whole layers, in the order their gradients become final, each at least grad_bucket_params
    # but the last: their all-reduces together move every gradient once, plus one ring's latency (its start-up and
    # its steps) per extra bucket.
    layout = job.cluster.group_layout(4, 1)
    params = graph_for(job).param_count()
    whole = collective_time_s("all-reduce", params * 2, layout, job.cluster, cal)
    params_ar = cal.comm_params("all-reduce")
    ring_latency = nccl.RING_BASE_LATENCY_S[nccl.SIMPLE] + params_ar.base_latency_s + 2 * 3 * (
        nccl.NVLINK_RING_STEP_S[nccl.SIMPLE] + params_ar.latency_s)  # large buckets: NCCL's Simple protocol
    assert comm == pytest.approx(whole + (len(buckets) - 1) * ring_latency, rel=1e-9)
    assert 2 <= len(buckets) <= params / stack.grad_bucket_params + 1


# ---- structure -----------------------------------------------------------------------------------------------------
def _check_graph(graph: ExecGraph) -> None:
    for task in graph.tasks:
        assert all(0 <= d < len(graph.tasks) and d != task.tid for d in task.deps)
    keys = Counter(t.sync_key for t in graph.tasks if t.sync_key)
    assert all(count >= 2 for count in keys.values())
    for device in graph.devices:
        allocated = sum(t.alloc_bytes for t in graph.tasks if t.device == device.index)
        freed = sum(t.free_bytes for t in graph.tasks if t.device == device.index)
        assert allocated == pytest.approx(freed, rel=1e-9), "everything a task allocates is released"


@pytest.mark.parametrize("strategy", [
    {"pp": 2, "tp": 2, "global_batch": 8},
    {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch": 8, "recompute": "selective"},
    {"pp": 4, "schedule": "gpipe", "global_batch": 8, "recompute": "full"},
    {"pp": 2, "zero": 3, "global_batch": 8, "recompute": "full"},
    {"pp": 2, "zero": 1, "global_batch": 8, "schedule": "zb-h1"},
    {"pp": 1, "tp": 2, "sp": True, "global_batch": 8},
], ids=["tp", "interleaved", "gpipe-full", "zero3", "zb-h1", "sp"])
@pytest.mark.parametrize("level", ["layer", "op"])
def test_graphs_are_well_formed_and_op_level_agrees(strategy: dict[str, object], level: str) -> None:
    job = make_job(TINY, a100_cluster(8), ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, **strategy}))
    sim = _sim(task_level=level)
    result = sim.estimate(job, graph_for(job))
    _check_graph(_timeline(result).exec_graph)
    layer_time = _sim().estimate(job, graph_for(job)).iteration_time_s
    assert result.iteration_time_s == pytest.approx(layer_time, rel=1e-9)
    assert sum(result.breakdown.values()) == pytest.approx(result.iteration_time_s, rel=1e-9)


def test_one_simulated_device_per_stage_and_tasks_per_layer_phase() -> None:
    job = _job(8, pp=2, tp=2, global_batch=8)  # dp=2, m=4
    graph = compile_job(job, default_plan(graph_for(job), job.parallel), Pricer(Calibration()))
    assert [(d.stage, d.ranks) for d in graph.devices] == [(0, 4), (1, 4)]
    units = Counter((t.device, t.phase) for t in {(t.device, t.phase, t.layer, t.micro_batch): t
                                                  for t in graph.tasks if t.category == "compute"}.values())
    # stage 0: embedding + 2 blocks; stage 1: 2 blocks + head; 4 micro-batches each way.
    assert units == {(0, "fwd"): 12, (0, "bwd"): 12, (1, "fwd"): 12, (1, "bwd"): 12}
    # One task per layer-phase: gradient buckets start when their last gradient is ready (no split window).
    assert not [t for t in graph.tasks if t.category == "compute" and " part" in t.name]
    tp = [t for t in graph.tasks if t.category == "tp_comm"]
    # per micro-batch: 4 blocks x (fwd, bwd), the embedding's forward all-reduce, the head's cross-entropy
    # all-reduces forward and its input-gradient all-reduce backward
    assert {t.stream for t in tp} == {"feature"} and len(tp) == (4 * 2 + 1 + 2) * 4
    assert graph.devices[0].static_breakdown.keys() == {"weights", "gradients", "optimizer", "runtime_reserved"}


def test_graph_size_does_not_grow_with_the_data_parallel_degree() -> None:
    model = load_model("gpt3-1.3b")
    sizes = []
    for dp in (2, 32):
        par = ParallelSpec(tp=2, pp=2, dp=dp, micro_batch=1, global_batch=8 * dp, seq_len=2048)
        job = make_job(model, a100_cluster(4 * dp), par)
        sizes.append(len(compile_job(job, default_plan(graph_for(job), par), Pricer(Calibration())).tasks))
    assert sizes[0] == sizes[1]


def test_zero_bubble_h1_splits_the_backward_and_shrinks_the_bubble() -> None:
    job = _job(8, pp=4, global_batch=16)
    sim = _sim()
    plan = default_plan(graph_for(job), job.parallel)
    one_f_one_b = sim.estimate(job, graph_for(job)).iteration_time_s
    zb_result = sim.estimate(job, graph_for(job), dataclasses.replace(plan, schedule="zb-h1"))
    assert zb_result.iteration_time_s < one_f_one_b
    graph = _timeline(zb_result).exec_graph
    wgrad = [t for t in graph.tasks if t.name.startswith("W")]
    assert wgrad and all(t.phase == "bwd" for t in wgrad)


# ---- the engine entry --------------------------------------------------------------------------------------------
def test_out_of_memory_is_a_result_not_an_error() -> None:
    job = make_job(load_model("gpt3-175b"), a100_cluster(8),
                   ParallelSpec(tp=8, micro_batch=1, global_batch=1, seq_len=2048))
    result = SimEstimator().estimate(job, graph_for(job))
    assert result.oom and result.peak_memory_bytes > result.memory_capacity_bytes
    assert sum(result.memory_breakdown.values()) == pytest.approx(result.peak_memory_bytes)
    assert result.notes and "out of memory" in result.notes[0]


def test_the_simulated_optimizer_step_allocates_the_foreach_temporary() -> None:
    """GPT-3 6.7B, full recompute, torch's foreach AdamW: both engines peak at the optimizer step, with one
    fp32 temporary per parameter on top of the model states."""
    job = make_job(load_model("gpt3-6.7b"), load_cluster("dgx-h200").with_num_gpus(1),
                   ParallelSpec(micro_batch=2, global_batch=2, seq_len=2048, precision="amp-bf16", recompute="full",
                                optimizer_impl="foreach"))
    analytical = AnalyticalEstimator().estimate(job, graph_for(job))
    simulated = SimEstimator().estimate(job, graph_for(job))
    step = analytical.memory_breakdown["optimizer_step"]
    assert step > 0.0
    assert simulated.peak_memory_bytes == pytest.approx(analytical.peak_memory_bytes, rel=1e-9)
    fused = dataclasses.replace(job, parallel=job.parallel.model_copy(update={"optimizer_impl": "fused"}))
    assert SimEstimator().estimate(fused, graph_for(fused)).peak_memory_bytes < simulated.peak_memory_bytes


def test_registered_as_sim_and_its_result_carries_the_timeline() -> None:
    estimator = make_engine("sim")
    assert estimator.name == "sim" and isinstance(estimator, SimEstimator)
    job = _job(2, pp=2, global_batch=4)
    result = estimator.estimate(job, graph_for(job))
    assert result.timeline is not None and result.timeline.outcome.critical_path
    assert result.timeline.device_names == ("stage 0 (1 ranks)", "stage 1 (1 ranks)")
    assert "timeline" not in result.to_dict()
    assert estimator.options.bandwidth_sharing


def test_bad_task_level_and_mismatched_plan_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="task_level"):
        SimEstimator(Pricer(Calibration()), task_level="kernel")  # type: ignore[arg-type]
    job = _job(2, pp=2, global_batch=4)
    plan = default_plan(graph_for(_job(2, global_batch=4)), _job(2, global_batch=4).parallel)
    with pytest.raises(ConfigError, match="num_stages"):
        compile_job(job, plan, Pricer(Calibration()))


@pytest.mark.parametrize("sp", [False, True])
def test_vocab_parallel_embedding_and_cross_entropy_collectives(sp: bool) -> None:
    """Megatron-LM under tensor parallelism: the embedding sums its vocabulary shards (all-reduce, or
    reduce-scatter with sp and an all-gather of the gradient), the head gathers its input (with sp; without,
    the input gradient is all-reduced) and the cross-entropy all-reduces max, target logit and sum of
    exponentials: 4 fp32 bytes per token each."""
    from trainsim.frontends.catalog.transformer import build_transformer
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.precision import policy_for

    spec = load_model("gpt3-1.3b")
    assert isinstance(spec, TransformerSpec)
    graph = build_transformer(spec, DeviceSlice(2, 2048, policy_for("bf16"), tp=2, sp=sp))
    embedding, head = graph.layers[0], graph.layers[-1]
    hidden = 2 * 2048 * spec.hidden * 2  # tokens x h x bf16
    described = {layer.kind: [(c.collective, c.phase, c.buffer_bytes) for c in layer.comms]
                 for layer in (embedding, head)}
    loss = [("all-reduce", "fwd", 2 * 2048 * 4.0)] * 3
    if sp:
        assert described["embedding"] == [("reduce-scatter", "fwd", hidden), ("all-gather", "bwd", hidden)]
        assert described["head"] == [("all-gather", "fwd", hidden), ("reduce-scatter", "bwd", hidden), *loss]
    else:
        assert described["embedding"] == [("all-reduce", "fwd", hidden)]
        assert described["head"] == [("all-reduce", "bwd", hidden), *loss]


def test_ranks_sharing_cores_wait_for_them_except_in_bubbles() -> None:
    """4 ranks on 2 cores (share 1/2): a step of 5 s with a 1 s bubble keeps a core busy for 4 s, so it lasts at
    least 4 / (1/2) = 8 s: 3 s of core sharing. A whole core per rank changes nothing."""
    from trainsim.estimate.result import with_shared_cores

    breakdown = {"compute": 3.0, "pp_comm": 1.0, "bubble": 1.0}
    assert with_shared_cores(breakdown, 1.0) == breakdown
    shared = with_shared_cores(breakdown, 0.5)
    assert shared["core_sharing"] == pytest.approx(3.0, rel=1e-12)
    assert sum(shared.values()) == pytest.approx(8.0, rel=1e-12)
    assert with_shared_cores({"compute": 1.0, "bubble": 9.0}, 0.5)["core_sharing"] == 0.0


def test_task_fields_keep_the_order_the_compiler_builds_them_in() -> None:
    """BuildContext.add and StageWriter.chain build tasks positionally (the compiler's hot path): a reordered
    Task would silently swap fields, so its field order is fixed here."""
    assert [f.name for f in dataclasses.fields(Task)] == [
        "tid", "name", "device", "stream", "kind", "duration_s", "deps", "sync_key", "resources", "alloc_bytes",
        "free_bytes", "phase", "layer", "micro_batch", "stage", "category", "priority", "link_shares"]
    job = _job(2, pp=2, global_batch=4)
    graph = compile_job(job, default_plan(graph_for(job), job.parallel), Pricer(Calibration()))
    chained = [t for t in graph.tasks if t.category == "compute"]
    assert chained and all(t.stage == t.device and t.sync_key == "" and t.priority == 0 for t in chained)
    assert all(t.tid == index for index, t in enumerate(graph.tasks))


def _one_block_at_a_time(self: StageWriter, blocks: list[SpecBlock], micro_batches: list[int]) -> None:
    """The reference for StageWriter.emit_blocks: each block written by emit_block, one after the other (the step the
    driver is in keeps its first task: emit_blocks leaves it)."""
    step_first = self.step_first
    for block, micro_batch in zip(blocks, micro_batches, strict=True):
        self.emit_block(block, micro_batch)
    self.step_first = step_first


@pytest.mark.parametrize(("level", "strategy"), [
    ("layer", {"pp": 2, "tp": 2, "zero": 1, "global_batch": 16}),
    ("layer", {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "zero": 1, "global_batch": 16,
               "recompute": "full"}),
    ("op", {"pp": 4, "schedule": "gpipe", "global_batch": 8, "recompute": "selective"}),
    ("layer", {"pp": 2, "zero": 3, "global_batch": 8}),
    ("layer", {"pp": 2, "schedule": "zb-h1", "global_batch": 8}),
], ids=["1f1b-zero1", "interleaved-full", "gpipe-op", "zero3", "zb-h1"])
def test_template_steps_written_together_give_the_graph_written_block_by_block(
        level: TaskLevel, strategy: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiler writes a stage's consecutive template steps with one extension per column (emit_blocks): the
    graph is the one emit_block writes step by step, task for task (every field, names included)."""
    job = make_job(TINY, a100_cluster(8), ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, **strategy}))
    sizes: list[int] = []
    batched = StageWriter.emit_blocks

    def counted(self: StageWriter, blocks: list[SpecBlock], micro_batches: list[int]) -> None:
        sizes.append(len(blocks))
        batched(self, blocks, micro_batches)

    monkeypatch.setattr(StageWriter, "emit_blocks", counted)
    graph = compile_job(job, default_plan(graph_for(job), job.parallel), Pricer(Calibration()), level)
    monkeypatch.setattr(StageWriter, "emit_blocks", _one_block_at_a_time)
    reference = compile_job(job, default_plan(graph_for(job), job.parallel), Pricer(Calibration()), level)
    assert graph == reference and graph.tasks == reference.tasks
    if strategy.get("zero") != 3:  # (ZeRO-3 cuts into every step: no templates)
        assert max(sizes) > 1  # several steps were written at once


def test_a_stack_that_copies_gradients_into_buckets_pays_the_copies_before_the_optimizer_step() -> None:
    """torch DDP's default (grad_bucket_copies): after the gradient sync, a host task of the Pricer's copy time
    over the parameters a device syncs, then the optimizer step; without it, or without data parallelism
    (nothing synced), the graph has no such task."""
    pricer = Pricer(Calibration())
    copying = _job(2, stack=StackSpec(grad_bucket_copies=True), global_batch=4)
    graph = compile_job(copying, default_plan(graph_for(copying), copying.parallel), pricer)
    params = sum(layer.count * layer.param_count for layer in graph_for(copying).layers)
    copies = [t for t in graph.tasks if t.name == "gradient bucket copies"]
    assert [t.duration_s for t in copies] == [pricer.grad_copies_s(params, copying)]
    assert pricer.grad_copies_s(params, copying) == pytest.approx(params * 24 / (
        copying.cluster.device.hbm_bw_bytes_per_s * Calibration().compute.memory_efficiency))
    step = next(t for t in graph.tasks if t.name == "optimizer step")
    assert step.deps == (copies[0].tid,) and copies[0].stream == "compute"
    for job in (_job(2, global_batch=4), _job(1, stack=StackSpec(grad_bucket_copies=True), global_batch=2)):
        plain = compile_job(job, default_plan(graph_for(job), job.parallel), pricer)
        assert not any(t.name == "gradient bucket copies" for t in plain.tasks)


def test_distributed_optimizer_gathers_that_do_not_overlap_follow_the_optimizer_step() -> None:
    """ZeRO 1 as Megatron-DeepSpeed runs it (neither the reduce-scatters nor the parameter all-gathers
    overlapped): the gathers wait for the optimizer step that updates the shards and run back to back after it,
    one per bucket of the reduce-scatters, before the iteration's end; the iteration is the analytical engine's
    sum. With the reduce-scatters overlapped the gathers still follow the step."""
    cal = Calibration().model_copy(update={"runtime": Calibration().runtime.model_copy(
        update={"iteration_overhead_s": 1e-3})})
    sim = _sim(cal)
    for overlap in (False, True):
        stack = StackSpec(grad_reduce_overlap=overlap, param_gather_overlap=False, grad_bucket_params=4e7)
        job = _job(4, stack=stack, zero=1, global_batch=8)
        result = sim.estimate(job, graph_for(job))
        graph, outcome = _timeline(result).exec_graph, _timeline(result).outcome
        scatters = [t for t in graph.tasks if t.name.startswith("dp reduce-scatter")]
        gathers = [t for t in graph.tasks if t.name.startswith("dp all-gather")]
        step = next(t for t in graph.tasks if t.name == "optimizer step")
        overhead = next(t for t in graph.tasks if t.name == "iteration overhead")
        assert len(gathers) == len(scatters) >= 2
        assert min(outcome.start_s[t.tid] for t in gathers) == outcome.end_s[step.tid]
        assert outcome.start_s[overhead.tid] == max(outcome.end_s[t.tid] for t in gathers)
        if not overlap:
            expected = AnalyticalEstimator(sim.pricer).estimate(job, graph_for(job)).iteration_time_s
            assert result.iteration_time_s == pytest.approx(expected, rel=1e-9)
