"""Repeated blocks that hand on another shape (a CNN stage ending in a pool, a strided block): the capture traces
every block on its own shapes, so the FLOPs and parameters equal those of the same model captured whole (its
blocks held as plain attributes, no repeated container); blocks that keep their shape are still traced twice and
counted; a module that fails on fake tensors is refused in one line naming the module."""

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from trainsim.cli.main import app  # noqa: E402
from trainsim.errors import ConfigError  # noqa: E402
from trainsim.frontends.torch.capture import TensorSpec, graph_from_module  # noqa: E402

MB, HW, CHANNELS, CLASSES = 8, 32, 16, 10


class _Block(nn.Module):
    def __init__(self, pool: bool, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(CHANNELS)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x: Any) -> Any:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class _Cnn(nn.Module):
    """stem, `depth` blocks (in a ModuleList, or as attributes b0, b1, ... when `whole`), a classifier."""

    def __init__(self, depth: int, pool: bool, stride: int = 1, whole: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        blocks = [_Block(pool, stride) for _ in range(depth)]
        if whole:
            for index, block in enumerate(blocks):
                self.add_module(f"b{index}", block)
        else:
            self.blocks = nn.ModuleList(blocks)
        self.depth = depth
        shrink = 2 ** depth if pool or stride > 1 else 1
        self.fc = nn.Linear(CHANNELS * (HW // shrink) ** 2, CLASSES)

    def forward(self, images: Any, labels: Any) -> Any:
        x = self.stem(images)
        blocks = self.blocks if hasattr(self, "blocks") else [getattr(self, f"b{i}") for i in range(self.depth)]
        for block in blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.fc(x.flatten(1)), labels)


INPUTS = {"images": TensorSpec((MB, 3, HW, HW), "float32"), "labels": TensorSpec((MB,), "int64")}


def _graph(net: nn.Module) -> Any:
    return graph_from_module(net, INPUTS, precision="fp32", micro_batch=MB, seq_len=1, fused=True)


@pytest.mark.parametrize(("depth", "pool", "stride"), [(3, True, 1), (4, False, 2), (4, False, 1), (2, True, 1)])
def test_blocks_price_as_the_whole_model(depth: int, pool: bool, stride: int) -> None:
    stacked, whole = _graph(_Cnn(depth, pool, stride)), _graph(_Cnn(depth, pool, stride, whole=True))
    for phase in ("fwd", "bwd"):
        assert stacked.total_flops(phase) == whole.total_flops(phase)  # exact
    assert stacked.param_count() == whole.param_count() == sum(
        p.numel() for p in _Cnn(depth, pool, stride).parameters())


def test_pooling_blocks_are_each_traced_on_their_own_shapes() -> None:
    graph = _graph(_Cnn(3, pool=True))
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert [(layer.name, layer.count) for layer in blocks] == [("block.0", 1), ("block.1", 1), ("block.2", 1)]
    conv_flops = [sum(op.flops for op in layer.fwd if op.kind == "conv") for layer in blocks]
    # 2 x batch x out pixels x out channels x (in channels x 3 x 3), the image halving per block
    assert conv_flops == [2 * MB * (HW // 2 ** i) ** 2 * CHANNELS * CHANNELS * 9 for i in range(3)]
    assert graph.param_count() == (3 * 9 * CHANNELS + CHANNELS) + 3 * (CHANNELS * CHANNELS * 9 + 2 * CHANNELS) + (
        CHANNELS * (HW // 8) ** 2 * CLASSES + CLASSES)


def test_blocks_that_keep_their_shape_are_traced_twice_and_counted() -> None:
    graph = _graph(_Cnn(4, pool=False))
    assert [(layer.name, layer.count) for layer in graph.layers if layer.kind == "block"] == [("block", 4)]


def test_a_module_failing_on_fake_tensors_is_one_line_naming_it() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(7, 2))
    with pytest.raises(ConfigError, match=r"forward fails on fake tensors .* in module '2' \(RuntimeError") as info:
        graph_from_module(net, [TensorSpec((2, 3, 8, 8), "float32")])
    assert "\n" not in str(info.value)


def _mlp_blocks(width: int, depth: int) -> list[nn.Module]:
    return [nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU()) for _ in range(depth)]


class _Mlp(nn.Module):
    """A linear layer, then `depth` identical linear-BN-ReLU blocks whose last feeds the default loss (a sum)."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.first = nn.Linear(width, width)
        self.blocks = nn.ModuleList(_mlp_blocks(width, depth))

    def forward(self, x: Any) -> Any:
        x = self.first(x)
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("width", [1, 4])
def test_fused_blocks_that_tell_the_last_apart_are_counted_once(width: int) -> None:
    """Fusing tells the last traced block (its backward reads the loss's gradient) from the first: the blocks
    not traced repeat the first, so 4 blocks are 3 + 1, not 4 + 4. Whole: the same layers in one Sequential
    whose children differ (no repeated container)."""
    inputs = [TensorSpec((2, width), "float32")]
    stacked = graph_from_module(_Mlp(width, 4), inputs, fused=True)
    whole = graph_from_module(nn.Sequential(nn.Linear(width, width), *_mlp_blocks(width, 4)), inputs, fused=True)
    assert sum(layer.count for layer in stacked.layers if layer.kind == "block") == 4
    assert stacked.param_count() == whole.param_count() == width * width + width + 4 * (width * width + 3 * width)
    for phase in ("fwd", "bwd"):
        assert stacked.total_flops(phase) == whole.total_flops(phase)  # exact


def pooled_cnn(micro_batch: int = MB) -> tuple[nn.Module, dict[str, TensorSpec]]:
    """For `trainsim predict --frontend torch --model THIS_FILE:pooled_cnn`: three blocks, each ending in a pool."""
    return _Cnn(3, pool=True), {"images": TensorSpec((micro_batch, 3, HW, HW), "float32"),
                                "labels": TensorSpec((micro_batch,), "int64")}


def test_predict_splits_the_pooling_blocks_over_tp_alike_in_both_engines(tmp_path: Path) -> None:
    tree = tmp_path / "tree.yaml"
    tree.write_text("strategy_tree:\n  map:\n    - {tp: 2}\n  split:\n"
                    '    - {path: "blocks.*.conv", item: compute, dim: out, parts: 2, axis: tp}\n')
    args = ["predict", "--frontend", "torch", "--model", f"{__file__}:pooled_cnn", "--cluster", "local-cpu",
            "--num-gpus", "2", "--tp", "2", "--precision", "fp32", "--micro-batch", str(MB), "--global-batch",
            str(MB), "--tree", str(tree), "--json"]
    runs = []
    for engine in ("sim", "analytical"):
        result = CliRunner().invoke(app, [*args, "--engine", engine])
        assert result.exit_code == 0, result.output
        runs.append(json.loads(result.stdout))
    assert runs[0]["iteration_time_s"] == pytest.approx(runs[1]["iteration_time_s"], rel=1e-9)
    assert runs[0]["breakdown"]["tp_comm"] > 0.0
    whole = _graph(_Cnn(3, pool=True, whole=True))
    assert runs[0]["model_flops_per_iteration"] == whole.total_flops("fwd") + whole.total_flops("bwd")
