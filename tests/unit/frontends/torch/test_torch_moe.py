"""A Hugging Face Mixtral captured by the torch front-end (balanced routing, torch.moe) against the catalog's
Mixtral for the same config: FLOPs, parameters, the per-expert ops, and the ep split's all-to-alls, expert
parameters and gradient groups."""

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from trainsim.catalog import load_cluster, load_model  # noqa: E402
from trainsim.catalog.hf_config import model_from_hf_config  # noqa: E402
from trainsim.cli.main import app  # noqa: E402
from trainsim.errors import ConfigError  # noqa: E402
from trainsim.frontends.catalog.transformer import build_transformer  # noqa: E402
from trainsim.frontends.registry import ModelSource  # noqa: E402
from trainsim.frontends.torch.hf import graph_from_hf_config, hf_config_from_spec  # noqa: E402
from trainsim.frontends.torch.moe import expert_of, moe_layers  # noqa: E402
from trainsim.ir.graph import Layer, OpGraph  # noqa: E402
from trainsim.ir.model_spec import TransformerSpec  # noqa: E402
from trainsim.job import make_job  # noqa: E402
from trainsim.pipeline import graph_for, predict  # noqa: E402
from trainsim.strategy.device_slice import DeviceSlice  # noqa: E402
from trainsim.strategy.parallel import ParallelSpec  # noqa: E402
from trainsim.strategy.precision import policy_for  # noqa: E402

MB, SEQ, HIDDEN, FFN, EXPERTS, TOP_K = 2, 64, 128, 96, 8, 2
TOKENS = MB * SEQ
CONFIG: dict[str, Any] = {"model_type": "mixtral", "_name_or_path": "tiny-mixtral", "num_hidden_layers": 3,
                          "hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "vocab_size": 500, "max_position_embeddings": 256,
                          "num_local_experts": EXPERTS, "num_experts_per_tok": TOP_K}
_GEMMS = ("matmul", "attention")


def _spec() -> TransformerSpec:
    spec = model_from_hf_config(CONFIG, name="tiny-mixtral")
    assert isinstance(spec, TransformerSpec)
    return spec


def _flops(graph: OpGraph, kinds: tuple[str, ...] | None = None) -> float:
    return sum(op.flops * layer.count for layer in graph.layers for op in layer.fwd + layer.bwd
               if kinds is None or op.kind in kinds)


def _block(graph: OpGraph) -> Layer:
    return next(layer for layer in graph.layers if layer.kind in ("block", "moe_block"))


@pytest.mark.parametrize(("precision", "fused"), [("fp32", False), ("bf16", False), ("bf16", True)])
def test_captured_mixtral_flops_and_parameters_match_the_catalog(precision: Any, fused: bool) -> None:
    """Matmul and attention FLOPs (the router's matmul and every expert's among them) and parameters are the
    catalog's exactly; the rest, element-wise work, differs by what each counts: the capture's aten ops (the
    router's softmax, top-k and renormalisation, each expert's gather, scaling and index_add and in the backward
    the gather's gradient written into a zero (T, h) tensor and added, E times, as HF's eager loop runs it; the
    norms' and SwiGLU's ops one by one) against the catalog's per-element FLOPs of its norms, SwiGLU and residual
    adds: under 1% of the step's FLOPs here (0.74% at fp32)."""
    traced = graph_from_hf_config(CONFIG, micro_batch=MB, seq_len=SEQ, precision=precision, fused=fused)
    analytic = build_transformer(_spec(), DeviceSlice(MB, SEQ, policy_for(precision)))
    assert {expert_of(op.module_path) for op in _block(traced).fwd} - {None} == set(range(EXPERTS))
    assert _flops(traced, _GEMMS) == _flops(analytic, _GEMMS)
    assert traced.param_count() == analytic.param_count()
    assert _block(traced).full_param_count == _block(analytic).full_param_count
    assert _block(traced).count == _block(analytic).count == 3
    other_traced, other_analytic = _flops(traced) - _flops(traced, _GEMMS), _flops(analytic) - _flops(analytic, _GEMMS)
    assert abs(other_traced - other_analytic) < 0.01 * _flops(analytic)
    assert other_traced != other_analytic  # the two count element-wise work differently (docstring)


def test_each_expert_runs_t_k_over_e_tokens_and_the_router_and_gathers_are_traced() -> None:
    block = _block(graph_from_hf_config(CONFIG, micro_batch=MB, seq_len=SEQ, precision="bf16"))
    per_expert: dict[int, list[tuple[str, tuple[int, ...], float]]] = {}
    for op in block.fwd:
        expert = expert_of(op.module_path)
        if expert is not None:
            per_expert.setdefault(expert, []).append((op.name, op.shape, op.flops))
    assert sorted(per_expert) == list(range(EXPERTS))
    assert all(ops == per_expert[0] for ops in per_expert.values())  # every expert alike: balanced
    rows = TOKENS * TOP_K // EXPERTS
    gate_up, down = (op for op in per_expert[0] if op[0] == "mm")
    assert gate_up[1] == (1, rows, 2 * FFN, HIDDEN) and down[1] == (1, rows, HIDDEN, FFN)
    names = [name for name, _, _ in per_expert[0]]
    assert names[0] == "index" and names[-1] == "index_add_"  # the gather of its tokens, the scatter back
    router = [op for op in block.fwd if op.module_path.endswith("mlp.gate")]
    assert router[0].name == "mm" and router[0].shape == (1, TOKENS, EXPERTS, HIDDEN)
    assert {"_softmax", "topk"} <= {op.name for op in router}
    assert any(op.module_path.endswith("mlp.gate") for op in block.bwd)  # the router learns (through the weights)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_ep_split_matches_the_catalog_ep_plan(ep: int) -> None:
    """E / ep experts a rank, each on T k ep / E rows (T k in all, as at ep 1), the dispatch and combine
    all-to-alls over ep forward and backward with the catalog's bytes, the experts' parameters in their own
    gradient group; the router counted whole (the catalog counts it 1 / ep with the experts)."""
    spec, dev = _spec(), DeviceSlice(MB, SEQ, policy_for("bf16"), ep=ep)
    traced = moe_layers(graph_from_hf_config(CONFIG, micro_batch=MB, seq_len=SEQ, precision="bf16", ep=ep), spec,
                        dev)
    analytic = build_transformer(spec, dev)
    block, reference = _block(traced), _block(analytic)
    assert block.kind == reference.kind == "moe_block"
    assert block.comms == reference.comms
    assert [(c.name, c.collective, c.axis, c.phase) for c in block.comms] == [
        ("dispatch", "all-to-all", "ep", "fwd"), ("combine", "all-to-all", "ep", "fwd"),
        ("combine", "all-to-all", "ep", "bwd"), ("dispatch", "all-to-all", "ep", "bwd")]
    routed_bytes = TOKENS * TOP_K * HIDDEN * 2  # T k h in bf16
    assert [c.buffer_bytes for c in block.comms] == [routed_bytes * (1 + 1 / HIDDEN), routed_bytes,
                                                     routed_bytes, routed_bytes * (1 + 1 / HIDDEN)]
    assert block.experts == reference.experts
    assert block.full_param_count == reference.full_param_count
    router = HIDDEN * EXPERTS
    assert block.param_count - reference.param_count == router - router / ep
    experts = {expert_of(op.module_path) for op in block.fwd} - {None}
    assert experts == set(range(EXPERTS // ep))
    gemm_rows = {op.shape[1] for op in block.fwd if expert_of(op.module_path) is not None and op.name == "mm"}
    assert gemm_rows == {TOKENS * TOP_K * ep // EXPERTS}
    assert _flops(traced, _GEMMS) == _flops(analytic, _GEMMS)


@pytest.mark.parametrize("engine", ["analytical", "sim"])
def test_ep_plan_prices_the_same_collectives_and_gradient_groups_as_the_catalog(engine: str,
                                                                                tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    par = ParallelSpec(dp=4, ep=2, micro_batch=MB, global_batch=8, seq_len=SEQ, precision="bf16")
    results = {}
    for frontend in ("catalog", "torch"):
        source = ModelSource(str(config), frontend=frontend)
        job = make_job(source.model_spec(), load_cluster("local-cpu"), par, num_gpus=4)
        results[frontend] = predict(job, engine, graph=graph_for(job, source))
    torch_s, catalog_s = results["torch"].breakdown, results["catalog"].breakdown
    assert torch_s["ep_comm"] == pytest.approx(catalog_s["ep_comm"], rel=1e-12) and torch_s["ep_comm"] > 0
    # the gradients' reduction and the optimizer step: the same groups; the capture's router weight whole on
    # every rank (h E, the catalog's 1 / ep of it) is the only difference, well under 1% of the parameters
    for key in ("dp_comm", "optimizer"):
        assert catalog_s[key] <= torch_s[key] < 1.01 * catalog_s[key], key


def _catalog_transformer(name: str) -> TransformerSpec:
    spec = load_model(name)
    assert isinstance(spec, TransformerSpec)
    return spec


def test_catalog_mixtral_maps_to_a_mixtral_config_and_other_moes_are_refused() -> None:
    config = hf_config_from_spec(_catalog_transformer("mixtral-8x7b"))
    assert (config["model_type"], config["num_local_experts"], config["num_experts_per_tok"]) == ("mixtral", 8, 2)
    back, catalog = model_from_hf_config(config, name="mixtral-8x7b"), _catalog_transformer("mixtral-8x7b")
    fields = ("num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads", "vocab", "mlp", "norm", "position",
              "bias", "tied_embeddings", "num_experts", "top_k", "moe_every", "expert_ffn")
    assert [getattr(back, f) for f in fields] == [getattr(catalog, f) for f in fields]
    with pytest.raises(ConfigError, match="Mixtral-shaped"):
        hf_config_from_spec(_catalog_transformer("deepseek-v3"))


@pytest.mark.parametrize(("change", "ep", "field"), [
    ({}, 3, "ep"),  # 3 does not divide 8 experts
    ({"num_local_experts": 6}, 1, "micro_batch x seq_len"),  # 128 tokens x 2 not divisible by 6 experts
    ({"model_type": "llama", "num_local_experts": 1}, 2, "ep"),  # no experts
])
def test_bad_input_is_one_config_error(change: dict[str, Any], ep: int, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        graph_from_hf_config({**CONFIG, **change}, micro_batch=MB, seq_len=SEQ, precision="bf16", ep=ep)
    assert error.value.field == field


def test_experts_traced_as_the_model_runs_them_are_refused_not_priced_without_their_shard() -> None:
    """A Mixtral traced without balanced routing (HF's own experts: one grouped GEMM, no expert slots) would lose
    its experts' shard and all-to-alls: refused in one line."""
    from trainsim.frontends.torch.capture import TensorSpec, graph_from_module
    from trainsim.frontends.torch.hf import model_for, to_pretrained_config

    config = to_pretrained_config({**CONFIG, "num_hidden_layers": 1})
    inputs = {"input_ids": TensorSpec((MB, SEQ), "int64"), "labels": TensorSpec((MB, SEQ), "int64")}
    graph = graph_from_module(lambda: model_for(config), inputs, precision="bf16", micro_batch=MB, seq_len=SEQ,
                              name="tiny-mixtral")
    with pytest.raises(ConfigError) as error:
        moe_layers(graph, _spec(), DeviceSlice(MB, SEQ, policy_for("bf16"), ep=2))
    assert error.value.field == "model tiny-mixtral" and "\n" not in str(error.value)


def test_balanced_routing_refuses_a_model_with_no_experts_module_it_recognises() -> None:
    from trainsim.frontends.torch.moe import with_balanced_routing

    with pytest.raises(ConfigError, match="Mixtral's layout") as error:
        with_balanced_routing(torch.nn.Sequential(torch.nn.Linear(4, 4)), ep=2)
    assert error.value.field == "model" and error.value.value == "Sequential"


def test_cli_refuses_ep_with_tp_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    result = CliRunner().invoke(app, ["predict", "--frontend", "torch", "--model", str(config), "--cluster",
                                      "local-cpu", "--num-gpus", "4", "--tp", "2", "--ep", "2", "--micro-batch",
                                      str(MB), "--global-batch", "4", "--seq-len", str(SEQ)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "ep=2 is invalid" in result.output


def test_an_nn_module_factory_of_mixtral_is_captured_as_its_config_is(tmp_path: Path) -> None:
    """A factory returning transformers' MixtralForCausalLM traces balanced routing too (HF's own experts
    implementation is replaced): at ep 2 its MoE block's collectives, expert shard and GEMM FLOPs are the
    config.json's."""
    factory = tmp_path / "mixtral_factory.py"
    fields = {key: value for key, value in CONFIG.items() if key not in ("model_type", "_name_or_path")}
    factory.write_text("import transformers\n\n\ndef build():\n"
                       f"    return transformers.MixtralForCausalLM(transformers.MixtralConfig(**{fields!r}))\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    par = ParallelSpec(dp=2, ep=2, micro_batch=MB, global_batch=4, seq_len=SEQ, precision="bf16")
    graphs = []
    for model in (f"{factory}:build", str(config)):
        source = ModelSource(model, frontend="torch")
        graphs.append(graph_for(make_job(source.model_spec(), load_cluster("local-cpu"), par, num_gpus=2), source))
    built, from_config = (_block(graph) for graph in graphs)
    assert built.kind == from_config.kind == "moe_block"
    assert built.comms == from_config.comms and built.experts == from_config.experts
    assert _flops(graphs[0], _GEMMS) == _flops(graphs[1], _GEMMS)
