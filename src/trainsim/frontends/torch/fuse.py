"""Lower the eager op log of the torch front-end to the kernels a fused training stack runs (imports nothing
heavy; works on the log's dataflow), so that a traced model is priced like the catalog's analytic one.

Two rewrites, each within one layer segment:

1. Horizontal GEMM fusion: linears that read the same activation (LLaMA's q/k/v projections, gate and up) are
   one GEMM with the output widths summed, as Megatron-LM's fused QKV and gate-up projections are (Shoeybi et
   al. 2019). Their backward GEMMs fuse the same way (one data-gradient GEMM writes the input gradient
   once, one weight-gradient GEMM reads the input once), and the additions that summed the separate input
   gradients disappear.
2. Pointwise fusion: each maximal run of consecutive memory-bound ops (elementwise and norm; softmax and loss
   apart from them) is one kernel moving its external tensors once: the tensors it reads that it did not write,
   and the tensors it writes that another kernel reads. A backward kernel recomputes the forward kernel's
   intermediates from that kernel's inputs instead of reading them (as fused norm and activation kernels do, and
   as torch.compile's min-cut partitioner chooses for pointwise ops), so a forward kernel writes nothing that
   only a backward pointwise kernel reads.

Embedding lookups move the rows they touch: the forward gathers tokens x dim (read and write), the backward
scatter-adds them (reads the gradient, reads and writes the rows), not the whole table.

FLOPs and the activations kept for the backward pass are kept (the sums of the fused ops'); what changes is the
kernel count and the bytes moved.
"""

from collections.abc import Iterable
from dataclasses import dataclass, replace

from trainsim.frontends.torch.oplog import LoggedOp, OpLog, storage_dtype
from trainsim.hardware.device import BYTES_PER_DTYPE, DType
from trainsim.ir.graph import Op, OpKind

POINTWISE: frozenset[OpKind] = frozenset({"elementwise", "norm", "softmax", "loss"})
_KIND_ORDER: tuple[OpKind, ...] = ("loss", "softmax", "norm", "elementwise")
_WIDTH: dict[DType, int] = {"fp8": 0, "fp16": 1, "bf16": 1, "tf32": 2, "fp32": 3}


def fuse_log(log: OpLog) -> None:
    """Rewrite log.ops in place: fused GEMMs, fused pointwise kernels, row-wise embedding traffic."""
    ops = _fuse_gemms(log.ops, log)
    ops = [_embedding_rows(lo, log) for lo in ops]
    log.ops[:] = _fuse_pointwise(ops, log)


# ---- 1. horizontal GEMM fusion ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Group:
    members: list[LoggedOp]  # the forward GEMMs, in order
    activation: int  # the value id they all read

    @property
    def paths(self) -> set[str]:
        return {lo.op.module_path for lo in self.members}


def _fuse_gemms(ops: list[LoggedOp], log: OpLog) -> list[LoggedOp]:
    groups = _gemm_groups(ops, log)
    if not groups:
        return list(ops)
    out = list(ops)
    for group in groups:
        out = _apply_group(out, group)
    return out


def _gemm_groups(ops: list[LoggedOp], log: OpLog) -> list[_Group]:
    by_input: dict[tuple[str, int], list[LoggedOp]] = {}
    for lo in ops:
        if lo.op.phase != "fwd" or lo.op.kind != "matmul" or len(lo.op.shape) != 4:
            continue
        weights = [v for v in lo.reads if v in log.param_values]
        activations = [v for v in lo.reads if v not in log.param_values]
        if len(weights) == 0 or len(activations) != 1:
            continue
        by_input.setdefault((lo.segment, activations[0]), []).append(lo)
    return [_Group(members, key[1]) for key, members in by_input.items()
            if len(members) > 1 and len({lo.op.module_path for lo in members}) == len(members)
            and len({(lo.op.shape[0], lo.op.shape[1], lo.op.shape[3], lo.op.dtype) for lo in members}) == 1]


def _apply_group(ops: list[LoggedOp], group: _Group) -> list[LoggedOp]:
    first = group.members[0]
    batch, tokens, _, width_in = first.op.shape
    widths = {lo.op.module_path: lo.op.shape[2] for lo in group.members}
    total = sum(widths.values())
    element = BYTES_PER_DTYPE[storage_dtype(first.op.dtype)]
    shared = float(batch * tokens * width_in * element)  # the activation, or its gradient
    fwd = _merged(group.members, (batch, tokens, total, width_in), shared, first, _writes(group.members))
    roles: dict[str, list[LoggedOp]] = {"dgrad": [], "wgrad": []}
    for lo in ops:
        if lo.op.phase == "bwd" and lo.op.kind == "matmul" and lo.op.module_path in widths:
            roles[_role(lo.op, tokens, width_in, widths[lo.op.module_path], roles)].append(lo)
    replaced: dict[int, LoggedOp | None] = {id(lo): None for lo in group.members[1:]}
    replaced[id(first)] = fwd
    if len(roles["dgrad"]) == len(group.members):
        summed = _summing_adds(ops, roles["dgrad"])
        replaced.update({id(lo): None for lo in roles["dgrad"][:-1] + summed})
        writes = _writes(roles["dgrad"] + summed)
        replaced[id(roles["dgrad"][-1])] = _merged(roles["dgrad"], (batch, tokens, width_in, total), shared,
                                                   roles["dgrad"][-1], writes)
    if len(roles["wgrad"]) == len(group.members):
        replaced.update({id(lo): None for lo in roles["wgrad"][:-1]})
        replaced[id(roles["wgrad"][-1])] = _merged(roles["wgrad"], (batch, total, width_in, tokens), shared,
                                                   roles["wgrad"][-1], _writes(roles["wgrad"]))
    kept = [replaced.get(id(lo), lo) for lo in ops]
    return [lo for lo in kept if lo is not None]


def _role(op: Op, tokens: int, width_in: int, width_out: int, roles: dict[str, list[LoggedOp]]) -> str:
    """A data-gradient GEMM is (batch, tokens, in, out), a weight-gradient one (batch, out, in, tokens); when
    both read alike (tokens == out) they have one shape and either role fits: fill dgrad first."""
    is_dgrad = op.shape[1:] == (tokens, width_in, width_out)
    is_wgrad = op.shape[1:] in ((width_out, width_in, tokens), (width_in, width_out, tokens))
    if is_dgrad and is_wgrad:
        return "dgrad" if len(roles["dgrad"]) <= len(roles["wgrad"]) else "wgrad"
    return "dgrad" if is_dgrad else "wgrad"


def _summing_adds(ops: list[LoggedOp], dgrads: list[LoggedOp]) -> list[LoggedOp]:
    """The backward additions that only sum the separate input gradients."""
    partial = set(_writes(dgrads))
    adds: list[LoggedOp] = []
    for lo in ops:
        if lo.op.phase == "bwd" and lo.op.name == "add" and lo.reads and set(lo.reads) <= partial:
            adds.append(lo)
            partial.update(lo.writes)
    return adds


def _writes(ops: Iterable[LoggedOp]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(v for lo in ops for v in lo.writes))


def _merged(members: list[LoggedOp], shape: tuple[int, int, int, int], shared_bytes: float, at: LoggedOp,
            writes: tuple[int, ...]) -> LoggedOp:
    """One GEMM for the members: FLOPs summed, the shared operand (input or input gradient) moved once."""
    paths = [lo.op.module_path for lo in members]
    moved = sum(lo.op.bytes_moved for lo in members) - (len(members) - 1) * shared_bytes
    op = replace(at.op, module_path=_common_path(paths), flops=sum(lo.op.flops for lo in members),
                 bytes_moved=moved, shape=shape,
                 saved_bytes=sum(lo.op.saved_bytes for lo in members),
                 saved_aux_bytes=sum(lo.op.saved_aux_bytes for lo in members))
    reads = tuple(dict.fromkeys(v for lo in members for v in lo.reads))
    return LoggedOp(op, at.segment, reads, writes)


# ---- embedding rows ----------------------------------------------------------------------------------------------
def _embedding_rows(lo: LoggedOp, log: OpLog) -> LoggedOp:
    if lo.op.kind != "embedding" or not lo.writes:
        return lo
    rows = sum(log.value_bytes.get(v, 0.0) for v in lo.writes)
    if lo.op.phase == "fwd":
        return replace(lo, op=replace(lo.op, bytes_moved=2.0 * rows))
    touched = sum(log.value_bytes.get(v, 0.0) for v in lo.reads if v not in log.param_values)
    return replace(lo, op=replace(lo.op, bytes_moved=3.0 * min(touched, rows)))


# ---- 2. pointwise fusion -----------------------------------------------------------------------------------------
def _fuse_pointwise(ops: list[LoggedOp], log: OpLog) -> list[LoggedOp]:
    runs = _runs(ops)
    fwd_inputs: dict[int, tuple[int, ...]] = {}  # value written inside a forward kernel -> that kernel's inputs
    bwd_kernels: set[int] = set()
    for run in runs:
        if len(run) and run[0].op.phase == "fwd" and _fusible(run[0]):
            inputs = _external_reads(run)
            fwd_inputs.update({v: inputs for lo in run for v in lo.writes})
        elif len(run) and _fusible(run[0]):
            bwd_kernels.update(id(lo) for lo in run)
    readers: dict[int, list[LoggedOp]] = {}
    for lo in ops:
        for v in lo.reads:
            readers.setdefault(v, []).append(lo)
    fused: list[LoggedOp] = []
    for run in runs:
        if not _fusible(run[0]):
            fused.extend(run)
            continue
        fused.append(_kernel(run, log, fwd_inputs, readers, bwd_kernels))
    return fused


def _fusible(lo: LoggedOp) -> bool:
    return lo.op.kind in POINTWISE and bool(lo.reads or lo.writes)


def _family(lo: LoggedOp) -> str:
    """A loss (softmax and NLL over the vocabulary) is a kernel of its own: cross-entropy as PyTorch and
    Megatron-LM run it reads the logits the model materialised (cast to fp32), not a fused cast."""
    return "loss" if lo.op.kind in ("loss", "softmax") else "pointwise"


def _runs(ops: list[LoggedOp]) -> list[list[LoggedOp]]:
    runs: list[list[LoggedOp]] = []
    for lo in ops:
        last = runs[-1][-1] if runs else None
        if (last is not None and _fusible(lo) and _fusible(last) and last.segment == lo.segment
                and last.op.phase == lo.op.phase and _family(last) == _family(lo)):
            runs[-1].append(lo)
        else:
            runs.append([lo])
    return runs


def _external_reads(run: list[LoggedOp]) -> tuple[int, ...]:
    inside = {v for lo in run for v in lo.writes}
    return tuple(dict.fromkeys(v for lo in run for v in lo.reads if v not in inside))


def _kernel(run: list[LoggedOp], log: OpLog, fwd_inputs: dict[int, tuple[int, ...]],
            readers: dict[int, list[LoggedOp]], bwd_kernels: set[int]) -> LoggedOp:
    members = {id(lo) for lo in run}
    reads = _external_reads(run)
    if run[0].op.phase == "bwd":  # recompute the forward kernels' intermediates from their inputs
        reads = tuple(dict.fromkeys(r for v in reads for r in fwd_inputs.get(v, (v,))))
    recomputed = bwd_kernels if run[0].op.phase == "fwd" else set()  # backward kernels recompute, not read
    written = tuple(dict.fromkeys(
        v for lo in run for v in lo.writes
        if any(id(other) not in members and id(other) not in recomputed for other in readers.get(v, ()))))
    moved = sum(log.value_bytes.get(v, 0.0) for v in reads + written)
    biggest = max(run, key=lambda lo: lo.op.bytes_moved).op
    kind: OpKind = next(k for k in _KIND_ORDER if any(lo.op.kind == k for lo in run))
    dtypes: list[DType] = [lo.op.dtype for lo in run]
    dtype: DType = max(dtypes, key=lambda d: _WIDTH[d])
    name = run[0].op.name if len(run) == 1 else f"{run[0].op.name}+{len(run) - 1}"
    op = Op(name, kind, _common_path([lo.op.module_path for lo in run]), run[0].op.phase, dtype,
            sum(lo.op.flops for lo in run), moved, biggest.shape,
            recompute_selective=all(lo.op.recompute_selective for lo in run),
            saved_bytes=sum(lo.op.saved_bytes for lo in run), saved_aux_bytes=sum(lo.op.saved_aux_bytes for lo in run))
    return LoggedOp(op, run[0].segment, reads, written)


def _common_path(paths: list[str]) -> str:
    parts = [path.split(".") for path in paths]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)
