"""YOLACT's building blocks below the model (model_export.models.yolact.Yolact assembles them): the feature pyramid,
the prototype net, the shared prediction head, and the resize they upsample with (exact under ONNX export). Module
and attribute names are those of the official dbolya/yolact state_dict: Yolact's keys are made of them."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------------------------------------ exact resize
class _ResizeToStaticSize(torch.autograd.Function):
    """ONNX export only: bilinear resize whose Resize node gets a constant `sizes` input (the stock opset-11
    symbolic always adds Shape -> Slice -> Concat for the batch and channel dims)."""

    @staticmethod
    def forward(ctx, x, height: int, width: int):
        return F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)

    @staticmethod
    def symbolic(g, x, height: int, width: int):
        empty = g.op("Constant", value_t=torch.tensor([], dtype=torch.float32))
        batch_channels = (x.type().varyingSizes() or [None, None])[:2]
        if None not in batch_channels:
            sizes = g.op("Constant", value_t=torch.tensor([*batch_channels, height, width], dtype=torch.int64))
        else:  # dynamic batch: take N, C from the tensor at run time
            shape = g.op("Shape", x)
            starts, ends = (g.op("Constant", value_t=torch.tensor([v], dtype=torch.int64)) for v in (0, 2))
            hw = g.op("Constant", value_t=torch.tensor([height, width], dtype=torch.int64))
            sizes = g.op("Concat", g.op("Slice", shape, starts, ends), hw, axis_i=0)
        return g.op(
            "Resize",
            x,
            empty,
            empty,
            sizes,
            coordinate_transformation_mode_s="half_pixel",
            mode_s="linear",
            cubic_coeff_a_f=-0.75,
            nearest_mode_s="floor",
        )


def resize_bilinear(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """x: [B, C, h, w] -> [B, C, size[0], size[1]], bilinear, align_corners=False, to exactly `size` (Python ints)."""
    if torch.onnx.is_in_onnx_export():
        return _ResizeToStaticSize.apply(x, int(size[0]), int(size[1]))
    return F.interpolate(x, size=(int(size[0]), int(size[1])), mode="bilinear", align_corners=False)


def static_hw(x: torch.Tensor) -> tuple[int, int]:
    """(h, w) of x [B, C, h, w] as Python ints. Under tracing the exported graph is specialised to this input
    size on purpose (the priors are too), so the tracer's "treated as a constant" warning is expected."""
    if not torch.jit.is_tracing():
        return int(x.shape[-2]), int(x.shape[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        return int(x.shape[-2]), int(x.shape[-1])


# ------------------------------------------------------------------------------------------------------ modules
class FPN(nn.Module):
    """Feature pyramid. `lat_layers` / `pred_layers` are stored in reverse (index 0 works on the deepest level),
    as in the official state_dict. forward([C3, C4, C5], sizes) -> [P3, P4, P5, P6, P7], each
    [B, num_features, h, w]; P3..P5 pass through ReLU, P6/P7 (stride-2 convs) do not."""

    def __init__(self, in_channels: Sequence[int], num_features: int = 256, num_downsample: int = 2):
        super().__init__()
        self.lat_layers = nn.ModuleList(nn.Conv2d(c, num_features, 1) for c in reversed(in_channels))
        self.pred_layers = nn.ModuleList(nn.Conv2d(num_features, num_features, 3, padding=1) for _ in in_channels)
        self.downsample_layers = nn.ModuleList(
            nn.Conv2d(num_features, num_features, 3, stride=2, padding=1) for _ in range(num_downsample)
        )

    def forward(self, feats: Sequence[torch.Tensor], sizes: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
        """feats: backbone outputs, shallowest first; sizes: their (h, w) as Python ints (upsampling targets)."""
        n = len(feats)
        merged: list[torch.Tensor] = [feats[0]] * n
        x = None
        for k, lat_layer in enumerate(self.lat_layers):  # top-down, deepest level first
            j = n - 1 - k
            lateral = lat_layer(feats[j])
            x = lateral if x is None else resize_bilinear(x, sizes[j]) + lateral
            merged[j] = x
        outs = [F.relu(self.pred_layers[n - 1 - j](merged[j])) for j in range(n)]
        for downsample_layer in self.downsample_layers:
            outs.append(downsample_layer(outs[-1]))
        return outs


def make_proto_net(in_channels: int, channels: int, mask_dim: int) -> nn.Sequential:
    """conv3x3-ReLU x3, bilinear x2 upsample, ReLU, conv3x3-ReLU, conv1x1 -> mask_dim (convs at indices 0, 2, 4,
    8, 10, the official `proto_net.*` keys). [B, in, h, w] -> [B, mask_dim, 2h, 2w] (no final activation)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, channels, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
        nn.ReLU(inplace=True),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(channels, mask_dim, 1),
    )


class PredictionHead(nn.Module):
    """Shared head applied to every pyramid level. forward(p: [B, C, h, w]) -> loc [B, h*w*A, 4],
    conf [B, h*w*A, num_classes] logits, mask [B, h*w*A, mask_dim] tanh; rows ordered (y, x, anchor).
    Conv output channel a*k + c is anchor a, component c."""

    def __init__(self, in_channels: int, head_channels: int, num_anchors: int, num_classes: int, mask_dim: int):
        super().__init__()
        self.num_classes = num_classes
        self.mask_dim = mask_dim
        self.upfeature = nn.Sequential(nn.Conv2d(in_channels, head_channels, 3, padding=1), nn.ReLU(inplace=True))
        self.bbox_layer = nn.Conv2d(head_channels, num_anchors * 4, 3, padding=1)
        self.conf_layer = nn.Conv2d(head_channels, num_anchors * num_classes, 3, padding=1)
        self.mask_layer = nn.Conv2d(head_channels, num_anchors * mask_dim, 3, padding=1)

    @staticmethod
    def _per_prior(t: torch.Tensor, k: int) -> torch.Tensor:
        """[B, A*k, h, w] -> [B, h*w*A, k]."""
        return t.permute(0, 2, 3, 1).reshape(t.size(0), -1, k)

    def forward(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.upfeature(p)
        loc = self._per_prior(self.bbox_layer(x), 4)
        conf = self._per_prior(self.conf_layer(x), self.num_classes)
        mask = torch.tanh(self._per_prior(self.mask_layer(x), self.mask_dim))
        return loc, conf, mask
