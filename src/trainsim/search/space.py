"""The space of plain strategies the planner walks: every combination of the axes below, nothing pruned yet.

tp: divisors of the GPUs per NVLink domain that divide num_heads (tensor parallelism stays on NVLink).
pp: divisors of num_layers (the even split); dp is inferred as num_gpus / (tp x pp) and left to make_job to
    refuse when it is not a whole number. And the pp that do not divide num_layers but divide num_gpus / tp
    (a whole dp), each with the uneven split Megatron-Core accepts (uneven_split), where there is one.
vpp: 1 (schedule 1f1b), and for pp > 1 every v in 2..max_vpp with num_layers % (pp x v) == 0
    (schedule interleaved-1f1b); for a pp that does not divide num_layers, every v in 1..max_vpp with an
    uneven split.
micro_batch: divisors of global_batch / dp up to max_micro_batch; when dp is not a whole number or does not
    divide the global batch there is no valid micro-batch and the plan is tried once with micro_batch=1, so
    that make_job refuses it and the reason is counted.
recompute: none, selective, full.  zero: 0..3.  sp: off, and on when tp > 1.
ep: 1 for a dense model; for a model with experts every power of two that divides num_experts and dp (make_job's
    rule: experts share data ranks, ep | dp x cp with cp = 1; Megatron-Core's expert mesh over the same ranks at
    expert tp = tp, world / (tp x ep x pp) expert data-parallel ranks, initialize_model_parallel in
    megatron/core/parallel_state.py, megatron-core 0.16.1). Folding ep over tensor-parallel ranks (an expert tp
    apart from tp) is not a plan trainsim expresses, so it is not searched.
cp stays 1. Non-transformer models (CNN, DLRM) search dp, ZeRO, recompute and micro-batch only.
"""

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from trainsim.divisors import divisors
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.strategy.parallel import RECOMPUTES, AttentionKernel, OptimizerImpl, ParallelSpec, Recompute
from trainsim.strategy.precision import Precision
from trainsim.strategy.stack import StackSpec

ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The fixed job settings and the bounds of the enumerated axes."""

    global_batch: int
    seq_len: int = 2048
    precision: Precision = "bf16"
    attention: AttentionKernel = "flash2"
    optimizer_impl: OptimizerImpl = "fused"
    stack: StackSpec = field(default_factory=StackSpec)  # the training software every plan runs on
    max_micro_batch: int = 16
    max_vpp: int = 8
    recomputes: tuple[Recompute, ...] = RECOMPUTES
    zero_stages: tuple[int, ...] = ZERO_STAGES

    def __post_init__(self) -> None:
        for name in ("global_batch", "seq_len", "max_micro_batch", "max_vpp"):
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(name, value, "must be a positive integer")
        if not self.recomputes:
            raise ConfigError("recomputes", self.recomputes, "must name at least one recompute mode")
        for mode in self.recomputes:
            if mode not in RECOMPUTES:
                raise ConfigError("recompute", mode, f"choose from {', '.join(RECOMPUTES)}")
        for stage in self.zero_stages:
            if stage not in ZERO_STAGES:
                raise ConfigError("zero", stage, "choose ZeRO stages from 0, 1, 2, 3")
        if not self.zero_stages:
            raise ConfigError("zero_stages", self.zero_stages, "must name at least one ZeRO stage")


def tp_candidates(model: ModelSpec, gpus_per_node: int) -> list[int]:
    if not isinstance(model, TransformerSpec):
        return [1]
    return [tp for tp in divisors(gpus_per_node) if model.num_heads % tp == 0]


def pp_candidates(model: ModelSpec) -> list[int]:
    """The pp of the even split: the divisors of num_layers."""
    if not isinstance(model, TransformerSpec):
        return [1]
    return divisors(model.num_layers)


@dataclass(frozen=True, slots=True)
class PipelineSplit:
    """A pipeline degree, its model chunks per rank, and how its blocks are split (strategy.stages.split_blocks):
    the embedding and the loss counted as layers, or the first and last ranks' blocks fixed; neither: even."""

    pp: int
    vpp: int = 1
    embedding_in_split: bool = False
    loss_in_split: bool = False
    first_stage_layers: int = 0
    last_stage_layers: int = 0


def uneven_split(num_layers: int, pp: int, vpp: int) -> PipelineSplit | None:
    """The split of num_layers blocks over pp ranks of vpp chunks each that pp x vpp does not divide, as
    Megatron-Core accepts it (TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py,
    megatron-core 0.16.1), or None:
    - the embedding and the loss counted as a layer each (account_for_embedding_in_pipeline_split,
      account_for_loss_in_pipeline_split; both, else the loss alone, else the embedding alone): valid where pp
      divides the counted layers and vpp divides each rank's share;
    - else the first and last ranks' blocks fixed (num_layers_in_first_pipeline_stage / _last_), each a
      multiple of vpp, the middle ranks holding the rest evenly, a multiple of vpp each: here each middle rank
      holds ceil(num_layers / pp) blocks (rounded up to a multiple of vpp) and the first and last ranks share
      the remainder (the first the smaller half, a multiple of vpp), no more than a middle rank each, as they
      also hold the embedding and the loss; with pp 2 (no middle rank) the two halves of the blocks."""
    if pp < 2 or num_layers % (pp * vpp) == 0:
        return None
    for embedding, loss in ((True, True), (False, True), (True, False)):
        counted = num_layers + embedding + loss
        if counted % pp == 0 and counted // pp % vpp == 0:
            return PipelineSplit(pp, vpp, embedding_in_split=embedding, loss_in_split=loss)
    middle = pp - 2
    per_rank = -(-num_layers // pp)
    per_rank = -(-per_rank // vpp) * vpp
    rest = num_layers - middle * per_rank
    first = rest // 2 // vpp * vpp
    last = rest - first
    if first <= 0 or last % vpp or (middle and last > per_rank):
        return None
    return PipelineSplit(pp, vpp, first_stage_layers=first, last_stage_layers=last)


def pipeline_splits(model: ModelSpec, ranks: int, max_vpp: int) -> list[list[PipelineSplit]]:
    """Per pp, ascending, its splits: the even pp (pp_candidates) with vpp_candidates; then, merged in, every
    pp of 2..num_layers that does not divide num_layers but divides `ranks` (num_gpus / tp: dp whole), with its
    uneven_split for each vpp of 1..max_vpp that has one (none: not listed). NB: the uneven pp are bounded by
    the GPUs: a pp that leaves dp fractional is never enumerated, while an even pp is (make_job refuses it,
    counted)."""
    by_pp = {pp: [PipelineSplit(pp, vpp) for vpp in vpp_candidates(model, pp, max_vpp)] for pp in pp_candidates(model)}
    if not isinstance(model, TransformerSpec):
        return list(by_pp.values())
    layers = model.num_layers
    for pp in divisors(ranks) if ranks > 0 else []:
        if 2 <= pp <= layers and layers % pp:
            splits = [split for vpp in range(1, max_vpp + 1) if (split := uneven_split(layers, pp, vpp))]
            if splits:
                by_pp[pp] = splits
    return [by_pp[pp] for pp in sorted(by_pp)]


def ep_candidates(model: ModelSpec, num_gpus: int, model_parallel: int) -> list[int]:
    """1, and for a model with experts the powers of two above 1 that divide num_experts and dp = num_gpus /
    model_parallel (module doc); [1] when dp is not a whole number."""
    if not isinstance(model, TransformerSpec) or not model.is_moe or num_gpus % model_parallel:
        return [1]
    dp = num_gpus // model_parallel
    return [ep for ep in divisors(math.gcd(model.num_experts, dp)) if ep & (ep - 1) == 0]


def vpp_candidates(model: ModelSpec, pp: int, max_vpp: int) -> list[int]:
    if pp == 1 or not isinstance(model, TransformerSpec):
        return [1]
    return [1] + [v for v in range(2, max_vpp + 1) if model.num_layers % (pp * v) == 0]


def micro_batch_candidates(global_batch: int, num_gpus: int, model_parallel: int, cap: int) -> list[int]:
    """Divisors of global_batch / dp up to cap, or [1] when no dp splits the global batch evenly."""
    if num_gpus % model_parallel:
        return [1]
    dp = num_gpus // model_parallel
    if global_batch % dp:
        return [1]
    return [mb for mb in divisors(global_batch // dp) if mb <= cap]


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace) -> Iterator[ParallelSpec]:
    """Every plan of the space, in a fixed order (tp, pp, ep, vpp, micro-batch, sp, recompute, zero)."""
    variants = plan_variants(space)
    for base in _validated_bases(model, cluster, space):
        for recompute, zero in variants:
            yield base.replaced(recompute=recompute, zero=zero)


@dataclass(frozen=True, slots=True)
class PlanColumns:
    """What the enumeration knows of its plans, one entry per plan in its order, so that the search's grid engine
    need not read it back from each plan's spec: the number of the validated spec the plan copies (plans of one
    base differ in their recompute mode and ZeRO stage only) and the number of its (recompute, ZeRO) in
    `variants`."""

    base: list[int]
    variant: list[int]
    variants: tuple[tuple[Recompute, int], ...]

    def take(self, indices: Sequence[int]) -> "PlanColumns":
        """The columns of the plans at `indices` (those make_job accepted), in that order."""
        base, variant = self.base, self.variant
        return PlanColumns([base[index] for index in indices], [variant[index] for index in indices], self.variants)


def plan_grid(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace) -> tuple[list[ParallelSpec], PlanColumns]:
    """enumerate_plans' plans as a list, with their PlanColumns."""
    variants = plan_variants(space)
    plans: list[ParallelSpec] = []
    bases: list[int] = []
    count = 0
    for base in _validated_bases(model, cluster, space):
        plans += [base.replaced(recompute=recompute, zero=zero) for recompute, zero in variants]
        bases += [count] * len(variants)
        count += 1
    return plans, PlanColumns(bases, list(range(len(variants))) * count, variants)


def plan_variants(space: SearchSpace) -> tuple[tuple[Recompute, int], ...]:
    """The (recompute, ZeRO) variants of every validated spec, in the enumeration's order."""
    return tuple((recompute, zero) for recompute in space.recomputes for zero in space.zero_stages)


def _validated_bases(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace) -> Iterator[ParallelSpec]:
    """One validated spec per (tp, pp, ep, vpp, micro-batch, sp), in the enumeration's order, with the space's first
    recompute mode and ZeRO stage: every plan of the space copies one with its own (no ParallelSpec check reads
    them; SearchSpace checked their values), so validation runs once, not recomputes x zero stages times."""
    for tp in tp_candidates(model, cluster.gpus_per_domain):
        ranks = cluster.num_gpus // tp if cluster.num_gpus % tp == 0 else 0
        for splits in pipeline_splits(model, ranks, space.max_vpp):
            pp = splits[0].pp
            micro_batches = micro_batch_candidates(space.global_batch, cluster.num_gpus, tp * pp,
                                                   space.max_micro_batch)
            for ep, split, mb, sp in itertools.product(ep_candidates(model, cluster.num_gpus, tp * pp), splits,
                                                       micro_batches, (False, True) if tp > 1 else (False,)):
                yield ParallelSpec(
                    tp=tp, pp=pp, ep=ep, vpp=split.vpp, sp=sp, zero=space.zero_stages[0],
                    recompute=space.recomputes[0], micro_batch=mb, global_batch=space.global_batch,
                    seq_len=space.seq_len, precision=space.precision,
                    schedule="interleaved-1f1b" if split.vpp > 1 else "1f1b",
                    attention=space.attention, optimizer_impl=space.optimizer_impl,
                    first_stage_layers=split.first_stage_layers, last_stage_layers=split.last_stage_layers,
                    embedding_in_split=split.embedding_in_split, loss_in_split=split.loss_in_split,
                )
