"""The host memory copies that resharding a tensor makes beside its collectives, as trainsim measure's split
executor runs them (measure/split_model.py: transform() and its autograd functions).

A collective library moves a tensor's bytes between devices (strategy.reshard prices that); the framework around
it lays the tensor out for the call and back: parts made contiguous before they are sent, received parts
concatenated into one tensor, a partial sum cloned before it is reduced in place. On a GPU those are device
copies, on a CPU host memory copies on the training thread; either way memory-bound work that the collective's
microbenchmark (one flat buffer, profile/collectives.py) does not contain. Per reshard step, walking the steps of
strategy.reshard.reshard (the executor's transform() walks the same), the bytes each side copies:

- partial sums reduce-scattered along dim d: forward, the local tensor cut into parts along d (a copy where d is
  not the leading batch dimension: torch.chunk's parts are strided there) and concatenated into one flat send
  buffer; backward (the gradient all-gathered), the received parts concatenated;
- partial sums all-reduced: forward, the local tensor cloned (the all-reduce runs in place); backward, nothing;
- all-to-all gathering g and splitting s: forward, cut along s (a copy unless s is the batch) and the received
  parts concatenated along g; backward, the same with g and s swapped;
- all-gather along d: forward, the received parts concatenated; backward (the gradient reduce-scattered), cut along
  d (a copy unless d is the batch) and concatenated into one flat buffer, as above;
- a local slice along d (no communication): forward, the kept part made contiguous (unless d is the batch);
  backward (the gradient all-gathered), the received parts concatenated.

And one more the executor makes without a reshard step: an op whose output dimension is split (a column-parallel
matmul or convolution) reading an input it needs whole clones its input's gradient before all-reducing it
(Megatron-LM's f; measure/split_model.ReduceGradients): reduce_gradients_copy_bytes.

Bytes are what one device copies (each byte read once and written once: an op of 2 x these bytes moved).
"""

from dataclasses import dataclass

from trainsim.strategy.placement import Placement
from trainsim.strategy.reshard import ReshardMove, divisible, local_bytes, reshard_moves

LEADING_DIM = "batch"  # dimension 0 of every tensor the executor reshards: its parts are contiguous views


@dataclass(frozen=True, slots=True)
class ReshardCopies:
    """Bytes one device copies on the host for one reshard: in the forward pass and in its backward."""

    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0

    def __add__(self, other: "ReshardCopies") -> "ReshardCopies":
        return ReshardCopies(self.fwd_bytes + other.fwd_bytes, self.bwd_bytes + other.bwd_bytes)


def _cut(dim: str, bytes_: float) -> float:
    """Cutting a tensor into parts along dim and making them contiguous: a copy unless dim is the leading one."""
    return 0.0 if dim == LEADING_DIM else bytes_


def reshard_copies(src: Placement, dst: Placement, full_bytes: float) -> ReshardCopies:
    """The host copies of turning src into dst for a tensor of full_bytes (the module doc's rules, per step of
    strategy.reshard.reshard_moves). Degrees that do not divide each other (a point-to-point exchange) copy nothing
    beyond the transfer."""
    if src == dst or not divisible(src, dst):
        return ReshardCopies()
    total = ReshardCopies()
    for move in reshard_moves(src, dst):
        total += _move_copies(move, move.bytes_before(full_bytes), move.bytes_after(full_bytes))
    return total


def _move_copies(move: ReshardMove, before_bytes: float, after_bytes: float) -> ReshardCopies:
    """One move's copies (the module doc's rules); before_bytes / after_bytes: a device's part before and after."""
    if move.kind == "reduce-scatter":
        assert move.split is not None
        return ReshardCopies(_cut(move.split, before_bytes) + before_bytes, before_bytes)
    if move.kind == "all-reduce":
        return ReshardCopies(before_bytes, 0.0)
    if move.kind == "all-to-all":
        assert move.split is not None and move.gathered is not None
        return ReshardCopies(_cut(move.split, before_bytes) + before_bytes,
                             _cut(move.gathered, before_bytes) + before_bytes)
    if move.kind == "all-gather":
        assert move.gathered is not None
        return ReshardCopies(after_bytes, _cut(move.gathered, after_bytes) + after_bytes)
    assert move.split is not None  # a local slice
    return ReshardCopies(_cut(move.split, before_bytes / move.ranks), before_bytes)


def reduce_gradients_copy_bytes(need: Placement, full_bytes: float) -> float:
    """The backward's clone of an input gradient that an output-split op all-reduces where its input needed no
    reshard (the module doc): the device's part of the input."""
    return local_bytes(need, full_bytes)
