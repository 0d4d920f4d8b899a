"""Megatron's TP/SP/CP/EP as splits of a layer's ops (strategy.megatron): the collectives their resharding
inserts are the ones the fixed patterns wrote, and compile to the same tasks.

The oracle (_pattern_comms) is the fixed-pattern code trainsim's transformer builder held before the patterns
became splits (frontends/catalog/transformer.py: _tp_comms, _cp_comms, _embedding_comms, _head_comms and the
MoE block's dispatch/combine), kept here verbatim so the split form is checked against it."""

from dataclasses import replace

import pytest

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.loader import load_model
from trainsim.compile.build import compile_job
from trainsim.cost.pricing import Pricer
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import Comm, Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.megatron import layer_comms, op_config
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig
from trainsim.strategy.precision import policy_for

# --- the oracle: the fixed patterns as they were written ---


def _act_bytes(dev: DeviceSlice) -> int:
    return BYTES_PER_DTYPE[dev.precision.activation_dtype]


def _tp_comms(spec: TransformerSpec, dev: DeviceSlice) -> list[Comm]:
    if dev.tp == 1:
        return []
    buffer = dev.local_tokens * spec.hidden * _act_bytes(dev)
    comms: list[Comm] = []
    for phase in ("fwd", "bwd"):
        for site in ("attn", "mlp"):
            if dev.sp:
                comms += [Comm(f"{site}.ag", "all-gather", "tp", phase, buffer),
                          Comm(f"{site}.rs", "reduce-scatter", "tp", phase, buffer)]
            else:
                comms.append(Comm(f"{site}.ar", "all-reduce", "tp", phase, buffer))
    return comms


def _cp_comms(spec: TransformerSpec, dev: DeviceSlice) -> list[Comm]:
    if dev.cp == 1:
        return []
    kv_full = 2 * dev.micro_batch * dev.seq_len * spec.kv_heads * spec.head_dim // dev.tp * _act_bytes(dev)
    return [Comm("kv.ag", "all-gather", "cp", "fwd", kv_full),
            Comm("kv.rs", "reduce-scatter", "cp", "bwd", kv_full)]


def _embedding_comms(spec: TransformerSpec, dev: DeviceSlice) -> list[Comm]:
    if dev.tp == 1:
        return []
    full = dev.local_tokens * spec.hidden * _act_bytes(dev)
    if dev.sp:
        return [Comm("embed.rs", "reduce-scatter", "tp", "fwd", full),
                Comm("embed.ag", "all-gather", "tp", "bwd", full)]
    return [Comm("embed.ar", "all-reduce", "tp", "fwd", full)]


def _head_comms(spec: TransformerSpec, dev: DeviceSlice) -> list[Comm]:
    if dev.tp == 1:
        return []
    tokens = dev.local_tokens
    hidden = tokens * spec.hidden * _act_bytes(dev)
    if dev.sp:
        comms = [Comm("logits.ag", "all-gather", "tp", "fwd", hidden),
                 Comm("logits.rs", "reduce-scatter", "tp", "bwd", hidden)]
    else:
        comms = [Comm("logits.ar", "all-reduce", "tp", "bwd", hidden)]
    return [*comms, *(Comm(f"loss.{name}", "all-reduce", "tp", "fwd", tokens * 4.0)
                      for name in ("max", "target", "sum_exp"))]


def _moe_comms(spec: TransformerSpec, dev: DeviceSlice) -> list[Comm]:
    a2a_bytes = dev.local_tokens * spec.top_k * spec.hidden * _act_bytes(dev)
    return [Comm("dispatch", "all-to-all", "ep", "fwd", a2a_bytes),
            Comm("combine", "all-to-all", "ep", "fwd", a2a_bytes)]


def _pattern_comms(spec: TransformerSpec, dev: DeviceSlice, layer: Layer) -> tuple[Comm, ...]:
    if layer.kind == "embedding":
        return tuple(_embedding_comms(spec, dev))
    if layer.kind == "head":
        return tuple(_head_comms(spec, dev))
    moe = _moe_comms(spec, dev) if layer.kind == "moe_block" else []
    return tuple(moe + _tp_comms(spec, dev) + _cp_comms(spec, dev))


def _ep_backward(spec: TransformerSpec, dev: DeviceSlice) -> tuple[Comm, ...]:
    """The conjugates of dispatch and combine in the backward pass, which the fixed pattern left out."""
    a2a_bytes = dev.local_tokens * spec.top_k * spec.hidden * _act_bytes(dev)
    return (Comm("combine", "all-to-all", "ep", "bwd", a2a_bytes),
            Comm("dispatch", "all-to-all", "ep", "bwd", a2a_bytes))


# --- shapes ---

DENSE = ("gpt3-125m", "llama3.1-8b", "bert-base", "bloom-176b", "llama3.2-1b")
MESHES = [(1, False, 1), (2, False, 1), (2, True, 1), (4, True, 2), (8, False, 2), (8, True, 1), (1, False, 4)]


def _slice(tp: int, sp: bool, cp: int, ep: int = 1, micro_batch: int = 2, seq_len: int = 2048,
           attention: str = "flash2") -> DeviceSlice:
    return DeviceSlice(micro_batch, seq_len, policy_for("bf16"), tp, sp, cp, ep, attention)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", DENSE)
@pytest.mark.parametrize(("tp", "sp", "cp"), MESHES)
def test_splits_of_dense_layers_insert_the_pattern_collectives(model: str, tp: int, sp: bool, cp: int) -> None:
    spec = load_model(model)
    assert isinstance(spec, TransformerSpec)
    for micro_batch, seq_len, attention in ((1, 1024, "flash2"), (2, 2048, "math"), (4, 512, "flash2")):
        dev = _slice(tp, sp, cp, micro_batch=micro_batch, seq_len=seq_len, attention=attention)
        for layer in build_transformer(spec, dev).layers:
            assert layer.comms == _pattern_comms(spec, dev, layer), (layer.name, dev)
            assert layer_comms(spec, dev, layer.kind, layer.fwd) == layer.comms


@pytest.mark.parametrize(("tp", "sp", "cp", "ep"), [(1, False, 1, 2), (2, True, 1, 2), (2, False, 2, 4),
                                                    (1, False, 1, 1)])
def test_expert_split_inserts_dispatch_and_combine_and_their_backward_conjugates(tp: int, sp: bool, cp: int,
                                                                                 ep: int) -> None:
    """The expert split (tokens by batch -> by expert and back) is the pattern's two all-to-alls forward; the
    backward pass runs their conjugates (Megatron-Core's _AllToAll backward is an all-to-all,
    megatron/core/tensor_parallel/mappings.py, megatron-core 0.9), which the fixed pattern left out. At ep=1
    the pattern listed two all-to-alls over one rank (priced 0); the split form lists none."""
    spec = load_model("mixtral-8x7b")
    assert isinstance(spec, TransformerSpec)
    dev = _slice(tp, sp, cp, ep)
    for layer in build_transformer(spec, dev).layers:
        expected = _pattern_comms(spec, dev, layer)
        if layer.kind == "moe_block":
            expected = tuple(c for c in expected if c.axis != "ep")
            if ep > 1:
                expected = (*_moe_comms(spec, dev), *_ep_backward(spec, dev), *expected)
        assert layer.comms == expected, layer.name


def test_megatron_configs_of_a_block_are_column_row_and_sequence_splits() -> None:
    """tp 2 + sp: qkv and fc1 split their outputs, the attention its heads, the projection and fc2 their
    reduction, norms and residual adds the sequence; the lookup its vocabulary rows (a reduction)."""
    spec = load_model("gpt3-125m")
    assert isinstance(spec, TransformerSpec)
    dev = _slice(2, True, 1)
    graph = build_transformer(spec, dev)
    configs = {op.name: op_config("tp", op, dev) for layer in graph.layers for op in layer.fwd}
    out, reduce, seq = OpConfig(1, 1, 2, 1), OpConfig(1, 1, 1, 2), OpConfig(1, 2, 1, 1)
    assert configs == {"lookup": reduce, "pos_add": seq, "norm1": seq, "qkv": out, "attention": out,
                       "out_proj": reduce, "residual1": seq, "norm2": seq, "fc1": out, "gelu": out, "fc2": reduce,
                       "residual2": seq, "final_norm": seq, "logits": out, "cross_entropy": out}
    block = next(layer for layer in graph.layers if layer.kind == "block")
    hidden = dev.local_tokens * spec.hidden * 2  # bf16
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in block.comms] == [
        ("attn.ag", "all-gather", "fwd", hidden), ("attn.rs", "reduce-scatter", "fwd", hidden),
        ("mlp.ag", "all-gather", "fwd", hidden), ("mlp.rs", "reduce-scatter", "fwd", hidden),
        ("attn.ag", "all-gather", "bwd", hidden), ("attn.rs", "reduce-scatter", "bwd", hidden),
        ("mlp.ag", "all-gather", "bwd", hidden), ("mlp.rs", "reduce-scatter", "bwd", hidden)]


# --- compiled: the same tasks ---


def _with_pattern(graph: OpGraph, spec: TransformerSpec, dev: DeviceSlice) -> OpGraph:
    return replace(graph, layers=tuple(replace(layer, comms=_pattern_comms(spec, dev, layer))
                                       for layer in graph.layers))


def _tasks(graph: ExecGraph) -> list[tuple[object, ...]]:
    return [(t.name, t.device, t.stream, t.kind, t.duration_s, t.deps, t.resources, t.category, t.phase,
             t.alloc_bytes, t.free_bytes) for t in graph.tasks]


@pytest.mark.parametrize("level", ["layer", "op"])
@pytest.mark.parametrize(("model", "strategy"), [
    ("gpt3-125m", {"tp": 2}),
    ("gpt3-125m", {"tp": 4, "sp": True}),
    ("llama3.2-1b", {"tp": 2, "sp": True, "cp": 2}),
    ("llama3.2-1b", {"tp": 8, "pp": 2, "sp": True}),
    ("bert-base", {"tp": 2, "pp": 2}),
])
def test_split_form_compiles_to_the_pattern_tasks(model: str, strategy: dict[str, object], level: str) -> None:
    """The job's graph (collectives from the splits) and the same graph with the fixed patterns' collectives
    compile to identical tasks: kinds, groups (link resources), bytes (durations priced from them), order."""
    spec = load_model(model)
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 512, "global_batch": 32, **strategy})
    job = make_job(spec, a100_cluster(16), par)
    dev = DeviceSlice.of(job.parallel)
    graph = build_transformer(spec, dev)
    split_form = compile_job(job, default_plan(graph, job.parallel), Pricer(Calibration()), level)  # type: ignore[arg-type]
    pattern = _with_pattern(graph, spec, dev)
    fixed = compile_job(job, default_plan(pattern, job.parallel), Pricer(Calibration()), level)  # type: ignore[arg-type]
    assert _tasks(split_form) == _tasks(fixed)
    assert any(t.category == "tp_comm" for t in split_form.tasks)
