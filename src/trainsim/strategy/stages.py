"""Pipeline stages: how many transformer blocks each (virtual) pipeline stage holds, and which layers (and how
many repeats) each pipeline rank holds.

The split follows Megatron-Core (megatron/core/transformer/transformer_block.py get_num_layers_to_build and
transformer_config.py __post_init__, megatron-core 0.16.1): by default the blocks are split evenly over the
pp x vpp virtual stages; `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage` fix the
first and last rank's blocks and split the rest evenly over the middle ranks;
`account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split` count the embedding and the
loss (output layer + loss) as one layer each in the split, taking one block off the first (last) virtual stage.
Megatron-Core refuses a split that does not divide; here the remainder goes one layer each to the first
virtual stages in model order, as torchtitan (torchtitan/distributed/pipeline_parallel.py
generate_llm_fqn_per_model_part, torchtitan 0.3.0) and DeepSpeed (deepspeed/runtime/utils.py partition_uniform,
deepspeed 0.19.8) deal it; where the division is exact the result is Megatron-Core's.

Virtual stage c * pp + r is model chunk c of pipeline rank r (Megatron-LM's interleaved placement).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from trainsim.errors import ConfigError
from trainsim.ir.graph import Layer, OpGraph
from trainsim.strategy.parallel import ParallelSpec

BLOCK_KINDS = ("block", "moe_block")


@dataclass(frozen=True, slots=True)
class StagePart:
    layer: Layer
    count: float  # repeats of this layer on the stage (fractional when blocks do not split evenly by kind)


def deal(items: int, slots: int) -> list[int]:
    """`items` over `slots` as evenly as possible, the first `items mod slots` slots one more (torchtitan's and
    DeepSpeed's remainder rule)."""
    base, extra = divmod(items, slots)
    return [base + (1 if slot < extra else 0) for slot in range(slots)]


def _rank_to_chunks(per_rank: Sequence[int], pp: int, vpp: int) -> tuple[int, ...]:
    """Per-rank block counts dealt over each rank's vpp chunks, in virtual-stage order (c * pp + r)."""
    chunks = [deal(count, vpp) for count in per_rank]
    return tuple(chunks[vs % pp][vs // pp] for vs in range(pp * vpp))


def split_blocks(num_blocks: int, pp: int, vpp: int = 1, *, first: int = 0, last: int = 0,
                 embedding: bool = False, loss: bool = False, explicit: Sequence[int] = (),
                 allow_empty: bool = False) -> tuple[int, ...]:
    """Transformer blocks per virtual stage (pp x vpp entries, virtual stage c * pp + r is chunk c of rank r).

    first / last: the first / last rank's blocks (0 = not fixed), dealt over its vpp chunks; the other blocks
    are dealt over the middle ranks' virtual stages in model order. embedding / loss: count the embedding /
    the loss as a layer of the first / last virtual stage. explicit: blocks per rank (pp entries, each dealt
    over the rank's chunks) or per virtual stage (pp x vpp entries); it excludes the other settings.
    Raises ConfigError (naming the field) where the settings do not make a split of num_blocks, or leave a
    middle virtual stage without a layer (unless allow_empty: a strategy tree's lowering of fewer blocks than
    virtual stages)."""
    stages = pp * vpp
    if explicit:
        return _explicit_split(num_blocks, pp, vpp, explicit, allow_empty)
    if first or last:
        if embedding or loss:
            raise ConfigError("first_stage_layers", first or last, "cannot be combined with embedding_in_split or "
                              "loss_in_split (as in Megatron-Core)")
        counts = _first_last_split(num_blocks, pp, vpp, first, last)
    else:
        effective = num_blocks + int(embedding) + int(loss)
        counts = deal(effective, stages)
        if embedding:
            counts[0] -= 1
        if loss:
            counts[-1] -= 1
        if min(counts) < 0:
            raise ConfigError("pp", pp, f"pp x vpp = {stages} virtual stages need at least {stages} layers; the "
                              f"model has {num_blocks} blocks + {int(embedding) + int(loss)} counted "
                              "embedding/loss layers")
    return tuple(counts) if allow_empty else _checked(tuple(counts), pp, vpp, num_blocks)


def _first_last_split(num_blocks: int, pp: int, vpp: int, first: int, last: int) -> list[int]:
    """Megatron-Core's uneven first / last stages; the rest dealt over the middle ranks' virtual stages."""
    fixed = [(rank, count) for rank, count in ((0, first), (pp - 1, last)) if count]
    middle_ranks = [rank for rank in range(pp) if rank not in dict(fixed)]
    rest = num_blocks - first - last
    if rest < 0 or (rest > 0) != bool(middle_ranks):
        field, value = ("first_stage_layers", first) if first else ("last_stage_layers", last)
        raise ConfigError(field, value, f"first_stage_layers + last_stage_layers = {first + last} leaves "
                          f"{rest} of the {num_blocks} layers for {len(middle_ranks)} middle stages of pp={pp}")
    per_vs = dict.fromkeys(range(pp * vpp), 0)
    for rank, count in fixed:
        for chunk, blocks in enumerate(deal(count, vpp)):
            per_vs[chunk * pp + rank] = blocks
    middle = [vs for vs in range(pp * vpp) if vs % pp in middle_ranks]
    for vs, blocks in zip(middle, deal(rest, len(middle)) if middle else [], strict=True):
        per_vs[vs] = blocks
    return [per_vs[vs] for vs in range(pp * vpp)]


def _explicit_split(num_blocks: int, pp: int, vpp: int, explicit: Sequence[int], allow_empty: bool) -> tuple[int, ...]:
    text = ",".join(str(n) for n in explicit)
    if len(explicit) not in (pp, pp * vpp):
        allowed = f"{pp} entries (one per pipeline rank)" + (f" or {pp * vpp} (one per virtual stage)"
                                                              if vpp > 1 else "")
        raise ConfigError("stage_layers", text, f"has {len(explicit)} entries; allowed: {allowed}")
    if sum(explicit) != num_blocks:
        raise ConfigError("stage_layers", text, f"sums to {sum(explicit)}; must equal the model's {num_blocks} "
                          "layers")
    counts = tuple(explicit) if len(explicit) == pp * vpp else _rank_to_chunks(explicit, pp, vpp)
    return counts if allow_empty else _checked(counts, pp, vpp, num_blocks, field="stage_layers", value=text)


def _checked(counts: tuple[int, ...], pp: int, vpp: int, num_blocks: int, *, field: str = "pp",
             value: object = None) -> tuple[int, ...]:
    """Every virtual stage holds a layer: a block, or the embedding (the first) or the head (the last)."""
    for vs, blocks in enumerate(counts):
        if blocks == 0 and 0 < vs < len(counts) - 1:
            raise ConfigError(field, pp if value is None else value,
                              f"leaves virtual stage {vs} (chunk {vs // pp} of pipeline rank {vs % pp}) without a "
                              f"layer ({num_blocks} layers on pp={pp} x vpp={vpp})")
    return counts


def virtual_stage_blocks(num_blocks: int, par: ParallelSpec, *, allow_empty: bool = False) -> tuple[int, ...]:
    """split_blocks with the strategy's settings."""
    return _cached_split(num_blocks, par.pp, par.vpp, par.first_stage_layers, par.last_stage_layers,
                         par.embedding_in_split, par.loss_in_split, par.stage_layers, allow_empty)


@lru_cache(maxsize=4096)
def _cached_split(num_blocks: int, pp: int, vpp: int, first: int, last: int, embedding: bool, loss: bool,
                  explicit: tuple[int, ...], allow_empty: bool) -> tuple[int, ...]:
    """split_blocks, made once per settings (a search's make_job asks for the same few splits once per plan; a
    refusal raises anew each time)."""
    return split_blocks(num_blocks, pp, vpp, first=first, last=last, embedding=embedding, loss=loss,
                        explicit=explicit, allow_empty=allow_empty)


def rank_blocks(num_blocks: int, par: ParallelSpec) -> tuple[int, ...]:
    """Transformer blocks per pipeline rank (the sum over its chunks)."""
    per_vs = virtual_stage_blocks(num_blocks, par)
    return tuple(sum(per_vs[chunk * par.pp + rank] for chunk in range(par.vpp)) for rank in range(par.pp))


def num_blocks(graph: OpGraph) -> int:
    """The transformer blocks (dense and mixture-of-experts) of a graph; 0 for a model without blocks."""
    return sum(layer.count for layer in graph.layers if layer.kind in BLOCK_KINDS)


def is_even_split(par: ParallelSpec) -> bool:
    """No split setting given: the blocks are split evenly (partition_stages' default)."""
    return not (par.first_stage_layers or par.last_stage_layers or par.embedding_in_split or par.loss_in_split
                or par.stage_layers)


def is_even_graph_split(graph: OpGraph, par: ParallelSpec) -> bool:
    """The graph's blocks split evenly over the pp x vpp virtual stages with no split setting, and its dense and
    MoE blocks interleaved (a graph whose dense blocks lead needs the virtual stages' blocks to place them)."""
    blocks = num_blocks(graph)
    return not blocks or (is_even_split(par) and blocks % (par.pp * par.vpp) == 0
                          and not graph.leading_dense_blocks)


def plan_stages(graph: OpGraph, par: ParallelSpec) -> list[list[StagePart]]:
    """partition_stages with the strategy's split (per rank)."""
    if is_even_graph_split(graph, par):
        return partition_stages(graph, par.pp)
    blocks = num_blocks(graph)
    return partition_stages(graph, par.pp, rank_blocks(blocks, par), virtual_stage_blocks(blocks, par))


def leading_dense_per_rank(leading: int, virtual_blocks: Sequence[int], pp: int) -> list[int]:
    """The leading dense blocks (the first `leading` in model order) each pipeline rank holds, given the blocks
    of each virtual stage (c * pp + r is chunk c of rank r, model order)."""
    dense = [0] * pp
    left = leading
    for vs, blocks in enumerate(virtual_blocks):
        taken = min(left, blocks)
        dense[vs % pp] += taken
        left -= taken
    return dense


def partition_stages(graph: OpGraph, pp: int, blocks_per_rank: Sequence[int] | None = None,
                     virtual_blocks: Sequence[int] | None = None) -> list[list[StagePart]]:
    """Blocks split over pp stages, evenly (as Megatron-LM does) or `blocks_per_rank`; the embedding on the first
    stage, the head on the last. A rank's blocks of each kind (dense, mixture-of-experts) are in the proportion
    of the model's, or, where the dense blocks lead (OpGraph.leading_dense_blocks), the leading dense blocks its
    virtual stages hold (virtual_blocks: blocks per virtual stage; None: the ranks' blocks, one chunk each).
    Non-block layers of CNNs and DLRMs are dealt out in order, balancing the layer count."""
    stages: list[list[StagePart]] = [[] for _ in range(pp)]
    total = num_blocks(graph)
    if total and graph.leading_dense_blocks:
        per_rank = list(blocks_per_rank) if blocks_per_rank is not None else deal(total, pp)
        return _dense_first_stages(graph, per_rank, virtual_blocks or per_rank)
    if total:
        for layer in graph.layers:
            if layer.kind == "embedding":
                stages[0].append(StagePart(layer, 1.0))
            elif layer.kind == "head":
                stages[-1].append(StagePart(layer, 1.0))
            elif layer.kind in BLOCK_KINDS:
                even = StagePart(layer, layer.count / pp)  # NB: frozen; one object for every rank's stage
                for rank, stage in enumerate(stages):
                    if blocks_per_rank is None:
                        stage.append(even)
                    elif blocks_per_rank[rank]:
                        stage.append(StagePart(layer, layer.count * blocks_per_rank[rank] / total))
            else:
                stages[0].append(StagePart(layer, float(layer.count)))
        return stages
    flat = [layer for layer in graph.layers for _ in range(layer.count)]
    if len(flat) < pp:
        raise ConfigError("pp", pp, f"must be at most the {len(flat)} layers of {graph.model_name} (a stage with no "
                          "layer)")
    for index, layer in enumerate(flat):
        stages[min(pp - 1, index * pp // max(len(flat), 1))].append(StagePart(layer, 1.0))
    return stages


def _dense_first_stages(graph: OpGraph, per_rank: Sequence[int], virtual_blocks: Sequence[int]
                        ) -> list[list[StagePart]]:
    """partition_stages of a graph whose dense blocks lead: each rank's leading dense blocks
    (leading_dense_per_rank), then its MoE blocks; the embedding on the first stage, the head on the last."""
    pp = len(per_rank)
    dense = leading_dense_per_rank(graph.leading_dense_blocks, virtual_blocks, pp)
    stages: list[list[StagePart]] = [[] for _ in range(pp)]
    for layer in graph.layers:
        for rank, stage in enumerate(stages):
            count = {"embedding": 1 if rank == 0 else 0, "head": 1 if rank == pp - 1 else 0,
                     "block": dense[rank], "moe_block": per_rank[rank] - dense[rank]}[layer.kind]
            if count:
                stage.append(StagePart(layer, float(count)))
    return stages


def in_flight_micro_batches(schedule: str, stage: int, pp: int, vpp: int, num_micro_batches: int,
                            chunk_shares: Sequence[float] | None = None) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the whole stage's activations.

    GPipe holds all m; 1F1B holds p - i on stage i (Narayanan et al. 2021); interleaved 1F1B holds
    (2(p - i - 1) + (v - 1) p + 1) model chunks of 1/v stage each (Megatron-LM's warm-up count), which for the
    first stage is p + (p - 1)/v stages' worth (Korthikanti et al. 2022, sec. 4.2.3).
    chunk_shares: for interleaved 1F1B, each chunk's share of the stage's activations (summing to 1) where
    they differ: the peak of the running sum over the rank's order of steps (interleaved_peak_chunks).
    """
    if schedule == "gpipe":
        return float(num_micro_batches)
    if schedule == "interleaved-1f1b":
        if chunk_shares is not None:
            return interleaved_peak_chunks(stage, pp, vpp, num_micro_batches, chunk_shares)
        chunks = 2 * (pp - stage - 1) + (vpp - 1) * pp + 1
        return min(chunks, num_micro_batches * vpp) / vpp
    return float(min(num_micro_batches, pp - stage))


def interleaved_peak_chunks(stage: int, pp: int, vpp: int, num_micro_batches: int,
                            chunk_shares: Sequence[float]) -> float:
    """The most activations (in whole-stage units) rank `stage` holds over interleaved 1F1B, chunks weighted by
    their shares: W = 2(p - i - 1) + (v - 1) p warm-up forwards, then forward k + W and backward k alternate.
    Forward k runs chunk (k mod pv) // p, backward k chunk v - 1 - (k mod pv) // p (micro-batches in groups of
    p per chunk: get_model_chunk_id / get_schedule_table in megatron/core/pipeline_parallel/schedules.py,
    megatron-core 0.16.1, whose warm-up count this is). With unequal chunks the peak can come after the
    warm-up: a forward of a large chunk while a backward frees a small one."""
    total = num_micro_batches * vpp
    warmup = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    group = pp * vpp

    def chunk(k: int, forward: bool) -> int:
        position = (k % group) // pp
        return position if forward else vpp - 1 - position

    held = sum(chunk_shares[chunk(k, True)] for k in range(warmup))
    peak = held
    for k in range(total - warmup):
        held += chunk_shares[chunk(k + warmup, True)]
        peak = max(peak, held)
        held -= chunk_shares[chunk(k, False)]
    return peak
