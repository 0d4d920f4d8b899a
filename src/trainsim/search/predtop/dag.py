"""A stage's DAG of tensor operations, from the torch IR (PredTOP sec. IV-B; the paper reads JAX's jaxpr, here
the aten ops torch dispatches while the stage's forward runs, recorded with a TorchDispatchMode).

Nodes: every aten op (operator), every tensor it reads that no op made (input: the stage input, parameters),
and the stage's output (output). Edges follow the tensors. Pruning (sec. IV-B4): ops whose effect the node
features already carry are removed and their inputs joined to their outputs: views, reshapes, transposes,
copies and dtype conversions (the paper's reshape and convert_element_type).

Node features (Table I): the operator type one-hot (over OP_VOCAB, the rest as "other"), the output tensor's
dimensions (log2(1 + d), the last four, right-aligned), the output dtype one-hot, the node type one-hot. Depth
(the longest path from a source) is the DAG Transformer's positional encoding; the reachability matrix (a path
either way, or the node itself) its attention mask (sec. IV-A, eq. 1 with k = infinity).
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainsim.ir.model_spec import TransformerSpec

PRUNED = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "contiguous", "clone", "detach",
    "alias", "_to_copy", "to", "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "chunk",
    "unbind", "as_strided", "lift_fresh", "_reshape_alias", "expand_as", "view_as", "flatten", "unflatten",
    "lift_fresh_copy", "copy_", "copy",
})
OP_VOCAB = (
    "embedding", "add", "mul", "addmm", "mm", "bmm", "native_layer_norm", "gelu", "silu", "softmax", "_softmax",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math", "index", "topk", "nonzero",
    "zeros_like", "index_add", "sub", "neg", "cat", "sum", "mean", "rsqrt", "pow", "div", "eq", "where",
    "_log_softmax", "nll_loss_forward", "cross_entropy_loss", "arange", "masked_fill", "slice_scatter",
    # jaxpr primitives (jaxdag.py: the JAX source of the same stages), one vocabulary for both sources
    "dot_general", "exp", "log", "tanh", "erf", "max", "reduce_max", "reduce_sum", "integer_pow", "sqrt",
    "gather", "iota", "select_n", "ge", "lt", "gt", "top_k", "argmax", "scatter-add", "dynamic_slice",
    "concatenate", "logistic", "stop_gradient",
)
DTYPES = ("float32", "bfloat16", "float16", "int64", "int32", "bool")
NODE_TYPES = ("input", "literal", "operator", "output")
DIMS = 4
COST_FEATURES = 3  # log2(1 + FLOPs), log2(1 + output bytes), log2(1 + depth)
NUM_FEATURES = len(OP_VOCAB) + 1 + DIMS + len(DTYPES) + 1 + len(NODE_TYPES) + COST_FEATURES


@dataclass(frozen=True, slots=True)
class StageDag:
    """A stage's DAG: features [N, F], edges (src, dst), depth [N], reachability mask [N, N]."""

    features: np.ndarray
    edges: tuple[tuple[int, int], ...]
    depth: np.ndarray
    reach: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.features.shape[0])


@dataclass(slots=True)
class _Node:
    op: str
    kind: str
    shape: tuple[int, ...]
    dtype: str  # numpy-style name: float32, int64, ...
    preds: list[int]
    flops: float = 0.0
    out_bytes: float = 0.0


class _Recorder(TorchDispatchMode):
    """Records each aten op with the ops (or leaves) that made its tensor inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[_Node] = []
        self.made_by: dict[int, int] = {}
        self.keep: list[torch.Tensor] = []  # tensors whose ids are keys: alive while recording

    def leaf(self, t: torch.Tensor, kind: str = "param") -> int:
        key = id(t)
        if key not in self.made_by:
            self.nodes.append(_Node(kind, kind, tuple(t.shape), dtype_name(t.dtype), []))
            self.made_by[key] = len(self.nodes) - 1
            self.keep.append(t)
        return self.made_by[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        preds = [self.leaf(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        first = outputs[0] if outputs else None
        self.nodes.append(_Node(func.overloadpacket.__name__, "operator",
                                tuple(first.shape) if first is not None else (),
                                dtype_name(first.dtype) if first is not None else "float32",
                                list(dict.fromkeys(preds)), _flops(func, args, kwargs, out),
                                float(sum(t.numel() * t.element_size() for t in outputs))))
        index = len(self.nodes) - 1
        for t in outputs:
            self.made_by[id(t)] = index
            self.keep.append(t)
        return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _flops(func, args, kwargs, out) -> float:  # type: ignore[no-untyped-def]
    """An op's FLOPs: torch.utils.flop_counter's formula where it has one (matrix products, attention on GPUs),
    the two products of attention for the CPU attention kernels (which it lacks), else one per output element
    (element-wise ops, norms, reductions' outputs)."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func.overloadpacket)
    name = func.overloadpacket.__name__
    if formula is None and name.startswith("_scaled_dot_product") and len(args) >= 2:  # the CPU kernels
        q, k = args[0], args[1]  # [batch, heads, s_q, d] and [batch, heads, s_k, d]: QK^T and AV
        return 4.0 * math.prod(q.shape[:-1]) * k.shape[-2] * q.shape[-1]
    if formula is not None:
        try:
            return float(formula(*args, **(kwargs or {}), out_val=out))
        except (TypeError, ValueError, RuntimeError):
            pass
    return float(sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)))


def record(module: torch.nn.Module, inputs: torch.Tensor) -> list[_Node]:
    """The forward's ops, with an output node on the result."""
    recorder = _Recorder()
    with torch.no_grad():
        recorder.leaf(inputs, "input")
        for parameter in module.parameters():
            recorder.leaf(parameter)
        with recorder:
            out = module(inputs)
    result = out if isinstance(out, torch.Tensor) else tree_leaves(out)[0]
    nodes = recorder.nodes
    nodes.append(_Node("output", "output", tuple(result.shape), dtype_name(result.dtype),
                       [recorder.made_by[id(result)]]))
    return nodes


def prune(nodes: list[_Node]) -> list[_Node]:
    """Drop PRUNED ops (their inputs feed their users), parameters (each op's output dims and its predecessors'
    carry their shapes; this keeps graphs small enough to train on a CPU) and inputs nothing reads."""
    alias: dict[int, list[int]] = {}
    kept: dict[int, int] = {}
    out: list[_Node] = []
    for index, node in enumerate(nodes):
        preds: list[int] = []
        for p in node.preds:
            preds.extend(alias.get(p, [p]))
        preds = list(dict.fromkeys(preds))
        if node.kind == "operator" and node.op in PRUNED:
            alias[index] = preds
            continue
        kept[index] = len(out)
        out.append(_Node(node.op, node.kind, node.shape, node.dtype, preds, node.flops, node.out_bytes))
    for node in out:
        node.preds = [kept[p] for p in node.preds]
    used = {p for node in out for p in node.preds}
    keep = [i for i, node in enumerate(out) if node.kind not in ("input", "param") or
            (node.kind == "input" and i in used)]
    renumber = {old: new for new, old in enumerate(keep)}
    final = [out[i] for i in keep]
    for node in final:
        node.preds = [renumber[p] for p in node.preds if p in renumber]
    return final


def _features(node: _Node, depth: int) -> list[float]:
    op = [0.0] * (len(OP_VOCAB) + 1)
    op[OP_VOCAB.index(node.op) if node.op in OP_VOCAB else len(OP_VOCAB)] = 1.0 if node.kind == "operator" else 0.0
    dims = [0.0] * DIMS
    for slot, d in zip(range(DIMS - 1, -1, -1), reversed(node.shape[-DIMS:]), strict=False):
        dims[slot] = math.log2(1 + d)
    dtype = [0.0] * (len(DTYPES) + 1)
    dtype[DTYPES.index(node.dtype) if node.dtype in DTYPES else len(DTYPES)] = 1.0
    kind = [0.0] * len(NODE_TYPES)
    kind[NODE_TYPES.index(node.kind)] = 1.0
    cost = [math.log2(1.0 + node.flops), math.log2(1.0 + node.out_bytes), math.log2(1.0 + depth)]
    return op + dims + dtype + kind + cost


def to_dag(nodes: list[_Node]) -> StageDag:
    n = len(nodes)
    depth = np.zeros(n, dtype=np.int64)
    ancestors = [0] * n  # bitsets
    for i, node in enumerate(nodes):
        bits = 1 << i
        for p in node.preds:
            depth[i] = max(depth[i], depth[p] + 1)
            bits |= ancestors[p]
        ancestors[i] = bits
    reach = np.zeros((n, n), dtype=bool)
    for i, bits in enumerate(ancestors):
        row = np.array([(bits >> j) & 1 for j in range(n)], dtype=bool)
        reach[i] |= row
        reach[:, i] |= row
    features = np.array([_features(node, int(d)) for node, d in zip(nodes, depth, strict=True)], dtype=np.float32)
    edges = tuple((p, i) for i, node in enumerate(nodes) for p in node.preds)
    return StageDag(features, edges, depth, reach)


def unit_nodes(model: TransformerSpec, unit: int, micro_batch: int, seq_len: int) -> list[_Node]:
    """The pruned forward of one unit: node 0 is its input, the last its output."""
    from trainsim.measure.stage import build_stage

    module = build_stage(model, unit, unit + 1)
    gen = torch.Generator().manual_seed(0)
    if unit == 0:
        inputs = torch.randint(0, model.vocab, (micro_batch, seq_len), generator=gen)
    else:
        inputs = torch.randn(micro_batch, seq_len, model.hidden, generator=gen)
    nodes = prune(record(module, inputs))
    assert nodes[0].kind == "input" and nodes[-1].kind == "output"
    return nodes


@dataclass(slots=True)
class DagBuilder:
    """Stage DAGs of one model and micro-batch, composed from its units' recorded forwards: a stage's forward is
    its units' forwards in a row, each reading the one before's output, so the stage's graph is theirs joined
    output to input. Units of the same kind (unit_kind) are recorded once."""

    model: TransformerSpec
    micro_batch: int
    seq_len: int
    _units: dict[str, list[_Node]] = field(default_factory=dict)

    def unit(self, unit: int) -> list[_Node]:
        from trainsim.strategy.stage_plan import unit_kind

        kind = unit_kind(self.model, unit)
        if kind not in self._units:
            self._units[kind] = unit_nodes(self.model, unit, self.micro_batch, self.seq_len)
        return self._units[kind]

    def stage(self, first: int, end: int) -> StageDag:
        nodes: list[_Node] = []
        last_producer: int | None = None
        for unit in range(first, end):
            fragment = self.unit(unit)
            mapping: dict[int, int] = {}
            for index, node in enumerate(fragment):
                if node.kind == "input" and last_producer is not None:
                    mapping[index] = last_producer
                    continue
                if node.kind == "output" and unit < end - 1:
                    last_producer = mapping[node.preds[0]]
                    continue
                mapping[index] = len(nodes)
                nodes.append(_Node(node.op, node.kind, node.shape, node.dtype, [mapping[p] for p in node.preds],
                                   node.flops, node.out_bytes))
        return to_dag(nodes)


def unit_costs(builder: DagBuilder, heavy_ops: frozenset[str]) -> tuple[list[float], list[int]]:
    """Per unit of the chain: its forward's FLOPs and its count of heavy ops (the op names given)."""
    flops: list[float] = []
    heavy: list[int] = []
    for unit in range(builder.model.num_layers + 2):
        nodes = builder.unit(unit)
        flops.append(sum(n.flops for n in nodes if n.kind == "operator"))
        heavy.append(sum(1 for n in nodes if n.kind == "operator" and n.op in heavy_ops))
    return flops, heavy


def stage_dag(model: TransformerSpec, first: int, end: int, micro_batch: int, seq_len: int) -> StageDag:
    """The pruned DAG of units [first, end)'s forward on one micro-batch."""
    return DagBuilder(model, micro_batch, seq_len).stage(first, end)
