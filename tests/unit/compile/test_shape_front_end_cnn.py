"""Convolutions, pools, batch norms and token lookups split over tp on the torch front-end's captured graph
(compile.shape_front_end, compile.shape_front_end_cnn): a torchvision-style CNN given as an nn.Module factory
(stem conv, two blocks of conv-BN-ReLU, conv-BN-ReLU, max-pool, a classifier) at micro-batch 4, 8 x 8 images,
fp32, tp 2 on A100s; the token lookup of a tiny Hugging Face GPT-2 and LLaMA (vocab 512, hidden 64) at
micro-batch 2 x 32 tokens in bf16, tp 2 x dp 4, against the catalog's vocab-parallel lookup (differential).

The first block's tensors (fp32): its input and each conv's output 4 x 8 x 8 x 8 x 4 = 8192 bytes, its pool's
4 x 8 x 4 x 4 x 4 = 2048. Its parameters: two 3x3 convs of 8 -> 8 channels (576 each, no bias), two batch norms
(16 each): 1184. The lookup's output: 64 tokens x 64 x 2 bytes = 8192 bytes.
"""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_hf import GPT2, LLAMA

from conftest import a100_cluster, module_from_file
from trainsim.catalog.hf_config import model_from_hf_config
from trainsim.compile.shape_layers import shape_layers
from trainsim.compile.splits import plan_mesh_comms
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import Layer, OpGraph
from trainsim.job import Job, make_job
from trainsim.pipeline import predict
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree import StrategyTree

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

MB, HW = 4, 8
ACT_BYTES, POOL_BYTES, BLOCK_PARAMS = MB * 8 * HW * HW * 4, MB * 8 * (HW // 2) ** 2 * 4, 2 * 576 + 2 * 16


def _net() -> nn.Module:
    """The shipped factory's CNN (data/strategies/frontend/models/small_cnn.py) at 8 channels on 8 x 8 images,
    10 classes: a stem, two blocks of conv-BN-ReLU, conv-BN-ReLU and a 2x2 max-pool, the classifier."""
    module = module_from_file("data/strategies/frontend/models/small_cnn.py")
    return module.SmallCnn(channels=8, image_hw=HW, classes=10)


@pytest.fixture(scope="module")
def cnn() -> OpGraph:
    from trainsim.frontends.torch.capture import TensorSpec, graph_from_module

    inputs = {"images": TensorSpec((MB, 3, HW, HW), "float32"), "labels": TensorSpec((MB,), "int64")}
    return graph_from_module(_net(), inputs, precision="fp32", micro_batch=MB, seq_len=1, fused=True)


def _cnn_job(tp: int = 2) -> Job:
    par = ParallelSpec.parse({"micro_batch": MB, "seq_len": 1, "global_batch": MB, "tp": tp, "dp": 1,
                              "precision": "fp32"})
    return make_job(opaque_spec("cnn", "nn.Module factory", split_by_tree=True), a100_cluster(tp), par)


def _plan(job: Job, graph: OpGraph, splits: list[tuple[str, str]], parts: int = 2) -> LoweredPlan:
    tree = StrategyTree.from_graph(graph)
    for path, dim in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp")
    return tree.lower(job.parallel)


def _comms(layer: Layer) -> list[tuple[str, str, str, float, str]]:
    return [(c.name, c.collective, c.phase, c.buffer_bytes, c.column_input) for c in layer.comms]


def _fwd(layer: Layer, suffix: str) -> Any:
    return [op for op in layer.fwd if op.module_path.endswith(suffix)]


def test_conv_by_out_then_by_reduce_pays_one_all_reduce_each_way(cnn: OpGraph) -> None:
    """conv1 by out channels, conv2 by reduce (input channels): Megatron's pair on images. bn1 and the ReLU keep
    the channel split (per channel, no statistics exchanged); conv2's partial sums are all-reduced before bn2
    (8192 bytes), conv1's input gradient, partial over its output channels, backward (its column input); each conv
    runs half its FLOPs, bn1 half its channels; the block holds 576 / 2 x 2 + 8 + 16 = 600 of 1184 parameters.
    conv1 by out alone gives the same: conv2 reading split channels infers its reduce split (Proteus Sec. VII)."""
    job = _cnn_job()
    whole = cnn.layers[1]
    for splits in ([("blocks.*.conv1", "out"), ("blocks.*.conv2", "reduce")], [("blocks.*.conv1", "out")]):
        block = shape_layers(job, _plan(job, cnn, splits)).layers[1].layer
        assert _comms(block) == [("block.ar", "all-reduce", "fwd", ACT_BYTES, ""),
                                 ("block.ar", "all-reduce", "bwd", ACT_BYTES, "blocks.0.conv1")]
        assert block.param_count == BLOCK_PARAMS - 288 - 288 - 8 == 600
        for mine, theirs in zip(block.fwd, whole.fwd, strict=True):
            if mine.kind == "conv":
                assert mine.flops == theirs.flops / 2
        # by hand: each 3x3 conv of 8 -> 8 channels on 4 x 8 x 8 outputs, 2 x 4 x 8 x 8 x 8 x 8 x 9 FLOPs, halved
        assert [op.flops for op in block.fwd if op.kind == "conv"] == [2 * MB * HW * HW * 8 * 8 * 9 / 2] * 2
        bn1, bn2 = (op for op in block.fwd if op.kind == "norm")
        assert (bn1.shape, bn2.shape) == ((MB, 4, HW, HW), (MB, 8, HW, HW))
        norms_bwd = [op for op in block.bwd if op.kind == "norm"]  # bn2's first: the backward meets it first
        assert [op.shape for op in norms_bwd] == [(MB, 8, HW, HW), (MB, 4, HW, HW)]
        assert [op.flops for op in block.bwd if op.kind == "conv"] == [
            op.flops / 2 for op in whole.bwd if op.kind == "conv"]
        assert len([op for op in block.bwd if op.kind == "conv"]) == 2  # conv2's backward, then conv1's


def test_pool_and_batch_norm_follow_a_channel_split(cnn: OpGraph) -> None:
    """conv2 by out: bn2, the ReLU and the pool run half the channels (the pool (4, 4, 4, 4)), the block hands on
    the whole pool output: an all-gather of 2048 bytes forward (block.ag); conv2's input gradient is partial
    over its output channels: all-reduced backward (8192 bytes)."""
    job = _cnn_job()
    whole = cnn.layers[1]
    block = shape_layers(job, _plan(job, cnn, [("blocks.*.conv2", "out")])).layers[1].layer
    assert _comms(block) == [("block.ag", "all-gather", "fwd", POOL_BYTES, ""),
                             ("block.ar", "all-reduce", "bwd", ACT_BYTES, "blocks.0.conv2")]
    pool = _fwd(block, "pool")[0]
    assert (pool.shape, pool.flops) == ((MB, 4, HW // 2, HW // 2), _fwd(whole, "pool")[0].flops / 2)
    assert [op.shape for op in block.bwd if op.kind == "pool"] == [(MB, 4, HW, HW)]
    assert block.param_count == BLOCK_PARAMS - 288 - 8


def test_conv_by_reduce_reads_its_input_channels_split(cnn: OpGraph) -> None:
    """conv1 by reduce: each rank reads half the block's input channels (a local slice, no collective) and leaves
    partial sums, all-reduced before bn1 (8192 bytes); backward conv1's input gradient, split by channels,
    all-gathered onto the whole input's (8192 bytes: the input's (4, 8, 8, 8), not conv1's output)."""
    job = _cnn_job()
    block = shape_layers(job, _plan(job, cnn, [("blocks.*.conv1", "reduce")])).layers[1].layer
    assert _comms(block) == [("block.ar", "all-reduce", "fwd", ACT_BYTES, ""),
                             ("block.ag", "all-gather", "bwd", ACT_BYTES, "")]
    assert block.param_count == BLOCK_PARAMS - 288


def test_stem_conv_by_out_and_the_classifier(cnn: OpGraph) -> None:
    """The stem (the embedding layer: it reads the image, which every rank holds) by out: half its FLOPs and its
    216 weights, the layer hands on the whole 8-channel output (all-gather of 8192 bytes); its backward is the
    weight gradient alone, (8, 3, 3, 3) -> (4, 3, 3, 3)."""
    job = _cnn_job()
    stem = shape_layers(job, _plan(job, cnn, [("embedding.stem", "out")])).layers[0].layer
    assert _comms(stem) == [("embed.ag", "all-gather", "fwd", ACT_BYTES, "")]
    assert stem.param_count == 216 / 2
    assert [op.shape for op in stem.bwd] == [(4, 3, 3, 3)]


class _Basic(nn.Module):
    """torchvision's BasicBlock without a downsample: conv-BN-ReLU, conv-BN, the skip added, ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def forward(self, x: Any) -> Any:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + x)


class _ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.layer1 = nn.Sequential(_Basic(8), _Basic(8))
        self.fc = nn.Linear(8 * HW * HW, 10)

    def forward(self, x: Any, labels: Any) -> Any:
        return nn.functional.cross_entropy(self.fc(self.layer1(self.stem(x)).flatten(1)), labels)


def test_residual_block_split_by_conv2_out_gathers_its_output_and_its_skip_gradient() -> None:
    """A basic block (bn2, the skip add and the ReLU one fused group reading conv2's output and the block's input)
    with conv2 by out: the fused group follows the channel split (the skip input sliced), the block hands on its
    whole output (all-gather of 8192 bytes); backward, the skip's gradient lies split and the block's input
    gradient whole (conv1 reads it whole): all-gathered, and conv2's input gradient, partial over its output
    channels, all-reduced (8192 bytes each)."""
    from trainsim.frontends.torch.capture import TensorSpec, graph_from_module

    inputs = {"x": TensorSpec((MB, 3, HW, HW), "float32"), "labels": TensorSpec((MB,), "int64")}
    graph = graph_from_module(_ResNet(), inputs, precision="fp32", micro_batch=MB, seq_len=1, fused=True)
    job = _cnn_job()
    block = next(a.layer for a in shape_layers(job, _plan(job, graph, [("blocks.*.*.conv2", "out")])).layers
                 if a.layer.kind == "block")
    added = block.fwd[-1]
    assert (added.kind, added.inputs, added.shape) == ("norm", (2, -1), (MB, 4, HW, HW))
    assert _comms(block) == [("block.ag", "all-gather", "fwd", ACT_BYTES, ""),
                             ("block.ag", "all-gather", "bwd", ACT_BYTES, ""),
                             ("block.ar", "all-reduce", "bwd", ACT_BYTES, "layer1.0.conv2")]
    assert block.param_count == BLOCK_PARAMS - 288 - 8


def _catalog_cnn() -> Any:
    """The same CNN as a catalog CnnSpec (its convs and batch norms, ReLUs and pools as the catalog's layers)."""
    from trainsim.catalog.model_files import parse_model

    def layer(kind: str, name: str, cin: int, kernel: int, hw: int, block: str) -> dict[str, Any]:
        return {"type": kind, "name": name, "in_channels": cin, "out_channels": 10 if kind == "fc" else 8,
                "kernel": [kernel, kernel], "stride": 2 if kind == "pool" else 1, "out_hw": [hw, hw], "block": block}

    layers = [layer("conv", "stem", 3, 3, HW, "stem")]
    for i, hw in ((0, HW), (1, HW // 2)):
        b = f"blocks.{i}"
        layers += [layer("conv", f"{b}.conv1", 8, 3, hw, b), layer("norm", f"{b}.bn1", 8, 1, hw, b),
                   layer("relu", f"{b}.relu1", 8, 1, hw, b), layer("conv", f"{b}.conv2", 8, 3, hw, b),
                   layer("norm", f"{b}.bn2", 8, 1, hw, b), layer("relu", f"{b}.relu2", 8, 1, hw, b),
                   layer("pool", f"{b}.pool", 8, 2, hw // 2, b)]
    layers.append(layer("fc", "fc", 32, 1, 1, "head"))
    return parse_model({"kind": "cnn", "name": "tiny-cnn", "input_hw": [HW, HW], "layers": layers})


@pytest.mark.parametrize(("splits", "handed"), [([("conv1", "out")], False), ([("conv2", "out")], True),
                                               ([("conv1", "reduce")], False),
                                               ([("conv1", "out"), ("conv2", "reduce")], False)], ids=str)
def test_captured_cnn_split_matches_the_catalog_cnn(cnn: OpGraph, splits: list[tuple[str, str]],
                                                    handed: bool) -> None:
    """The catalog's configs over dp (compile.splits) on the same CNN, its 2 data-parallel ranks carved as the
    pair (the stem whole: batch 1, so every op after it reads the group's 4 samples whole, as each tp rank reads
    the captured micro-batch of 4) against the captured graph's configs over tp 2: per block the same collectives
    (kind, phase, bytes, in order) and the same FLOPs per rank for every convolution, forward and backward (the
    catalog's dgrad and wgrad summed: torch's one convolution_backward). Residual, exact: the catalog holds a
    batch norm's gain and bias whole under a channel split (compile.splits sheds only a conv's or matmul's
    weight), so a block whose bn1 or bn2 runs half the channels holds 8 parameters more there. Where a block
    ends split (conv2 by out: bn2, the ReLU and the pool follow its channels), the captured block hands on its
    whole output, an all-gather of the pool's 2048 bytes (a captured layer reads and hands on whole tensors),
    while the catalog's chain carries the split into the next block (its conv1 infers a reduce split there): the
    first block is compared without that all-gather, the second not at all."""
    from trainsim.compile.splits import config_of, plan_splits, scaled_op
    from trainsim.frontends.catalog.build import build_graph

    job = _cnn_job()
    captured = shape_layers(job, _plan(job, cnn, [(f"blocks.*.{path}", dim) for path, dim in splits]))
    par = ParallelSpec.parse({"micro_batch": MB // 2, "seq_len": 1, "dp": 2, "global_batch": MB,
                              "precision": "fp32"})
    spec = _catalog_cnn()
    tree = StrategyTree.from_parallel(build_graph(spec, DeviceSlice.of(par)), par).split("stem", "compute",
                                                                                          "batch", 1)
    for path, dim in splits:
        tree = tree.split(f"blocks.*.{path}", "compute", dim, 2)
    plan = tree.lower(make_job(spec, a100_cluster(2), par).parallel)
    reference = plan_splits(plan, 2)
    for mine, theirs in zip(captured.layers[1:2 if handed else 3], plan.layers[1:2 if handed else 3], strict=True):
        split = reference[theirs.index]
        ours = [(c.collective, c.phase, c.buffer_bytes) for c in mine.layer.comms]
        if handed:
            assert ours[0] == ("all-gather", "fwd", POOL_BYTES)
            ours = ours[1:]
        assert ours == [(c.step.collective, c.phase, c.step.buffer_bytes) for c in split.comms
                        if c.phase == "fwd"] + [(c.step.collective, c.phase, c.step.buffer_bytes)
                                                for c in split.comms if c.phase == "bwd"]
        catalog_flops: dict[tuple[str, str], float] = {}
        for op in theirs.layer.fwd + theirs.layer.bwd:
            if op.kind == "conv":
                config = config_of(split, op)
                assert config is not None
                key = (op.module_path.rsplit(".", 1)[-1], op.phase)
                catalog_flops[key] = catalog_flops.get(key, 0.0) + scaled_op(op, config, 2).flops
        assert {(op.module_path.rsplit(".", 1)[-1], op.phase): op.flops for op in mine.layer.fwd + mine.layer.bwd
                if op.kind == "conv"} == catalog_flops
        norms_split = sum(1 for op in mine.layer.fwd if op.kind == "norm" and op.shape[1] < 8)
        assert split.held_params - mine.layer.param_count == 8 * norms_split


def test_sim_and_analytical_agree_on_the_split_cnn(cnn: OpGraph) -> None:
    """Both engines price the shaped graph and its collectives; the split runs less compute per rank than tp 1."""
    job = _cnn_job()
    plan = _plan(job, cnn, [("blocks.*.conv1", "out"), ("blocks.*.conv2", "reduce")])
    sim = predict(job, "sim", graph=cnn, plan=plan)
    closed = predict(job, "analytical", graph=cnn, plan=plan)
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=1e-6)
    assert sim.breakdown["tp_comm"] > 0.0
    single = _cnn_job(tp=1)
    alone = predict(single, "sim", graph=cnn, plan=StrategyTree.from_graph(cnn).lower(single.parallel))
    assert sim.breakdown["compute"] < alone.breakdown["compute"]


@pytest.mark.parametrize(("path", "dim", "parts", "field", "words"), [
    ("blocks.*.conv1", "seq", 2, "conv1", "no sequence dimension"),
    ("blocks.*.pool", "seq", 2, "pool", "no sequence dimension"),
    ("blocks.*.pool", "reduce", 2, "pool split.compute@tp", "no reduction dimension"),
    ("blocks.*.conv1", "out", 4, "conv1 split.compute@tp", "must divide tp=2"),
])
def test_bad_cnn_configs_are_refused_in_one_line(cnn: OpGraph, path: str, dim: str, parts: int, field: str,
                                                 words: str) -> None:
    job = _cnn_job()
    with pytest.raises(ConfigError) as info:
        shape_layers(job, _plan(job, cnn, [(path, dim)], parts))
    message = str(info.value)
    assert "\n" not in message and words in message and field in message and dim in message


def test_tp_on_a_module_without_a_tree_is_refused(cnn: OpGraph) -> None:
    job = _cnn_job()
    with pytest.raises(ConfigError, match="give a strategy tree that splits its ops over tp"):
        shape_layers(job, StrategyTree.from_graph(cnn).lower(job.parallel))
    with pytest.raises(ConfigError, match="cp=2 is invalid"):
        make_job(opaque_spec("cnn", "nn.Module factory", split_by_tree=True), a100_cluster(2),
                 ParallelSpec.parse({"micro_batch": 4, "seq_len": 2, "cp": 2, "dp": 1, "precision": "fp32"}))


LOOKUP_BYTES = 64 * 64 * 2


def _hf(config: dict[str, Any]) -> tuple[Job, OpGraph]:
    from trainsim.frontends.torch.hf import graph_from_hf_config

    spec = model_from_hf_config(config, name=config["model_type"])
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 8, "tp": 2, "dp": 4,
                              "precision": "bf16"})
    return make_job(spec, a100_cluster(8), par), graph_from_hf_config(config, micro_batch=2, seq_len=32,
                                                                       precision="bf16", fused=True)


def test_llama_lookup_by_rows_matches_the_catalogs_vocab_parallel_lookup() -> None:
    """The lookup by reduce (the vocabulary's rows; Megatron's VocabParallelEmbedding): each rank writes the whole
    output (its FLOPs do not halve), holds half the table (16384 of 32768) and the partial lookups are all-reduced
    (8192 bytes, forward only: the backward of a sum is the identity); the catalog LLaMA's lookup at its Megatron
    split gives the same collectives, parameters and lookup FLOPs; the table's gradient halves its rows."""
    job, graph = _hf(LLAMA)
    embedding = shape_layers(job, _plan(job, graph, [("embedding.embed_tokens", "reduce")])).layers[0].layer
    catalog = build_transformer(job.model, DeviceSlice.of(job.parallel))  # type: ignore[arg-type]
    reference = _plan(job, catalog, [("embedding.tokens", "reduce")])
    theirs = reference.layers[0].layer
    assert _comms(embedding) == [("embed.ar", "all-reduce", "fwd", LOOKUP_BYTES, "")]
    assert [(c.name, c.collective, c.phase, c.buffer_bytes) for c in plan_mesh_comms(
        reference, job.model, job.parallel)[0]] == [("embed.ar", "all-reduce", "fwd", LOOKUP_BYTES)]
    assert embedding.param_count == theirs.param_count == 16384
    lookup = next(op for op in embedding.fwd if op.kind == "embedding")
    assert lookup.flops == next(op.flops for op in theirs.fwd if op.kind == "embedding") == 64 * 64
    assert [op.shape for op in embedding.bwd if op.kind == "embedding"] == [(256, 64)]


def test_gpt2_lookup_by_columns_gathers_what_it_hands_on() -> None:
    """GPT-2's token lookup by out (the table's columns): its output and the fused add of the positions (read
    whole, sliced) hold half the features, the embedding hands on the whole hidden state (all-gather of 8192
    bytes) and the position table's gradient, read split from the add, is all-gathered backward (its lookup's
    (1, 32, 64): 4096 bytes). The token table is tied to lm_head: split alike (lm_head by reduce, the features),
    a rank holds half of it and the whole position table, 32768 / 2 + 4096 = 20480 parameters; with lm_head
    whole, the whole table (36864). A rows split all-reduces instead, and holds half the table beside lm_head by
    out (the vocabulary: Megatron's vocab-parallel pair)."""
    job, graph = _hf(GPT2)
    columns = [("embedding.transformer.wte", "out"), ("head.lm_head", "reduce")]
    embedding = shape_layers(job, _plan(job, graph, columns)).layers[0].layer
    assert _comms(embedding) == [("embed.ag", "all-gather", "fwd", LOOKUP_BYTES, ""),
                                 ("embed.ag", "all-gather", "bwd", LOOKUP_BYTES / 2, "")]
    assert embedding.param_count == 32768 / 2 + 4096
    lookup, _, add = embedding.fwd
    assert (lookup.shape, lookup.flops, add.shape) == ((2, 32, 32), 64 * 32, (2, 32, 32))
    assert [op.shape for op in embedding.bwd if op.kind == "embedding"] == [(64, 64), (512, 32)]
    alone = shape_layers(job, _plan(job, graph, columns[:1])).layers[0].layer
    assert (_comms(alone), alone.param_count) == (_comms(embedding), 32768 + 4096)
    for head_dim, held in (("out", 32768 / 2 + 4096), ("reduce", 32768 + 4096)):
        rows = [("embedding.transformer.wte", "reduce"), ("head.lm_head", head_dim)]
        layer = shape_layers(job, _plan(job, graph, rows)).layers[0].layer
        assert (_comms(layer), layer.param_count) == ([("embed.ar", "all-reduce", "fwd", LOOKUP_BYTES, "")], held)


def test_lookup_parts_must_divide_tp() -> None:
    job, graph = _hf(LLAMA)
    with pytest.raises(ConfigError) as info:
        shape_layers(job, _plan(job, graph, [("embedding.embed_tokens", "reduce")], 4))
    assert "\n" not in str(info.value) and "embed_tokens split.compute@tp='reduce=4'" in str(info.value)
    assert "must divide tp=2" in str(info.value)


def test_an_opaque_model_without_module_paths_keeps_tp_1() -> None:
    """Only the torch front-end's factory models take tp (through a tree); an opaque model from the jax front-end
    (no module tree to address) is refused tp > 1 at the job, naming the field."""
    with pytest.raises(ConfigError, match="tp=2 is invalid: must be 1 for a model of kind opaque"):
        make_job(opaque_spec("step", "jax train step"), a100_cluster(2),
                 ParallelSpec.parse({"micro_batch": 1, "seq_len": 8, "tp": 2, "dp": 1, "precision": "fp32"}))


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 9), channels=st.integers(1, 40), hw=st.integers(1, 6), kernel=st.integers(1, 3),
       parts=st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2), (4, 1, 1)]))
def test_a_split_image_op_runs_at_least_its_share(batch: int, channels: int, hw: int, kernel: int,
                                                  parts: tuple[int, int, int]) -> None:
    """A convolution, pool or batch norm at any (batch, out, reduce) config: the busiest rank runs at least its even
    share of the FLOPs, exactly it where the parts divide the dims they split, and never more than the whole."""
    from trainsim.compile.shape_front_end_cnn import image_op
    from trainsim.ir.graph import Op
    from trainsim.strategy.placement import OpConfig

    b, out, red = parts
    flops = 2.0 * batch * channels * hw * hw * channels * kernel * kernel
    for kind in ("conv", "pool", "norm"):
        config = OpConfig(b, 1, out, red if kind == "conv" else 1)
        op = Op(kind, kind, "m", "fwd", "fp32", flops, 4.0 * flops, (batch, channels, hw, hw))  # type: ignore[arg-type]
        mine = image_op(op, config, None)
        share = flops / config.parts
        assert share * (1 - 1e-12) <= mine.flops <= flops * (1 + 1e-12)
        if batch % b == 0 and channels % out == 0:
            assert mine.flops == pytest.approx(share)
            assert mine.shape == (batch // b, channels // out, hw, hw)
