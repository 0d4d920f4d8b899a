"""Peak memory per GPU: model states by precision and ZeRO stage, activations by recompute and schedule."""

from dataclasses import dataclass

from trainsim.hardware.device import DeviceSpec
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stages import StagePart, in_flight_micro_batches


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


def stage_memory(stage: list[StagePart], index: int, par: ParallelSpec, device: DeviceSpec) -> dict[str, float]:
    """What one stage's device holds at its peak: during forward and backward (activations and working
    buffers), or during the optimizer step (its temporaries, after the activations are freed)."""
    params = sum(part.count * part.layer.param_count for part in stage)
    parts = model_state_bytes(params, par)
    per_micro_batch = sum(part.count * part.layer.saved_bytes[par.recompute] for part in stage)
    in_flight = in_flight_micro_batches(par.schedule, index, par.pp, par.vpp, par.num_micro_batches)
    activations, working = per_micro_batch * in_flight, _working_bytes(stage, par)
    step = optimizer_step_bytes(stage, par)
    if step > activations + working:
        parts.update(activations=0.0, temporary=0.0, optimizer_step=step)
    else:
        parts.update(activations=activations, temporary=working, optimizer_step=0.0)
    parts["runtime_reserved"] = device.runtime_reserved_bytes
    return parts


def _working_bytes(stage: list[StagePart], par: ParallelSpec) -> float:
    """Memory alive only inside one layer: a recomputed block's full activations (full recompute), the
    unsharded weights of the layers being gathered (ZeRO-3: current + prefetched), the loss's fp32 gradient."""
    policy = policy_for(par.precision)
    largest_layer = max((part.layer for part in stage), key=lambda layer: layer.saved_bytes["none"])
    working = largest_layer.saved_bytes["none"] if par.recompute != "none" else 0.0
    if par.zero >= 3:
        working += 2 * max(part.layer.param_count for part in stage) * policy.weight_bytes
    head = [part.layer for part in stage if part.layer.kind == "head"]
    if head:
        working += head[0].saved_bytes["none"]  # gradient of the logits, same size as the saved softmax
    return working


def estimate_memory(stages: list[list[StagePart]], par: ParallelSpec, device: DeviceSpec) -> MemoryEstimate:
    per_stage = [stage_memory(stage, index, par, device) for index, stage in enumerate(stages)]
    totals = [sum(parts.values()) for parts in per_stage]
    peak_stage = max(range(len(totals)), key=totals.__getitem__)
    return MemoryEstimate(totals[peak_stage], device.hbm_bytes, per_stage[peak_stage], peak_stage)
