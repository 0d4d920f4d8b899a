"""The JAX front-end: a GPT block train step in jax.numpy -> DAG (PredTOP IV-B) -> OpGraph."""

from typing import Any

import pytest

jax = pytest.importorskip("jax")
nx = pytest.importorskip("networkx")

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from trainsim.errors import ConfigError  # noqa: E402
from trainsim.frontends.catalog.transformer import build_transformer  # noqa: E402
from trainsim.frontends.jax.capture import (  # noqa: E402
    PRUNABLE,
    conv_flops,
    dag_from_jax,
    dot_general_flops,
    graph_from_jax,
    graph_from_jax_target,
    module_path,
)
from trainsim.ir.model_spec import TransformerSpec  # noqa: E402
from trainsim.strategy.device_slice import DeviceSlice  # noqa: E402
from trainsim.strategy.precision import policy_for  # noqa: E402

HIDDEN, HEADS, SEQ, BATCH = 64, 2, 16, 2
F32 = jnp.float32


def _layer_norm(x: Any, gain: Any, bias: Any) -> Any:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * gain + bias


def gpt_block(p: dict[str, Any], x: Any, compute_dtype: Any = jnp.bfloat16) -> Any:
    """Pre-norm GPT block; matmuls in compute_dtype (mixed precision: converts appear), the rest in fp32."""
    b, s, h = x.shape
    hd = h // HEADS

    def mm(a: Any, w: Any) -> Any:
        return (a.astype(compute_dtype) @ w.astype(compute_dtype)).astype(F32)

    with jax.named_scope("ln1"):
        y = _layer_norm(x, p["g1"], p["b1"])
    with jax.named_scope("attn"):
        qkv = mm(y, p["wqkv"]) + p["bqkv"]
        q, k, v = (t.reshape(b, s, HEADS, hd).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(float(hd))
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
        o = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        x = x + mm(o.transpose(0, 2, 1, 3).reshape(b, s, h), p["wo"]) + p["bo"]
    with jax.named_scope("ln2"):
        y = _layer_norm(x, p["g2"], p["b2"])
    with jax.named_scope("mlp"):
        x = x + mm(jax.nn.gelu(mm(y, p["w1"]) + p["c1"]), p["w2"]) + p["c2"]
    return x


def gpt_params(h: int = HIDDEN) -> dict[str, Any]:
    shapes = {"g1": (h,), "b1": (h,), "wqkv": (h, 3 * h), "bqkv": (3 * h,), "wo": (h, h), "bo": (h,),
              "g2": (h,), "b2": (h,), "w1": (h, 4 * h), "c1": (4 * h,), "w2": (4 * h, h), "c2": (h,)}
    return {key: jax.ShapeDtypeStruct(shape, F32) for key, shape in shapes.items()}


def train_step(p: dict[str, Any], x: Any) -> Any:
    def loss(p: dict[str, Any]) -> Any:
        return (gpt_block(p, x) ** 2).mean()

    return jax.value_and_grad(loss)(p)


def gpt_step_factory(*, micro_batch: int, seq_len: int, precision: str) -> tuple[Any, tuple[Any, ...]]:
    """For `trainsim graph --frontend jax --model tests/unit/test_jax_frontend.py:gpt_step_factory`."""
    del precision
    return train_step, (gpt_params(), jax.ShapeDtypeStruct((micro_batch, seq_len, HIDDEN), F32))


def _example() -> tuple[dict[str, Any], Any]:
    return gpt_params(), jax.ShapeDtypeStruct((BATCH, SEQ, HIDDEN), F32)


def _analytic_block_matmul_flops() -> float:
    """24 B S H^2 (qkv, out, fc1, fc2) + 4 B S^2 H (scores and weighted sum, unmasked) per forward."""
    return 24.0 * BATCH * SEQ * HIDDEN**2 + 4.0 * BATCH * SEQ**2 * HIDDEN


def test_dot_general_flops_match_the_analytic_block_formula() -> None:
    dag = dag_from_jax(train_step, *_example())
    g = dag.graph
    dots = [g.nodes[n] for n in dag.operators() if g.nodes[n]["op"] == "dot_general"]
    fwd = sum(d["flops"] for d in dots if d["phase"] == "fwd")
    bwd = sum(d["flops"] for d in dots if d["phase"] == "bwd")
    assert fwd == pytest.approx(_analytic_block_matmul_flops(), rel=0.01)
    assert bwd == pytest.approx(2 * _analytic_block_matmul_flops(), rel=0.01)
    assert sum(1 for d in dots if d["phase"] == "fwd") == 6
    assert sum(1 for d in dots if d["phase"] == "bwd") == 12


def test_matches_the_catalog_builder_block() -> None:
    spec = TransformerSpec(name="tiny-gpt", num_layers=1, hidden=HIDDEN, ffn_hidden=4 * HIDDEN, num_heads=HEADS,
                           vocab=128, max_seq_len=SEQ)
    analytic = build_transformer(spec, DeviceSlice(BATCH, SEQ, policy_for("fp32"), attention="math"))
    block = next(layer for layer in analytic.layers if layer.name == "block")
    graph = graph_from_jax(train_step, *_example(), name="block")
    for phase in ("fwd", "bwd"):
        expected = sum(op.flops for op in (block.fwd if phase == "fwd" else block.bwd)
                       if op.kind in ("matmul", "attention"))
        got = sum(op.flops for layer in graph.layers for op in (layer.fwd if phase == "fwd" else layer.bwd)
                  if op.kind == "matmul")
        assert got == pytest.approx(expected, rel=0.01), phase
    assert graph.param_count() == block.full_param_count


def test_pruning_removes_reshape_and_convert_nodes_and_keeps_bytes() -> None:
    full = dag_from_jax(train_step, *_example(), prune=False)
    pruned = dag_from_jax(train_step, *_example())
    for op in ("reshape", "convert_element_type", "transpose", "broadcast_in_dim"):
        assert full.count(op) > 0, op
    g = pruned.graph
    left = [n for n in pruned.operators() if g.nodes[n]["op"] in PRUNABLE]
    for nid in left:  # only those whose sole consumers are graph outputs (fp32 casts of the gradients)
        assert all(g.nodes[s]["node_type"] == "output" for s in g.successors(nid))
    assert pruned.count("reshape") == 0
    assert pruned.count("convert_element_type") < full.count("convert_element_type") // 2
    assert len(pruned.operators()) < len(full.operators()) * 0.8
    assert pruned.total("bytes_moved") == pytest.approx(full.total("bytes_moved"))
    assert pruned.total("flops") == pytest.approx(full.total("flops"))
    merged = [g.nodes[n]["merged"] for n in pruned.operators() if g.nodes[n]["merged"]]
    assert any("convert_element_type" in m for m in merged)
    assert nx.is_directed_acyclic_graph(g)


def test_forward_backward_and_module_paths() -> None:
    graph = graph_from_jax(train_step, *_example(), name="gpt-block")
    assert [layer.name for layer in graph.layers][:4] == ["ln1", "attn", "ln2", "mlp"]
    attn = next(layer for layer in graph.layers if layer.name == "attn")
    assert attn.fwd and attn.bwd
    assert graph.total_flops("bwd") > 1.5 * graph.total_flops("fwd")
    assert graph.tokens_per_micro_batch == BATCH * SEQ and graph.samples_per_micro_batch == BATCH
    matmuls = [op for op in attn.fwd if op.kind == "matmul"]
    assert matmuls[0].dtype == "bf16" and matmuls[0].shape == (1, BATCH * SEQ, 3 * HIDDEN, HIDDEN)
    assert all(op.module_path.startswith("attn") for op in attn.fwd + attn.bwd)
    assert attn.saved_bytes["none"] > 0
    assert "gpt-block" in graph.pretty()


def test_dag_node_features_for_the_learned_predictor() -> None:
    dag = dag_from_jax(train_step, *_example())
    g = dag.graph
    types = {d["node_type"] for _, d in g.nodes(data=True)}
    assert types == {"input", "literal", "operator", "output"}
    for _, d in g.nodes(data=True):
        assert {"op", "shape", "dtype", "flops", "depth"} <= set(d)
    depths = [g.nodes[n]["depth"] for n in dag.operators()]
    assert max(depths) > 20
    for u, v in g.edges:
        assert g.nodes[v]["depth"] > g.nodes[u]["depth"]
    assert len(dag.param_nodes) == len(gpt_params())
    assert "dot_general" in dag.pretty()


def test_recurses_into_jit_remat_and_custom_jvp() -> None:
    def f(w: Any, x: Any) -> Any:
        with jax.named_scope("blk"):
            y = jax.checkpoint(lambda x: jnp.tanh(x @ w))(x)
            return jax.nn.relu(y).sum()

    w, x = jax.ShapeDtypeStruct((8, 8), F32), jax.ShapeDtypeStruct((4, 8), F32)
    dag = dag_from_jax(jax.jit(jax.grad(f)), w, x)
    ops = [dag.graph.nodes[n] for n in dag.operators()]
    names = [d["op"] for d in ops]
    assert not {"jit", "pjit", "remat2", "checkpoint", "custom_jvp_call"} & set(names)
    # forward x @ w, recomputed x @ w in the backward (remat), and the weight gradient
    dots = [d for d in ops if d["op"] == "dot_general"]
    assert [d["phase"] for d in dots] == ["fwd", "bwd", "bwd"]
    assert all(d["flops"] == 2 * 4 * 8 * 8 for d in dots)
    assert all(d["module_path"] == "blk" for d in dots)
    forward_only = dag_from_jax(f, w, x)
    assert "max" in [forward_only.graph.nodes[n]["op"] for n in forward_only.operators()]  # relu's body


def test_conv_and_scan_flops() -> None:
    def conv_loss(w: Any, x: Any) -> Any:
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")).sum()

    w, x = jax.ShapeDtypeStruct((3, 3, 8, 16), F32), jax.ShapeDtypeStruct((2, 10, 10, 8), F32)
    dag = dag_from_jax(jax.grad(conv_loss), w, x)
    convs = [dag.graph.nodes[n] for n in dag.operators() if dag.graph.nodes[n]["op"] == "conv_general_dilated"]
    forward = 2.0 * 2 * 10 * 10 * 16 * 8 * 3 * 3
    assert [c["flops"] for c in convs] == [forward, forward]  # forward and the weight gradient
    assert conv_flops((2, 10, 10, 16), (3, 3, 8, 16), (3, 2, 0, 1)) == forward

    def scanned(w: Any, x: Any) -> Any:
        return lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=5)[0].sum()

    dag = dag_from_jax(scanned, jax.ShapeDtypeStruct((8, 8), F32), jax.ShapeDtypeStruct((4, 8), F32))
    scan = next(dag.graph.nodes[n] for n in dag.operators() if dag.graph.nodes[n]["op"] == "scan")
    assert scan["flops"] == 5 * (2 * 4 * 8 * 8 + 4 * 8)
    assert dot_general_flops((3, 4, 5), (3, 5, 6), (((2,), (1,)), ((0,), (0,)))) == 2 * 3 * 4 * 5 * 6


def test_module_path_strips_autodiff_wrappers() -> None:
    assert module_path(("transpose(jvp(attn))/bhqk,bhkd->bhqd",)) == "attn"
    assert module_path(("transpose(jvp(blk))/jvp(blk)", "rematted_computation")) == "blk"
    assert module_path(("jvp(outer)", "inner")) == "outer.inner"
    assert module_path(("jvp()",)) == ""


def test_unscoped_ops_get_equation_paths() -> None:
    graph = graph_from_jax(jax.grad(lambda w, x: jnp.tanh(x @ w).sum()), jax.ShapeDtypeStruct((8, 8), F32),
                           jax.ShapeDtypeStruct((4, 8), F32))
    assert [layer.name for layer in graph.layers] == ["jaxpr"]
    assert all(op.module_path.startswith("jaxpr.") for op in graph.layers[0].fwd)


def test_factory_target_for_the_cli() -> None:
    graph = graph_from_jax_target(f"{__file__}:gpt_step_factory", micro_batch=1, seq_len=8, precision="fp32")
    assert graph.model_name == "gpt_step_factory" and graph.tokens_per_micro_batch == 8
    with pytest.raises(ConfigError):
        graph_from_jax_target("no_colon_here", micro_batch=1, seq_len=8, precision="fp32")
    with pytest.raises(ConfigError):
        graph_from_jax_target(f"{__file__}:missing", micro_batch=1, seq_len=8, precision="fp32")
