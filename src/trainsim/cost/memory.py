"""Peak memory per GPU: model states by precision and ZeRO stage, activations by recompute and schedule."""

from collections.abc import Sequence
from dataclasses import dataclass

from trainsim.hardware.device import DeviceSpec
from trainsim.strategy.parallel import ParallelSpec, Recompute
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stages import BLOCK_KINDS, StagePart, in_flight_micro_batches


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    peak_bytes: float
    capacity_bytes: float
    breakdown: dict[str, float]
    peak_stage: int

    @property
    def oom(self) -> bool:
        return self.peak_bytes > self.capacity_bytes


def optimizer_shards(par: ParallelSpec) -> int:
    """How many ranks share one optimizer state: dp x cp from ZeRO-1 on (Megatron-LM's distributed optimizer)."""
    return par.dp * par.cp if par.zero >= 1 else 1


def model_state_bytes(params: float, par: ParallelSpec) -> dict[str, float]:
    """Weights, gradients and optimizer states (Adam: fp32 master + two moments) of `params` parameters.

    ZeRO (Rajbhandari et al. 2020): stage 1 shards optimizer states, 2 also gradients, 3 also weights, over
    the data-parallel ranks (dp x cp, as Megatron-LM's distributed optimizer does).
    """
    policy = policy_for(par.precision)
    shards = par.dp * par.cp
    return {
        "weights": params * policy.weight_bytes / (shards if par.zero >= 3 else 1),
        "gradients": params * policy.grad_bytes / (shards if par.zero >= 2 else 1),
        "optimizer": params * (policy.master_bytes + policy.optimizer_state_bytes) / optimizer_shards(par),
    }


def optimizer_step_bytes(stage: list[StagePart], par: ParallelSpec) -> float:
    """fp32 temporaries of the Adam step on one device (strategy.parallel.OptimizerImpl): none when fused; as
    large as the local optimizer shard under foreach (torch's _foreach_sqrt of the second moments); one tensor
    at a time under loop, bounded here by the largest layer."""
    if par.optimizer_impl == "fused" or not stage:
        return 0.0
    if par.optimizer_impl == "foreach":
        return 4.0 * sum(part.count * part.layer.param_count for part in stage) / optimizer_shards(par)
    return 4.0 * max(part.layer.param_count for part in stage) / optimizer_shards(par)


# What a stage's device holds at its peak, in the order of stage_memory's dict (and of its sum).
STAGE_MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "temporary", "optimizer_step",
                     "runtime_reserved")


@dataclass(frozen=True, slots=True)
class StageMemoryBase:
    """A stage's memory before the schedule says how many micro-batches it holds: its model states (weights,
    gradients, optimizer), one micro-batch's saved activations, its working buffers and optimizer-step
    temporaries."""

    states: tuple[float, float, float]
    per_micro_batch: float
    working: float
    step: float


def memory_key(par: ParallelSpec) -> tuple[object, ...]:
    """Every field of the strategy stage_memory_base reads: stages of the same layers and equal keys need the
    same memory (the pricing service caches by it)."""
    return (par.precision, par.dp, par.cp, par.zero, par.recompute, par.optimizer_impl)


def stage_memory_base(stage: list[StagePart], par: ParallelSpec, loss_grad_buffers: float = 1.0) -> StageMemoryBase:
    """loss_grad_buffers: the stack's (strategy.stack.StackSpec.loss_grad_buffers)."""
    params = sum(part.count * part.layer.param_count for part in stage)
    states = model_state_bytes(params, par)
    return StageMemoryBase((states["weights"], states["gradients"], states["optimizer"]),
                           sum(part.count * part.layer.saved_bytes[par.recompute] for part in stage),
                           _working_bytes(stage, par, loss_grad_buffers), optimizer_step_bytes(stage, par))


def stage_memory_values(base: StageMemoryBase, in_flight: float, reserved_bytes: float) -> tuple[float, ...]:
    """What one stage's device holds at its peak (STAGE_MEMORY_KEYS): during forward and backward (activations
    of `in_flight` micro-batches and working buffers), or during the optimizer step (its temporaries, after the
    activations are freed), plus the runtime's reserve."""
    activations = base.per_micro_batch * in_flight
    if base.step > activations + base.working:
        return (*base.states, 0.0, 0.0, base.step, reserved_bytes)
    return (*base.states, activations, base.working, 0.0, reserved_bytes)


def stage_in_flight(par: ParallelSpec, index: int, shares: Sequence[float] | None = None) -> float:
    """Micro-batches stage `index` holds at its peak (strategy.stages.in_flight_micro_batches); shares: its
    chunks' shares of its activations where they differ (chunk_shares)."""
    return in_flight_micro_batches(par.schedule, index, par.pp, par.vpp, par.num_micro_batches, shares)


def chunk_shares(stage: list[StagePart], blocks_per_chunk: Sequence[int],
                 recompute: Recompute) -> tuple[float, ...] | None:
    """Each model chunk's share of the stage's saved activations per micro-batch: its blocks' (the stage's blocks
    of each kind in one proportion), the embedding on the first chunk, the head on the last; None when the stage
    saves nothing."""
    blocks = sum(blocks_per_chunk)
    per_chunk = [0.0] * len(blocks_per_chunk)
    for part in stage:
        saved = part.count * part.layer.saved_bytes[recompute]
        if part.layer.kind in BLOCK_KINDS:
            for chunk, count in enumerate(blocks_per_chunk):
                per_chunk[chunk] += saved * count / blocks
        elif part.layer.kind == "head":
            per_chunk[-1] += saved
        else:
            per_chunk[0] += saved
    total = sum(per_chunk)
    return tuple(value / total for value in per_chunk) if total > 0.0 else None


def stage_memory(stage: list[StagePart], index: int, par: ParallelSpec, device: DeviceSpec) -> dict[str, float]:
    """What stage `index`'s device holds at its peak (stage_memory_values, by name)."""
    values = stage_memory_values(stage_memory_base(stage, par), stage_in_flight(par, index),
                                 device.runtime_reserved_bytes)
    return dict(zip(STAGE_MEMORY_KEYS, values, strict=True))


def _working_bytes(stage: list[StagePart], par: ParallelSpec, loss_grad_buffers: float = 1.0) -> float:
    """Memory alive only inside one layer: a recomputed block's full activations (full recompute) or the
    activations of the part selective recompute drops and rebuilds (the core attention: Korthikanti et al.
    2022, sec. 5; none with a fused attention kernel, which keeps no scores), the unsharded weights of the
    layers being gathered (ZeRO-3: current + prefetched), the loss's fp32 gradient buffers (as many as the
    stack's loss holds: loss_grad_buffers, each the size of the saved probabilities)."""
    policy = policy_for(par.precision)
    largest_layer = max((part.layer for part in stage), key=lambda layer: layer.saved_bytes["none"])
    working = {"none": 0.0, "full": largest_layer.saved_bytes["none"],
               "selective": largest_layer.saved_bytes["none"] - largest_layer.saved_bytes["selective"]}[par.recompute]
    if par.zero >= 3:
        working += 2 * max(part.layer.param_count for part in stage) * policy.weight_bytes
    head = [part.layer for part in stage if part.layer.kind == "head"]
    if head:
        working += loss_grad_buffers * head[0].saved_bytes["none"]
    return working


def estimate_memory(stages: list[list[StagePart]], par: ParallelSpec, device: DeviceSpec,
                    loss_grad_buffers: float = 1.0) -> MemoryEstimate:
    return memory_estimate([stage_memory_base(stage, par, loss_grad_buffers) for stage in stages],
                           [stage_in_flight(par, index) for index in range(len(stages))], device)


def memory_estimate(bases: Sequence[StageMemoryBase], in_flight: Sequence[float],
                    device: DeviceSpec) -> MemoryEstimate:
    """The peak over the stages whose memory before the schedule is `bases` and that hold `in_flight`
    micro-batches at their peaks (one each per stage, in order)."""
    reserved = device.runtime_reserved_bytes
    values = [stage_memory_values(base, held, reserved) for base, held in zip(bases, in_flight, strict=True)]
    totals = [sum(stage) for stage in values]
    peak_stage = max(range(len(totals)), key=totals.__getitem__)
    return MemoryEstimate(totals[peak_stage], device.hbm_bytes, dict(zip(STAGE_MEMORY_KEYS, values[peak_stage],
                                                                         strict=True)), peak_stage)
