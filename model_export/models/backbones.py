"""YOLACT backbones: ResNet (Bottleneck or BasicBlock stages) and DarkNet-53, with the official state_dict names.

Both return the output of every stage (`forward(x) -> list[Tensor]`, NCHW), and know their stage output
channels (`channels`) and spatial sizes (`stage_sizes(h, w)`) without running, so the FPN can upsample to static
sizes. Key names follow dbolya/yolact `backbone.py`: `layers` is registered before the stem, so stage weights come
first in the state_dict (`backbone.layers.*`, then `backbone.conv1` / `backbone._preconv`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def stride2_size(n: int) -> int:
    """Output length of a stride-2 conv/pool whose padding is kernel//2 (3x3 pad 1, 7x7 pad 3, 1x1 pad 0)."""
    return (n + 1) // 2


# ------------------------------------------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    """1x1 -> 3x3 (carries the stride) -> 1x1 (x4 channels), torchvision style. out: [B, planes*4, H/s, W/s]."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class BasicBlock(nn.Module):
    """3x3 (carries the stride) -> 3x3, torchvision style (ResNet-18/34). out: [B, planes, H/s, W/s]."""

    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


RESNET_BLOCKS = {"bottleneck": Bottleneck, "basic": BasicBlock}


class ResNetBackbone(nn.Module):
    """conv1 7x7/2 -> bn1 -> ReLU -> maxpool 3/2 -> `layers[0..3]` (stage s has width base_width * 2**s, stride 2
    from stage 1 on). forward(x: [B, 3, H, W]) -> [C2, C3, C4, C5], e.g. R50 at 550: 256@138, 512@69, 1024@35,
    2048@18."""

    def __init__(self, block: str, depths: Sequence[int], base_width: int = 64):
        super().__init__()
        if block not in RESNET_BLOCKS:
            raise ValueError(f"ResNet block {block!r} is not one of {sorted(RESNET_BLOCKS)}")
        block_cls = RESNET_BLOCKS[block]
        self.layers = nn.ModuleList()  # registered first: the official state_dict lists the stages first
        self.channels: list[int] = []
        self.conv1 = nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = base_width
        for stage, depth in enumerate(depths):
            planes = base_width * 2**stage
            stride = 1 if stage == 0 else 2
            self.layers.append(self._make_stage(block_cls, in_channels, planes, depth, stride))
            in_channels = planes * block_cls.expansion
            self.channels.append(in_channels)

    @staticmethod
    def _make_stage(block_cls, in_channels: int, planes: int, depth: int, stride: int) -> nn.Sequential:
        out_channels = planes * block_cls.expansion
        downsample = None
        if stride != 1 or in_channels != out_channels:
            downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )
        blocks = [block_cls(in_channels, planes, stride, downsample)]
        blocks += [block_cls(out_channels, planes) for _ in range(depth - 1)]
        return nn.Sequential(*blocks)

    def stage_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """(h, w) of every stage output for an input of height x width pixels."""
        h, w = stride2_size(stride2_size(height)), stride2_size(stride2_size(width))  # conv1, maxpool
        sizes = []
        for stage in range(len(self.layers)):
            if stage > 0:
                h, w = stride2_size(h), stride2_size(w)
            sizes.append((h, w))
        return sizes

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return outs


# ----------------------------------------------------------------------------------------------------- DarkNet
def darknet_conv(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    """conv (no bias, padding kernel//2) -> BN -> LeakyReLU(0.1); keys `.0.weight`, `.1.*`."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.LeakyReLU(0.1, inplace=True),
    )


class DarkNetBlock(nn.Module):
    """Residual block: conv1 1x1 c -> c/2, conv2 3x3 c/2 -> c, out = conv2(conv1(x)) + x."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = darknet_conv(channels, channels // 2, 1)
        self.conv2 = darknet_conv(channels // 2, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x)) + x


class DarkNetBackbone(nn.Module):
    """`_preconv` 3x3 (3 -> base_width) then stages of [stride-2 3x3 conv, depth x DarkNetBlock], stage s has
    base_width * 2**(s+1) channels. DarkNet-53 at 550: 64@275, 128@138, 256@69, 512@35, 1024@18."""

    def __init__(self, depths: Sequence[int], base_width: int = 32):
        super().__init__()
        self.layers = nn.ModuleList()  # registered first, as in the official state_dict
        self.channels: list[int] = []
        in_channels = base_width
        for stage, depth in enumerate(depths):
            out_channels = base_width * 2 ** (stage + 1)
            blocks = [darknet_conv(in_channels, out_channels, 3, stride=2)]
            blocks += [DarkNetBlock(out_channels) for _ in range(depth)]
            self.layers.append(nn.Sequential(*blocks))
            self.channels.append(out_channels)
            in_channels = out_channels
        self._preconv = darknet_conv(3, base_width, 3)

    def stage_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """(h, w) of every stage output for an input of height x width pixels."""
        sizes, h, w = [], height, width
        for _ in self.layers:
            h, w = stride2_size(h), stride2_size(w)
            sizes.append((h, w))
        return sizes

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self._preconv(x)
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return outs
