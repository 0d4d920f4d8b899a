"""A stage's DAG from JAX's jaxpr, the paper's own source (PredTOP sec. IV-B2): the stage's forward written in
jax.numpy, traced with jax.make_jaxpr, made a DAG of equations by the JAX front-end (frontends/jax/capture.py:
a node per equation, input, literal and output nodes, call-like equations inlined) and pruned as sec. IV-B4
(reshape, broadcast_in_dim, convert_element_type, squeeze, expand_dims and transpose removed, their effect
carried by their neighbours' shapes and dtypes). The result has dag.py's node features (one vocabulary for the
aten ops and the jaxpr primitives), so the predictors take either source.

The stage mirrors measure.stage's torch stage (measure/model.py, pre-norm GPT blocks): the embedding (token
gather plus learned positions) with the first unit, per block layer norm, q/k/v/o projections, causal softmax
attention, layer norm, a GeLU MLP, residuals; a MoE block's MLP is GShard's (Lepikhin et al. 2020, sec. 2.2)
dense dispatch: softmax router, top-k, every expert on the tokens routed to it through one-hot dispatch and
combine tensors (static shapes, as a jaxpr needs; torch's loop over routed rows has data-dependent shapes);
the final layer norm and the vocabulary projection with the last unit. Parameters are the traced function's
inputs and are dropped, as dag.py drops them (each op's output dims and its predecessors' carry their shapes).

jax is imported here only (pip install jax jaxlib).
"""

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from trainsim.frontends.jax.capture import dag_from_jax
from trainsim.ir.model_spec import TransformerSpec
from trainsim.search.predtop.dag import StageDag, _Node, to_dag
from trainsim.strategy.stage_plan import unit_kind


def _layer_norm(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]


def _linear(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    return x @ p["w"] + p["b"]


def _attention(x: jax.Array, p: dict[str, Any], heads: int) -> jax.Array:
    b, s, h = x.shape
    d = h // heads

    def split(t: jax.Array) -> jax.Array:
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(_linear(x, p["q"])), split(_linear(x, p["k"])), split(_linear(x, p["v"]))
    scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(jnp.float32(d))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
    return _linear(out, p["o"])


def _mlp(x: jax.Array, p: dict[str, Any]) -> jax.Array:
    return _linear(jax.nn.gelu(_linear(x, p["up"]), approximate=False), p["down"])


def _moe(x: jax.Array, p: dict[str, Any], experts: int, top_k: int) -> jax.Array:
    flat = x.reshape(-1, x.shape[-1])
    gates = jax.nn.softmax(flat @ p["router"], axis=-1)
    weight, expert = jax.lax.top_k(gates, top_k)
    dispatch = jax.nn.one_hot(expert, experts, dtype=flat.dtype)  # [tokens, k, experts]
    combine = (dispatch * weight[..., None]).sum(1)  # [tokens, experts]
    routed = jnp.einsum("te,th->eth", dispatch.sum(1), flat)
    hidden = jax.nn.gelu(jnp.einsum("eth,ehf->etf", routed, p["up"]) + p["up_b"][:, None], approximate=False)
    out = jnp.einsum("etf,efh->eth", hidden, p["down"]) + p["down_b"][:, None]
    return jnp.einsum("te,eth->th", combine, out).reshape(x.shape)


def _params(model: TransformerSpec, kinds: list[str]) -> list[Any]:
    """Shape-only parameters (jax.ShapeDtypeStruct) of each unit: nothing is allocated to trace."""
    h, f, v = model.hidden, model.ffn_hidden, model.vocab

    def a(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def lin(i: int, o: int) -> dict[str, Any]:
        return {"w": a(i, o), "b": a(o)}

    def norm() -> dict[str, Any]:
        return {"g": a(h), "b": a(h)}

    out: list[Any] = []
    for kind in kinds:
        if kind == "embedding":
            out.append({"tok": a(v, h), "pos": a(model.max_seq_len, h)})
        elif kind == "head":
            out.append({"norm": norm(), "w": a(h, v)})
        else:
            attn = {"q": lin(h, h), "k": lin(h, h), "v": lin(h, h), "o": lin(h, h)}
            e = model.num_experts
            fe = model.expert_ffn
            mlp = ({"router": a(h, e), "up": a(e, h, fe), "up_b": a(e, fe), "down": a(e, fe, h), "down_b": a(e, h)}
                   if kind == "moe_block" else {"up": lin(h, f), "down": lin(f, h)})
            out.append({"attn_norm": norm(), "attn": attn, "mlp_norm": norm(), "mlp": mlp})
    return out


def stage_forward(model: TransformerSpec, kinds: list[str]) -> Any:
    """fn(params, x) of units with these kinds in a row."""

    def forward(params: list[Any], x: jax.Array) -> jax.Array:
        for kind, p in zip(kinds, params, strict=True):
            if kind == "embedding":
                x = jnp.take(p["tok"], x, axis=0) + p["pos"][: x.shape[1]]
            elif kind == "head":
                x = _layer_norm(x, p["norm"]) @ p["w"]
            else:
                x = x + _attention(_layer_norm(x, p["attn_norm"]), p["attn"], model.num_heads)
                y = _layer_norm(x, p["mlp_norm"])
                x = x + (_moe(y, p["mlp"], model.num_experts, model.top_k) if kind == "moe_block"
                         else _mlp(y, p["mlp"]))
        return x

    return forward


def jax_nodes(model: TransformerSpec, first: int, end: int, micro_batch: int, seq_len: int) -> list[_Node]:
    """The pruned jaxpr DAG of units [first, end) as dag.py's nodes (parameters and unread inputs dropped)."""
    kinds = [unit_kind(model, u) for u in range(first, end)]
    x = (jax.ShapeDtypeStruct((micro_batch, seq_len), jnp.int32) if first == 0
         else jax.ShapeDtypeStruct((micro_batch, seq_len, model.hidden), jnp.float32))
    dag = dag_from_jax(stage_forward(model, kinds), _params(model, kinds), x, param_argnums=(0,))
    graph = dag.graph
    params = set(dag.param_nodes)
    keep = _topological(graph, [n for n in graph.nodes if n not in params and graph.nodes[n]["op"] != "const"])
    index = {n: i for i, n in enumerate(keep)}
    nodes = []
    for n in keep:
        d = graph.nodes[n]
        preds = [index[p] for p in graph.predecessors(n) if p in index]
        nodes.append(_Node(d["op"], d["node_type"], tuple(d["shape"]), d["dtype"], preds, float(d["flops"]),
                           float(sum(_bytes(shape, dtype) for shape, dtype in zip(d["shapes"], d["dtypes"],
                                                                                  strict=True)))))
    return nodes


def _topological(graph: Any, keep: list[int]) -> list[int]:
    import networkx as nx

    wanted = set(keep)
    return [n for n in nx.topological_sort(graph) if n in wanted]


def _bytes(shape: tuple[int, ...], dtype: str) -> float:
    import numpy as np

    try:
        size = np.dtype(dtype).itemsize
    except TypeError:
        return 0.0
    return float(np.prod(shape, dtype=np.float64)) * size


@dataclass(slots=True)
class JaxDagBuilder:
    """Stage DAGs of one model and micro-batch from the stages' jaxprs; stages of the same unit kinds in a row
    (the same DAG) are traced once."""

    model: TransformerSpec
    micro_batch: int
    seq_len: int
    _cache: dict[tuple[str, ...], StageDag] = field(default_factory=dict)

    def stage(self, first: int, end: int) -> StageDag:
        key = tuple(unit_kind(self.model, u) for u in range(first, end))
        if key not in self._cache:
            self._cache[key] = to_dag(jax_nodes(self.model, first, end, self.micro_batch, self.seq_len))
        return self._cache[key]
