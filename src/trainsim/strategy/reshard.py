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

__all__ = ["DIMS", "Placement", "ReshardStep", "divisible", "local_bytes", "reshard", "with_degree"]

Collective = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]


@dataclass(frozen=True, slots=True)
class ReshardStep:
    collective: Collective
    ranks: int  # group size of the collective
    buffer_bytes: float  # in comm.collectives' convention (module doc)


def local_bytes(p: Placement, full_bytes: float) -> float:
    """Bytes of one device's part of a tensor of full_bytes (a partial sum is full-sized in its other dims)."""
    return full_bytes / (p.batch * p.seq * p.feature)


def reshard(src: Placement, dst: Placement, full_bytes: float) -> tuple[ReshardStep, ...]:
    """The collectives that turn src into dst for a tensor of full_bytes (the whole tensor over the group)."""
    if src.group != dst.group:
        raise ConfigError("reshard", f"{src.describe()} -> {dst.describe()}", "needs one device group")
    if src == dst:
        return ()
    if not divisible(src, dst):
        return (ReshardStep("send-recv", 2, local_bytes(dst, full_bytes)),)
    steps: list[ReshardStep] = []
    cur = src
    if cur.partial > dst.partial:
        factor = cur.partial // dst.partial
        grow = next((dim for dim in DIMS if dst.degree(dim) >= cur.degree(dim) * factor), None)
        here = local_bytes(cur, full_bytes)
        if grow is not None:
            steps.append(ReshardStep("reduce-scatter", factor, here))
            cur = with_degree(cur, grow, cur.degree(grow) * factor, partial=dst.partial)
        else:
            steps.append(ReshardStep("all-reduce", factor, here))
            cur = with_degree(cur, None, 0, partial=dst.partial)
    gathers = {dim: cur.degree(dim) // dst.degree(dim) for dim in DIMS if cur.degree(dim) > dst.degree(dim)}
    splits = {dim: dst.degree(dim) // cur.degree(dim) for dim in DIMS if dst.degree(dim) > cur.degree(dim)}
    for g_dim, g in list(gathers.items()):
        for s_dim, s in list(splits.items()):
            k = gcd(g, s)
            if k > 1:
                steps.append(ReshardStep("all-to-all", k, local_bytes(cur, full_bytes)))
                cur = with_degree(with_degree(cur, g_dim, cur.degree(g_dim) // k), s_dim, cur.degree(s_dim) * k)
                g //= k
                gathers[g_dim], splits[s_dim] = g, s // k
    for g_dim, g in gathers.items():
        if g > 1:
            cur = with_degree(cur, g_dim, cur.degree(g_dim) // g)
            steps.append(ReshardStep("all-gather", g, local_bytes(cur, full_bytes)))
    # what remains split further is a local slice of what a device holds
    return tuple(steps)


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
