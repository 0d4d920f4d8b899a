"""Peak memory per GPU: model states by precision and ZeRO stage, activations by recompute and schedule."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import Layer
from trainsim.strategy.expert_groups import expert_data_size, experts_own_group
from trainsim.strategy.parallel import ParallelSpec, Recompute
from trainsim.strategy.precision import policy_for
from trainsim.strategy.stack import StackSpec
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


ExpertParams = Mapping[int, float]  # {ranks of an expert data-parallel group: MoE expert parameters it shards}


def model_state_bytes(params: float, par: ParallelSpec, experts: ExpertParams | None = None) -> dict[str, float]:
    """Weights, gradients and optimizer states (Adam: fp32 master + two moments) of `params` parameters.

    ZeRO (Rajbhandari et al. 2020): stage 1 shards optimizer states, 2 also gradients, 3 also weights, over
    the data-parallel ranks (dp x cp, as Megatron-LM's distributed optimizer does). experts: of `params`, the MoE
    experts' sharded over their expert data-parallel group instead (stage_expert_params; Megatron-Core's
    distributed optimizer shards the expert parameters' states over it: megatron/core/optimizer/__init__.py,
    megatron-core 0.16.1).
    """
    policy = policy_for(par.precision)
    shards = par.dp * par.cp
    experts = experts or {}
    dense = params - sum(experts.values())
    per_param = {"weights": (policy.weight_bytes, 3), "gradients": (policy.grad_bytes, 2),
                 "optimizer": (policy.master_bytes + policy.optimizer_state_bytes, 1)}
    return {name: dense * size / (shards if par.zero >= stage else 1)
            + sum(count * size / (ranks if par.zero >= stage else 1) for ranks, count in experts.items())
            for name, (size, stage) in per_param.items()}


def owned_params(params: float, par: ParallelSpec, experts: ExpertParams | None = None) -> float:
    """The parameters of `params` whose optimizer state one GPU owns and steps: all of them, or from ZeRO-1 on
    1 / (dp x cp) of them and 1 / ranks of the experts' (model_state_bytes)."""
    experts = experts or {}
    shared = par.zero >= 1
    return (params - sum(experts.values())) / optimizer_shards(par) + sum(
        count / (ranks if shared else 1) for ranks, count in experts.items())


def stage_expert_params(stage: Iterable[StagePart], par: ParallelSpec) -> dict[int, float]:
    """{ranks: parameters} of the stage's MoE experts (Layer.experts) whose expert data-parallel group is not the
    data-parallel group (strategy.expert_groups), by the size of that group; {} for a stage without."""
    out: dict[int, float] = {}
    for part in stage:
        experts = part.layer.experts
        if experts is not None and experts_own_group(par, experts.tp_degree):
            ranks = expert_data_size(par, experts.tp_degree)
            out[ranks] = out.get(ranks, 0.0) + part.count * experts.params
    return out


def optimizer_step_bytes(stage: list[StagePart], par: ParallelSpec) -> float:
    """fp32 temporaries of the Adam step on one device (strategy.parallel.OptimizerImpl): none when fused; as
    large as the local optimizer shard under foreach (torch's _foreach_sqrt of the second moments); one tensor
    at a time under loop, bounded here by the largest layer."""
    if par.optimizer_impl == "fused" or not stage:
        return 0.0
    experts = stage_expert_params(stage, par)
    if par.optimizer_impl == "foreach":
        return 4.0 * owned_params(sum(part.count * part.layer.param_count for part in stage), par, experts)
    largest = max(stage, key=lambda part: part.layer.param_count)
    return 4.0 * owned_params(largest.layer.param_count, par, stage_expert_params([StagePart(largest.layer, 1.0)],
                                                                                    par))


def saved_key(recompute: Recompute, stack: StackSpec | None) -> str:
    """The Layer.saved_bytes entry a layer keeps under `recompute` on `stack`: selective recompute keeps what
    the stack's policy keeps (StackSpec.selective_recompute: Megatron's all but the attention core, or
    torchtitan's op-level policy, "selective_op")."""
    if recompute == "selective" and stack is not None and stack.selective_recompute == "op":
        return "selective_op"
    return recompute


def kept_bytes(layer: Layer, key: str) -> float:
    """Activations one micro-batch through `layer` keeps for its backward pass under saved_key `key` (a graph
    whose layers lack the op-level entry keeps the selective one)."""
    saved = layer.saved_bytes
    if key in saved:
        return saved[key]
    return saved.get("selective", 0.0) if key == "selective_op" else 0.0


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


def memory_key(par: ParallelSpec, stack: StackSpec | None = None) -> tuple[object, ...]:
    """Every field of the strategy (and stack) stage_memory_base reads: stages of the same layers and equal
    keys need the same memory (the pricing service caches by it)."""
    return (par.precision, par.dp, par.cp, par.zero, saved_key(par.recompute, stack), par.optimizer_impl,
            _loss_grad_buffers(stack), par.tp, par.sp, par.ep)  # tp, sp, ep: the experts' groups


def _loss_grad_buffers(stack: StackSpec | None) -> float:
    return stack.loss_grad_buffers if stack is not None else StackSpec.model_fields["loss_grad_buffers"].default


def stage_memory_base(stage: list[StagePart], par: ParallelSpec, stack: StackSpec | None = None) -> StageMemoryBase:
    """stack: what selective recompute keeps (saved_key) and the loss's gradient buffers; None: Megatron's
    policy and one buffer."""
    params = sum(part.count * part.layer.param_count for part in stage)
    states = model_state_bytes(params, par, stage_expert_params(stage, par))
    return StageMemoryBase((states["weights"], states["gradients"], states["optimizer"]),
                           stage_kept_bytes(stage, par.recompute, stack),
                           _working_bytes(stage, par, stack), optimizer_step_bytes(stage, par))


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
                 recompute: str) -> tuple[float, ...] | None:
    """Each model chunk's share of the stage's saved activations per micro-batch: its blocks' (the stage's blocks
    of each kind in one proportion; NB: also where a graph's dense blocks lead, whose first chunks hold them), the
    embedding on the first chunk, the head on the last; None when the stage saves nothing. recompute: the
    saved_key."""
    blocks = sum(blocks_per_chunk)
    per_chunk = [0.0] * len(blocks_per_chunk)
    for part in stage:
        saved = part.count * kept_bytes(part.layer, recompute)
        if part.layer.kind in BLOCK_KINDS:
            for chunk, count in enumerate(blocks_per_chunk):
                per_chunk[chunk] += saved * count / blocks
        elif part.layer.kind == "head":
            per_chunk[-1] += saved
        else:
            per_chunk[0] += saved
    total = sum(per_chunk)
    return tuple(value / total for value in per_chunk) if total > 0.0 else None


def stage_memory(stage: list[StagePart], index: int, par: ParallelSpec, device: DeviceSpec,
                 stack: StackSpec | None = None) -> dict[str, float]:
    """What stage `index`'s device holds at its peak (stage_memory_values, by name)."""
    values = stage_memory_values(stage_memory_base(stage, par, stack), stage_in_flight(par, index),
                                 device.runtime_reserved_bytes)
    return dict(zip(STAGE_MEMORY_KEYS, values, strict=True))


def _working_bytes(stage: list[StagePart], par: ParallelSpec, stack: StackSpec | None = None) -> float:
    """Memory alive only inside one layer: what recompute rebuilds (recompute_working_bytes), the unsharded
    weights of the layers being gathered (ZeRO-3: current + prefetched), the loss's gradient buffers
    (loss_working_bytes)."""
    working = recompute_working_bytes(stage, par.recompute, stack)
    if par.zero >= 3:
        working += 2 * max(part.layer.param_count for part in stage) * policy_for(par.precision).weight_bytes
    return working + loss_working_bytes(stage, stack)


def stage_kept_bytes(stage: list[StagePart], recompute: Recompute, stack: StackSpec | None = None) -> float:
    """Activations one micro-batch through the stage keeps for its backward pass."""
    key = saved_key(recompute, stack)
    return sum(part.count * kept_bytes(part.layer, key) for part in stage)


def rebuilt_bytes(layer: Layer, recompute: Recompute, stack: StackSpec | None = None) -> float:
    """Activations the backward of `layer` rebuilds before it runs: all of them under full recompute; under
    selective what the stack's policy dropped (Megatron's core attention, Korthikanti et al. 2022 sec. 5: only
    its fp32 softmax statistics with a fused kernel). Both engines' recompute allocates this."""
    if recompute == "none":
        return 0.0
    key = saved_key(recompute, stack)
    return layer.saved_bytes["none"] - (kept_bytes(layer, key) if key != "full" else 0.0)


def recompute_working_bytes(stage: list[StagePart], recompute: Recompute, stack: StackSpec | None = None) -> float:
    """The largest block's rebuilt_bytes. The embedding and the head are not recomputed
    (compile/apply_recompute.py)."""
    blocks = [part.layer for part in stage if part.layer.kind in BLOCK_KINDS]
    return max((rebuilt_bytes(layer, recompute, stack) for layer in blocks), default=0.0)


def loss_working_bytes(stage: list[StagePart], stack: StackSpec | None = None) -> float:
    """The loss's fp32 gradient buffers on the stage with the head (loss_grad_bytes)."""
    head = [part.layer for part in stage if part.layer.kind == "head"]
    return loss_grad_bytes(head[0], stack) if head else 0.0


def loss_grad_bytes(head: Layer, stack: StackSpec | None = None) -> float:
    """The loss's fp32 gradient buffers beside its saved probabilities while the head's backward runs: the
    stack's loss_grad_buffers of them, each the size of the saved probabilities."""
    return _loss_grad_buffers(stack) * head.saved_bytes["none"]


def estimate_memory(stages: list[list[StagePart]], par: ParallelSpec, device: DeviceSpec,
                    stack: StackSpec | None = None, capacities: Sequence[float] = ()) -> MemoryEstimate:
    return memory_estimate([stage_memory_base(stage, par, stack) for stage in stages],
                           [stage_in_flight(par, index) for index in range(len(stages))], device, capacities)


def memory_estimate(bases: Sequence[StageMemoryBase], in_flight: Sequence[float], device: DeviceSpec,
                    capacities: Sequence[float] = ()) -> MemoryEstimate:
    """The peak over the stages whose memory before the schedule is `bases` and that hold `in_flight`
    micro-batches at their peaks (one each per stage, in order). capacities: per stage, the memory of its
    smallest rank where the cluster's ranks differ (cost.rank_classes); then the stage nearest its capacity is
    the verdict's, as the simulator's (estimate.simulation.sim_memory)."""
    reserved = device.runtime_reserved_bytes
    values = [stage_memory_values(base, held, reserved) for base, held in zip(bases, in_flight, strict=True)]
    totals = [sum(stage) for stage in values]
    if capacities:
        peak_stage = max(range(len(totals)), key=lambda s: totals[s] / capacities[s])
        capacity = capacities[peak_stage]
    else:
        peak_stage = max(range(len(totals)), key=totals.__getitem__)
        capacity = device.hbm_bytes
    return MemoryEstimate(totals[peak_stage], capacity, dict(zip(STAGE_MEMORY_KEYS, values[peak_stage], strict=True)),
                          peak_stage)
