"""YOLACT v1 (Bolya et al., ICCV 2019) in PyTorch, state_dict-compatible with the official dbolya/yolact checkpoints.

Facts (layouts, key names, formulas) follow dbolya/yolact and the paper (docs/yolact.md); the code is our own.
The graph ends at the heads: `forward` returns raw per-prior outputs and Detect / mask assembly run outside, in
numpy (`pipelines.ops.yolact_postprocess`), for the Spark job and the PyTorch eval path alike. The pyramid, the
prototype net and the prediction head are in `yolact_heads`.

    cfg = get_config("yolact_resnet50")
    model = Yolact(cfg).eval()
    loc, conf, mask, proto = model(x)          # x: [B, 3, 550, 550] normalized RGB
    priors = model.priors()                    # [19248, 4] (cx, cy, w, h) relative
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model_export.models.backbones import DarkNetBackbone, ResNetBackbone, stride2_size
from model_export.models.yolact_heads import FPN, PredictionHead, make_proto_net, static_hw
from pipelines.datasets.classes import ROAD_DISTRESS_CLASSES
from pipelines.ops.yolact_postprocess import make_priors

COCO_CLASSES = (
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
)
BASE_SCALES = (24, 48, 96, 192, 384)
IMAGENET_MEAN_RGB = (123.68, 116.78, 103.94)
IMAGENET_STD_RGB = (58.40, 57.12, 57.38)


@dataclass(frozen=True)
class YolactConfig:
    """Everything that defines a YOLACT model, its input and its postprocess defaults.

    num_classes counts the background (conf column 0); class_names are the foreground names, in conf column order
    1..num_classes-1. pred_scales: anchor side in pixels per level (P3..P7), divided by max_size for the priors.
    normalization: "mean_std" ((x - mean_rgb) / std_rgb on 0-255 RGB) or "div255" (x / 255, DarkNet).
    """

    name: str
    backbone: str = "resnet"  # "resnet" | "darknet"
    block: str = "bottleneck"  # ResNet block: "bottleneck" | "basic"
    stage_depths: tuple[int, ...] = (3, 4, 6, 3)
    base_width: int = 64  # ResNet stem / stage-0 width; DarkNet _preconv width
    selected_layers: tuple[int, ...] = (1, 2, 3)  # backbone stages fed to the FPN (C3, C4, C5)
    num_classes: int = 81
    class_names: tuple[str, ...] = COCO_CLASSES
    max_size: int = 550  # square input side, pixels
    fpn_features: int = 256
    num_downsample: int = 2  # P6, P7 by stride-2 convs
    proto_channels: int = 256
    head_channels: int = 256  # prediction head `upfeature` width
    mask_dim: int = 32
    pred_scales: tuple[int, ...] = BASE_SCALES
    pred_aspect_ratios: tuple[float, ...] = (1.0, 0.5, 2.0)
    square_anchors: bool = True
    normalization: str = "mean_std"
    mean_rgb: tuple[float, float, float] = IMAGENET_MEAN_RGB
    std_rgb: tuple[float, float, float] = IMAGENET_STD_RGB
    conf_thresh: float = 0.05
    nms_thresh: float = 0.5
    top_k: int = 200
    max_num_detections: int = 100

    def __post_init__(self):
        def fail(message: str):
            raise ValueError(f"YolactConfig {self.name!r}: {message}")

        if self.backbone not in ("resnet", "darknet"):
            fail(f"backbone {self.backbone!r} must be 'resnet' or 'darknet'")
        if self.backbone == "resnet" and self.block not in ("bottleneck", "basic"):
            fail(f"block {self.block!r} must be 'bottleneck' or 'basic'")
        if (
            list(self.selected_layers) != sorted(set(self.selected_layers))
            or not self.selected_layers
            or self.selected_layers[0] < 0
            or self.selected_layers[-1] >= len(self.stage_depths)
        ):
            fail(
                f"selected_layers {self.selected_layers} must be increasing stage indices "
                f"< {len(self.stage_depths)} (stage_depths {self.stage_depths})"
            )
        levels = len(self.selected_layers) + self.num_downsample
        if len(self.pred_scales) != levels:
            fail(f"pred_scales has {len(self.pred_scales)} entries; give one per prediction level ({levels})")
        if self.num_classes < 2:
            fail(f"num_classes {self.num_classes} must be >= 2 (background + at least one class)")
        if len(self.class_names) != self.num_classes - 1:
            fail(
                f"class_names has {len(self.class_names)} names but num_classes {self.num_classes} needs "
                f"{self.num_classes - 1} (foreground only; background is implicit)"
            )
        if self.max_size <= 0:
            fail(f"max_size {self.max_size} must be a positive number of pixels")
        if self.normalization not in ("mean_std", "div255"):
            fail(f"normalization {self.normalization!r} must be 'mean_std' or 'div255'")
        if len(self.mean_rgb) != 3 or len(self.std_rgb) != 3 or min(self.std_rgb) <= 0:
            fail(f"mean_rgb {self.mean_rgb} / std_rgb {self.std_rgb} need 3 values each, std > 0")

    @property
    def num_anchors(self) -> int:
        """Anchors per feature-map cell (one per aspect ratio)."""
        return len(self.pred_aspect_ratios)

    @property
    def mean(self) -> tuple[float, float, float]:
        """Effective per-channel mean (RGB, 0-255 scale) that the input has subtracted."""
        return (0.0, 0.0, 0.0) if self.normalization == "div255" else tuple(self.mean_rgb)

    @property
    def std(self) -> tuple[float, float, float]:
        """Effective per-channel divisor (RGB, 0-255 scale): x_in = (rgb - mean) / std."""
        return (255.0, 255.0, 255.0) if self.normalization == "div255" else tuple(self.std_rgb)


def _scaled(scales: Iterable[int], size: int) -> tuple[int, ...]:
    """Reference rule for other input sizes: int(s / 550 * size)."""
    return tuple(int(s / 550 * size) for s in scales)


CONFIGS = MappingProxyType(
    {
        cfg.name: cfg
        for cfg in (
            YolactConfig(name="yolact_base", stage_depths=(3, 4, 23, 3)),
            YolactConfig(name="yolact_resnet50", stage_depths=(3, 4, 6, 3)),
            YolactConfig(
                name="yolact_im700", stage_depths=(3, 4, 23, 3), max_size=700, pred_scales=_scaled(BASE_SCALES, 700)
            ),
            YolactConfig(
                name="yolact_darknet53",
                backbone="darknet",
                stage_depths=(1, 2, 8, 8, 4),
                base_width=32,
                selected_layers=(2, 3, 4),
                normalization="div255",
            ),
            # Ours: a small ResNet-18-style model for the road-distress classes (IR of a few MB, fast on CPU).
            YolactConfig(
                name="yolact_r18_small",
                block="basic",
                stage_depths=(2, 2, 2, 2),
                base_width=32,
                num_classes=len(ROAD_DISTRESS_CLASSES) + 1,
                class_names=ROAD_DISTRESS_CLASSES,
                max_size=352,
                fpn_features=128,
                proto_channels=128,
                head_channels=128,
                pred_scales=_scaled(BASE_SCALES, 352),
            ),
        )
    }
)


def get_config(name: str, **overrides) -> YolactConfig:
    """The registered config `name`, with fields replaced by `overrides` (e.g. num_classes=5,
    class_names=("a", "b", "c", "d"), max_size=700). Giving only class_names sets num_classes to match."""
    if name not in CONFIGS:
        raise KeyError(f"unknown YOLACT config {name!r}; valid names: {', '.join(sorted(CONFIGS))}")
    fields = {f.name for f in dataclasses.fields(YolactConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"get_config({name!r}): unknown override(s) {unknown}; valid fields: {sorted(fields)}")
    for key in (
        "class_names",
        "stage_depths",
        "selected_layers",
        "pred_scales",
        "pred_aspect_ratios",
        "mean_rgb",
        "std_rgb",
    ):
        if key in overrides:
            overrides[key] = tuple(overrides[key])
    if "class_names" in overrides and "num_classes" not in overrides:
        overrides["num_classes"] = len(overrides["class_names"]) + 1
    base = CONFIGS[name]
    if "num_classes" in overrides and "class_names" not in overrides and overrides["num_classes"] != base.num_classes:
        raise ValueError(
            f"get_config({name!r}, num_classes={overrides['num_classes']}): also pass class_names "
            f"({overrides['num_classes'] - 1} foreground names)"
        )
    return dataclasses.replace(base, **overrides)


class Yolact(nn.Module):
    """YOLACT v1: backbone -> FPN -> proto net (on P3) + one shared prediction head (on P3..P7).

    forward(x: [B, 3, S, S] float32 normalized RGB):
      eval:  (loc [B, N, 4] offsets, conf [B, N, num_classes] softmax, mask [B, N, mask_dim] tanh,
              proto [B, Ph, Pw, mask_dim] ReLU, NHWC)  -- N = 19248 and Ph = 138 for 550 inputs
      train: dict(loc, conf (raw logits), mask, proto, segm [B, num_classes-1, h3, w3] = semantic_seg_conv(P3))
    state_dict keys, order and shapes equal the official checkpoints' for the released configs.
    """

    def __init__(self, cfg: YolactConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.backbone == "resnet":
            self.backbone = ResNetBackbone(cfg.block, cfg.stage_depths, cfg.base_width)
        else:
            self.backbone = DarkNetBackbone(cfg.stage_depths, cfg.base_width)
        in_channels = [self.backbone.channels[i] for i in cfg.selected_layers]
        self.proto_net = make_proto_net(cfg.fpn_features, cfg.proto_channels, cfg.mask_dim)
        self.fpn = FPN(in_channels, cfg.fpn_features, cfg.num_downsample)
        self.prediction_layers = nn.ModuleList(
            [PredictionHead(cfg.fpn_features, cfg.head_channels, cfg.num_anchors, cfg.num_classes, cfg.mask_dim)]
        )
        self.semantic_seg_conv = nn.Conv2d(cfg.fpn_features, cfg.num_classes - 1, 1)
        self._sizes_cache: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._priors_cache: dict[tuple[int, int], np.ndarray] = {}
        self._init_weights()

    def _init_weights(self) -> None:
        """Backbone convs: Kaiming (fan_out); everything else: Xavier-uniform weights, zero biases (reference)."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Conv2d):
                if name.startswith("backbone."):
                    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # -------------------------------------------------------------------------------------------- static sizes
    def _input_hw(self, input_size: int | tuple[int, int] | None) -> tuple[int, int]:
        if input_size is None:
            return self.cfg.max_size, self.cfg.max_size
        if isinstance(input_size, int):
            return input_size, input_size
        height, width = input_size
        return int(height), int(width)

    def feature_map_sizes(self, input_size: int | tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """(h, w) of P3..P7 for a square side or (h, w) input (default cfg.max_size), e.g. 550 ->
        [(69, 69), (35, 35), (18, 18), (9, 9), (5, 5)]. Computed from the layer arithmetic, cached per size."""
        hw = self._input_hw(input_size)
        if hw not in self._sizes_cache:
            stages = self.backbone.stage_sizes(*hw)
            sizes = [stages[i] for i in self.cfg.selected_layers]
            for _ in range(self.cfg.num_downsample):
                sizes.append((stride2_size(sizes[-1][0]), stride2_size(sizes[-1][1])))
            self._sizes_cache[hw] = sizes
        return list(self._sizes_cache[hw])

    def proto_size(self, input_size: int | tuple[int, int] | None = None) -> tuple[int, int]:
        """(Ph, Pw) of the prototypes: twice P3, e.g. 138 x 138 for 550."""
        h, w = self.feature_map_sizes(input_size)[0]
        return 2 * h, 2 * w

    def priors(self, input_size: int | tuple[int, int] | None = None) -> np.ndarray:
        """Anchors matching forward()'s rows: [N, 4] float32 (cx, cy, w, h) relative (19248 for 550)."""
        hw = self._input_hw(input_size)
        if hw not in self._priors_cache:
            self._priors_cache[hw] = make_priors(
                self.feature_map_sizes(hw),
                self.cfg.pred_scales,
                self.cfg.pred_aspect_ratios,
                self.cfg.max_size,
                self.cfg.square_anchors,
            )
        return self._priors_cache[hw].copy()

    # ------------------------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor):
        if not torch.jit.is_tracing() and (x.dim() != 4 or x.shape[1] != 3):
            raise ValueError(f"Yolact.forward: x must be [B, 3, H, W] normalized RGB, got {tuple(x.shape)}")
        level_sizes = self.feature_map_sizes(static_hw(x))
        stages = self.backbone(x)
        feats = [stages[i] for i in self.cfg.selected_layers]
        pyramid = self.fpn(feats, level_sizes[: len(feats)])
        proto = F.relu(self.proto_net(pyramid[0])).permute(0, 2, 3, 1).contiguous()
        head = self.prediction_layers[0]
        per_level = [head(p) for p in pyramid]
        loc, conf, mask = (torch.cat([level[i] for level in per_level], dim=1) for i in range(3))
        if self.training:
            return {"loc": loc, "conf": conf, "mask": mask, "proto": proto, "segm": self.semantic_seg_conv(pyramid[0])}
        return loc, F.softmax(conf, dim=-1), mask, proto


# ------------------------------------------------------------------------------------------------------ helpers
def bias_class_logits(model: Yolact, classes: Iterable[int], logit: float = 10.0) -> None:
    """Add `logit` to the conf_layer bias of the given conf columns (1..num_classes-1; 0 is the background) for
    every anchor, in place. Used to make random-weight models give full sets of detections in parity tests."""
    num_classes = model.cfg.num_classes
    classes = [int(c) for c in classes]
    bad = [c for c in classes if not 1 <= c < num_classes]
    if bad:
        raise ValueError(
            f"bias_class_logits: class indices {bad} out of range; pass conf columns 1.."
            f"{num_classes - 1} (0 is the background)"
        )
    bias = model.prediction_layers[0].conf_layer.bias
    with torch.no_grad():
        for anchor in range(model.cfg.num_anchors):
            for c in classes:
                bias[anchor * num_classes + c] += logit


CLASS_DEPENDENT_PREFIXES = ("prediction_layers.0.conf_layer.", "semantic_seg_conv.")


def reset_class_layers(model: Yolact) -> list[str]:
    """Re-initialize the layers whose shape depends on num_classes (conf_layer, semantic_seg_conv): Xavier-uniform
    weights, zero biases. Returns their state_dict keys."""
    for layer in (model.prediction_layers[0].conf_layer, model.semantic_seg_conv):
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)
    return [key for key in model.state_dict() if key.startswith(CLASS_DEPENDENT_PREFIXES)]
