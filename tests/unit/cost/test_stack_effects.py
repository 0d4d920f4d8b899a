"""Stack behaviours in the pricing service: exact tiny cases (overlap on vs off changes the exposed time by the
computed amount), fusion, CUDA graphs, and the simulator agreeing with the analytical engine per behaviour."""

import itertools
import random

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration, RuntimeParams
from trainsim.catalog.model_files import parse_model
from trainsim.cost.pricing import Pricer
from trainsim.cost.stack_effects import (
    bucket_closes,
    bucket_queue,
    bucket_runs,
    bucketed_backward_s,
    bucketed_s,
    fuses_every_op,
    overlapped_s,
    queue_exposed_s,
    queue_tail_s,
    queued_buckets_s,
    unfused_extra_bytes,
)
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec

TINY = parse_model({"name": "tiny-gpt", "num_layers": 4, "hidden": 1024, "ffn_hidden": 4096, "num_heads": 16,
                    "vocab": 32000, "max_seq_len": 1024})


def _job(num_gpus: int, stack: StackSpec, **strategy: object) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, **strategy})
    return make_job(TINY, a100_cluster(num_gpus), par, stack)


def test_overlap_formulas_exact() -> None:
    assert overlapped_s(3.0, 5.0, 0.0) == 0.0
    assert overlapped_s(3.0, 5.0, 0.5) == 1.5  # hidden, both slowed by 1.5 for 3 s
    assert overlapped_s(7.0, 5.0, 0.0) == 2.0
    # 4 buckets of 1 s ready at 2, 4, 6, 8 of an 8 s window: the last ends at 9
    assert bucketed_s(4.0, 8.0, 4.0, 0.0) == 1.0
    # 4 buckets of 3 s: back to back from 2 s, ending at 14: 6 s past the window
    assert bucketed_s(12.0, 8.0, 4.0, 0.0) == 6.0
    assert bucketed_s(4.0, 8.0, 4.0, 0.5) == 1.0 + 0.5 * 3.0
    assert bucketed_s(4.0, 8.0, 0.3, 0.0) == 4.0  # fewer than one bucket: all of it after the window


def test_bucket_runs_fill_whole_layers_in_order() -> None:
    # layers of 3, 3, 3 and 5 parameters into buckets of 5: 3+3, then 3+5 (a bucket closes once it holds 5)
    assert bucket_runs([(3.0, 3), (5.0, 1)], 5.0) == ((6.0, 1), (8.0, 1))
    # equal buckets in a row are one run; the last layer closes a bucket that is not full
    assert bucket_runs([(2.0, 5)], 4.0) == ((4.0, 2), (2.0, 1))
    assert bucket_runs([(10.0, 2)], 1.0) == ((10.0, 2),)
    assert bucket_runs([(4.0, 1.5)], 4.0) == ((4.0, 1), (2.0, 1))  # half a layer of an uneven split


def _bucket_runs_by_instance(layers: list[tuple[float, float]], bucket_params: float) -> tuple[tuple[float, int], ...]:
    """bucket_runs' definition, one layer instance at a time."""
    instances: list[float] = []
    for params, repeats in layers:
        whole = int(repeats)
        instances += [params] * whole
        if repeats - whole > 1e-9:
            instances.append(params * (repeats - whole))
    runs: list[list[float]] = []
    held = 0.0
    for position, params in enumerate(instances):
        held += params
        if held < bucket_params and position < len(instances) - 1:
            continue
        if runs and runs[-1][0] == held:
            runs[-1][1] += 1
        else:
            runs.append([held, 1])
        held = 0.0
    return tuple((size, int(count)) for size, count in runs)


def test_bucket_runs_equal_their_definition_instance_by_instance() -> None:
    """bucket_runs takes a run of layers each as large as a bucket at once: the same runs (==) as filling the
    buckets one layer instance at a time, over random layers (large and small, whole and fractional repeats,
    none) and bucket sizes (0, negative, below and above the layers)."""
    rng = random.Random(3)
    for _ in range(3000):
        layers = [(rng.choice([1.0, 7.5, 1e6, 4e7, 8.5e8, rng.uniform(0.0, 1e8), 0.0]),
                   rng.choice([1, 2, 3, 0.5, 2.25, 10, 0.0, 3 + 1e-12])) for _ in range(rng.randint(0, 6))]
        size = rng.choice([0.0, 1.0, 4e7, 1e8, 5e8, rng.uniform(0.0, 1e9), -1.0])
        assert bucket_runs(layers, size) == _bucket_runs_by_instance(layers, size), (layers, size)


def test_bucket_closes_are_bucket_runs_layer_by_layer() -> None:
    """Exact: instances of 3, 3, 3 and 5 parameters in buckets of 5 close buckets of 6 (the second) and 8 (the
    last); a half layer is its own instance with half the parameters. Over random layers (positive parameters,
    whole and fractional repeats) and positive bucket sizes, the buckets closed, in order, are bucket_runs's."""
    assert bucket_closes([(3.0, 3), (5.0, 1)], 5.0) == ((1.0, 0.0), (1.0, 6.0), (1.0, 0.0), (1.0, 8.0))
    assert bucket_closes([(4.0, 1.5)], 4.0) == ((1.0, 4.0), (0.5, 2.0))
    rng = random.Random(5)
    for _ in range(2000):
        layers = [(rng.choice([1.0, 7.5, 1e6, 4e7, 8.5e8, rng.uniform(1.0, 1e8)]),
                   rng.choice([1, 2, 3, 0.5, 2.25, 10, 0.0, 3 + 1e-12])) for _ in range(rng.randint(0, 6))]
        size = rng.choice([1.0, 4e7, 1e8, 5e8, rng.uniform(1.0, 1e9)])
        runs: list[list[float]] = []
        for _, params in bucket_closes(layers, size):
            if params > 0.0 and runs and runs[-1][0] == params:
                runs[-1][1] += 1
            elif params > 0.0:
                runs.append([params, 1])
        assert tuple((params, int(count)) for params, count in runs) == bucket_runs(layers, size), (layers, size)


def test_bucketed_backward_runs_the_gradient_stream_exactly() -> None:
    """Steps (recompute, window, gather, scatter of the bucket closed) of a backward pass, by hand:
    - gathers of 1 s under windows of 4 s, one bucket of 5 s closed by the last layer: sent after the pass, all
      5 s exposed;
    - a bucket of 7 s closed by the first layer goes out when the second starts (at 4 s, behind its gather: 5 s
      to 12 s): the third gather waits for it and ends at 13 s, 1 s after the last compute, though 8 s of
      compute followed the bucket's closing (no spread of the buckets over the window sees it);
    - recompute delays the window's start: 2 s of recompute before each 4 s window, a 5 s bucket closed by the
      first layer goes out at 8 s behind the second gather and ends at 14 s, 2 s past the compute; the hidden
      5 s slow by gamma;
    - gathers longer than their windows: each layer waits for its own, max(0, gather - window) per layer."""
    assert bucketed_backward_s([(0.0, 4.0, 1.0, 0.0), (0.0, 4.0, 1.0, 0.0), (0.0, 4.0, 1.0, 5.0)], 0.0) == 5.0
    assert bucketed_backward_s([(0.0, 4.0, 1.0, 7.0), (0.0, 4.0, 1.0, 0.0), (0.0, 4.0, 1.0, 0.0)], 0.0) == 1.0
    assert bucketed_backward_s([(2.0, 4.0, 1.0, 5.0), (2.0, 4.0, 1.0, 0.0)], 0.0) == 2.0
    assert bucketed_backward_s([(2.0, 4.0, 1.0, 5.0), (2.0, 4.0, 1.0, 0.0)], 0.5) == 2.0 + 0.5 * 5.0
    assert bucketed_backward_s([(0.0, 1.0, 3.0, 0.0), (0.0, 1.0, 3.0, 0.0)], 0.0) == 4.0
    assert bucketed_backward_s([], 0.0) == 0.0


def test_a_stack_that_fuses_every_op_adds_no_kernel() -> None:
    """fuses_every_op says unfused_extra_bytes is 0 for every op of a graph: exactly where it is, over every
    combination of the four fusions, with and without fp8 linears."""
    fp8_job = _job(1, StackSpec(), precision="fp8")
    ops = [op for job in (_job(1, StackSpec()), fp8_job) for layer in graph_for(job).layers
           for op in layer.fwd + layer.bwd]
    names = ("fused_bias_activation", "fused_cross_entropy", "fused_layernorm_linear", "fused_fp8_cast")
    for flags in itertools.product((False, True), repeat=4):
        stack = StackSpec(**dict(zip(names, flags, strict=True)))
        for fp8 in (False, True):
            assert fuses_every_op(stack, fp8) == all(unfused_extra_bytes(op, stack, fp8) == 0.0 for op in ops), \
                (flags, fp8)


def test_queued_buckets_exact() -> None:
    # equal buckets: the closed form max(c, C - W (n - 1) / n) of bucketed_s
    assert queued_buckets_s([(1.0, 4)], 8.0, 0.0) == bucketed_s(4.0, 8.0, 4.0, 0.0) == 1.0
    assert queued_buckets_s([(3.0, 4)], 8.0, 0.0) == bucketed_s(12.0, 8.0, 4.0, 0.0) == 6.0
    # buckets of 1, 1, 5 s ready at 2, 4, 6 of a 6 s window: the last starts at 6 and ends at 11
    assert queued_buckets_s([(1.0, 2), (5.0, 1)], 6.0, 0.0) == 5.0
    # 5, 1, 1 s: back to back from 2 s, ending at 9
    assert queued_buckets_s([(5.0, 1), (1.0, 2)], 6.0, 0.0) == 3.0
    assert queued_buckets_s([(1.0, 4)], 8.0, 0.5) == 1.0 + 0.5 * 3.0
    assert queued_buckets_s([], 8.0, 0.0) == 0.0


def _bucket_seconds(pricer: Pricer, collective: str, runs: tuple[tuple[float, int], ...],
                    job: Job) -> list[tuple[float, int]]:
    return [(pricer.axis_collective_s(collective, params * 2, "grad", job), count) for params, count in runs]


def test_gradient_overlap_on_vs_off_differs_by_the_hidden_part() -> None:
    pricer = Pricer(Calibration(runtime=RuntimeParams(overlap_slowdown=0.25)))
    on, off = StackSpec(grad_bucket_params=1e6), StackSpec(grad_bucket_params=1e6, grad_reduce_overlap=False)
    job_on, job_off = _job(8, on, global_batch=8), _job(8, off, global_batch=8)
    stages = pricer.partition(graph_for(job_on), 1).stages
    cost = pricer.stage_cost(stages[0], job_on)
    layers = [(part.layer.param_count, part.count) for part in stages[0]]
    runs = bucket_runs(layers[::-1], 1e6)  # the backward pass finishes the last layer first
    assert pricer.grad_bucket_runs(stages[0], job_on) == runs
    buckets = _bucket_seconds(pricer, "all-reduce", runs, job_on)
    total = sum(seconds * count for seconds, count in buckets)  # one collective per bucket
    assert pricer.gradient_sync_exposed_s(stages[0], pricer.stage_cost(stages[0], job_off), job_off) == \
        pytest.approx(total, rel=1e-12)
    expected = queued_buckets_s(buckets, cost.backward_s + cost.recompute_s, 0.25)
    assert pricer.gradient_sync_exposed_s(stages[0], cost, job_on) == pytest.approx(expected, rel=1e-12)
    assert 0.0 < expected < total
    analytical = AnalyticalEstimator(pricer)
    gap = analytical.estimate(job_off, graph_for(job_off)).iteration_time_s - \
        analytical.estimate(job_on, graph_for(job_on)).iteration_time_s
    assert gap == pytest.approx(total - expected, rel=1e-9)


def test_gradient_buckets_each_pay_their_latency() -> None:
    pricer = Pricer(Calibration())
    job = _job(8, StackSpec(grad_reduce_overlap=False, grad_bucket_params=1.0), global_batch=8)
    stage = pricer.partition(graph_for(job), 1).stages[0]
    one = pricer.axis_collective_s("all-reduce", pricer.stage_params(stage) * 2, "grad", job)
    per_layer = sum(part.count * pricer.axis_collective_s("all-reduce", part.layer.param_count * 2, "grad", job)
                    for part in stage if part.layer.param_count > 0)
    layers = sum(part.count for part in stage if part.layer.param_count > 0)
    assert pricer.gradient_sync_exposed_s(stage, pricer.stage_cost(stage, job), job) == pytest.approx(per_layer)
    assert per_layer > one  # every bucket is its own collective: (layers - 1) more start-ups
    assert layers > 1


def test_param_gather_overlap_hides_the_distributed_optimizer_gather() -> None:
    pricer = Pricer(Calibration())
    job_on = _job(8, StackSpec(), zero=1, global_batch=8)
    job_off = _job(8, StackSpec(param_gather_overlap=False), zero=1, global_batch=8)
    stage = pricer.partition(graph_for(job_on), 1).stages[0]
    cost = pricer.stage_cost(stage, job_on)
    after_step = _bucket_seconds(pricer, "all-gather", pricer.grad_bucket_runs(stage, job_off), job_off)
    ahead = _bucket_seconds(pricer, "all-gather", pricer.grad_bucket_runs(stage, job_on, forward=True), job_on)
    hidden = sum(s * n for s, n in after_step) - queued_buckets_s(ahead[::-1], cost.forward_s, 0.0)
    gap = pricer.gradient_sync_exposed_s(stage, cost, job_off) - pricer.gradient_sync_exposed_s(stage, cost, job_on)
    assert gap == pytest.approx(hidden, rel=1e-12)
    assert gap > 0.0


def test_fsdp_prefetch_exact_per_layer() -> None:
    pricer = Pricer(Calibration())
    job = _job(2, StackSpec(fsdp_prefetch_depth=1), zero=3, global_batch=2)
    none = _job(2, StackSpec(fsdp_prefetch_depth=0), zero=3, global_batch=2)
    layer = graph_for(job).layers[1]
    cost = pricer.layer_cost(layer, job)
    gather = pricer.axis_collective_s("all-gather", layer.param_count * 2, "grad", job)
    scatter = pricer.axis_collective_s("reduce-scatter", layer.param_count * 2, "grad", job)
    assert pricer.fsdp_exposed_s(layer, cost, none) == 2 * gather + scatter
    assert pricer.fsdp_exposed_s(layer, cost, job) == \
        max(0.0, gather - cost.fwd_s) + max(0.0, gather + scatter - cost.bwd_s)


def test_tp_overlap_leaves_one_chunk_per_phase_exposed() -> None:
    pricer = Pricer(Calibration())
    on = _job(8, StackSpec(tp_comm_overlap=True), tp=2, sp=True, global_batch=4)
    off = _job(8, StackSpec(), tp=2, sp=True, global_batch=4)
    layer = graph_for(on).layers[1]
    hidden, plain = pricer.layer_cost(layer, on), pricer.layer_cost(layer, off)
    assert plain.tp_exposed_fraction == (1.0, 1.0)
    assert hidden.comm_s["tp"] < plain.comm_s["tp"]
    # TP collectives are much shorter than the GEMMs here: one chunk of tp = 2 stays exposed per phase
    assert hidden.tp_exposed_fraction == (0.5, 0.5)
    assert hidden.comm_s["tp"] == pytest.approx(plain.comm_s["tp"] / 2, rel=1e-12)


def test_ring_attention_hides_the_key_value_exchange_behind_attention() -> None:
    pricer = Pricer(Calibration())
    on = _job(8, StackSpec(cp_comm_overlap=True), cp=2, global_batch=4)
    off = _job(8, StackSpec(), cp=2, global_batch=4)
    layer = graph_for(on).layers[1]
    hidden, plain = pricer.layer_cost(layer, on), pricer.layer_cost(layer, off)
    assert plain.cp_exposed_fraction == (1.0, 1.0)
    for index, phase, ops in ((0, "fwd", layer.fwd), (1, "bwd", layer.bwd)):
        total = sum(pricer.axis_collective_s(c.collective, c.buffer_bytes, "cp", on)
                    for c in layer.comms if c.axis == "cp" and c.phase == phase)
        attention = pricer.ops_time_s(tuple(op for op in ops if op.kind == "attention"), on)
        assert total > 0.0 and attention > 0.0
        # gamma 0: what the phase's attention kernels cannot cover stays exposed
        assert hidden.cp_exposed_fraction[index] * total == pytest.approx(max(0.0, total - attention), abs=1e-15)
    assert hidden.comm_s["cp"] < plain.comm_s["cp"]


def test_scatter_gather_sends_one_tp_share_and_all_gathers() -> None:
    pricer = Pricer(Calibration())
    job = _job(8, StackSpec(pp_scatter_gather=True), tp=2, pp=2, global_batch=8)
    out = 1e6
    expected = pricer.axis_collective_s("send-recv", out / 2, "pp", job) + \
        pricer.axis_collective_s("all-gather", out, "tp", job)
    assert pricer.pipeline_hop_s(out, job) == expected
    plain = _job(8, StackSpec(), tp=2, pp=2, global_batch=8)
    assert pricer.pipeline_hop_s(out, plain) == pricer.axis_collective_s("send-recv", out, "pp", plain)


def test_unfused_kernels_and_cuda_graphs() -> None:
    pricer = Pricer(Calibration())
    fused, unfused = _job(1, StackSpec()), _job(1, StackSpec(fused_cross_entropy=False))
    head = graph_for(fused).layers[-1]
    loss = next(op for op in head.fwd if op.kind == "loss")
    device = fused.cluster.device
    extra = loss.bytes_moved / (device.hbm_bw_bytes_per_s * pricer.cal.compute.memory_efficiency) + \
        pricer.cal.compute.kernel_overhead_s
    assert pricer.op_time_s(loss, unfused) == pytest.approx(pricer.op_time_s(loss, fused) + extra, rel=1e-12)
    stage = pricer.partition(graph_for(fused), 1).stages[0]
    cal = Pricer(Calibration(runtime=RuntimeParams(micro_batch_overhead_s=1e-3)))
    assert cal.micro_batch_overhead_s(stage, fused) == 1e-3
    assert cal.micro_batch_overhead_s(stage, _job(1, StackSpec(cuda_graphs=True))) == 0.0


@pytest.mark.parametrize("stack", [StackSpec(grad_reduce_overlap=False),
                                   StackSpec(grad_reduce_overlap=False, param_gather_overlap=False)])
def test_sim_agrees_with_analytical_per_gradient_behaviour(stack: StackSpec) -> None:
    """NB: overlapped buckets of a 4-layer model differ by whole layers between the engines (the simulator's
    buckets hold whole layers); tests/validation/test_sim_vs_analytical.py checks them on the calibration runs."""
    pricer = Pricer(Calibration())
    for zero in (0, 1):
        job = _job(8, stack, zero=zero, global_batch=16)
        expected = AnalyticalEstimator(pricer).estimate(job, graph_for(job)).iteration_time_s
        got = SimEstimator(pricer, overlap=False, sharing=False).estimate(job, graph_for(job)).iteration_time_s
        assert got == pytest.approx(expected, rel=0.02)


def test_zero3_gradient_buckets_leave_the_last_bucket_exposed() -> None:
    """One bucket of all the stage's gradients is closed by the last layer of the backward pass and sent after
    it: its reduce-scatter is the last step's; the stage's ZeRO-3 exposure is the forward's gathers
    (fsdp_exposed_s) plus the backward pass's stream (fsdp_bucketed_backward_s); the simulator agrees."""
    pricer = Pricer(Calibration())
    plain = _job(2, StackSpec(), zero=3, global_batch=2)
    bucketed = _job(2, StackSpec(fsdp_bucket_params=1e12), zero=3, global_batch=2)  # one bucket: all at the end
    stage = pricer.partition(graph_for(plain), 1).stages[0]
    scatter = pricer.axis_collective_s("reduce-scatter", pricer.stage_params(stage) * 2, "grad", bucketed)
    steps = pricer.fsdp_backward_steps(stage, bucketed, "none")
    assert [step[3] for step in steps] == [0.0] * (len(steps) - 1) + [scatter]
    assert len(steps) == sum(layer.count for layer in graph_for(bucketed).layers)
    backward = pricer.fsdp_bucketed_backward_s(stage, bucketed, "none")
    assert backward == bucketed_backward_s(steps, 0.0) >= scatter
    forward = sum(layer.count * pricer.fsdp_exposed_s(layer, pricer.layer_cost(layer, bucketed), bucketed)
                  for layer in graph_for(bucketed).layers)
    assert pricer.stage_cost(stage, bucketed).fsdp_exposed_s == pytest.approx(forward + backward, rel=1e-12)
    analytical = AnalyticalEstimator(pricer).estimate(bucketed, graph_for(bucketed)).iteration_time_s
    sim = SimEstimator(pricer, overlap=False, sharing=False).estimate(bucketed, graph_for(bucketed)).iteration_time_s
    assert sim == pytest.approx(analytical, rel=0.02)


def test_the_queue_formula_over_arrays_equals_it_over_floats() -> None:
    """queue_tail_s is one formula for the plain engine (floats, max) and the search's grid engine (one queue
    per plan as numpy arrays, np.maximum, candidates padded with peaks -inf and lags 0): equal, exactly, for
    random queues and windows, runs of one and of many buckets, windows shorter and longer than the queue."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(7)
    queues, windows = [], []
    for _ in range(300):
        runs = [(float(rng.uniform(1e-5, 1e-2)), int(rng.integers(1, 6))) for _ in range(int(rng.integers(1, 5)))]
        queues.append(bucket_queue(runs))
        windows.append(float(rng.uniform(0.0, 2.0)) * sum(s * n for s, n in runs))
    width = max(len(queue.peaks_s) for queue in queues)
    peaks = np.full((len(queues), width), -np.inf)
    lags = np.zeros((len(queues), width))
    for row, queue in enumerate(queues):
        peaks[row, :len(queue.peaks_s)] = queue.peaks_s
        lags[row, :len(queue.lags)] = queue.lags
    count = np.array([queue.count for queue in queues], dtype=float)
    total = np.array([queue.total_s for queue in queues])
    for gamma in (0.0, 0.3):
        arrays = queue_tail_s(total, list(peaks.T), list(lags.T), np.array(windows) / count, gamma, np.maximum)
        floats = [queue_exposed_s(queue, window, gamma) for queue, window in zip(queues, windows, strict=True)]
        assert arrays.tolist() == floats
        for queue in queues:  # no window: nothing hides
            assert queue_exposed_s(queue, 0.0, gamma) == pytest.approx(queue.total_s, rel=1e-12)


def test_a_bucket_queue_holds_the_ends_of_each_run() -> None:
    queue = bucket_queue([(1.0, 2), (5.0, 1)])  # sent: 1, 1, 5
    assert (queue.count, queue.total_s) == (3, 7.0)
    assert queue.peaks_s == (5.0, 5.0, 6.0, 7.0) and queue.lags == (0, 0, 1, 2)
    assert queue_exposed_s(bucket_queue([]), 8.0, 0.5) == 0.0
