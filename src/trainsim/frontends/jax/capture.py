"""The JAX front-end: a JAX function (a training step) -> jaxpr -> a DAG of equations -> OpGraph.

Follows the DAG construction of PredTOP (sec. IV-B): a node per
jaxpr equation carrying its output shape and dtype, plus input, literal and output nodes (Table I's node types);
an edge per data dependency. Call-like equations (jit/pjit, custom_jvp_call, custom_vjp_call, remat/checkpoint,
closed_call) are inlined: their sub-jaxpr's equations become nodes. Control flow (scan, while, cond) stays one
node whose FLOPs are its body's (x the trip count for scan).

Pruning (sec. IV-B.4): reshape, broadcast_in_dim, convert_element_type, squeeze, expand_dims and transpose nodes
are removed when an operator consumes them, because the neighbours' shapes and dtypes already imply them; their
bytes are merged into the consuming operators (split evenly) so the total bytes are kept, and each consumer
records what it absorbed.

Module path: the equation's name stack (jax.named_scope), with the autodiff wrappers (jvp(...), transpose(...))
stripped; "jaxpr.<index>" where no scope was open. Phase: "bwd" when the name stack shows a transpose (the
backward pass of jax.grad), else "fwd". The DAG is exposed as a networkx DiGraph with the node features PredTOP's
learned predictor consumes (op type, output shape, dtype, FLOPs, depth).

jax and networkx are imported here, never at trainsim import time (pip install jax jaxlib networkx).
"""

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, Literal

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
from jax.extend import core as jcore

from trainsim.errors import ConfigError
from trainsim.frontends.factory import load_factory
from trainsim.hardware.device import DType
from trainsim.ir.graph import Layer, Op, OpGraph, OpKind, Phase

NodeType = Literal["input", "literal", "operator", "output"]

PRUNABLE = frozenset({"reshape", "broadcast_in_dim", "convert_element_type", "squeeze", "expand_dims", "transpose"})
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
          "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr", "shard_map": "jaxpr"}
# NB: data movement and bookkeeping do no arithmetic: 0 FLOPs (their bytes still count).
_NO_ARITHMETIC = frozenset({
    "reshape", "broadcast_in_dim", "convert_element_type", "squeeze", "expand_dims", "transpose", "concatenate",
    "pad", "slice", "dynamic_slice", "dynamic_update_slice", "gather", "iota", "copy", "copy_p", "rev", "split",
    "stop_gradient", "device_put", "sharding_constraint", "select_n", "optimization_barrier", "bitcast_convert_type",
    "random_bits", "random_wrap", "random_unwrap", "random_seed", "squeeze_p", "full", "zeros_like",
})
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                         "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})
_POOL = frozenset({"reduce_window", "reduce_window_sum", "reduce_window_max", "reduce_window_min",
                   "select_and_scatter_add", "select_and_gather_add"})
_DROPPED_SCOPES = frozenset({"rematted_computation", "checkpoint", "remat"})
_WRAPPER = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")
_IR_DTYPES: dict[str, DType] = {"float32": "fp32", "float64": "fp32", "float16": "fp16", "bfloat16": "bf16"}


# ---- FLOP formulas: small pure functions of shapes ------------------------------------------------------------
def dot_general_dims(lhs: Sequence[int], rhs: Sequence[int], dimension_numbers: Any) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a dot_general: batch and contracting dims from the dimension numbers, m and n the
    products of the free lhs and rhs dims."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    batch = prod(lhs[d] for d in lhs_batch)
    k = prod(lhs[d] for d in lhs_contract)
    m = prod(size for d, size in enumerate(lhs) if d not in lhs_contract and d not in lhs_batch)
    n = prod(size for d, size in enumerate(rhs) if d not in rhs_contract and d not in rhs_batch)
    return batch, m, n, k


def dot_general_flops(lhs: Sequence[int], rhs: Sequence[int], dimension_numbers: Any) -> float:
    """2 * batch * M * N * K (one multiply and one add per term)."""
    batch, m, n, k = dot_general_dims(lhs, rhs, dimension_numbers)
    return 2.0 * batch * m * n * k


def conv_flops(out_shape: Sequence[int], rhs_shape: Sequence[int], rhs_spec: Sequence[int]) -> float:
    """2 * output elements * (kernel input features x kernel window): each output element reduces over one
    output feature's slice of the kernel. NB: holds for feature_group_count > 1 (the kernel's input-feature dim is
    already per group) and for the batch-grouped weight-gradient convolutions of the backward pass."""
    kernel_out = rhs_shape[rhs_spec[0]]
    return 2.0 * prod(out_shape) * prod(rhs_shape) / max(1, kernel_out)


# ---- the DAG -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JaxDag:
    """A jaxpr as a DAG. graph: networkx DiGraph, node attributes node_type, op, shape, dtype, shapes, dtypes,
    flops, bytes_moved, module_path, phase, merged (pruned ops absorbed), eqn (equation index, -1 for
    non-operators), depth (longest path from a source). param_nodes: input node ids of the parameters."""

    graph: nx.DiGraph
    param_nodes: tuple[int, ...]
    pruned: bool

    def operators(self) -> list[int]:
        """Operator node ids in equation order."""
        ops = [n for n, data in self.graph.nodes(data=True) if data["node_type"] == "operator"]
        return sorted(ops, key=lambda n: self.graph.nodes[n]["eqn"])

    def count(self, op: str) -> int:
        return sum(1 for _, data in self.graph.nodes(data=True) if data["op"] == op)

    def total(self, key: str, phase: Phase | None = None) -> float:
        return sum(float(data[key]) for _, data in self.graph.nodes(data=True)
                   if data["node_type"] == "operator" and (phase is None or data["phase"] == phase))

    def pretty(self, limit: int = 40) -> str:
        g = self.graph
        lines = [f"JaxDag: {g.number_of_nodes()} nodes, {g.number_of_edges()} edges, "
                 f"{len(self.operators())} operators{' (pruned)' if self.pruned else ''}"]
        for nid in self.operators()[:limit]:
            d = g.nodes[nid]
            dims = "x".join(str(s) for s in d["shape"])
            extra = f" +{','.join(d['merged'])}" if d["merged"] else ""
            lines.append(f"  {nid:>5} {d['phase']} {d['op']:<22} {d['module_path']:<24} {d['dtype']}[{dims}] "
                         f"{d['flops']:.4g} FLOP {d['bytes_moved']:.4g} B depth {d['depth']}{extra}")
        if len(self.operators()) > limit:
            lines.append(f"  ... {len(self.operators()) - limit} more")
        return "\n".join(lines)


def dag_from_jax(fn: Callable[..., Any], *example_args: Any, prune: bool = True,
                 param_argnums: Sequence[int] = (0,)) -> JaxDag:
    """Trace fn(*example_args) to a jaxpr and build its DAG. example_args may be arrays or
    jax.ShapeDtypeStruct (nothing is allocated). param_argnums: the arguments holding the parameters."""
    closed = jax.make_jaxpr(fn)(*example_args)
    builder = _Builder()
    env: dict[Any, int] = {}
    for var, const in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        env[var] = builder.leaf("input", "const", var.aval, np.shape(const))
    leaf_counts = [len(jax.tree_util.tree_leaves(arg)) for arg in example_args]
    owners = [argnum for argnum, count in enumerate(leaf_counts) for _ in range(count)]
    params: list[int] = []
    wanted = {a % len(example_args) for a in param_argnums} if example_args else set()
    for index, var in enumerate(closed.jaxpr.invars):
        env[var] = builder.leaf("input", "input", var.aval)
        if index < len(owners) and owners[index] in wanted:
            params.append(env[var])
    builder.walk(closed.jaxpr, env, ())
    for var in closed.jaxpr.outvars:
        source = builder.source(var, env)
        out = builder.leaf("output", "output", var.aval)
        builder.graph.add_edge(source, out)
    if prune:
        prune_dag(builder.graph)
    _set_depth(builder.graph)
    return JaxDag(builder.graph, tuple(params), prune)


class _Builder:
    """Walks a jaxpr and its call-like sub-jaxprs, adding a node per equation."""

    def __init__(self) -> None:
        self.graph = nx.DiGraph()
        self.eqns = 0

    def leaf(self, node_type: NodeType, op: str, aval: Any, shape: tuple[int, ...] | None = None) -> int:
        nid = self.graph.number_of_nodes()
        dims = _shape(aval) if shape is None else tuple(int(d) for d in shape)
        dtype = _dtype(aval)
        self.graph.add_node(nid, node_type=node_type, op=op, shape=dims, dtype=dtype, shapes=(dims,),
                            dtypes=(dtype,), flops=0.0, bytes_moved=0.0, module_path="", phase="fwd", merged=(),
                            eqn=-1, depth=0)
        return nid

    def source(self, var: Any, env: dict[Any, int]) -> int:
        if isinstance(var, jcore.Literal):
            return self.leaf("literal", "literal", var.aval)
        return env[var]

    def walk(self, jaxpr: Any, env: dict[Any, int], stack: tuple[str, ...]) -> None:
        for eqn in jaxpr.eqns:
            here = (*stack, str(eqn.source_info.name_stack))
            sub = _call_jaxpr(eqn)
            sources = [self.source(v, env) for v in eqn.invars]
            if sub is not None:
                inner, consts = sub
                sub_env: dict[Any, int] = {}
                for var, const in zip(inner.constvars, consts, strict=True):
                    sub_env[var] = self.leaf("input", "const", var.aval, np.shape(const))
                sub_env.update(zip(inner.invars, sources, strict=True))
                self.walk(inner, sub_env, here)
                for outer, inner_var in zip(eqn.outvars, inner.outvars, strict=True):
                    if not isinstance(outer, jcore.DropVar):
                        env[outer] = self.source(inner_var, sub_env)
                continue
            nid = self.operator(eqn, here)
            for src in sources:
                self.graph.add_edge(src, nid)
            for var in eqn.outvars:
                if not isinstance(var, jcore.DropVar):
                    env[var] = nid

    def operator(self, eqn: Any, stack: tuple[str, ...]) -> int:
        index = self.eqns
        self.eqns += 1
        nid = self.graph.number_of_nodes()
        outs = [v.aval for v in eqn.outvars]
        shapes = tuple(_shape(a) for a in outs)
        dtypes = tuple(_dtype(a) for a in outs)
        path = module_path(stack) or f"jaxpr.{index}"
        moved = sum(_nbytes(v.aval) for v in eqn.invars if not isinstance(v, jcore.Literal))
        moved += sum(_nbytes(a) for a in outs)
        self.graph.add_node(nid, node_type="operator", op=eqn.primitive.name, shape=shapes[0] if shapes else (),
                            dtype=dtypes[0] if dtypes else "", shapes=shapes, dtypes=dtypes,
                            flops=equation_flops(eqn), bytes_moved=float(moved), module_path=path,
                            phase=phase_of(stack), merged=(), eqn=index, depth=0,
                            in_dtype=_dtype(eqn.invars[0].aval) if eqn.invars else "")
        if eqn.primitive.name == "dot_general":
            self.graph.nodes[nid]["dims"] = dot_general_dims(_shape(eqn.invars[0].aval), _shape(eqn.invars[1].aval),
                                                             eqn.params["dimension_numbers"])
        return nid


def _call_jaxpr(eqn: Any) -> tuple[Any, Sequence[Any]] | None:
    """The (jaxpr, consts) of a call-like equation whose sub-jaxpr maps its inputs and outputs one to one."""
    key = _CALLS.get(eqn.primitive.name)
    value = eqn.params.get(key) if key else None
    if value is None:
        return None
    jaxpr, consts = (value.jaxpr, value.consts) if hasattr(value, "consts") else (value, ())
    if len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != len(eqn.outvars):
        return None
    return jaxpr, consts


def equation_flops(eqn: Any) -> float:
    """FLOPs of one equation. Elementwise ops: 1 per output element; reductions: 1 per input element
    (NB: the conventions of the torch front-end for ops the jaxpr already decomposed into primitives)."""
    name = eqn.primitive.name
    params = eqn.params
    if name == "dot_general":
        return dot_general_flops(_shape(eqn.invars[0].aval), _shape(eqn.invars[1].aval),
                                 params["dimension_numbers"])
    if name == "conv_general_dilated":
        return conv_flops(_shape(eqn.outvars[0].aval), _shape(eqn.invars[1].aval),
                          params["dimension_numbers"].rhs_spec)
    if name == "scan":
        return params["length"] * _body_flops(params["jaxpr"])
    if name == "while":  # NB: the trip count is not static: one trip counted
        return _body_flops(params["cond_jaxpr"]) + _body_flops(params["body_jaxpr"])
    if name == "cond":
        return max((_body_flops(branch) for branch in params["branches"]), default=0.0)
    if name in _NO_ARITHMETIC:
        return 0.0
    if name in _REDUCTIONS or name.startswith("scatter"):
        source = eqn.invars[-1] if name.startswith("scatter") else eqn.invars[0]  # scatter: the updates
        return float(prod(_shape(source.aval)))
    return float(sum(prod(_shape(v.aval)) for v in eqn.outvars[:1]))


def _body_flops(closed: Any) -> float:
    jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    builder = _Builder()
    env: dict[Any, int] = {}
    for var in (*jaxpr.constvars, *jaxpr.invars):
        env[var] = builder.leaf("input", "input", var.aval)
    builder.walk(jaxpr, env, ())
    return sum(float(d["flops"]) for _, d in builder.graph.nodes(data=True) if d["node_type"] == "operator")


def module_path(stack: Sequence[str]) -> str:
    """Scopes of a name stack joined by "."; autodiff wrappers stripped, repeats and einsum specs dropped."""
    scopes: list[str] = []
    for level in stack:
        for token in level.split("/"):
            while (match := _WRAPPER.match(token)) is not None:
                token = match.group(1)
            if not token or "->" in token or token in _DROPPED_SCOPES or (scopes and scopes[-1] == token):
                continue
            scopes.append(token)
    return ".".join(scopes)


def phase_of(stack: Sequence[str]) -> Phase:
    return "bwd" if any("transpose(" in level for level in stack) else "fwd"


def prune_dag(graph: nx.DiGraph) -> int:
    """Remove reshape/convert-like operators that feed an operator (PredTOP IV-B.4); merge their bytes into the
    consuming operators. Returns how many nodes were removed."""
    removed = 0
    for nid in list(nx.topological_sort(graph)):
        data = graph.nodes[nid]
        if data["node_type"] != "operator" or data["op"] not in PRUNABLE:
            continue
        consumers = [s for s in graph.successors(nid) if graph.nodes[s]["node_type"] == "operator"]
        if not consumers:
            continue  # feeds only the outputs: nothing carries its effect
        share = data["bytes_moved"] / len(consumers)
        for succ in consumers:
            target = graph.nodes[succ]
            target["bytes_moved"] += share
            target["merged"] = (*target["merged"], *data["merged"], data["op"])
        preds, succs = list(graph.predecessors(nid)), list(graph.successors(nid))
        graph.remove_node(nid)
        graph.add_edges_from((p, s) for p in preds for s in succs)
        removed += 1
    return removed


def _set_depth(graph: nx.DiGraph) -> None:
    """Depth: the longest path from a source (DAGPE of the DAG Transformer)."""
    for nid in nx.topological_sort(graph):
        graph.nodes[nid]["depth"] = max((graph.nodes[p]["depth"] + 1 for p in graph.predecessors(nid)), default=0)


def _shape(aval: Any) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in getattr(aval, "shape", ()))
    except TypeError:  # symbolic dimensions
        return tuple(int(d) if isinstance(d, int) else 1 for d in aval.shape)


def _dtype(aval: Any) -> str:
    dtype = getattr(aval, "dtype", None)
    return str(np.dtype(dtype)) if dtype is not None and not _is_extended(dtype) else str(dtype or "token")


def _is_extended(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jax.dtypes.extended))


def _nbytes(aval: Any) -> int:
    dtype = getattr(aval, "dtype", None)
    if dtype is None or _is_extended(dtype):
        return 0
    return prod(_shape(aval)) * np.dtype(dtype).itemsize


def ir_dtype(dtype: str) -> DType:
    """IR dtype of a jax dtype. NB: integer and bool ops have no IR dtype: fp32 (they are memory-bound)."""
    if dtype.startswith("float8"):
        return "fp8"
    return _IR_DTYPES.get(dtype, "fp32")


# ---- OpGraph -------------------------------------------------------------------------------------------------
def op_kind(op: str) -> OpKind:
    if op == "dot_general":
        return "matmul"
    if op == "conv_general_dilated":
        return "conv"
    if op in _POOL:
        return "pool"
    return "elementwise"


def graph_from_jax(fn: Callable[..., Any], *example_args: Any, name: str | None = None, prune: bool = True,
                   param_argnums: Sequence[int] = (0,), batch_argnum: int = -1, micro_batch: int | None = None,
                   seq_len: int | None = None) -> OpGraph:
    """OpGraph of one call of fn (a training step: loss and jax.grad, so forward and backward both appear).

    Layers: one per top-level scope (the first component of the module path), in order of first appearance;
    unscoped equations form the layer "jaxpr". A layer's parameters are the elements of the parameter inputs
    (param_argnums) its forward ops consume first. micro_batch and seq_len default to the first two dimensions
    of the first array of args[batch_argnum].

    The graph is one device's whole step (OpGraph.frontend "jax"), split over tp by a strategy tree's configs
    on its ops (compile.shape_front_end), addressed by module path. For that, each forward op carries its data
    dependencies (Op.inputs: the layer's forward ops whose output it reads, -1 for the layer's input, an earlier
    layer's output or a non-parameter argument; parameters and constants left out) and the activation bytes it
    keeps for the backward pass (Op.saved_bytes: each forward output a backward op reads, counted with its first
    forward reader in the layer, else with its writer); a layer names the op writing what a later layer reads
    (Layer.hands_on).
    """
    dag = dag_from_jax(fn, *example_args, prune=prune, param_argnums=param_argnums)
    mb, seq = _batch_dims(example_args, batch_argnum, micro_batch, seq_len)
    g = dag.graph
    order: list[str] = []
    nodes: dict[str, list[int]] = {}
    for nid in dag.operators():
        layer = _layer_of(g.nodes[nid]["module_path"])
        if layer not in nodes:
            order.append(layer)
            nodes[layer] = []
        nodes[layer].append(nid)
    params = _params_by_layer(dag, order)
    params_in = set(dag.param_nodes)
    layers = tuple(_layer(dag, layer, nodes[layer], params.get(layer, 0.0), params_in) for layer in order)
    label = name or getattr(fn, "__name__", "jax")
    return OpGraph(label, layers, mb * seq, mb, frontend="jax")


def _layer(dag: JaxDag, name: str, nids: list[int], params: float, params_in: set[int]) -> Layer:
    """One layer: its forward ops with their data dependencies and saved bytes, its backward ops. params_in: the
    graph's parameter input nodes."""
    g = dag.graph
    fwd = [nid for nid in nids if g.nodes[nid]["phase"] == "fwd"]
    position = {nid: index for index, nid in enumerate(fwd)}
    saved = _saved_by_reader(dag, fwd, position)
    ops: list[Op] = []
    for nid in fwd:
        inputs = tuple(dict.fromkeys(position.get(p, -1) for p in _activation_inputs(g, nid, params_in)))
        ops.append(dataclasses.replace(_ir_op(g.nodes[nid]), inputs=inputs, saved_bytes=saved.get(nid, 0.0)))
    hands_on = max((position[nid] for nid in fwd if any(
        g.nodes[s]["node_type"] == "operator" and g.nodes[s]["phase"] == "fwd" and s not in position
        for s in g.successors(nid))), default=None)
    bwd = tuple(_ir_op(g.nodes[nid]) for nid in nids if g.nodes[nid]["phase"] == "bwd")
    return Layer(name, "block", 1, tuple(ops), bwd, (), params, params, {"none": sum(saved.values())},
                 hands_on=hands_on)


def _activation_inputs(g: nx.DiGraph, nid: int, params: set[int]) -> list[int]:
    """The predecessors of an operator that carry activations: operators, and inputs that are not parameters
    (literals and constants left out), in argument order."""
    out: list[int] = []
    for p in g.predecessors(nid):
        data = g.nodes[p]
        if data["node_type"] == "operator" or (data["node_type"] == "input" and data["op"] == "input"
                                               and p not in params):
            out.append(p)
    return out


def _saved_by_reader(dag: JaxDag, fwd: list[int], position: dict[int, int]) -> dict[int, float]:
    """{forward op: bytes it keeps for the backward pass}: each of the layer's forward outputs that a backward
    op reads, with the first forward op of the layer that reads it (as the torch front-end counts a saved tensor
    with its reader), else with its writer. NB: the jaxpr fixes what autodiff saves, so only the "none" (no
    recompute) entry is known."""
    g = dag.graph
    out: dict[int, float] = {}
    for nid in fwd:
        d = g.nodes[nid]
        if not any(g.nodes[s]["node_type"] == "operator" and g.nodes[s]["phase"] == "bwd" for s in g.successors(nid)):
            continue
        size = float(sum(prod(s) * _itemsize(t) for s, t in zip(d["shapes"], d["dtypes"], strict=True)))
        first_reader = min((position[s] for s in g.successors(nid) if s in position), default=None)
        owner = nid if first_reader is None else fwd[first_reader]
        out[owner] = out.get(owner, 0.0) + size
    return out


def _layer_of(path: str) -> str:
    return "jaxpr" if path.startswith("jaxpr.") else path.split(".")[0]


def _ir_op(d: dict[str, Any]) -> Op:
    kind = op_kind(d["op"])
    dtype = ir_dtype(d["in_dtype"] if kind in ("matmul", "conv") or d["dtype"] == "bool" else d["dtype"])
    shape = d["shape"]
    if d["op"] == "dot_general" and "dims" in d:
        shape = d["dims"]
    name = d["op"] + (f"+{len(d['merged'])}" if d["merged"] else "")
    return Op(name, kind, d["module_path"], d["phase"], dtype, float(d["flops"]), float(d["bytes_moved"]),
              tuple(shape))


def _params_by_layer(dag: JaxDag, order: list[str]) -> dict[str, float]:
    """Each parameter's elements, in the layer of its first consumer (graph_from_jax); a parameter no operator reads
    goes to the first layer."""
    g = dag.graph
    first = _first_consumers(g)
    out: dict[str, float] = {}
    for nid in dag.param_nodes:
        layer = _layer_of(g.nodes[first[nid]]["module_path"]) if nid in first else (order[0] if order else "jaxpr")
        out[layer] = out.get(layer, 0.0) + float(prod(g.nodes[nid]["shape"]))
    return out


def _first_consumers(g: nx.DiGraph) -> dict[int, int]:
    """Per node, the operator among its descendants that runs first (the forward before the backward, then in
    equation order); nodes without one are left out. One pass in reverse topological order: a node's first
    consumer is the first of its operator successors and of their own first consumers."""
    def runs_at(nid: int) -> tuple[bool, int]:
        return g.nodes[nid]["phase"] != "fwd", g.nodes[nid]["eqn"]

    first: dict[int, int] = {}
    for nid in reversed(list(nx.topological_sort(g))):
        candidates = [s for s in g.successors(nid) if g.nodes[s]["node_type"] == "operator"]
        candidates += [first[s] for s in g.successors(nid) if s in first]
        if candidates:
            first[nid] = min(candidates, key=runs_at)
    return first


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 0


def _batch_dims(args: Sequence[Any], batch_argnum: int, micro_batch: int | None,
                seq_len: int | None) -> tuple[int, int]:
    leaves = jax.tree_util.tree_leaves(args[batch_argnum]) if args else []
    shape = next((tuple(int(d) for d in leaf.shape) for leaf in leaves if getattr(leaf, "shape", ())), ())
    mb = micro_batch or (shape[0] if shape else 1)
    seq = seq_len or (shape[1] if len(shape) > 1 else 1)
    return mb, seq


# ---- the `trainsim graph --frontend jax` entry -----------------------------------------------------------------
def graph_from_jax_target(target: str, *, micro_batch: int, seq_len: int, precision: str,
                          name: str | None = None) -> OpGraph:
    """OpGraph from "path/to/file.py:factory" or "package.module:factory". The factory is called as
    factory(micro_batch=..., seq_len=..., precision=...) and returns (fn, example_args)."""
    factory = load_factory(target, "jax")
    made = factory(micro_batch=micro_batch, seq_len=seq_len, precision=precision)
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise ConfigError("model", target, "the factory must return (fn, example_args)")
    fn, args = made
    return graph_from_jax(fn, *args, name=name or target.rpartition(":")[2], micro_batch=micro_batch,
                          seq_len=seq_len)
