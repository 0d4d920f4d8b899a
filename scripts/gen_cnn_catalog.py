"""Write the CNN catalog files (ResNet-50, VGG-19, Inception-v3) under src/trainsim/catalog/data/models/.

The layer lists follow torchvision's module names (torchvision.models resnet50, vgg19, inception_v3), so a
layer's `block` is the module-path prefix a profiler or torch front-end reports. Output sizes are computed
from each layer's kernel, stride and padding. Run from the repository root:

    python scripts/gen_cnn_catalog.py
"""

from dataclasses import dataclass, field
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "src" / "trainsim" / "catalog" / "data" / "models"


@dataclass
class Net:
    """Collects layers while tracking the current channel count and spatial size."""

    channels: int
    hw: tuple[int, int]
    rows: list[dict[str, object]] = field(default_factory=list)
    input_hw: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.input_hw = self.hw

    def add(self, kind: str, name: str, block: str, in_c: int, out_c: int, kernel: tuple[int, int],
            stride: int, out_hw: tuple[int, int]) -> None:
        self.rows.append({"type": kind, "name": name, "in_channels": in_c, "out_channels": out_c,
                          "kernel": list(kernel), "stride": stride, "out_hw": list(out_hw), "block": block})

    def conv(self, name: str, block: str, out_c: int, kernel: tuple[int, int] | int, stride: int = 1,
             pad: tuple[int, int] | int = 0, src: tuple[int, tuple[int, int]] | None = None) -> None:
        """A convolution reading `src` (channels, hw) or the current tensor; its output becomes current."""
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        in_c, (h, w) = src if src is not None else (self.channels, self.hw)
        out_hw = ((h + 2 * ph - kh) // stride + 1, (w + 2 * pw - kw) // stride + 1)
        self.add("conv", name, block, in_c, out_c, (kh, kw), stride, out_hw)
        self.channels, self.hw = out_c, out_hw

    def unary(self, kind: str, name: str, block: str) -> None:
        """A norm or relu on the current tensor (same shape in and out)."""
        self.add(kind, name, block, self.channels, self.channels, (1, 1), 1, self.hw)

    def pool(self, name: str, block: str, kernel: int, stride: int, pad: int = 0,
             src: tuple[int, tuple[int, int]] | None = None) -> None:
        in_c, (h, w) = src if src is not None else (self.channels, self.hw)
        out_hw = ((h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1)
        self.add("pool", name, block, in_c, in_c, (kernel, kernel), stride, out_hw)
        self.channels, self.hw = in_c, out_hw

    def fc(self, name: str, block: str, in_features: int, out_features: int) -> None:
        self.add("fc", name, block, in_features, out_features, (1, 1), 1, (1, 1))
        self.channels, self.hw = out_features, (1, 1)

    def concat(self, name: str, block: str, out_c: int) -> None:
        self.add("concat", name, block, out_c, out_c, (1, 1), 1, self.hw)
        self.channels = out_c


# --- ResNet-50 (torchvision v1.5: the stride sits on the 3x3 conv) ---


def resnet50() -> Net:
    net = Net(3, (224, 224))
    net.conv("conv1", "stem", 64, 7, stride=2, pad=3)
    net.unary("norm", "bn1", "stem")
    net.unary("relu", "relu", "stem")
    net.pool("maxpool", "stem", 3, 2, pad=1)
    for stage, (width, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), 1):
        for index in range(blocks):
            _bottleneck(net, f"layer{stage}.{index}", width, stride if index == 0 else 1)
    net.pool("avgpool", "head", net.hw[0], net.hw[0])
    net.fc("fc", "head", net.channels, 1000)
    return net


def _bottleneck(net: Net, block: str, width: int, stride: int) -> None:
    block_in = (net.channels, net.hw)
    out_c = width * 4
    net.conv(f"{block}.conv1", block, width, 1)
    net.unary("norm", f"{block}.bn1", block)
    net.unary("relu", f"{block}.relu1", block)
    net.conv(f"{block}.conv2", block, width, 3, stride=stride, pad=1)
    net.unary("norm", f"{block}.bn2", block)
    net.unary("relu", f"{block}.relu2", block)
    net.conv(f"{block}.conv3", block, out_c, 1)
    net.unary("norm", f"{block}.bn3", block)
    main = (net.channels, net.hw)
    if stride != 1 or block_in[0] != out_c:
        net.conv(f"{block}.downsample.0", block, out_c, 1, stride=stride, src=block_in)
        net.unary("norm", f"{block}.downsample.1", block)
    net.channels, net.hw = main
    net.unary("relu", f"{block}.relu3", block)  # after the residual add


# --- VGG-19 (configuration E, no batch norm) ---


def vgg19() -> Net:
    net = Net(3, (224, 224))
    plan = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
            512, 512, 512, 512, "M"]
    index, block = 0, ""
    for item in plan:
        if item == "M":
            net.pool(f"features.{index}", block, 2, 2)
            index += 1
            continue
        assert isinstance(item, int)
        block = f"features.{index}"
        net.conv(block, block, item, 3, pad=1)
        net.unary("relu", f"features.{index + 1}", block)
        index += 2
    flat = net.channels * net.hw[0] * net.hw[1]
    net.fc("classifier.0", "classifier", flat, 4096)
    net.unary("relu", "classifier.1", "classifier")
    net.fc("classifier.3", "classifier", 4096, 4096)
    net.unary("relu", "classifier.4", "classifier")
    net.fc("classifier.6", "classifier", 4096, 1000)
    return net


# --- Inception-v3 (299x299 input, without the auxiliary classifier) ---


def _basic(net: Net, name: str, block: str, out_c: int, kernel: tuple[int, int] | int, stride: int = 1,
           pad: tuple[int, int] | int = 0, src: tuple[int, tuple[int, int]] | None = None) -> None:
    """torchvision BasicConv2d: conv (no bias) + BatchNorm + ReLU."""
    net.conv(f"{name}.conv", block, out_c, kernel, stride, pad, src)
    net.unary("norm", f"{name}.bn", block)
    net.unary("relu", f"{name}.relu", block)


def inception_v3() -> Net:
    net = Net(3, (299, 299))
    _basic(net, "Conv2d_1a_3x3", "Conv2d_1a_3x3", 32, 3, stride=2)
    _basic(net, "Conv2d_2a_3x3", "Conv2d_2a_3x3", 32, 3)
    _basic(net, "Conv2d_2b_3x3", "Conv2d_2b_3x3", 64, 3, pad=1)
    net.pool("maxpool1", "Conv2d_2b_3x3", 3, 2)
    _basic(net, "Conv2d_3b_1x1", "Conv2d_3b_1x1", 80, 1)
    _basic(net, "Conv2d_4a_3x3", "Conv2d_4a_3x3", 192, 3)
    net.pool("maxpool2", "Conv2d_4a_3x3", 3, 2)
    for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        _inception_a(net, name, pool_features)
    _inception_b(net, "Mixed_6a")
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        _inception_c(net, name, c7)
    _inception_d(net, "Mixed_7a")
    _inception_e(net, "Mixed_7b")
    _inception_e(net, "Mixed_7c")
    net.pool("avgpool", "head", net.hw[0], net.hw[0])
    net.fc("fc", "head", net.channels, 1000)
    return net


def _inception_a(net: Net, b: str, pool_features: int) -> None:
    x = (net.channels, net.hw)
    _basic(net, f"{b}.branch1x1", b, 64, 1, src=x)
    _basic(net, f"{b}.branch5x5_1", b, 48, 1, src=x)
    _basic(net, f"{b}.branch5x5_2", b, 64, 5, pad=2)
    _basic(net, f"{b}.branch3x3dbl_1", b, 64, 1, src=x)
    _basic(net, f"{b}.branch3x3dbl_2", b, 96, 3, pad=1)
    _basic(net, f"{b}.branch3x3dbl_3", b, 96, 3, pad=1)
    net.pool(f"{b}.branch_pool.avg_pool", b, 3, 1, pad=1, src=x)
    _basic(net, f"{b}.branch_pool", b, pool_features, 1)
    net.concat(f"{b}.cat", b, 64 + 64 + 96 + pool_features)


def _inception_b(net: Net, b: str) -> None:
    x = (net.channels, net.hw)
    _basic(net, f"{b}.branch3x3", b, 384, 3, stride=2, src=x)
    _basic(net, f"{b}.branch3x3dbl_1", b, 64, 1, src=x)
    _basic(net, f"{b}.branch3x3dbl_2", b, 96, 3, pad=1)
    _basic(net, f"{b}.branch3x3dbl_3", b, 96, 3, stride=2)
    net.pool(f"{b}.branch_pool.max_pool", b, 3, 2, src=x)
    net.concat(f"{b}.cat", b, 384 + 96 + x[0])


def _inception_c(net: Net, b: str, c7: int) -> None:
    x = (net.channels, net.hw)
    _basic(net, f"{b}.branch1x1", b, 192, 1, src=x)
    _basic(net, f"{b}.branch7x7_1", b, c7, 1, src=x)
    _basic(net, f"{b}.branch7x7_2", b, c7, (1, 7), pad=(0, 3))
    _basic(net, f"{b}.branch7x7_3", b, 192, (7, 1), pad=(3, 0))
    _basic(net, f"{b}.branch7x7dbl_1", b, c7, 1, src=x)
    _basic(net, f"{b}.branch7x7dbl_2", b, c7, (7, 1), pad=(3, 0))
    _basic(net, f"{b}.branch7x7dbl_3", b, c7, (1, 7), pad=(0, 3))
    _basic(net, f"{b}.branch7x7dbl_4", b, c7, (7, 1), pad=(3, 0))
    _basic(net, f"{b}.branch7x7dbl_5", b, 192, (1, 7), pad=(0, 3))
    net.pool(f"{b}.branch_pool.avg_pool", b, 3, 1, pad=1, src=x)
    _basic(net, f"{b}.branch_pool", b, 192, 1)
    net.concat(f"{b}.cat", b, 4 * 192)


def _inception_d(net: Net, b: str) -> None:
    x = (net.channels, net.hw)
    _basic(net, f"{b}.branch3x3_1", b, 192, 1, src=x)
    _basic(net, f"{b}.branch3x3_2", b, 320, 3, stride=2)
    _basic(net, f"{b}.branch7x7x3_1", b, 192, 1, src=x)
    _basic(net, f"{b}.branch7x7x3_2", b, 192, (1, 7), pad=(0, 3))
    _basic(net, f"{b}.branch7x7x3_3", b, 192, (7, 1), pad=(3, 0))
    _basic(net, f"{b}.branch7x7x3_4", b, 192, 3, stride=2)
    net.pool(f"{b}.branch_pool.max_pool", b, 3, 2, src=x)
    net.concat(f"{b}.cat", b, 320 + 192 + x[0])


def _inception_e(net: Net, b: str) -> None:
    x = (net.channels, net.hw)
    _basic(net, f"{b}.branch1x1", b, 320, 1, src=x)
    _basic(net, f"{b}.branch3x3_1", b, 384, 1, src=x)
    mid = (net.channels, net.hw)
    _basic(net, f"{b}.branch3x3_2a", b, 384, (1, 3), pad=(0, 1))
    _basic(net, f"{b}.branch3x3_2b", b, 384, (3, 1), pad=(1, 0), src=mid)
    _basic(net, f"{b}.branch3x3dbl_1", b, 448, 1, src=x)
    _basic(net, f"{b}.branch3x3dbl_2", b, 384, 3, pad=1)
    mid = (net.channels, net.hw)
    _basic(net, f"{b}.branch3x3dbl_3a", b, 384, (1, 3), pad=(0, 1))
    _basic(net, f"{b}.branch3x3dbl_3b", b, 384, (3, 1), pad=(1, 0), src=mid)
    net.pool(f"{b}.branch_pool.avg_pool", b, 3, 1, pad=1, src=x)
    _basic(net, f"{b}.branch_pool", b, 192, 1)
    net.concat(f"{b}.cat", b, 320 + 768 + 768 + 192)


# --- writing ---

_HEADERS = {
    "resnet": """\
# ResNet-50: He et al. 2016, "Deep Residual Learning for Image Recognition", Table 1, in torchvision's
# v1.5 form (stride on the 3x3 conv of each first bottleneck; torchvision/models/resnet.py).
# 25,557,032 parameters (torchvision docs); 4.09 GMACs per 224x224 image.
# NB: the residual additions are not listed (ConvLayer has no add type).
""",
    "vgg": """\
# VGG-19: Simonyan & Zisserman 2015, "Very Deep Convolutional Networks", Table 1 configuration E
# (144M parameters, Table 2), as torchvision/models/vgg.py builds it (no batch norm): 143,667,240
# parameters. Blocks: one per conv (+ its ReLU and the max-pool after it), named features.<index>.
""",
    "inception": """\
# Inception-v3: Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer Vision",
# Table 1, as torchvision/models/inception.py builds it, 299x299 input, without the auxiliary
# classifier: 23,834,568 parameters (27.2M with the aux head). Each BasicConv2d is conv (no bias)
# + BatchNorm + ReLU.
""",
}


def _row(row: dict[str, object]) -> str:
    def value(v: object) -> str:
        return "[" + ", ".join(str(x) for x in v) + "]" if isinstance(v, list) else str(v)

    return "      - {" + ", ".join(f"{key}: {value(v)}" for key, v in row.items()) + "}"


def render(family: str, name: str, description: str, net: Net, published: float, source: str) -> str:
    lines = [
        _HEADERS[family].rstrip("\n"),
        "# Generated by scripts/gen_cnn_catalog.py; edit the script, not this file.",
        "defaults:",
        "  kind: cnn",
        "models:",
        f"  - name: {name}",
        f"    description: \"{description}\"",
        f"    input_hw: [{net.input_hw[0]}, {net.input_hw[1]}]",
        f"    published_params: {published}",
        f"    source: \"{source}\"",
        "    layers:",
    ]
    lines += [_row(row) for row in net.rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    specs = [
        ("resnet", "resnet50", "ResNet-50 (torchvision v1.5), ImageNet 224x224", resnet50(), 25.557032e6,
         "He et al. 2016, Table 1; torchvision resnet50"),
        ("vgg", "vgg19", "VGG-19 (configuration E), ImageNet 224x224", vgg19(), 143.66724e6,
         "Simonyan & Zisserman 2015, Tables 1-2; torchvision vgg19"),
        ("inception", "inception-v3", "Inception-v3 without the auxiliary classifier, ImageNet 299x299",
         inception_v3(), 23.834568e6, "Szegedy et al. 2016, Table 1; torchvision inception_v3"),
    ]
    for family, name, description, net, published, source in specs:
        path = OUT_DIR / f"{family}.yaml"
        path.write_text(render(family, name, description, net, published, source))
        print(f"wrote {path} ({len(net.rows)} layers)")


if __name__ == "__main__":
    main()
