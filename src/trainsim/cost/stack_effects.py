"""What a training stack's behaviours (strategy/stack.py) do to a step's time: the formulas both engines share.

Overlap. A collective of C seconds that runs beside W seconds of compute it does not depend on slows both by
1 + gamma while they overlap (the overlap factor gamma of Proteus, sec. VI-C: compute and communication share
the SMs and the memory bandwidth), so together they take max(W, C) + gamma min(W, C): the exposed time beyond
the compute is max(0, C - W) + gamma min(W, C). gamma (Calibration.runtime.overlap_slowdown) is the one fitted
number; everything else follows from what the stack overlaps.

Bucketed overlap (DDP / Megatron gradient buckets, distributed-optimizer parameter gathers, userbuffers chunks):
n equal buckets of C / n, bucket i ready after i / n of the window W and sent one after another: the last one
ends at max(W + C / n, W / n + C), so max(C / n, C - W (n - 1) / n) stays exposed (the last bucket always);
the rest hides under compute, slowed by gamma. Without overlap the whole C is exposed.

Gradient buckets are separate collectives, each with its own start-up latency (Megatron-Core's
param_and_grad_buffer.py and torch DDP's reducer issue one NCCL call per bucket), and a bucket holds whole
layers: bucket_runs fills them as the simulator's compiler does (compile/insert_collectives.py), and
queued_buckets_s takes each bucket's own seconds. Bucket k starts when it is ready and the one before it has
ended, so the last ends at max over k of (ready_k + the seconds of buckets k..n-1): with bucket k ready after
(k + 1) / n of W, max_k (sum_{j >= k} c_j - W (n - 1 - k) / n) stays exposed.

ZeRO-3 gradient buckets (DeepSpeed's reduce_bucket_size) share one stream with the layers' prefetched weight
all-gathers: bucketed_backward_s runs that stream through a micro-batch's backward pass, layer by layer (the
simulator's schedule, compile/apply_zero.py), since a bucket's reduce-scatter delays the gathers behind it and
so the compute that waits for them; no spread of the buckets over the window stands for that.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from trainsim.ir.graph import Op
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec

if TYPE_CHECKING:  # NB: numpy only for the types: the plain engine's pricing runs without it
    import numpy as np
    from numpy.typing import NDArray

# a float, or a numpy array of one value per plan (queue_tail_s)
Seconds = TypeVar("Seconds", float, "NDArray[np.float64]")
BucketRuns = tuple[tuple[float, int], ...]  # (parameters of a bucket, how many such buckets in a row), in order

ACTIVATIONS = ("gelu", "swiglu")  # the activation ops of the graph's MLPs (frontends/catalog/transformer.py)


def overlapped_s(total_s: float, window_s: float, gamma: float) -> float:
    """Exposed seconds of a collective of total_s overlapped with window_s of compute."""
    return max(0.0, total_s - window_s) + gamma * min(total_s, window_s)


def column_backward_s(dgrad_comm_s: float, wgrad_s: float, regather_s: float, dgrad_s: float,
                      gamma: float) -> float:
    """Exposed seconds of one column-parallel linear's backward collectives where Megatron overlaps them with its
    GEMMs (LinearWithGradAccumulationAndAsyncCommunication, megatron/core/tensor_parallel/layers.py, megatron-core
    0.1.0 and 0.9.0): the input gradient's all-reduce / reduce-scatter (dgrad_comm_s) beside the weight-gradient
    GEMM (wgrad_s), and under sequence parallelism the all-gather of the saved input (regather_s; 0 without sp)
    beside the input-gradient GEMM (dgrad_s); each pair as overlapped_s."""
    return overlapped_s(dgrad_comm_s, wgrad_s, gamma) + overlapped_s(regather_s, dgrad_s, gamma)


def bucketed_s(total_s: float, window_s: float, buckets: float, gamma: float) -> float:
    """Exposed seconds of total_s sent in `buckets` equal buckets that become ready evenly over window_s."""
    if total_s <= 0.0:
        return 0.0
    n = max(1.0, buckets)
    exposed = max(total_s / n, total_s - window_s * (n - 1.0) / n)
    return exposed + gamma * (total_s - exposed)


def bucket_runs(layers: Iterable[tuple[float, float]], bucket_params: float) -> BucketRuns:
    """Parameters per bucket when the gradients of `layers` ((parameters, repeats) in the order their gradients
    become final) fill buckets of bucket_params: a bucket is sent once it holds at least bucket_params or the
    last layer is in (whole layers; compile/insert_collectives.py does the same). A fractional repeat count (an
    uneven split of the blocks) adds one partial layer. Equal buckets in a row come as one run."""
    chunks: list[tuple[float, int]] = []  # (parameters, instances in a row)
    for params, repeats in layers:
        whole = int(repeats)
        if whole:
            chunks.append((params, whole))
        if repeats - whole > 1e-9:
            chunks.append((params * (repeats - whole), 1))
    last = sum(count for _, count in chunks) - 1
    runs: list[list[float]] = []
    held = 0.0
    position = 0
    for params, count in chunks:
        if held == 0.0 and params >= bucket_params > 0.0:
            # NB: each instance fills a bucket of its own (0.0 + params is params): `count` buckets at once
            if runs and runs[-1][0] == params:
                runs[-1][1] += count
            else:
                runs.append([params, count])
            position += count
            continue
        for _ in range(count):
            held += params
            if held < bucket_params and position < last:
                position += 1
                continue
            if runs and runs[-1][0] == held:
                runs[-1][1] += 1
            else:
                runs.append([held, 1])
            held = 0.0
            position += 1
    return tuple((size, int(count)) for size, count in runs)


def bucket_closes(layers: Iterable[tuple[float, float]], bucket_params: float) -> tuple[tuple[float, float], ...]:
    """Per layer instance of `layers` ((parameters, repeats) in the order their gradients become final; a
    fractional repeat count adds one partial layer, as bucket_runs), in order: (its share of the layer: 1, or
    the fraction; the parameters of the bucket it closes, 0 where it closes none). The buckets are
    bucket_runs's: one closes once it holds at least bucket_params, or at the last instance."""
    instances: list[tuple[float, float]] = []  # (share, parameters)
    for params, repeats in layers:
        whole = int(repeats)
        instances += [(1.0, params)] * whole
        if repeats - whole > 1e-9:
            instances.append((repeats - whole, params * (repeats - whole)))
    out: list[tuple[float, float]] = []
    held = 0.0
    for position, (share, params) in enumerate(instances):
        held += params
        if held < bucket_params and position < len(instances) - 1:
            out.append((share, 0.0))
            continue
        out.append((share, held))
        held = 0.0
    return tuple(out)


def bucketed_backward_s(steps: Iterable[tuple[float, float, float, float]], gamma: float) -> float:
    """Exposed seconds of one micro-batch's ZeRO-3 gathers and bucketed reduce-scatters over a stage's backward
    pass, steps = per layer-phase in backward order (recompute_s, window_s, gather_s, scatter_s): its recompute
    (before its window opens), its window (backward with its feature collectives), the all-gather of its weights
    and the reduce-scatter of the bucket it closes (0 where none). The simulator's schedule on one gradient
    stream (compile/apply_zero.py): when layer-phase k's window opens its gather is issued, then the bucket the
    layer-phase before closed (collectives of one stream run in order); layer-phase k + 1 starts when k's
    compute and gather have ended, and the compute does not wait for a bucket until the last one, issued after
    the last layer-phase. NB: each window pairs with its own layer's gather (the simulator's with the next
    one's: Pricer.fsdp_exposed_s's convention; they differ at the ends of the stage). The exposed time is the end
    beyond the compute; the hidden rest of the collectives slows by gamma (module doc)."""
    start = free = pending = busy = comm = 0.0  # layer-phase start, stream free, bucket to issue, compute, comm
    for recompute, window, gather, scatter in steps:
        issue = start + recompute
        gathered = max(issue, free) + gather
        free = gathered + pending
        start = max(issue + window, gathered)
        pending = scatter
        busy += recompute + window
        comm += gather + scatter
    exposed = max(start, max(start, free) + pending) - busy
    return exposed + gamma * (comm - exposed)


@dataclass(frozen=True, slots=True)
class BucketQueue:
    """Buckets sent one after another (queued_buckets_s) as the terms of its closed form: `count` buckets of
    `total_s` seconds in all and, per end of a run of equal buckets (inside a run the tail is linear in k, so
    its ends suffice), the candidate tail peaks_s[i] - (window / count) x lags[i]: sum_{j >= k} c_j and
    n - 1 - k of the module doc. The first candidate is the last bucket alone (lag 0)."""

    count: int
    total_s: float
    peaks_s: tuple[float, ...]
    lags: tuple[int, ...]


def bucket_queue(runs: Sequence[tuple[float, int]]) -> BucketQueue:
    """The queue of `runs`: (seconds of one bucket, how many in a row) in sending order."""
    peaks: list[float] = []
    lags: list[int] = []
    later = 0.0  # seconds of the buckets after the current run
    after = 0  # how many buckets follow the current run
    for seconds, count in reversed(runs):
        peaks += [later + seconds, later + count * seconds]
        lags += [after, after + count - 1]
        later += count * seconds
        after += count
    return BucketQueue(sum([count for _, count in runs]), sum([seconds * count for seconds, count in runs]),
                       tuple(peaks), tuple(lags))


def queue_tail_s(total_s: Seconds, peaks_s: Sequence[Seconds], lags: Sequence[Seconds], step_s: Seconds,
                 gamma: float, maximum: Callable[[Seconds, Seconds], Seconds]) -> Seconds:
    """Exposed seconds of a non-empty queue (BucketQueue's terms) whose buckets become ready every step_s:
    max_k (sum_{j >= k} c_j - step_s (n - 1 - k)), at least the last bucket (the first candidate); the rest
    hides under compute, slowed by gamma. Over floats (maximum=max) or over numpy arrays of one queue per plan
    (np.maximum: the search's grid engine), one formula."""
    exposed = peaks_s[0] - step_s * lags[0]
    for peak, lag in zip(peaks_s[1:], lags[1:], strict=True):
        exposed = maximum(exposed, peak - step_s * lag)
    return exposed + gamma * (total_s - exposed)


def queued_buckets_s(runs: Sequence[tuple[float, int]], window_s: float, gamma: float) -> float:
    """Exposed seconds of buckets sent one after another, `runs` of (seconds of one bucket, how many in a row)
    in sending order, bucket k ready after (k + 1) / n of window_s (module doc; queue_tail_s)."""
    return queue_exposed_s(bucket_queue(runs), window_s, gamma)


def queue_exposed_s(queue: BucketQueue, window_s: float, gamma: float) -> float:
    """queued_buckets_s of a queue already made."""
    if queue.count == 0 or queue.total_s <= 0.0:
        return 0.0
    lags = tuple(float(lag) for lag in queue.lags)
    return queue_tail_s(queue.total_s, queue.peaks_s, lags, window_s / queue.count, gamma, max)


def window_micro_batches(schedule: str, pp: int) -> int:
    """Micro-batches of a stage's last backward pass that its overlapped gradient buckets fill over (and of its
    first forward pass that overlapped parameter gathers feed): one, except in Megatron-LM's interleaved 1F1B,
    whose micro-batches go through the chunks in groups of pp (Narayanan et al. 2021, sec. 2.2.2; backward chunk
    v - 1 first): a chunk's gradients are done when the group's pp micro-batches have left it, while the chunks
    after it in the backward order still run pp micro-batches each, so the buckets fill over pp micro-batches'
    backward passes (the simulator runs the schedule itself)."""
    return pp if schedule == "interleaved-1f1b" else 1


def ep_overlap_share(stack: StackSpec, par: ParallelSpec, overlaps: bool = True) -> float:
    """Of a step's forward (and backward) passes of a micro-batch through a stage, the share that runs beside
    another micro-batch's backward (forward) where the stack overlaps the expert all-to-alls (ep_comm_overlap;
    0.0 where it does not apply; overlaps: the device's collectives run beside its compute). Megatron-Core's
    combined 1F1B schedule (megatron/core/pipeline_parallel/combined_1f1b.py and schedules.py, megatron-core
    0.16.1; overlap_moe_expert_parallel_comm) pairs them in the 1F1B steady state only: at pp 1 the first forward
    and the last backward run alone (m - 1 pairs of m micro-batches); at pp > 1 only the interleaved schedule
    runs it (transformer_config.py asserts a virtual pipeline size), whose warm-up gains one forward:
    (pp - rank - 1) * 2 + (vpp - 1) * pp + 1 of the m * vpp passes run alone on each side
    (get_pp_rank_microbatches; microbatch_group_size_per_vp_stage is pp by default, model_parallel_config.py),
    taken at rank 0, whose timeline spans the step. It needs ep > 1 and refuses full recompute
    (transformer_config.py)."""
    if not (stack.ep_comm_overlap and overlaps) or par.ep <= 1 or par.recompute == "full":
        return 0.0
    micro_batches = par.num_micro_batches
    if micro_batches <= 0 or (par.pp > 1 and par.vpp <= 1):
        return 0.0
    if par.pp == 1:
        return (micro_batches - 1) / micro_batches
    passes = micro_batches * par.vpp
    alone = min(passes, (par.pp - 1) * 2 + (par.vpp - 1) * par.pp + 1)
    return (passes - alone) / passes


def fuses_every_op(stack: StackSpec, fp8_linears: bool) -> bool:
    """Whether unfused_extra_bytes is 0 for every op on this stack (its fusions on, or off only for fp8 casts the
    job does not make)."""
    return stack.fused_bias_activation and stack.fused_cross_entropy and (
        not fp8_linears or (stack.fused_layernorm_linear and stack.fused_fp8_cast))


def unfused_extra_bytes(op: Op, stack: StackSpec, fp8_linears: bool) -> float:
    """Memory traffic an unfused stack adds to an op the graph prices as one fused kernel:
    - an activation without fused_bias_activation: a separate bias add (gelu: one more read + write of the
      tensor, 1x the op's traffic) or, for SwiGLU, a separate SiLU kernel over the gate half (read + write of
      half the inputs: 2/3 of the op's read 2 + write 1);
    - cross-entropy without fused_cross_entropy: log_softmax writes its result and nll_loss reads it back
      (one more read + write of the logits, 1x);
    - fp8: a LayerNorm not fused with its GEMM casts its output in a kernel of its own (read 2 bytes, write 1
      per element: 3/4 of the norm's read + write of 2-byte values), and a GEMM whose input cast is not fused
      reads its 2-byte input and writes the 1-byte copy (3 bytes per input element).
    fp8_linears: the job's linear layers run in fp8."""
    if op.kind == "elementwise" and op.name in ACTIVATIONS and not stack.fused_bias_activation:
        return op.bytes_moved * (2.0 / 3.0 if op.name == "swiglu" else 1.0)
    if op.kind == "loss" and not stack.fused_cross_entropy:
        return op.bytes_moved
    if not fp8_linears:
        return 0.0
    if op.kind == "norm" and not stack.fused_layernorm_linear:
        return 0.75 * op.bytes_moved
    if op.kind == "matmul" and op.dtype == "fp8" and not stack.fused_fp8_cast and len(op.shape) == 4:
        batch, m, _, k = op.shape
        return 3.0 * batch * m * k
    return 0.0
