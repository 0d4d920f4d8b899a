"""Megatron's TP/SP/CP/EP as splits of a layer's ops (strategy.megatron): the collectives their resharding
inserts are the ones the fixed patterns wrote, and compile to the same tasks.

The oracle (_pattern_comms) is the fixed-pattern code trainsim's transformer builder held before the patterns
became splits (frontends/catalog/transformer.py: _tp_comms, _cp_comms, _embedding_comms, _head_comms and the
MoE block's dispatch/combine), kept here verbatim so the split form is checked against it."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.loader import load_model
from trainsim.compile.build import compile_job
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.exec_graph import ExecGraph
from trainsim.ir.graph import Comm, Layer, OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.megatron import layer_comms, megatron_tp, op_config, own_configs, replicable_module
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import StrategyTree
from trainsim.strategy.tree_yaml import dump_tree_yaml, load_tree_yaml, tree_from_mapping

# --- the oracle: the fixed patterns as they were written ---


def _act_bytes(dev: DeviceSlice) -> int:
    return BYTES_PER_DTYPE[dev.precision.activation_dtype]


def _tp_comms(spec: TransformerSpec, dev: DeviceSlice, moe: bool = False) -> list[Comm]:
    """Megatron's pattern; each collective at a column-parallel linear's input names it (an MoE's experts none):
    its forward all-gather under sp, its input gradient's all-reduce or reduce-scatter in backward."""
    if dev.tp == 1:
        return []
    buffer = dev.local_tokens * spec.hidden * _act_bytes(dev)
    # Megatron-Core's all-to-all dispatcher gathers the routed tokens (top_k per token) over tp after the dispatch,
    # with their routing probabilities (one activation-dtype value per copy), and scatters the outputs alone back
    routed = buffer * spec.top_k if moe and _alltoall_order(dev) else buffer
    with_probs = routed + routed // spec.hidden if moe and _alltoall_order(dev) else routed
    columns = {"attn": "qkv", "mlp": "" if moe else "gate_up" if spec.mlp == "swiglu" else "fc1"}
    comms: list[Comm] = []
    for phase in ("fwd", "bwd"):
        for site in ("attn", "mlp"):
            column = columns[site]
            gather = with_probs if site == "mlp" and phase == "fwd" else routed if site == "mlp" else buffer
            scatter = with_probs if site == "mlp" and phase == "bwd" else routed if site == "mlp" else buffer
            if dev.sp:
                comms += [Comm(f"{site}.ag", "all-gather", "tp", phase, gather, 0, column if phase == "fwd" else ""),
                          Comm(f"{site}.rs", "reduce-scatter", "tp", phase, scatter, 0,
                               column if phase == "bwd" else "")]
            else:
                comms.append(Comm(f"{site}.ar", "all-reduce", "tp", phase, buffer, 0, column if phase == "bwd" else ""))
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
        comms = [Comm("logits.ag", "all-gather", "tp", "fwd", hidden, 0, "logits"),
                 Comm("logits.rs", "reduce-scatter", "tp", "bwd", hidden, 0, "logits")]
    else:
        comms = [Comm("logits.ar", "all-reduce", "tp", "bwd", hidden, 0, "logits")]
    return [*comms, *(Comm(f"loss.{name}", "all-reduce", "tp", "fwd", tokens * 4.0)
                      for name in ("max", "target", "sum_exp"))]


def _alltoall_order(dev: DeviceSlice) -> bool:
    """Megatron-Core's MoEAlltoAllTokenDispatcher's order (megatron/core/transformer/moe/token_dispatcher.py,
    megatron-core 0.9.0 and 0.16.1): under sp at tp > 1 each tp rank dispatches its own sequence share (at ep 1
    the all-to-all is the identity and the routed copies are still gathered over tp)."""
    return dev.sp and dev.tp > 1


def _a2a_bytes(spec: TransformerSpec, dev: DeviceSlice) -> int:
    tokens = dev.local_tokens // dev.tp if _alltoall_order(dev) else dev.local_tokens
    return tokens * spec.top_k * spec.hidden * _act_bytes(dev)


def _moe_comms(spec: TransformerSpec, dev: DeviceSlice) -> list[Comm]:
    """The dispatch moves each routed copy's probability (one activation-dtype value) beside its hidden state
    (megatron-core 0.16.1's token_dispatch), the combine the hidden states alone."""
    a2a_bytes = _a2a_bytes(spec, dev)
    return [Comm("dispatch", "all-to-all", "ep", "fwd", a2a_bytes + a2a_bytes // spec.hidden),
            Comm("combine", "all-to-all", "ep", "fwd", a2a_bytes)]


def _pattern_comms(spec: TransformerSpec, dev: DeviceSlice, layer: Layer) -> tuple[Comm, ...]:
    if layer.kind == "embedding":
        return tuple(_embedding_comms(spec, dev))
    if layer.kind == "head":
        return tuple(_head_comms(spec, dev))
    moe = _moe_comms(spec, dev) if layer.kind == "moe_block" else []
    return tuple(moe + _tp_comms(spec, dev, bool(moe)) + _cp_comms(spec, dev))


def _ep_backward(spec: TransformerSpec, dev: DeviceSlice) -> tuple[Comm, ...]:
    """The conjugates of dispatch and combine in the backward pass, which the fixed pattern left out."""
    a2a_bytes = _a2a_bytes(spec, dev)
    return (Comm("combine", "all-to-all", "ep", "bwd", a2a_bytes),
            Comm("dispatch", "all-to-all", "ep", "bwd", a2a_bytes + a2a_bytes // spec.hidden))


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
                                                    (1, False, 1, 1), (2, True, 1, 1)])
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


def _pattern_path(job: Job, graph: OpGraph, spec: TransformerSpec, level: str) -> ExecGraph:
    """The fixed-pattern path: the layers hold the oracle's collectives and the plan no model-parallel splits,
    so the compiler reads the layers' collectives (as it did before the patterns became splits)."""
    dev = DeviceSlice.of(job.parallel)
    pattern = replace(graph, layers=tuple(replace(layer, comms=_pattern_comms(spec, dev, layer))
                                          for layer in graph.layers))
    plan = replace(default_plan(pattern, job.parallel), mesh_splits=())
    return compile_job(job, plan, Pricer(Calibration()), level)  # type: ignore[arg-type]


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
    """The default path (the plan carries Megatron's splits; the compiler derives the collectives from them)
    and the fixed-pattern path compile to identical tasks: kinds, groups (link resources), bytes (the durations
    priced from them), order and dependencies."""
    job, spec, graph = _job(model, strategy)
    plan = default_plan(graph, job.parallel)
    assert {s.axis for s in plan.mesh_splits} == {axis for axis in ("tp", "cp") if strategy.get(axis, 1) != 1}
    split_form = compile_job(job, plan, Pricer(Calibration()), level)  # type: ignore[arg-type]
    assert _tasks(split_form) == _tasks(_pattern_path(job, graph, spec, level))
    assert any(t.category == "tp_comm" for t in split_form.tasks)


# --- the tree form: StrategyTree.from_parallel and tree files ---

TREE_FILE = Path(__file__).resolve().parents[3] / "data" / "strategies" / "megatron" / "gpt-tp2-sp.yaml"


def _job(model: str, strategy: dict[str, object]) -> tuple[Job, TransformerSpec, OpGraph]:
    spec = load_model(model)
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 512, "global_batch": 32, **strategy})
    job = make_job(spec, a100_cluster(16), par)
    return job, spec, build_transformer(spec, DeviceSlice.of(job.parallel))


@pytest.mark.parametrize("level", ["layer", "op"])
@pytest.mark.parametrize(("model", "strategy"), [
    ("gpt3-125m", {"tp": 2}),
    ("gpt3-125m", {"tp": 4, "sp": True}),
    ("llama3.2-1b", {"tp": 2, "sp": True, "cp": 2}),
    ("llama3.2-1b", {"tp": 8, "pp": 2, "sp": True}),
    ("bert-base", {"tp": 2, "pp": 2}),
])
def test_tree_of_megatron_splits_compiles_to_the_pattern_tasks(model: str, strategy: dict[str, object],
                                                                level: str) -> None:
    """The plain strategy as a tree (its ops' computation configs over tp and cp), lowered: the compiler
    derives each layer instance's collectives from the plan's configs, and the tasks are the fixed patterns'."""
    job, spec, graph = _job(model, strategy)
    plan = StrategyTree.from_parallel(graph, job.parallel).lower(job.parallel)
    assert plan.mesh_splits
    assert plan == default_plan(graph, job.parallel)
    from_tree = compile_job(job, plan, Pricer(Calibration()), level)  # type: ignore[arg-type]
    assert _tasks(from_tree) == _tasks(_pattern_path(job, graph, spec, level))


def test_tree_of_expert_splits_derives_dispatch_and_combine() -> None:
    spec = load_model("mixtral-8x7b")
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 16, "tp": 2, "ep": 4, "pp": 2})
    job = make_job(spec, a100_cluster(16), par)
    graph = build_transformer(spec, DeviceSlice.of(job.parallel))
    tree = StrategyTree.from_parallel(graph, job.parallel)
    assert tree.effective("blocks.0.moe.mlp.gate_up")["split.compute.out@ep"].value == 4
    assert "split.compute.out@ep" not in tree.effective("blocks.0.moe.router")
    comms = compile_job(job, tree.lower(job.parallel), Pricer(Calibration()), "op")
    names = [t.name.split(" mb")[0] for t in comms.tasks if t.category == "ep_comm" and " mb0 " in t.name
             and t.layer.startswith("L1.")]
    assert names == ["dispatch all-to-all", "combine all-to-all", "combine all-to-all", "dispatch all-to-all"]


def test_tree_file_of_tp2_with_sp_predicts_as_the_plain_strategy() -> None:
    """data/strategies/megatron/gpt-tp2-sp.yaml (Megatron's splits written out) compiles to the tasks of the
    plain --tp 2 --sp job."""
    job, _, graph = _job("gpt3-125m", {"tp": 2, "sp": True})
    plan = load_tree_yaml(TREE_FILE, graph).lower(job.parallel)
    assert {s.axis for s in plan.mesh_splits} == {"tp"}
    from_file = compile_job(job, plan, Pricer(Calibration()), "op")
    plain = compile_job(job, default_plan(graph, job.parallel), Pricer(Calibration()), "op")
    assert _tasks(from_file) == _tasks(plain)


def test_tree_file_round_trips_with_axes() -> None:
    job, _, graph = _job("llama3.2-1b", {"tp": 2, "sp": True, "cp": 2})
    tree = StrategyTree.from_parallel(graph, job.parallel)
    text = dump_tree_yaml(tree)
    assert "{path: blocks.0-15.attn.qkv, item: compute, dim: out, parts: 2, axis: tp}" in text
    assert tree_from_mapping(yaml.safe_load(text)["strategy_tree"], graph) == tree


def test_tree_splits_other_than_the_graphs_are_refused_in_one_line() -> None:
    job, _, graph = _job("gpt3-125m", {"tp": 2})
    # Megatron's sp written out, on a job without sp: every op it splits by sequence takes that split (per-op
    # sequence parallelism: the positions, the norms and residual adds), the positions' add split by a reduction
    # dimension it has not: refused
    assert load_tree_yaml(TREE_FILE, graph).lower(job.parallel).tp_configs()
    with pytest.raises(ConfigError, match=r"pos_add splits nothing over tp; give that, or no tp splits; or any "
                                          r"split of its batch, seq, out whose parts divide 2, or none"):
        StrategyTree.from_graph(graph).split("embedding.positions", "compute", "reduce", 2, axis="tp").lower(
            job.parallel)
    tree = StrategyTree.from_graph(graph).split("blocks.*.mlp.act", "compute", "reduce", 2, axis="tp")
    # the lookup and every other op left without a tp split run whole on each rank; GELU has no reduction dim
    with pytest.raises(ConfigError, match=r"blocks.0.mlp.act split.compute@tp='reduce=2' is invalid: .* gelu "
                                          r"splits out=2 over tp; give that, or no tp splits; or any split of its "
                                          r"batch, seq, out whose parts divide 2, or none \(the gelu whole on each "
                                          r"tp rank\)") as info:
        tree.lower(job.parallel)
    assert "\n" not in str(info.value)
    full = StrategyTree.from_parallel(graph, job.parallel)
    with pytest.raises(ConfigError, match=r"blocks.3.mlp.fc2 split.compute@tp='out=2 reduce=2'.* fc2 splits reduce=2"):
        full.split("blocks.3.mlp.fc2", "compute", "out", 2, axis="tp").lower(job.parallel)
    with pytest.raises(ConfigError, match=r"ep does not split this layer"):
        full.split("blocks.3.mlp.fc1", "compute", "out", 2, axis="ep").lower(job.parallel)
    with pytest.raises(ConfigError, match=r"axis tp takes a computation config"):
        full.split("blocks.3.attn", "weight", "heads", 2, axis="tp")


@pytest.mark.parametrize(("tp", "sp", "d", "column", "row"), [
    (2, True, 1, OpConfig(1, 2, 1, 1), OpConfig(1, 2, 1, 1)),
    (2, False, 1, OpConfig(1, 1, 1, 1), OpConfig(1, 1, 1, 1)),
    (4, True, 2, OpConfig(1, 2, 2, 1), OpConfig(1, 2, 1, 2)),
    (4, True, 4, OpConfig(1, 1, 4, 1), OpConfig(1, 1, 1, 4)),
])
def test_expert_configs_over_fewer_tp_ranks_keep_their_ranks_tokens(tp: int, sp: bool, d: int, column: OpConfig,
                                                                   row: OpConfig) -> None:
    """An MoE's expert ops at tp degree d (Megatron-Core's expert tensor parallelism): gate_up and the SwiGLU split
    out d ways, down reduce d ways, and under sp the tokens of their d ranks (the sequence split tp / d ways; d = 1:
    the norms' config); the router, at the norms' config (Megatron's), is none of the layer's own configs,
    whatever the experts' degree."""
    spec = load_model("mixtral-8x7b")
    assert isinstance(spec, TransformerSpec)
    dev = _slice(tp, sp, 1, 2)
    moe = next(layer for layer in build_transformer(spec, dev).layers if layer.kind == "moe_block")
    ops = {op.name: op for op in moe.fwd}
    own = frozenset((name, megatron_tp(ops[name], dev, d)) for name in ("gate_up", "swiglu", "down", "router"))
    assert [replicable_module(ops[name]) for name in ("router", "gate_up", "swiglu", "down")] == \
        ["router", "experts", "experts", "experts"]
    assert op_config("tp", ops["gate_up"], dev, own) == op_config("tp", ops["swiglu"], dev, own) == column
    assert op_config("tp", ops["down"], dev, own) == row
    assert op_config("tp", ops["router"], dev, own) == op_config("tp", ops["norm2"], dev) == \
        OpConfig(1, tp if sp else 1, 1, 1)
    assert own_configs(moe.fwd, dev, lambda op: op_config("tp", op, dev, own)) == (
        frozenset({("gate_up", column), ("swiglu", column), ("down", row)}) if d < tp else frozenset())
