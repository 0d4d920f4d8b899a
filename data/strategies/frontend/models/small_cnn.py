"""A small torchvision-style CNN as an nn.Module factory for the torch front-end (`--model FILE.py:build`): a 3x3
stem to 64 channels, two blocks of conv-BN-ReLU, conv-BN-ReLU and a 2x2 max-pool (32x32 images down to 8x8),
a 100-class classifier; the split trees beside it (cnn-torch-tp2-*.yaml) address its modules
(`blocks.*.conv1`)."""

from typing import Any

import torch
from torch import nn

from trainsim.frontends.torch.capture import TensorSpec

CHANNELS, IMAGE_HW, CLASSES = 64, 32, 100


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        return self.pool(self.relu(self.bn2(self.conv2(x))))


class SmallCnn(nn.Module):
    """channels, image_hw, classes: the stem's output channels, the image side and the classifier's classes."""

    def __init__(self, channels: int = CHANNELS, image_hw: int = IMAGE_HW, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.blocks = nn.ModuleList([Block(channels) for _ in range(2)])
        self.fc = nn.Linear(channels * (image_hw // 4) ** 2, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.fc(x.flatten(1)), labels)


def build(micro_batch: int = 8) -> tuple[nn.Module, dict[str, Any]]:
    """The module and its example inputs: micro_batch images of 3 x 32 x 32 and their labels."""
    return SmallCnn(), {"images": TensorSpec((micro_batch, 3, IMAGE_HW, IMAGE_HW), "float32"),
                        "labels": TensorSpec((micro_batch,), "int64")}
