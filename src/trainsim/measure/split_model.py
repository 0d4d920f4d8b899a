"""A measured run of a strategy tree's computation configs: every op of the job's OpGraph run as torch runs it,
on the part of its tensors its config gives this rank, with the resharding collectives between them.

The compiler (compile/splits.py) decides each op's config and placement (Proteus Sec. IV-B, VII); this module
executes them for real on `world` ranks: each forward op becomes a torch op on its local shapes (a convolution
or linear layer on its share of output channels / input features, a BatchNorm on its channels, attention on its
heads, an embedding table on its columns), and where the tensor an op reads is placed differently from what the
op needs, the collectives of the strategy transformation run on it (all-gather, reduce-scatter, all-reduce,
all-to-all, or a local slice), as autograd functions whose backward runs the conjugate collective (Megatron-LM's
pairs). The dataflow is the model's: a ResNet block's shortcut and residual add, Inception's branches and concat
(from the small models' <name>.inputs.json, scripts/gen_proteus_small.py), a transformer's residual stream,
DLRM's two inputs meeting at the interaction. Weights are slices of one seeded full weight, so every plan of a
job computes the same function (the plain data-parallel plan's loss is the reference the tests compare).

Gradients of the weights are summed over the ranks that hold the same slice, in buckets launched from the
gradient-accumulate hooks (overlapping the rest of the backward pass, as DistributedDataParallel does) and
divided by the world size; AdamW (torch's one-tensor-at-a-time loop on a CPU) updates the local slices.

Rank layout of a placement (strategy.placement.Placement): shards major, replicas minor; within a shard index,
batch, sequence, feature and partial-sum coordinates from slowest to fastest. Every refinement the plans make
(a dimension split further inside a shard) keeps a coarse shard's ranks contiguous, so a collective's group is
the ranks of one shard of the coarsest placement both sides refine. Imported only inside measure workers.
"""

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainsim.ir.graph import Op
from trainsim.ir.model_spec import CnnSpec, ConvLayer, DlrmSpec, TransformerSpec
from trainsim.job import Job
from trainsim.strategy.lowered import LayerAssignment, LoweredPlan
from trainsim.strategy.placement import CONTRACTING, DIMS, OpConfig, Placement

LEARNING_RATE = 1e-4
BUCKET_PARAMS = 2**18  # gradient bucket (1 MiB of fp32); predict with --grad-bucket-params 262144
# The training thread's CPU time per phase of a step (SplitTrainer.phase_cpu_s): the forward and backward passes
# (reshard collectives included), the gradient sync's bucket copies, launches, waits and copies back, and AdamW.
PHASES = ("forward", "backward", "grad_sync", "optimizer")
INIT_STD = 0.02
Dims = dict[str, int | None]  # placement dimension -> tensor dimension (None: the tensor has no such dim)


# --- ranks and groups ---


class Ranks:
    """This rank, the world, and a process group for every subset of the world (created by every rank in the same
    order, as torch.distributed.new_group needs)."""

    def __init__(self, world: int, rank: int) -> None:
        self.world, self.rank = world, rank
        self.groups: dict[tuple[int, ...], Any] = {}
        for size in range(2, world + 1):
            for members in itertools.combinations(range(world), size):
                group = dist.new_group(list(members)) if size < world else dist.group.WORLD
                self.groups[members] = group

    def group(self, members: tuple[int, ...]) -> Any:
        return self.groups[members]


def coords(p: Placement, rank: int) -> dict[str, int]:
    """Which part of each dimension (and which partial sum) `rank` holds under p; "replica" among copies."""
    shard, replica = divmod(rank, p.replicas)
    out = {"replica": replica}
    for dim in ("partial", "feature", "seq", "batch"):
        shard, out[dim] = divmod(shard, p.degree(dim) if dim != "partial" else p.partial)
    return out


def _coarse(a: Placement, b: Placement) -> Placement:
    return Placement(a.group, min(a.batch, b.batch), min(a.seq, b.seq), min(a.feature, b.feature),
                     min(a.partial, b.partial))


def members(a: Placement, b: Placement, rank: int) -> tuple[int, ...]:
    """The ranks of `rank`'s shard of the coarsest placement a and b both refine: a collective's group."""
    c = _coarse(a, b)
    span = c.group // c.shards
    first = rank // span * span
    return tuple(range(first, first + span))


# --- collectives as autograd functions ---


def all_gather_parts(x: torch.Tensor, dim: int, group: Any, size: int) -> torch.Tensor:
    """The `size` ranks' parts of x concatenated along dim, in rank order."""
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group: Any, size: int) -> torch.Tensor:
    chunks = [c.contiguous() for c in x.chunk(size, dim=dim)]
    flat = torch.cat([c.reshape(-1) for c in chunks])
    out = torch.empty(chunks[0].numel(), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, flat, group=group)
    return out.view_as(chunks[0])


def _all_to_all(x: torch.Tensor, split_dim: int, cat_dim: int, group: Any, size: int) -> torch.Tensor:
    sends = [c.contiguous() for c in x.chunk(size, dim=split_dim)]
    recvs = [torch.empty_like(s) for s in sends]
    dist.all_to_all(recvs, sends, group=group)
    return torch.cat(recvs, dim=cat_dim)


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any, size: int) -> torch.Tensor:
        ctx.args = (dim, group, size)
        return all_gather_parts(x, dim, group, size)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grad = grad_outputs[0]
        return _reduce_scatter(grad, *ctx.args), None, None, None


class ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any, size: int) -> torch.Tensor:
        ctx.args = (dim, group, size)
        return _reduce_scatter(x, dim, group, size)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grad = grad_outputs[0]
        return all_gather_parts(grad, *ctx.args), None, None, None


class AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grad = grad_outputs[0]
        return grad, None


class ReduceGradients(torch.autograd.Function):
    """Identity forward; the backward all-reduces (Megatron-LM's f: a replicated input read by an op that splits
    its output, each rank holding a partial gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grad = grad_outputs[0]
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, split_dim: int, cat_dim: int, group: Any, size: int) -> torch.Tensor:
        ctx.args = (split_dim, cat_dim, group, size)
        return _all_to_all(x, split_dim, cat_dim, group, size)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grad = grad_outputs[0]
        split_dim, cat_dim, group, size = ctx.args
        return _all_to_all(grad, cat_dim, split_dim, group, size), None, None, None, None


class Slice(torch.autograd.Function):
    """Keep part `index` of `parts` along dim (no communication); the backward gathers the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, parts: int, index: int, group: Any) -> torch.Tensor:
        ctx.args = (dim, group, parts)
        return x.chunk(parts, dim=dim)[index].contiguous()

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grad = grad_outputs[0]
        return all_gather_parts(grad, *ctx.args), None, None, None, None


def _with(p: Placement, **values: int) -> Placement:
    base = {d: p.degree(d) for d in DIMS} | {"partial": p.partial}
    base.update(values)
    return Placement(p.group, base["batch"], base["seq"], base["feature"], base["partial"])


def transform(x: torch.Tensor, cur: Placement, dst: Placement, dims: Dims, ranks: Ranks) -> torch.Tensor:
    """Reshard x from cur to dst with the steps strategy.reshard.reshard prices: partial sums reduced (scattered
    where dst splits a dimension further), all-to-all where one dimension is gathered and another split,
    all-gather, local slices."""
    if cur == dst:
        return x

    def run(nxt: Placement, step: Callable[[Any, int], torch.Tensor]) -> torch.Tensor:
        group = members(cur, nxt, ranks.rank)
        return step(ranks.group(group), len(group)) if len(group) > 1 else x

    if cur.partial > dst.partial:
        factor = cur.partial // dst.partial
        grow = next((d for d in DIMS if dst.degree(d) >= cur.degree(d) * factor and dims.get(d) is not None), None)
        if grow is not None:
            nxt = _with(cur, **{grow: cur.degree(grow) * factor}, partial=dst.partial)
            x = run(nxt, lambda g, n, x=x: ReduceScatter.apply(x, _dim(dims, grow), g, n))
        else:
            nxt = _with(cur, partial=dst.partial)
            x = run(nxt, lambda g, _n, x=x: AllReduce.apply(x, g))
        cur = nxt
    gathers = {d: cur.degree(d) // dst.degree(d) for d in DIMS if cur.degree(d) > dst.degree(d)}
    splits = {d: dst.degree(d) // cur.degree(d) for d in DIMS if dst.degree(d) > cur.degree(d)}
    for g_dim, g in list(gathers.items()):
        for s_dim, s in list(splits.items()):
            k = math.gcd(g, s)
            if k > 1 and dims.get(s_dim) is not None:
                nxt = _with(cur, **{g_dim: cur.degree(g_dim) // k, s_dim: cur.degree(s_dim) * k})
                x = run(nxt, lambda gr, n, s_dim=s_dim, g_dim=g_dim, x=x: AllToAll.apply(
                    x, _dim(dims, s_dim), _dim(dims, g_dim), gr, n))
                cur = nxt
                gathers[g_dim], splits[s_dim] = g // k, s // k
    for g_dim, g in gathers.items():
        if g > 1:
            nxt = _with(cur, **{g_dim: cur.degree(g_dim) // g})
            x = run(nxt, lambda gr, n, g_dim=g_dim, x=x: AllGather.apply(x, _dim(dims, g_dim), gr, n))
            cur = nxt
    for s_dim, s in splits.items():
        if s > 1:
            nxt = _with(cur, **{s_dim: cur.degree(s_dim) * s})
            group = members(cur, nxt, ranks.rank)
            index = coords(nxt, ranks.rank)[s_dim] % s
            x = Slice.apply(x, _dim(dims, s_dim), s, index, ranks.group(group) if len(group) > 1 else None)
            cur = nxt
    return x


def _dim(dims: Dims, name: str) -> int:
    value = dims.get(name)
    if value is None:
        raise ValueError(f"the tensor has no {name} dimension to split")
    return value


# --- placements of an op under its config (as compile.splits._op_config makes them) ---


def need_of(op: Op, c: OpConfig, world: int) -> Placement:
    if op.kind in CONTRACTING:
        return Placement(world, c.batch, c.seq, c.reduce)
    return Placement(world, c.batch, c.seq, c.out)


def produced_of(op: Op, c: OpConfig, world: int) -> Placement:
    if op.kind in CONTRACTING:
        return Placement(world, c.batch, c.seq, c.out, c.reduce)
    return Placement(world, c.batch, c.seq, c.out)


@dataclass
class Placed:
    value: torch.Tensor
    placement: Placement
    dims: Dims


@dataclass
class Unit:
    """One forward op: its key, the keys it reads ("" data), its config and what it runs."""

    key: str
    op: Op  # with the instance's own name (a repeated CNN block's ops carry the first block's names)
    inputs: list[str]
    config: OpConfig
    layer: LayerAssignment
    params: list[nn.Parameter] = field(default_factory=list)
    params_named: dict[str, nn.Parameter] = field(default_factory=dict)
    sync: tuple[int, ...] = ()  # the ranks holding the same slice of its weights
    bias_here: bool = True  # the bias is added on one partial sum only
    offsets: torch.Tensor | None = None  # DLRM: each table's first row in the concatenated tables


def _slice(full: torch.Tensor, dim: int, parts: int, index: int) -> torch.Tensor:
    return full.chunk(parts, dim=dim)[index].contiguous()


def _generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + sum(ord(ch) * 131**i for i, ch in enumerate(key)) % 2**31)


class SplitModel(nn.Module):
    """The job's ops under the plan's configs on this rank; forward(batch) returns this rank's loss."""

    def __init__(self, job: Job, plan: LoweredPlan, configs: dict[str, OpConfig], ranks: Ranks, seed: int = 0,
                 dataflow: dict[str, list[str]] | None = None) -> None:
        super().__init__()
        self.job, self.ranks, self.seed = job, ranks, seed
        self.world = ranks.world
        self.model = job.model
        self.conv_layers = {layer.name: layer for layer in self.model.layers} if isinstance(self.model, CnnSpec) \
            else {}
        self.dataflow = dataflow or (_cnn_chain(self.model) if isinstance(self.model, CnnSpec) else {})
        self.block_input = self.bottom_out = self.lookups = ""
        self.tied_unit: Unit | None = None
        self._last_meta: Placed | None = None
        self.units: list[Unit] = []
        self.weights = nn.ParameterDict()
        self.recompute = {a.index: a.recompute == "full" and a.layer.kind == "block" for a in plan.layers}
        previous = ""
        blocks: dict[str, list[str]] = {}
        for layer in self.conv_layers.values():
            blocks.setdefault(layer.block, []).append(layer.name)
        repeat: dict[str, int] = {}
        for a in plan.layers:
            k = repeat[a.layer.name] = repeat.get(a.layer.name, -1) + 1
            for template in a.layer.fwd:
                config = configs.get(f"{a.index}:{template.name}", OpConfig(self.world, 1, 1, 1))
                op = _instance(template, a.layer.name, k, blocks) if self.conv_layers else template
                key = f"{a.index}:{op.name}"
                unit = Unit(key, op, self._inputs(a, op, previous), config, a)
                self._build(unit)
                self.units.append(unit)
                previous = key
        self.by_name = {u.op.name: u.key for u in self.units}

    # dataflow

    def _inputs(self, a: LayerAssignment, op: Op, previous: str) -> list[str]:
        if isinstance(self.model, CnnSpec):
            if op.name not in self.dataflow:
                return [previous]
            return [f"@{name}" if name else "" for name in self.dataflow[op.name]]
        if isinstance(self.model, TransformerSpec):
            if op.name == "lookup":
                return [""]
            if op.name == "residual1":
                return [self.block_input, previous]
            if op.name == "residual2":
                return [f"{a.index}:residual1", previous]
            if op.name == "norm1":
                self.block_input = previous
            return [previous]
        if isinstance(self.model, DlrmSpec):
            if a.layer.name == "embeddings" or (a.layer.name == "bottom_mlp" and op.name == "linear0"):
                return [""]
            if op.name == "stack":
                self.bottom_out = previous
                return [previous, self.lookups]
            if op.name == "gather_cat":
                return [previous, self.bottom_out]
            if a.layer.name == "embeddings":
                return [""]
            return [previous]
        raise ValueError(f"no measured dataflow for a {self.model.kind} model")

    # parameters

    def _param(self, unit: Unit, name: str, full: torch.Tensor, slices: list[tuple[int, int, int]]) -> nn.Parameter:
        local = full
        for dim, parts, index in slices:
            local = _slice(local, dim, parts, index)
        param = nn.Parameter(local)
        self.weights[f"{unit.key}.{name}".replace(".", "_").replace(":", "_")] = param
        unit.params.append(param)
        return param

    def _build(self, unit: Unit) -> None:
        op, c = unit.op, unit.config
        if op.kind in CONTRACTING and c.out > 1 and c.reduce > 1:
            raise ValueError(f"{op.name}: splitting both the output and the reduction is not measured")
        out_p = produced_of(op, c, self.world)
        at = coords(out_p, self.ranks.rank)
        gen = _generator(self.seed, unit.key.split(":", 1)[1] + ("" if self.conv_layers else unit.key))
        mine = (at["feature"], at["partial"])
        unit.sync = tuple(r for r in range(self.world)
                          if (coords(out_p, r)["feature"], coords(out_p, r)["partial"]) == mine)
        spec = self.model
        if op.kind == "conv" or (op.kind == "matmul" and isinstance(spec, CnnSpec)):
            layer = self.conv_layers[op.name]
            kh, kw = layer.kernel if op.kind == "conv" else (1, 1)
            shape = (layer.out_channels, layer.in_channels, kh, kw) if op.kind == "conv" else \
                (layer.out_channels, layer.in_channels)
            w = torch.randn(*shape, generator=gen) * INIT_STD
            unit.params_named = {"w": self._param(unit, "w", w, [(0, c.out, at["feature"]),
                                                                 (1, c.reduce, at["partial"])])}
            if op.kind == "matmul" or not self._before_norm(op.name):
                b = torch.zeros(layer.out_channels)
                unit.params_named["b"] = self._param(unit, "b", b, [(0, c.out, at["feature"])])
                unit.bias_here = at["partial"] == 0
        elif op.kind == "norm":
            width = self._width(op)
            parts = c.out if isinstance(spec, CnnSpec) else 1
            unit.params_named = {"w": self._param(unit, "w", torch.ones(width), [(0, parts, at["feature"])]),
                                 "b": self._param(unit, "b", torch.zeros(width), [(0, parts, at["feature"])])}
        elif op.kind == "matmul" and isinstance(spec, TransformerSpec) and op.name != "logits":
            _, _, n, k = op.shape
            w = torch.randn(n, k, generator=gen) * INIT_STD
            rows = _qkv_rows(n, c.out, at["feature"], spec) if op.name == "qkv" else None
            if rows is not None:
                w_local = w[rows]
                b_full = torch.zeros(n)[rows]
                unit.params_named = {"w": self._param(unit, "w", w_local, [(1, c.reduce, at["partial"])]),
                                     "b": self._param(unit, "b", b_full, [])}
            else:
                unit.params_named = {"w": self._param(unit, "w", w, [(0, c.out, at["feature"]),
                                                                     (1, c.reduce, at["partial"])]),
                                     "b": self._param(unit, "b", torch.zeros(n), [(0, c.out, at["feature"])])}
            unit.bias_here = at["partial"] == 0
        elif op.kind == "matmul" and isinstance(spec, DlrmSpec) and op.name != "dot":
            _, _, n, k = op.shape
            w = torch.randn(n, k, generator=gen) * (1.0 / math.sqrt(k))
            unit.params_named = {"w": self._param(unit, "w", w, [(0, c.out, at["feature"]),
                                                                 (1, c.reduce, at["partial"])]),
                                 "b": self._param(unit, "b", torch.zeros(n), [(0, c.out, at["feature"])])}
            unit.bias_here = at["partial"] == 0
        elif op.kind == "embedding" and isinstance(spec, TransformerSpec):
            table = torch.randn(spec.vocab, spec.hidden, generator=gen) * INIT_STD
            unit.params_named = {"w": self._param(unit, "w", table, [])}
            self.tied_unit = unit
        elif op.name == "pos_add" and isinstance(spec, TransformerSpec):
            pos = torch.randn(spec.max_seq_len, spec.hidden, generator=gen) * INIT_STD
            unit.params_named = {"w": self._param(unit, "w", pos, [])}
        elif op.kind == "embedding" and isinstance(spec, DlrmSpec):
            tables = [t for t in spec.tables for _ in range(t.count)]
            full = torch.cat([torch.randn(t.rows, t.dim, generator=gen) * (1.0 / math.sqrt(t.rows)) for t in tables])
            unit.params_named = {"w": self._param(unit, "w", full, [(1, c.out, at["feature"])])}
            unit.offsets = torch.tensor([0, *itertools.accumulate(t.rows for t in tables)][:-1])
            self.lookups = unit.key
        else:
            unit.params_named = {}

    def _before_norm(self, name: str) -> bool:
        names = list(self.conv_layers)
        index = names.index(name)
        return index + 1 < len(names) and self.conv_layers[names[index + 1]].type == "norm"

    def _width(self, op: Op) -> int:
        if isinstance(self.model, CnnSpec):
            return self.conv_layers[op.name].out_channels
        assert isinstance(self.model, TransformerSpec)
        return self.model.hidden

    # forward

    def forward(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        values: dict[str, Placed] = {}
        loss: torch.Tensor | None = None
        index = 0
        while index < len(self.units):
            layer = self.units[index].layer.index
            group = [u for u in self.units[index:] if u.layer.index == layer]
            index += len(group)
            if self.recompute.get(layer):
                loss = self._run_checkpointed(group, values, data) or loss
            else:
                for unit in group:
                    loss = self._run(unit, values, data) or loss
        assert loss is not None
        return loss

    def _run_checkpointed(self, units: list[Unit], values: dict[str, Placed], data: dict[str, torch.Tensor]) -> Any:
        first = units[0].inputs
        outside = [k for u in units for k in u.inputs if k and not any(k == v.key for v in units)]
        keys = list(dict.fromkeys(outside))
        tensors = [values[k].value for k in keys]
        meta = {k: values[k] for k in keys}

        def body(*args: torch.Tensor) -> torch.Tensor:
            local = {k: Placed(t, meta[k].placement, meta[k].dims) for k, t in zip(keys, args, strict=True)}
            for unit in units:
                self._run(unit, local, data)
            last = units[-1].key
            self._last_meta = local[last]
            return local[last].value

        del first
        out = checkpoint(body, *tensors, use_reentrant=False)
        assert isinstance(out, torch.Tensor) and self._last_meta is not None
        values[units[-1].key] = Placed(out, self._last_meta.placement, self._last_meta.dims)
        return None

    def _read(self, key: str, need: Placement, values: dict[str, Placed], data: dict[str, torch.Tensor],
              unit: Unit, which: int) -> Placed:
        if key == "":
            name = _data_name(self.model, unit.op)
            full, dims = data[name], _data_dims(self.model, name)
            local = full
            at = coords(need, self.ranks.rank)
            for dim in DIMS:
                if dims.get(dim) is not None and need.degree(dim) > 1:
                    local = _slice(local, _dim(dims, dim), need.degree(dim), at[dim])
            return Placed(local, need, dims)
        if key.startswith("@"):
            key = self._cnn_key(key[1:])
        src = values[key]
        x = transform(src.value, src.placement, need, src.dims, self.ranks)
        if unit.op.kind in CONTRACTING and unit.config.out > 1 and x is src.value:
            group = tuple(r for r in range(self.world)
                          if coords(need, r)["batch"] == coords(need, self.ranks.rank)["batch"])
            x = ReduceGradients.apply(x, self.ranks.group(group))
        return Placed(x, need, src.dims)

    def _cnn_key(self, name: str) -> str:
        return self.by_name[name]

    def _run(self, unit: Unit, values: dict[str, Placed], data: dict[str, torch.Tensor]) -> torch.Tensor | None:
        op, c = unit.op, unit.config
        need = need_of(op, c, self.world)
        ins = [self._read(k, need, values, data, unit, i) for i, k in enumerate(unit.inputs)]
        out_dims = ins[0].dims
        p = unit.params_named
        x = ins[0].value
        spec = self.model
        if isinstance(spec, CnnSpec):
            y, out_dims = self._cnn_op(unit, [i.value for i in ins], out_dims, data)
        elif isinstance(spec, TransformerSpec):
            y = self._transformer_op(unit, [i.value for i in ins], data)
        else:
            y, out_dims = self._dlrm_op(unit, [i.value for i in ins], out_dims, data)
        if op.kind == "loss":
            return y
        del x, p
        values[unit.key] = Placed(y, produced_of(op, c, self.world), out_dims)
        return None

    def _linear(self, unit: Unit, x: torch.Tensor) -> torch.Tensor:
        p = unit.params_named
        bias = p.get("b") if getattr(unit, "bias_here", True) else None
        return F.linear(x, p["w"], bias)

    def _cnn_op(self, unit: Unit, xs: list[torch.Tensor], dims: Dims, data: dict[str, torch.Tensor]) -> Any:
        op, p = unit.op, unit.params_named
        layer = self.conv_layers.get(op.name)
        x = xs[0]
        if op.kind == "loss":
            return F.cross_entropy(x, _labels(data["labels"], need_of(op, unit.config, self.world),
                                              self.ranks.rank)), dims
        assert layer is not None
        if layer.type == "conv":
            pad = _padding(x.shape[-2:], layer)
            bias = p.get("b") if getattr(unit, "bias_here", True) else None
            y = F.conv2d(x, p["w"], bias, stride=layer.stride, padding=pad)
            return y[..., : layer.out_hw[0], : layer.out_hw[1]], dims
        if layer.type == "norm":
            return F.batch_norm(x, None, None, p["w"], p["b"], training=True), dims
        if layer.type == "relu":
            return F.relu(sum(xs[1:], xs[0])), dims
        if layer.type == "pool":
            pad = _padding(x.shape[-2:], layer)
            pad = (min(pad[0], layer.kernel[0] // 2), min(pad[1], layer.kernel[1] // 2))
            pool = F.avg_pool2d if "avg" in op.name else F.max_pool2d
            y = pool(x, layer.kernel, layer.stride, pad)
            return y[..., : layer.out_hw[0], : layer.out_hw[1]], dims
        if layer.type == "concat":
            return torch.cat(xs, dim=1), dims
        if layer.type == "fc":
            return self._linear(unit, x.flatten(1)), {"batch": 0, "seq": None, "feature": 1}
        raise ValueError(f"no measured kernel for {layer.type}")

    def _transformer_op(self, unit: Unit, xs: list[torch.Tensor], data: dict[str, torch.Tensor]) -> torch.Tensor:
        op, p = unit.op, unit.params_named
        spec = self.model
        assert isinstance(spec, TransformerSpec)
        x = xs[0]
        if op.name == "lookup":
            return F.embedding(x, p["w"])
        if op.name == "pos_add":
            return x + p["w"][: x.shape[1]]
        if op.kind == "norm":
            return F.layer_norm(x, (x.shape[-1],), p["w"], p["b"])
        if op.name == "attention":
            b, s, width = x.shape
            hd = spec.hidden // spec.num_heads
            q, k, v = x.view(b, s, 3, width // (3 * hd), hd).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y.transpose(1, 2).reshape(b, s, -1)
        if op.name in ("residual1", "residual2"):
            return xs[0] + xs[1]
        if op.name == "gelu":
            return F.gelu(x)
        if op.name == "logits":
            assert self.tied_unit is not None
            return F.linear(x, self.tied_unit.params_named["w"])
        if op.kind == "loss":
            labels = _labels(data["labels"], need_of(op, unit.config, self.world), self.ranks.rank)
            return F.cross_entropy(x.flatten(0, 1), labels.flatten())
        if op.kind == "matmul":
            return self._linear(unit, x)
        raise ValueError(f"no measured kernel for {op.name}")

    def _dlrm_op(self, unit: Unit, xs: list[torch.Tensor], dims: Dims, data: dict[str, torch.Tensor]) -> Any:
        op = unit.op
        x = xs[0]
        if op.kind == "embedding":
            assert unit.offsets is not None
            ids = x + unit.offsets  # [batch, tables]
            return F.embedding(ids, unit.params_named["w"]), {"batch": 0, "seq": None, "feature": 2}
        if op.kind == "matmul" and op.name != "dot":
            return self._linear(unit, x), {"batch": 0, "seq": None, "feature": 1}
        if op.name.startswith("relu"):
            return F.relu(x), dims
        if op.name == "stack":
            return torch.cat([xs[0].unsqueeze(1), xs[1]], dim=1), {"batch": 0, "seq": None, "feature": 2}
        if op.name == "dot":
            return torch.bmm(x, x.transpose(1, 2)), {"batch": 0, "seq": None, "feature": None}
        if op.name == "gather_cat":
            n = x.shape[1]
            rows, cols = torch.tril_indices(n, n, offset=-1)
            return torch.cat([xs[1], x[:, rows, cols]], dim=1), {"batch": 0, "seq": None, "feature": 1}
        if op.kind == "loss":
            labels = _labels(data["labels"], need_of(op, unit.config, self.world), self.ranks.rank)
            return F.binary_cross_entropy_with_logits(x.squeeze(-1), labels), dims
        raise ValueError(f"no measured kernel for {op.name}")


def _instance(op: Op, group: str, k: int, blocks: dict[str, list[str]]) -> Op:
    """The op of the k-th block of a repeated group (the graph keeps one Layer for layer1.1..layer1.2, its ops
    named after the first block's layers): the layer at the same position in the k-th block."""
    first = group.split("..")[0]
    order = list(blocks)
    if k == 0 or first not in blocks or op.name not in blocks[first]:
        return op
    name = blocks[order[order.index(first) + k]][blocks[first].index(op.name)]
    return dataclasses.replace(op, name=name, module_path=name)


def _qkv_rows(n: int, out: int, index: int, spec: TransformerSpec) -> torch.Tensor | None:
    """The rows of a fused q, k, v weight [3 x hidden, hidden] that hold heads `index` of `out` parts: q, k and v
    of those heads, in that order (so the local attention reads whole heads)."""
    if out == 1:
        return None
    hidden = n // 3
    per = hidden // out
    return torch.cat([torch.arange(part * hidden + index * per, part * hidden + (index + 1) * per)
                      for part in range(3)])


def _padding(in_hw: Any, layer: ConvLayer) -> tuple[int, int]:
    pads = []
    for size, out, k in zip(in_hw, layer.out_hw, layer.kernel, strict=True):
        pads.append(max(0, ((out - 1) * layer.stride + k - int(size) + 1) // 2))
    return pads[0], pads[1]


def _labels(labels: torch.Tensor, need: Placement, rank: int) -> torch.Tensor:
    if need.batch == 1:
        return labels
    return _slice(labels, 0, need.batch, coords(need, rank)["batch"])


def _data_name(model: Any, op: Op) -> str:
    if isinstance(model, DlrmSpec):
        return "ids" if op.kind == "embedding" else "dense"
    return "tokens" if isinstance(model, TransformerSpec) else "images"


def _data_dims(model: Any, name: str) -> Dims:
    if name == "tokens":
        return {"batch": 0, "seq": 1, "feature": None}
    if name == "images":
        return {"batch": 0, "seq": None, "feature": 1}
    return {"batch": 0, "seq": None, "feature": None}


def _cnn_chain(model: CnnSpec) -> dict[str, list[str]]:
    """Without a dataflow file each layer reads the one before it."""
    names = [layer.name for layer in model.layers]
    return {name: [names[i - 1] if i else ""] for i, name in enumerate(names)}


def make_data(job: Job, seed: int) -> dict[str, torch.Tensor]:
    """One micro-batch of the whole data-parallel group (every rank draws the same and keeps its part)."""
    p = job.parallel
    batch = p.micro_batch * p.dp
    gen = torch.Generator().manual_seed(seed + 1)
    model = job.model
    if isinstance(model, CnnSpec):
        h, w = model.input_hw
        return {"images": torch.randn(batch, 3, h, w, generator=gen),
                "labels": torch.randint(0, model.layers[-1].out_channels, (batch,), generator=gen)}
    if isinstance(model, TransformerSpec):
        return {"tokens": torch.randint(0, model.vocab, (batch, p.seq_len), generator=gen),
                "labels": torch.randint(0, model.vocab, (batch, p.seq_len), generator=gen)}
    assert isinstance(model, DlrmSpec)
    rows = [t.rows for t in model.tables for _ in range(t.count)]
    return {"dense": torch.randn(batch, model.dense_features, generator=gen),
            "ids": torch.stack([torch.randint(0, r, (batch,), generator=gen) for r in rows], dim=1),
            "labels": torch.randint(0, 2, (batch,), generator=gen).float()}


class GradientSync:
    """Sum each weight's gradient over the ranks holding the same slice, in buckets launched as soon as their
    gradients are accumulated (overlapping the rest of the backward pass), then divide by the world size."""

    def __init__(self, units: list[Unit], ranks: Ranks) -> None:
        self.ranks = ranks
        self.buckets: list[tuple[tuple[int, ...], list[nn.Parameter]]] = []
        by_group: dict[tuple[int, ...], list[nn.Parameter]] = {}
        for unit in reversed(units):  # backward order
            for param in unit.params:
                params = by_group.setdefault(unit.sync, [])
                params.append(param)
                if sum(q.numel() for q in params) >= BUCKET_PARAMS:
                    self.buckets.append((unit.sync, list(params)))
                    params.clear()
        self.buckets += [(group, params) for group, params in by_group.items() if params]
        self.pending: dict[int, int] = {}
        self.owner: dict[int, int] = {}
        for index, (_, params) in enumerate(self.buckets):
            for param in params:
                self.owner[id(param)] = index
                param.register_post_accumulate_grad_hook(self._ready)
        self.works: dict[int, tuple[Any, torch.Tensor]] = {}
        self.launch_cpu_s = 0.0  # the training thread's CPU time in _launch (inside the backward pass)
        self.reset()

    def reset(self) -> None:
        self.pending = {i: len(params) for i, (_, params) in enumerate(self.buckets)}
        self.works = {}

    def _ready(self, param: torch.Tensor) -> None:
        index = self.owner[id(param)]
        self.pending[index] -= 1
        if self.pending[index] == 0:
            self._launch(index)

    def _launch(self, index: int) -> None:
        begun = time.thread_time()
        group, params = self.buckets[index]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        work = dist.all_reduce(flat, group=self.ranks.group(group), async_op=True) if len(group) > 1 else None
        self.works[index] = (work, flat)
        self.launch_cpu_s += time.thread_time() - begun

    def finish(self) -> None:
        for index in range(len(self.buckets)):
            if index not in self.works:
                self._launch(index)
        for index, (work, flat) in self.works.items():
            if work is not None:
                work.wait()
            flat.div_(self.ranks.world)
            offset = 0
            for p in self.buckets[index][1]:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[offset: offset + n].view_as(p))
                offset += n
        self.reset()


class SplitTrainer:
    """The measured step of a job under a strategy tree: forward and backward over the micro-batches, the
    overlapped gradient sync and AdamW. Gradient accumulation: the sync runs once, after the last micro-batch."""

    computes_loss = True

    def __init__(self, job: Job, plan: LoweredPlan, configs: dict[str, OpConfig], ranks: Ranks, seed: int = 0,
                 dataflow: dict[str, list[str]] | None = None) -> None:
        if plan.num_stages > 1:
            raise ValueError("pipelines are not measured by the split executor")
        self.job = job
        self.model = SplitModel(job, plan, configs, ranks, seed, dataflow)
        self.sync = GradientSync(self.model.units, ranks)
        self.data = [make_data(job, seed + i) for i in range(job.parallel.num_micro_batches)]
        self.optimizer = torch.optim.AdamW(list(self.model.parameters()), lr=LEARNING_RATE, foreach=False)
        self.stage_indices = [0]
        self.reset_phases()

    def step(self) -> float:
        clock, phase = time.thread_time, self.phase_cpu_s
        self.optimizer.zero_grad(set_to_none=True)
        n = len(self.data)
        losses = []
        for i, batch in enumerate(self.data):
            self.sync_enabled(i == n - 1)
            begun = clock()
            loss = self.model(batch) / n
            forward = clock()
            launched = self.sync.launch_cpu_s
            loss.backward()
            launch_s = self.sync.launch_cpu_s - launched
            phase["forward"] += forward - begun
            phase["backward"] += clock() - forward - launch_s
            phase["grad_sync"] += launch_s
            losses.append(float(loss.detach()))
        begun = clock()
        self.sync.finish()
        synced = clock()
        self.optimizer.step()
        phase["grad_sync"] += synced - begun
        phase["optimizer"] += clock() - synced
        return sum(losses)

    def reset_phases(self) -> None:
        """Start the training thread's CPU seconds per phase afresh (after the warm-up steps)."""
        self.phase_cpu_s = dict.fromkeys(PHASES, 0.0)

    def sync_enabled(self, last: bool) -> None:
        if not last:
            self.sync.pending = {i: 10**9 for i in self.sync.pending}  # no launch before the last micro-batch
        else:
            self.sync.reset()
