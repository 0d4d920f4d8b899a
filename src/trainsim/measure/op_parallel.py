"""Tensor parallelism op by op: a strategy tree's per-op tp configs applied to the measured transformer (Proteus
Sec. IV-B: a split on any op takes effect), the way measure/parallelize.apply_tp applies Megatron's.

Each op runs at its tp degree d (measure/tp_degrees.py): d = tp is Megatron-LM's split over the tp group
(Shoeybi et al. 2019, Sec. 3), 1 < d < tp the same split over the d consecutive tp ranks of a sub-group (a
DeviceMesh of shape (tp / d, d), its "part" dimension: ranks r with the same r // d hold one copy, rank r its part
r % d), d = 1 the op whole on every tp rank. The split matmuls, the vocab-parallel lookup and the vocab-parallel
head are torch.distributed.tensor.parallel's (ColwiseParallel, RowwiseParallel, loss_parallel) over the op's
(sub-)mesh; a whole op is the plain module. Between two stages of a module at different degrees (one of them
whole) the tensor is resharded as the predicted plan reshards it: a split read whole is all-gathered over the
split's ranks (its backward keeps this rank's part of the whole gradient), a whole tensor read split is sliced
(its backward all-gathers the parts' gradients); q, k and v of a split qkv read by a whole core, the ffn features
of a split fc1 read by a whole fc2, the logits of a split projection read by a whole cross-entropy (no
vocab-parallel statistics). An MoE block's experts and router are measure/moe_splits.py's. A whole op's inputs
and output gradients are the same on every tp rank, so its weight's gradient is complete on each: it is not
summed over the tp group. The splits other than Megatron's (a column matmul by its reduction dimension, the core
by query rows, a dense MLP or a block's norms by tokens) are measure/op_splits.py's; the weights a split by tokens
holds whole on each rank have their gradients summed over its ranks after the backward (apply_op_tp returns them;
the Trainer sums them before the optimizer step).
Imported only inside measure workers (torch).
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.hidden_splits import (
    block_by_hidden_splits,
    head_norm_split,
    part_dim,
    positions_split,
)
from trainsim.measure.model import Attention, Block, Embedding, Head, MoE, TransformerChunk
from trainsim.measure.moe_splits import moe_over_tp
from trainsim.measure.op_collectives import Group, gather, slice_part
from trainsim.measure.op_splits import (
    TokenSplit,
    attention_by_rows,
    block_by_tokens,
    column_by_reduce,
    mlp_by_tokens,
)
from trainsim.measure.tp_degrees import TOKEN_OPS, TpDegrees, TpDims


class Meshes:
    """The tp mesh and, per degree 1 < d < tp, the sub-mesh of d consecutive tp ranks holding this rank's copy.
    Every rank builds the same sub-meshes in the same order (torch.distributed.new_group's rule). The job's ranks
    are its tp group (the command measures per-op tp configs with dp = pp = 1)."""

    def __init__(self, tp_mesh: DeviceMesh, degrees: set[int]) -> None:
        self.tp = tp_mesh.size()
        self.by_degree: dict[int, DeviceMesh] = {self.tp: tp_mesh}
        ranks = tp_mesh.mesh
        for d in sorted(degrees):
            if 1 < d < self.tp:
                grid = DeviceMesh(tp_mesh.device_type, ranks.view(self.tp // d, d), mesh_dim_names=("copy", "part"))
                self.by_degree[d] = grid["part"]

    def __getitem__(self, degree: int) -> DeviceMesh:
        return self.by_degree[degree]

    def group(self, degree: int) -> Group:
        mesh = self[degree]
        return Group(mesh.get_group(), degree, mesh.get_local_rank())

    def gather(self, x: torch.Tensor, degree: int) -> torch.Tensor:
        return gather(x, self.group(degree), -1)

    def slice(self, x: torch.Tensor, degree: int) -> torch.Tensor:
        return slice_part(x, self.group(degree), -1)

    def part_index(self, degree: int) -> int:
        return 0 if degree == 1 else self[degree].get_local_rank()


def apply_op_tp(chunk: TransformerChunk, spec: TransformerSpec, tp_mesh: DeviceMesh, degrees: TpDegrees,
                dims: TpDims | None = None) -> list[TokenSplit]:
    """Shard the chunk's ops over tp at their own degrees and splits (module doc); degrees and dims:
    measure.tp_degrees's, the ops they leave out at Megatron's split over tp. Returns the weights held whole by
    ranks that split their tokens, whose gradients the step sums over those ranks (op_collectives.sum_grads)."""
    tp = tp_mesh.size()
    dims = dims or {}
    meshes = Meshes(tp_mesh, {d for ops in degrees.values() for d in ops.values()})
    token_splits: list[TokenSplit] = []
    if chunk.embed is not None:
        _embedding(chunk.embed, meshes, degrees.get("embed", {}).get("lookup", tp))
    for index, block in enumerate(chunk.layers.values()):
        assert isinstance(block, Block)
        ops = degrees.get(f"block:{index}", {})
        split = dims.get(f"block:{index}", {})
        if split.get("norm1") == "seq":  # measure.tp_degrees: the block's other ops then take Megatron's
            block_by_tokens(block, tp_mesh, meshes.group(tp))
            block.attn.head_offset = meshes.part_index(tp) * spec.num_heads // tp
            token_splits.append(([*block.attn_norm.parameters(), *block.mlp_norm.parameters()], meshes.group(tp)))
            continue
        _attention(block.attn, spec, meshes, ops, split)
        token_splits += _mlp(block.mlp, meshes, ops, split)
        if any(part_dim(split.get(name)) is not None for name in TOKEN_OPS):  # measure.tp_degrees: over tp,
            block_by_hidden_splits(block, tp_mesh, meshes.group(tp), split)  # the other ops Megatron's
    if chunk.embed is not None and (positions := dims.get("embed", {}).get("pos_add")):
        token_splits += positions_split(chunk.embed, tp_mesh, meshes.group(tp), positions)
    if chunk.head is not None:
        ops = degrees.get("head", {})
        _head(chunk.head, meshes, ops.get("logits", tp), ops.get("cross_entropy", tp))
        if final_norm := dims.get("head", {}).get("final_norm"):  # measure.tp_degrees: the logits over tp
            token_splits += head_norm_split(chunk.head, tp_mesh, meshes.group(tp), final_norm)
    return token_splits


def _degree(ops: Mapping[str, int], names: tuple[str, ...], tp: int) -> int:
    return min((ops.get(name, tp) for name in names), default=tp)  # measure.tp_degrees: one degree per stage


def _column(module: nn.Module, names: list[str], meshes: Meshes, degree: int, read_at: int,
            whole_input: bool = True) -> None:
    """Column-parallel matmuls at `degree`, read by a stage at `read_at` (equal, or one of the two whole). Several
    of them reading the module's whole input share one f (fused_input)."""
    if degree > 1:
        if whole_input and len(names) > 1:
            fused_input(module, meshes[degree])
        out = Replicate() if read_at == 1 else Shard(-1)  # Replicate: an all-gather, its backward a slice
        parallelize_module(module, meshes[degree], {name: ColwiseParallel(output_layouts=out) for name in names})
    elif read_at > 1:
        def sliced(_module: nn.Module, _inputs: Any, y: torch.Tensor) -> torch.Tensor:
            return meshes.slice(y, read_at)

        for name in names:
            module.get_submodule(name).register_forward_hook(sliced)


def fused_input(module: nn.Module, mesh: DeviceMesh) -> None:
    """The module's whole input made one replicated DTensor before its column matmuls read it (q, k and v; gate
    and up), so their partial input gradients are summed first and all-reduced once, as Megatron-LM's fused
    projection does (one f, copy_to_tensor_model_parallel_region, per ColumnParallelLinear: megatron/core/
    tensor_parallel/layers.py, megatron-core 0.9.0), and as the predictor prices it; each ColwiseParallel would
    all-reduce its own. The input is the first positional argument, or a Hugging Face module's `hidden_states`
    keyword (torch's PrepareModuleInput, which this does, wants every input's layout)."""
    def replicated(x: Any) -> Any:
        return x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Replicate()], run_check=False)

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if args:
            return (replicated(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": replicated(kwargs["hidden_states"])}

    module.register_forward_pre_hook(hook, with_kwargs=True)


def _row(linear: nn.Module, parent: nn.Module, name: str, meshes: Meshes, degree: int, read_from: int,
         onto: int | None = None) -> None:
    """A row-parallel matmul at `degree` reading a stage at `read_from`; its partial sums all-reduced, or
    reduce-scattered onto dimension `onto` where the residual add after it is split (hidden_splits)."""
    if degree > 1:
        out = Replicate() if onto is None else Shard(onto)
        parallelize_module(parent, meshes[degree], {name: RowwiseParallel(output_layouts=out)})
        if read_from == 1:  # before RowwiseParallel's own hook takes the local input as its shard
            linear.register_forward_pre_hook(lambda _m, args: (meshes.slice(args[0], degree),), prepend=True)
    elif read_from > 1:
        linear.register_forward_pre_hook(lambda _m, args: (meshes.gather(args[0], read_from),))


def _attention(attn: Attention, spec: TransformerSpec, meshes: Meshes, ops: Mapping[str, int],
               split: Mapping[str, str]) -> None:
    tp = meshes.tp
    qkv, core, out = (_degree(ops, names, tp) for names in (("qkv",), ("rope", "attention", "softmax"),
                                                              ("out_proj",)))
    if split.get("attention") == "seq":  # measure.tp_degrees: qkv and out_proj Megatron's over the same ranks
        parallelize_module(attn, meshes[core], {"q": ColwiseParallel(), "k": ColwiseParallel(),
                                                "v": ColwiseParallel(), "o": RowwiseParallel()})
        attention_by_rows(attn, meshes.group(core))
        return
    if split.get("qkv") == "reduce":
        column_by_reduce(attn, ["q", "k", "v"], meshes[qkv], meshes.group(qkv), core)
    else:
        _column(attn, ["q", "k", "v"], meshes, qkv, core, part_dim(split.get("norm1")) is None)
    _row(attn.o, attn, "o", meshes, out, core, part_dim(split.get("residual1")))
    attn.head_offset = meshes.part_index(core) * spec.num_heads // core  # places ALiBi slopes


def _mlp(mlp: nn.Module, meshes: Meshes, ops: Mapping[str, int], split: Mapping[str, str]) -> list[TokenSplit]:
    tp = meshes.tp
    if isinstance(mlp, MoE):  # measure.tp_degrees: the experts Megatron's over tp, the router whole or by seq
        return [moe_over_tp(mlp, meshes[tp], meshes.group(tp), split.get("router") == "seq")]
    first, act, second = (_degree(ops, names, tp) for names in (("fc1", "gate_up"), ("gelu", "swiglu"),
                                                                 ("fc2", "down")))
    if split.get("fc1", split.get("gate_up")) == "seq":  # measure.tp_degrees: every op of the MLP by seq
        return [mlp_by_tokens(mlp, meshes.group(first))]
    columns = ["up"] + (["gate"] if getattr(mlp, "gate", None) is not None else [])
    if split.get("fc1", split.get("gate_up")) == "reduce":
        column_by_reduce(mlp, columns, meshes[first], meshes.group(first), act)
    else:
        _column(mlp, columns, meshes, first, act, part_dim(split.get("norm2")) is None)
    _row(mlp.get_submodule("down"), mlp, "down", meshes, second, act, part_dim(split.get("residual2")))
    return []


def _embedding(embed: Embedding, meshes: Meshes, degree: int) -> None:
    """Megatron's vocab-parallel lookup over the degree's ranks (partial lookups all-reduced), or whole."""
    if degree > 1:
        parallelize_module(embed, meshes[degree], {"tok": RowwiseParallel(input_layouts=Replicate(),
                                                                          output_layouts=Replicate())})


def _head(head: Head, meshes: Meshes, logits: int, loss: int) -> None:
    """The vocabulary projection at `logits`, the cross-entropy at `loss`: vocab-parallel (loss_parallel) where
    split; a split projection read by a whole loss all-gathers the logits, a whole one read split slices them. A
    tied head reads the embedding's table, sharded as the lookup is (the tree gives both one degree)."""
    if head.weight is not None and logits > 1:
        sharded = distribute_tensor(head.weight.data, meshes[logits], [Shard(0)])
        head.register_parameter("weight", nn.Parameter(sharded))
    if logits > 1 and loss == 1:
        head.register_forward_hook(lambda _m, _i, y: y.redistribute(placements=[Replicate()]).to_local())
    elif logits == 1 and loss > 1:
        head.register_forward_hook(lambda _m, _i, y: DTensor.from_local(
            y, meshes[loss], [Replicate()], run_check=False).redistribute(placements=[Shard(-1)]))
