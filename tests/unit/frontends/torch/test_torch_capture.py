"""The torch front-end against the catalog's analytic IR (Hugging Face GPT-2, LLaMA, BERT), per-op precision on
a LLaMA block (rule table and fake-CUDA probe), repeated-layer detection, and plain nn.Modules."""

import subprocess
import sys
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainsim.catalog.hf_config import model_from_hf_config  # noqa: E402
from trainsim.frontends.catalog.transformer import build_transformer  # noqa: E402
from trainsim.frontends.torch.capture import TensorSpec, capture_step, graph_from_module  # noqa: E402
from trainsim.frontends.torch.hf import graph_from_hf_config, hf_config_from_spec, model_for  # noqa: E402
from trainsim.ir.graph import OpGraph  # noqa: E402
from trainsim.ir.model_spec import TransformerSpec  # noqa: E402
from trainsim.strategy.device_slice import DeviceSlice  # noqa: E402
from trainsim.strategy.precision import policy_for  # noqa: E402

MB, SEQ = 2, 128
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000,
             "n_positions": 256, "bos_token_id": 0, "eos_token_id": 0},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 352,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 256},
    "bert": {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 512,
             "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256},
}


def _catalog(config: dict[str, Any], precision: Any) -> OpGraph:
    spec = model_from_hf_config(config, name=config["model_type"])
    assert isinstance(spec, TransformerSpec)
    return build_transformer(spec, DeviceSlice(MB, SEQ, policy_for(precision)))


def _total(graph: OpGraph) -> float:
    return graph.total_flops("fwd") + graph.total_flops("bwd")


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_decoders_agree_with_the_catalog(family: str, precision: Any) -> None:
    config = CONFIGS[family]
    traced = graph_from_hf_config(config, micro_batch=MB, seq_len=SEQ, precision=precision)
    analytic = _catalog(config, precision)
    ratio = _total(traced) / _total(analytic)
    print(f"{family} {precision}: torch {_total(traced):.6g} FLOPs, catalog {_total(analytic):.6g}, "
          f"ratio {ratio:.5f}; params {traced.param_count():.0f} vs {analytic.param_count():.0f}")
    assert ratio == pytest.approx(1.0, rel=0.01)
    weight_bytes = policy_for(precision).weight_bytes
    assert traced.param_count() * weight_bytes == analytic.param_count() * weight_bytes
    assert [layer.kind for layer in traced.layers] == ["embedding", "block", "head"]
    assert traced.layers[1].full_param_count == analytic.layers[1].full_param_count
    assert traced.layers[1].output_bytes > 0 and traced.layers[1].saved_bytes["none"] > 0


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("precision", ["amp-bf16", "bf16"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_ops_carry_their_data_dependencies_and_saved_activations(family: str, precision: Any, fused: bool) -> None:
    """Each forward op names the ops it reads (Op.inputs: earlier positions of its layer, -1 the layer's input):
    a block's first op reads the block's input, its residual add the input (the skip) and the projection before
    it; every tensor the log keeps for the backward is counted with exactly one op (Op.saved_bytes sum to the
    layer's, their side outputs to what selective recompute drops); the block hands on what its last op writes."""
    graph = graph_from_hf_config(CONFIGS[family], micro_batch=MB, seq_len=SEQ, precision=precision, fused=fused)
    for layer in graph.layers:
        for position, op in enumerate(layer.fwd):
            assert op.inputs is not None and all(-1 <= p < position for p in op.inputs), (layer.name, op)
        assert sum(op.saved_bytes for op in layer.fwd) == layer.saved_bytes["none"]
        if layer.kind == "block":
            assert sum(op.saved_aux_bytes for op in layer.fwd) == layer.saved_bytes["none"] - layer.saved_bytes[
                "selective"]
    block = graph.layers[1]
    assert block.fwd[0].inputs == (-1,) and block.hands_on == len(block.fwd) - 1
    first_add = next(op for op in block.fwd if op.inputs is not None and -1 in op.inputs and op is not block.fwd[0])
    assert len(first_add.inputs or ()) == 2  # the skip connection and the attention's projection
    assert all(op.inputs == () for op in graph.layers[0].fwd if op.kind == "embedding")  # token ids


def test_bert_flops_agree_with_the_catalog() -> None:
    config = CONFIGS["bert"]
    traced = graph_from_hf_config(config, micro_batch=MB, seq_len=SEQ, precision="fp32")
    assert _total(traced) / _total(_catalog(config, "fp32")) == pytest.approx(1.0, rel=0.01)


def test_bert_parameter_bytes_match_the_catalog_exactly() -> None:
    config = CONFIGS["bert"]
    traced = graph_from_hf_config(config, micro_batch=MB, seq_len=SEQ, precision="fp32")
    assert traced.param_count() == _catalog(config, "fp32").param_count()


def test_ingesting_16_layers_costs_about_what_2_layers_cost() -> None:
    timings = {}
    graphs = {}
    for layers in (2, 16):
        config = {**CONFIGS["llama"], "num_hidden_layers": layers}
        graph_from_hf_config(config, micro_batch=MB, seq_len=SEQ)  # warm caches (imports, fake kernels)
        start = time.perf_counter()
        graphs[layers] = graph_from_hf_config(config, micro_batch=MB, seq_len=SEQ)
        timings[layers] = time.perf_counter() - start
    print(f"ingest time: 2 layers {timings[2]:.3f} s, 16 layers {timings[16]:.3f} s")
    for layers, graph in graphs.items():
        blocks = [layer for layer in graph.layers if layer.kind == "block"]
        assert len(blocks) == 1 and blocks[0].count == layers
    assert len(graphs[2].layers[1].fwd) == len(graphs[16].layers[1].fwd)
    assert _total(graphs[16]) == pytest.approx(_total(_catalog({**CONFIGS["llama"], "num_hidden_layers": 16},
                                                               "fp32")), rel=0.01)


# ---- per-op precision on a LLaMA block -------------------------------------------------------------------------

def _llama_capture(precision: str, keep_calls: bool = False) -> Any:
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=352,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                      max_position_embeddings=256, use_cache=False)
    config._attn_implementation = "sdpa"
    inputs = {"input_ids": TensorSpec((MB, 64), "int64"), "labels": TensorSpec((MB, 64), "int64")}
    return capture_step(lambda: model_for(config), inputs, precision=precision,  # type: ignore[arg-type]
                        keep_calls=keep_calls)


def _block_ops(capture: Any, phase: str = "fwd") -> list[Any]:
    return [lo.op for lo in capture.log.ops if lo.segment == "block:0" and lo.op.phase == phase]


def test_llama_block_dtypes_under_amp_bf16() -> None:
    capture = _llama_capture("amp-bf16")
    ops = _block_ops(capture)
    by_name: dict[str, set[str]] = {}
    for op in ops:
        by_name.setdefault(op.name, set()).add(op.dtype)
    assert by_name["mm"] == {"bf16"}  # every linear
    assert by_name["_scaled_dot_product_flash_attention_for_cpu"] == {"bf16"}
    assert by_name["pow"] == by_name["mean"] == by_name["rsqrt"] == {"fp32"}  # RMSNorm
    assert by_name["silu"] == {"bf16"}  # on the bf16 gate projection
    assert {op.dtype for op in ops if op.name == "add" and op.module_path == "model.layers.0"} == {"fp32"}
    casts = [op for op in ops if op.name == "_to_copy"]
    assert casts and {op.dtype for op in casts} == {"bf16"}  # autocast's input casts
    bwd = _block_ops(capture, "bwd")
    assert {op.dtype for op in bwd if op.kind == "matmul"} == {"bf16"}
    assert {op.dtype for op in bwd if op.name == "_to_copy"} == {"fp32"}  # gradients cast back
    mm = next(op for op in ops if op.name == "mm" and op.module_path.endswith("q_proj"))
    batch, m, n, k = mm.shape
    assert mm.bytes_moved == (m * k + k * n + m * n) * 2 * batch


def test_llama_block_dtypes_match_the_fake_cuda_probe() -> None:
    """Replay every forward op of the block on fake CUDA tensors of its inputs' dtypes under torch's CUDA
    autocast: the dtype torch produces is the one the front-end assigned."""
    from trainsim.frontends.torch.probe import probe_call

    capture = _llama_capture("amp-bf16", keep_calls=True)
    checked = set()
    for record in capture.log.calls:
        if not record.op.module_path.startswith("model.layers.0") or record.output_dtype is None:
            continue
        got = probe_call(record, "amp-bf16")
        if got is None:
            continue
        assert got == record.output_dtype, f"{record.op.name} at {record.op.module_path}"
        checked.add(record.op.name)
    assert {"mm", "_scaled_dot_product_flash_attention_for_cpu", "pow", "mean", "rsqrt", "mul", "add",
            "silu"} <= checked


@pytest.mark.parametrize(("precision", "gemm", "other", "element_bytes"), [
    ("fp32", "fp32", "fp32", 4), ("tf32", "tf32", "fp32", 4), ("fp16", "fp16", "fp16", 2),
    ("bf16", "bf16", "bf16", 2), ("fp8", "fp8", "bf16", 1),
])
def test_pure_precisions(precision: str, gemm: str, other: str, element_bytes: int) -> None:
    ops = _block_ops(_llama_capture(precision))
    linears = [op for op in ops if op.name == "mm"]
    assert {op.dtype for op in linears} == {gemm}
    assert {op.dtype for op in ops if op.name == "silu"} == {other}
    attention = next(op for op in ops if op.kind == "attention")
    assert attention.dtype == ("bf16" if precision == "fp8" else gemm)
    batch, m, n, k = linears[0].shape
    out_bytes = 2 if precision == "fp8" else element_bytes
    assert linears[0].bytes_moved == batch * ((m * k + k * n) * element_bytes + m * n * out_bytes)


# ---- plain modules ---------------------------------------------------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self, width: int, extra: bool = False) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)
        self.extra = extra

    def forward(self, x: Any) -> Any:
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return x + (y * 2 if self.extra else y)


class _Net(torch.nn.Module):
    def __init__(self, width: int = 32, depth: int = 6, vocab: int = 50, alternate: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(_Block(width, alternate and i % 2 == 1) for i in range(depth))
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids: Any) -> Any:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_module_instance_with_weights_is_traced_on_fake_tensors() -> None:
    net = _Net()
    graph = graph_from_module(net, [TensorSpec((4, 16), "int64")], precision="fp32")
    assert [(layer.name, layer.kind, layer.count) for layer in graph.layers] == [
        ("embedding", "embedding", 1), ("block", "block", 6), ("head", "head", 1)]
    assert graph.param_count() == sum(p.numel() for p in net.parameters())
    assert len(net.blocks) == 6  # the container was restored after the trace
    tokens = 4 * 16
    block = graph.layers[1]
    gemm = 2 * tokens * 32 * 128 * 2  # fc1 + fc2 forward
    assert sum(op.flops for op in block.fwd if op.kind == "matmul") == gemm
    assert sum(op.flops for op in block.bwd if op.kind == "matmul") == 2 * gemm
    assert {op.module_path for op in block.fwd} >= {"blocks.0.fc1", "blocks.0.fc2", "blocks.0.norm"}
    assert graph.tokens_per_micro_batch == tokens and graph.samples_per_micro_batch == 4


def test_factory_and_blocks_that_differ_by_index() -> None:
    graph = graph_from_module(lambda: _Net(depth=5, alternate=True), [TensorSpec((2, 8), "int64")])
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert sorted(layer.count for layer in blocks) == [2, 3]  # traced in full, grouped by op signature
    assert graph.param_count() == sum(p.numel() for p in _Net(depth=5).parameters())


def test_module_without_a_repeated_container() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    graph = graph_from_module(net, [(3, 8)])
    assert [layer.name for layer in graph.layers] == ["0", "1", "2", "head"]  # head: the default loss (a sum)
    assert graph.param_count() == sum(p.numel() for p in net.parameters())
    assert graph.total_flops("fwd") > 0 and graph.total_flops("bwd") > 0


def test_catalog_transformer_maps_to_a_hugging_face_family() -> None:
    from trainsim.catalog import load_model

    spec = load_model("gpt3-1.3b")
    config = hf_config_from_spec(spec)  # type: ignore[arg-type]
    assert config["model_type"] == "gpt2" and config["n_layer"] == spec.num_layers  # type: ignore[union-attr]


def test_trainsim_import_does_not_import_torch() -> None:
    code = ("import sys, trainsim, trainsim.cli.main, trainsim.cli.graph, trainsim.strategy.autocast_rules; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
