"""The EmbeddingBag ops of DLRM execution traces priced by a lookup model, for the predictive trace simulation
(frontends.trace.predicted, Lin et al. Sec. III-D, Algorithm 1): the paper's kernel model of the embedding
lookups (Sec. III-E: forward and backward from E, D, L, batch and the reuse factors) takes the place of the
traced durations, the rest of the trace keeps predicted_trace_graph's kernel models, host overheads and
collective curves.

In a trace of measure.dlrm_rank (torch's CPU EmbeddingBag, sparse gradients):
- forward: a top-level `aten::embedding_bag` (weight, indices, offsets), one per piece the rank holds, in the
  order of its pieces;
- backward: a top-level `EmbeddingBagBackward0` whose `aten::_embedding_bag_backward` reads the same indices
  tensor as its forward (matched by storage), then the sparse SGD update, a top-level `aten::add_` on the
  piece's weight. The lookup model's backward is the backward with that update (the microbenchmarks time them
  together, as FBGEMM fuses them), so the update takes 0 s of its own.
A piece comes from the sharding plan (the rank's pieces in order, as the run built its bags) or, without a plan,
from the op's shapes (rows x dim of the weight, samples = the offsets, L = indices / samples; no index skew known).
"""

from collections.abc import Sequence

from trainsim.cost.embedding_lookup import LookupCostModel
from trainsim.embedding.sharding import ShardPiece
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError
from trainsim.frontends.trace.rank_trace import RankTrace, TraceOp

LOOKUP_FWD = "aten::embedding_bag"
LOOKUP_BWD = "EmbeddingBagBackward0"
LOOKUP_BWD_KERNEL = "aten::_embedding_bag_backward"
SPARSE_UPDATE = "aten::add_"


def piece_from_op(op: TraceOp, rank: int) -> ShardPiece:
    """A forward EmbeddingBag's piece from its shapes: weight (rows x dim), indices, offsets (one per sample)."""
    if len(op.inputs) < 3 or len(op.inputs[0].shape) != 2:
        raise ConfigError("trace op", f"{op.name}#{op.node_id}", "an EmbeddingBag with weight, indices and offsets")
    rows, dim = op.inputs[0].shape
    samples = max(1, op.inputs[2].numel)
    pooling = op.inputs[1].numel / samples
    table = Table(op.node_id, rows, dim, pooling, 0.0)
    return ShardPiece(table, "table-wise", rank, rows, dim, samples, pooling)


def lookup_op_seconds(traces: Sequence[RankTrace], lookups: LookupCostModel,
                      pieces: Sequence[Sequence[ShardPiece]] | None = None) -> list[dict[int, float]]:
    """Per rank, node id -> seconds of every EmbeddingBag op (forward, backward, sparse update) of its trace.
    pieces: per rank, the pieces it looks up in the order of its bags (ShardingPlan.pieces); None: from shapes."""
    out = []
    for trace in traces:
        top = trace.top_level()
        forwards = [op for op in top if op.name == LOOKUP_FWD]
        if pieces is not None and len(pieces[trace.rank]) != len(forwards):
            raise ConfigError("pieces", len(pieces[trace.rank]), f"rank {trace.rank}'s trace has {len(forwards)} "
                              f"{LOOKUP_FWD} ops: one piece per op, in order")
        mine = [pieces[trace.rank][i] if pieces is not None else piece_from_op(op, trace.rank)
                for i, op in enumerate(forwards)]
        seconds = {op.node_id: lookups.lookup_s(piece, "fwd") for op, piece in zip(forwards, mine, strict=True)}
        by_indices = {op.inputs[1].storage_id: piece for op, piece in zip(forwards, mine, strict=True)}
        weights = {op.inputs[0].storage_id for op in forwards}
        previous = ""
        for op in top:
            if op.name == LOOKUP_BWD:
                piece = by_indices.get(_backward_indices(trace, op))
                if piece is None:
                    raise ConfigError("trace op", f"{op.name}#{op.node_id}", "a backward whose indices no traced "
                                      f"{LOOKUP_FWD} read")
                seconds[op.node_id] = lookups.lookup_s(piece, "bwd")
            elif (op.name == SPARSE_UPDATE and previous == LOOKUP_BWD and op.inputs
                  and op.inputs[0].storage_id in weights):
                seconds[op.node_id] = 0.0
            previous = op.name
        out.append(seconds)
    return out


def _backward_indices(trace: RankTrace, op: TraceOp) -> int:
    for node in trace.descendants(op):
        if node.name == LOOKUP_BWD_KERNEL and len(node.inputs) > 1:
            return node.inputs[1].storage_id
    return -1
