"""Strategy transformation (resharding): the collectives that turn one placement of a tensor into another
(Proteus, Sec. V-B: "infers collective communication primitives ... with communication pattern matching,
failing back to point-to-point communication if necessary"; the patterns as in Alpa, Zheng et al. 2022, Sec. 5).

A placement is how a group of `group` devices holds one tensor of (batch, seq, feature) dimensions: the number of
parts each dimension is split into, and `partial`: the number of partial sums (a reduction dimension split by the
producer) still to add. Devices beyond the product hold replicas. Patterns, in order:

- partial p -> none: reduce-scatter over p ranks when the destination splits a dimension p times more (the
  scatter lands on it), else all-reduce over p ranks;
- a dimension split less in the destination (gather factor g) while another is split more (factor s): all-to-all
  over min(g, s) ranks where they match;
- what remains gathered: all-gather; what remains split further: a local slice, no communication;
- degrees that do not divide each other: point-to-point (send-recv of the local part).

Buffer sizes follow comm.collectives' convention: all-reduce, all-to-all and send-recv take a rank's local
bytes, all-gather the gathered bytes, reduce-scatter the bytes a rank reduces.
"""

from dataclasses import dataclass
from math import gcd
from typing import Literal

from trainsim.errors import ConfigError
from trainsim.strategy.placement import DIMS, Placement

__all__ = ["DIMS", "Placement", "ReshardMove", "ReshardStep", "divisible", "local_bytes", "reshard",
           "reshard_moves", "with_degree"]

Collective = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]


@dataclass(frozen=True, slots=True)
class ReshardStep:
    collective: Collective
    ranks: int  # group size of the collective
    buffer_bytes: float  # in comm.collectives' convention (module doc)


def local_bytes(p: Placement, full_bytes: float) -> float:
    """Bytes of one device's part of a tensor of full_bytes (a partial sum is full-sized in its other dims)."""
    return full_bytes / (p.batch * p.seq * p.feature)


Move = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "slice"]


@dataclass(frozen=True, slots=True)
class ReshardMove:
    """One pattern of the walk from one placement to another (the module doc's order): its kind (a collective, or
    a local slice), the ranks it spans (a slice: its split factor), the parts of the tensor a device holds before
    and after it (its bytes: the tensor's over them; local_bytes) and the dimensions it gathers and splits (None
    where it does neither)."""

    kind: Move
    ranks: int
    parts_before: int
    parts_after: int
    gathered: str | None
    split: str | None

    def bytes_before(self, full_bytes: float) -> float:
        return full_bytes / self.parts_before

    def bytes_after(self, full_bytes: float) -> float:
        return full_bytes / self.parts_after


def _parts(p: Placement) -> int:
    return p.batch * p.seq * p.feature


def reshard_moves(src: Placement, dst: Placement) -> tuple[ReshardMove, ...]:
    """The patterns that turn src into dst, in order; src and dst divisible (divisible()), in one group."""
    moves: list[ReshardMove] = []
    cur = src
    if cur.partial > dst.partial:
        factor = cur.partial // dst.partial
        grow = next((dim for dim in DIMS if dst.degree(dim) >= cur.degree(dim) * factor), None)
        after = with_degree(cur, grow, cur.degree(grow) * factor if grow else 0, partial=dst.partial)
        moves.append(ReshardMove("reduce-scatter" if grow else "all-reduce", factor, _parts(cur), _parts(after),
                                 None, grow))
        cur = after
    gathers = {dim: cur.degree(dim) // dst.degree(dim) for dim in DIMS if cur.degree(dim) > dst.degree(dim)}
    splits = {dim: dst.degree(dim) // cur.degree(dim) for dim in DIMS if dst.degree(dim) > cur.degree(dim)}
    for g_dim, g in list(gathers.items()):
        for s_dim, s in list(splits.items()):
            k = gcd(g, s)
            if k > 1:
                after = with_degree(with_degree(cur, g_dim, cur.degree(g_dim) // k), s_dim, cur.degree(s_dim) * k)
                moves.append(ReshardMove("all-to-all", k, _parts(cur), _parts(after), g_dim, s_dim))
                cur = after
                g //= k
                gathers[g_dim], splits[s_dim] = g, s // k
    for g_dim, g in gathers.items():
        if g > 1:
            after = with_degree(cur, g_dim, cur.degree(g_dim) // g)
            moves.append(ReshardMove("all-gather", g, _parts(cur), _parts(after), g_dim, None))
            cur = after
    parts = _parts(cur)  # what remains split further is a local slice of what a device holds
    for s_dim, s in splits.items():
        if s > 1:
            moves.append(ReshardMove("slice", s, parts, parts * s, None, s_dim))
            parts *= s
    return tuple(moves)


def reshard(src: Placement, dst: Placement, full_bytes: float) -> tuple[ReshardStep, ...]:
    """The collectives that turn src into dst for a tensor of full_bytes (the whole tensor over the group)."""
    if src.group != dst.group:
        raise ConfigError("reshard", f"{src.describe()} -> {dst.describe()}", "needs one device group")
    if src == dst:
        return ()
    if not divisible(src, dst):
        return (ReshardStep("send-recv", 2, local_bytes(dst, full_bytes)),)
    # all-gather takes the gathered bytes; the others a rank's bytes before the step (module doc)
    return tuple(ReshardStep(move.kind, move.ranks, move.bytes_after(full_bytes) if move.kind == "all-gather"
                             else move.bytes_before(full_bytes))
                 for move in reshard_moves(src, dst) if move.kind != "slice")


def divisible(src: Placement, dst: Placement) -> bool:
    """Whether every degree of src and dst divides the other (else a point-to-point exchange)."""
    if src.partial % dst.partial != 0:
        return False
    return all(a % b == 0 or b % a == 0 for a, b in ((src.degree(d), dst.degree(d)) for d in DIMS))


def with_degree(p: Placement, dim: str | None, value: int, *, partial: int | None = None) -> Placement:
    """p with dimension dim at degree value (none where dim is None) and, when given, `partial` partial sums."""
    values = {d: p.degree(d) for d in DIMS}
    if dim is not None:
        values[dim] = value
    return Placement(p.group, values["batch"], values["seq"], values["feature"],
                     p.partial if partial is None else partial)
