"""The EmbeddingBag ops of DLRM execution traces priced by a lookup model, for the predictive trace simulation
(frontends.trace.predicted, Lin et al. Sec. III-D, Algorithm 1): the paper's kernel model of the embedding
lookups (Sec. III-E: forward and backward from E, D, L, batch and the reuse factors) takes the place of the
traced durations, the rest of the trace keeps predicted_trace_graph's kernel models, host overheads and
collective curves.

In a trace of measure.dlrm_rank (torch's CPU EmbeddingBag, sparse gradients):
- forward: a top-level `aten::embedding_bag` (weight, indices, offsets), one per piece the rank holds, in the
  order of its pieces;
- backward: a top-level `EmbeddingBagBackward0` whose `aten::_embedding_bag_backward` reads the same indices
  tensor as its forward (matched by storage), the sparse gradient's AccumulateGrad into the weight's .grad, then
  the sparse SGD update, a top-level `aten::add_` on the piece's weight. The lookup model's backward is the
  backward with the accumulation and the update (the microbenchmarks time them together, as FBGEMM fuses
  them), so those two take 0 s of their own.
A piece comes from the sharding plan (the rank's pieces in order, as the run built its bags) or, without a plan,
from the op's shapes (rows x dim of the weight, samples = the offsets, L = indices / samples; no index skew known).
"""

import math
from collections.abc import Sequence

from trainsim.embedding.lookup_model import LookupCostModel
from trainsim.embedding.sharding import ShardPiece
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError
from trainsim.frontends.trace.rank_trace import RankTrace, TraceOp

LOOKUP_FWD = "aten::embedding_bag"
LOOKUP_BWD = "EmbeddingBagBackward0"
LOOKUP_BWD_KERNEL = "aten::_embedding_bag_backward"
SPARSE_UPDATE = "aten::add_"
SPARSE_ACCUMULATE = "torch::autograd::AccumulateGrad"


def piece_from_op(op: TraceOp, rank: int) -> ShardPiece:
    """A forward EmbeddingBag's piece from its shapes: weight (rows x dim), indices, offsets (one per sample)."""
    if len(op.inputs) < 3 or len(op.inputs[0].shape) != 2:
        raise ConfigError("trace op", f"{op.name}#{op.node_id}", "an EmbeddingBag with weight, indices and offsets")
    rows, dim = op.inputs[0].shape
    samples = max(1, op.inputs[2].numel)
    pooling = max(op.inputs[1].numel, 1) / samples  # NB: an empty bag priced as one lookup
    table = Table(op.node_id, rows, dim, pooling, 0.0)
    return ShardPiece(table, "table-wise", rank, rows, dim, samples, pooling)


def lookup_op_seconds(traces: Sequence[RankTrace], lookups: LookupCostModel,
                      pieces: Sequence[Sequence[ShardPiece]] | None = None,
                      core_share: float = 1.0) -> list[dict[int, float]]:
    """Per rank, node id -> seconds of every EmbeddingBag op (forward, backward, sparse update) of its trace.
    pieces: per rank, the pieces it looks up in the order of its bags (ShardingPlan.pieces); None: from shapes.
    core_share: a rank's share of a core where the traced ranks outnumber the host's cores
    (hardware.device.core_share): the lookup model prices one uncontended thread, so each lookup takes
    1 / core_share of its price (the ranks take turns on the cores); the trace's other durations hold the turns
    already (estimate.sharded_dlrm.traced_result adds none)."""
    if not 0.0 < core_share <= 1.0:
        raise ConfigError("core_share", core_share, "a share of a core in (0, 1]")
    out = []
    for trace in traces:
        top = trace.top_level()
        forwards = [op for op in top if op.name == LOOKUP_FWD]
        if pieces is not None and len(pieces[trace.rank]) != len(forwards):
            raise ConfigError("pieces", len(pieces[trace.rank]), f"rank {trace.rank}'s trace has {len(forwards)} "
                              f"{LOOKUP_FWD} ops: one piece per op, in order")
        mine = [pieces[trace.rank][i] if pieces is not None else piece_from_op(op, trace.rank)
                for i, op in enumerate(forwards)]
        seconds = {op.node_id: lookups.lookup_s(piece, "fwd") / core_share
                   for op, piece in zip(forwards, mine, strict=True)}
        weights = {op.inputs[0].storage_id for op in forwards}
        for op, piece in _backward_pieces(trace, top, forwards, mine):
            seconds[op.node_id] = lookups.lookup_s(piece, "bwd") / core_share
        for op in top:
            if _sparse_gradient_step(op, weights):
                seconds[op.node_id] = 0.0
        out.append(seconds)
    return out


def _backward_pieces(trace: RankTrace, top: list[TraceOp], forwards: list[TraceOp], pieces: list[ShardPiece]
                     ) -> list[tuple[TraceOp, ShardPiece]]:
    """Each EmbeddingBag backward with its piece: the one whose forward read the indices its kernel reads; a
    backward whose kernel the profiler did not record takes the pieces left, in forward order."""
    by_indices = {op.inputs[1].storage_id: piece for op, piece in zip(forwards, pieces, strict=True)}
    backwards = [op for op in top if op.name == LOOKUP_BWD]
    matched = {op.node_id: by_indices.get(_backward_indices(trace, op)) for op in backwards}
    taken = {id(piece) for piece in matched.values() if piece is not None}
    left = [piece for piece in pieces if id(piece) not in taken]
    unmatched = [op for op in backwards if matched[op.node_id] is None]
    if len(left) != len(unmatched) or len(backwards) != len(pieces):
        raise ConfigError("trace", f"rank {trace.rank}", f"has {len(backwards)} {LOOKUP_BWD} ops for "
                          f"{len(pieces)} {LOOKUP_FWD} ops, {len(unmatched)} of them matched to no forward")
    for op, piece in zip(unmatched, left, strict=True):
        matched[op.node_id] = piece
    return [(op, piece) for op in backwards if (piece := matched[op.node_id]) is not None]


def _sparse_gradient_step(op: TraceOp, weights: set[int]) -> bool:
    """The sparse gradient's accumulation into the weight's .grad, or the SGD update of a bag's weight by it (a
    sparse tensor: the trace records no storage for it, id 0); a data-parallel bag's dense update is not one."""
    if op.name == SPARSE_ACCUMULATE:
        return bool(op.inputs) and op.inputs[0].storage_id == 0
    return (op.name == SPARSE_UPDATE and len(op.inputs) > 1 and op.inputs[0].storage_id in weights
            and op.inputs[1].storage_id == 0)


def _backward_indices(trace: RankTrace, op: TraceOp) -> int:
    for node in trace.descendants(op):
        if node.name == LOOKUP_BWD_KERNEL and len(node.inputs) > 1:
            return node.inputs[1].storage_id
    return -1


def realign_after_barrier(traces: Sequence[RankTrace]) -> None:
    """Each rank's traced iteration (its ProfilerStep) made to start where the rank left the first barrier of its
    trace (measure.dlrm_trace puts one right after the profiler starts, since the profiler starts on each rank
    after a different delay), in place: the wait at that barrier is no part of the iteration (neither a host gap
    nor the profiler's cost). A trace without a ProfilerStep or a barrier is left as it is."""
    for trace in traces:
        barriers = [op for op in trace.top_level() if op.collective is not None and op.collective.kind == "barrier"]
        if trace.step < 0 or not barriers or not barriers[0].measured:
            continue
        barrier, step = barriers[0], trace.ops[trace.step]
        collective = barrier.collective
        assert collective is not None
        left_s = barrier.end_s
        if collective.is_async and not math.isnan(collective.exec_duration_s):
            left_s = max(left_s, collective.exec_start_s + collective.exec_duration_s)
        if step.start_s < left_s < step.end_s:
            step.duration_s, step.start_s = step.end_s - left_s, left_s
