"""CNN and DLRM builders: parameter counts and FLOPs against published numbers, and exact tiny cases.

Published: ResNet-50 25.6M parameters and 4.1 GMACs per 224x224 image; VGG-19 143.7M parameters and
19.6 GMACs; Inception-v3 23.8M parameters (no auxiliary head) and 5.7 GMACs per 299x299 image
(torchvision model docs).
"""

import pytest

from trainsim.catalog import load_model
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.cnn import build_cnn
from trainsim.frontends.catalog.dlrm import build_dlrm
from trainsim.ir.flops import conv_backward, conv_flops, conv_op
from trainsim.ir.model_spec import CnnSpec, ConvLayer, DlrmSpec, EmbeddingTable
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import Precision, policy_for


def _dev(batch: int = 1, precision: Precision = "bf16") -> DeviceSlice:
    return DeviceSlice(micro_batch=batch, seq_len=1, precision=policy_for(precision))


def _cnn(name: str) -> CnnSpec:
    spec = load_model(name)
    assert isinstance(spec, CnnSpec)
    return spec


# --- conv formulas ---


def test_conv_flops_formula() -> None:
    # 2 * B * out_h * out_w * out_c * in_c * kh * kw
    assert conv_flops(2, 3, 64, (7, 7), (112, 112)) == 2 * 2 * 112 * 112 * 64 * 3 * 7 * 7


def test_conv_op_bytes_and_backward() -> None:
    op = conv_op("c", "m.c", "bf16", batch=1, in_channels=2, out_channels=4, kernel=(3, 3), stride=1,
                 out_hw=(5, 5))
    # input 1*2*5*5, weights 4*2*3*3, output 1*4*5*5 values of 2 bytes
    assert op.bytes_moved == (50 + 72 + 100) * 2
    assert op.shape == (1, 4, 5, 5)
    dgrad, wgrad = conv_backward(op)
    assert dgrad.flops == wgrad.flops == op.flops
    assert (dgrad.phase, wgrad.phase, dgrad.kind) == ("bwd", "bwd", "conv")


# --- CNN catalog models ---


@pytest.mark.parametrize(("name", "published"), [
    ("resnet50", 25.6e6),
    ("vgg19", 143.7e6),
    ("inception-v3", 23.8e6),
])
def test_cnn_param_count_matches_published(name: str, published: float) -> None:
    graph = build_cnn(_cnn(name), _dev())
    assert graph.param_count() == pytest.approx(published, rel=0.03)
    assert _cnn(name).published_params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize(("name", "gmacs"), [("resnet50", 4.1), ("vgg19", 19.6), ("inception-v3", 5.7)])
def test_cnn_forward_flops_per_image(name: str, gmacs: float) -> None:
    graph = build_cnn(_cnn(name), _dev())
    assert graph.total_flops("fwd") == pytest.approx(2 * gmacs * 1e9, rel=0.05)


def test_cnn_flops_scale_with_batch_and_backward_is_about_twice() -> None:
    spec = _cnn("resnet50")
    one, eight = build_cnn(spec, _dev(1)), build_cnn(spec, _dev(8))
    assert eight.total_flops("fwd") == pytest.approx(8 * one.total_flops("fwd"))
    ratio = one.total_flops("bwd") / one.total_flops("fwd")
    assert 1.9 < ratio < 2.0  # the stem conv has no input gradient
    assert (one.tokens_per_micro_batch, eight.samples_per_micro_batch) == (1, 8)


def test_resnet_blocks_are_grouped_and_deduplicated() -> None:
    graph = build_cnn(_cnn("resnet50"), _dev())
    counts = {layer.name: layer.count for layer in graph.layers}
    assert counts == {
        "stem": 1, "layer1.0": 1, "layer1.1..layer1.2": 2, "layer2.0": 1, "layer2.1..layer2.3": 3,
        "layer3.0": 1, "layer3.1..layer3.5": 5, "layer4.0": 1, "layer4.1..layer4.2": 2, "head": 1,
    }
    assert sum(layer.count for layer in graph.layers) == 18
    assert graph.layers[0].kind == "conv_block" and graph.layers[-1].kind == "head"
    assert graph.layers[-1].output_bytes == 0.0
    assert any(op.kind == "loss" for op in graph.layers[-1].fwd)


def test_cnn_saved_bytes_keys_and_order() -> None:
    graph = build_cnn(_cnn("resnet50"), _dev(4))
    for layer in graph.layers:
        saved = layer.saved_bytes
        assert set(saved) == {"none", "selective", "full"}
        assert saved["full"] <= saved["none"]
        assert layer.param_count == layer.full_param_count


def test_tiny_cnn_exact() -> None:
    """conv(3->8, 3x3) -> bn -> relu -> fc(8*4*4 -> 10), batch 2, bf16: every number by hand."""
    spec = CnnSpec(name="tiny", input_hw=(4, 4), layers=(
        ConvLayer(type="conv", name="c1", in_channels=3, out_channels=8, kernel=(3, 3), out_hw=(4, 4),
                  block="b1"),
        ConvLayer(type="norm", name="bn", in_channels=8, out_channels=8, out_hw=(4, 4), block="b1"),
        ConvLayer(type="relu", name="relu", in_channels=8, out_channels=8, out_hw=(4, 4), block="b1"),
        ConvLayer(type="fc", name="fc", in_channels=128, out_channels=10, block="head"),
    ))
    graph = build_cnn(spec, _dev(2))
    b1, head = graph.layers
    assert b1.full_param_count == 3 * 8 * 9 + 2 * 8  # conv before a norm has no bias; bn scale + shift
    assert head.full_param_count == 128 * 10 + 10
    assert b1.fwd[0].flops == 2 * 2 * 4 * 4 * 8 * 3 * 9
    assert [op.name for op in b1.bwd] == ["relu.bwd", "bn.bwd", "c1.wgrad"]  # images need no dgrad
    # saved: conv input (2*3*16) + bn input (2*8*16), bf16; relu is in place
    assert b1.saved_bytes == {"none": (96 + 256) * 2, "selective": (96 + 256) * 2, "full": 96 * 2}
    assert b1.output_bytes == 2 * 8 * 16 * 2
    assert head.fwd[0].flops == 2 * 2 * 10 * 128
    assert head.saved_bytes["none"] == 2 * 128 * 2 + 2 * 10 * 4  # fc input + fp32 softmax


def test_fp8_convs_run_in_16_bit() -> None:
    graph = build_cnn(_cnn("resnet50"), _dev(1, "fp8"))
    convs = [op for layer in graph.layers for op in layer.fwd if op.kind == "conv"]
    assert {op.dtype for op in convs} == {"bf16"}


# --- DLRM ---


def test_dlrm_mlperf_counts() -> None:
    spec = load_model("dlrm-mlperf-terabyte")
    assert isinstance(spec, DlrmSpec)
    graph = build_dlrm(spec, _dev(1))
    names = [layer.name for layer in graph.layers]
    assert names == ["embeddings", "bottom_mlp", "interaction", "top_mlp"]
    embeddings, bottom, interaction, top = graph.layers
    assert embeddings.full_param_count == sum(t.rows * t.dim for t in spec.tables)
    assert embeddings.full_param_count == pytest.approx(24.03e9, rel=0.001)
    assert bottom.full_param_count == 13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128
    # top MLP input: 27 * 26 / 2 pairwise dots + the 128-wide dense vector = 479
    assert top.full_param_count == (479 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 512 + 512
                                    + 512 * 256 + 256 + 256 + 1)
    kinds = (embeddings.kind, bottom.kind, interaction.kind, top.kind)
    assert kinds == ("sparse", "mlp", "interaction", "head")


def test_dlrm_lookup_bytes_and_interaction() -> None:
    spec = DlrmSpec(name="tiny-dlrm", dense_features=4, bottom_mlp=(16, 8), top_mlp=(4, 1), tables=(
        EmbeddingTable(rows=100, dim=8, pooling_factor=3.0),
        EmbeddingTable(rows=50, dim=8, count=2),
    ))
    batch = 16
    graph = build_dlrm(spec, _dev(batch))
    embeddings, bottom, interaction, top = graph.layers
    # bytes = B * pooling_factor * dim * 4 per table
    assert [op.bytes_moved for op in embeddings.fwd] == [batch * 3 * 8 * 4, batch * 1 * 8 * 4 * 2]
    assert all(op.kind == "embedding" for op in embeddings.fwd)
    assert embeddings.full_param_count == 100 * 8 + 2 * 50 * 8
    dot = next(op for op in interaction.fwd if op.kind == "matmul")
    assert dot.shape == (batch, 4, 4, 8)  # (B, F, F, d) with F = 3 tables + dense
    assert dot.flops == 2 * batch * 4 * 4 * 8
    assert top.fwd[0].shape == (1, batch, 4, 4 * 3 // 2 + 8)  # 6 dots + 8 dense -> 4
    assert bottom.bwd[-1].name == "linear0.wgrad"  # dense features need no gradient
    assert graph.total_flops("fwd") > 0 and graph.param_count() > 0


def test_dlrm_dim_mismatch_is_a_config_error() -> None:
    spec = DlrmSpec(name="bad", dense_features=4, bottom_mlp=(16, 8), top_mlp=(1,),
                    tables=(EmbeddingTable(rows=10, dim=16),))
    with pytest.raises(ConfigError, match="dim"):
        build_dlrm(spec, _dev())
