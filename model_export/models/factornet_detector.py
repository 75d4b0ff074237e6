"""The road-distress detector of the pothole paper: Faster R-CNN (torchvision's, with its region proposal network)
on a FactorNet backbone, trained on Pascal VOC annotated images. No pretrained weights; nothing is downloaded.

FactorNet: a 7x7 conv + 3x3 max-pool stem; a 1x1 and a 3x3 conv + max pool; then stages of FactorBlocks, each
four parallel sub-factors on the same input (3x3 max pool, 3x3, 5x5 and 7x7 convolutions) concatenated on
channels. Widths, depths and the input size come from a `DetectorConfig`; an FPN over the stages is optional.

    cfg = get_detector_config("factornet_small")
    model = FactorNetDetector(cfg).eval()
    [{"boxes", "scores", "labels"}] = model([rgb01])   # torchvision API: [3, h, w] RGB in 0-1, any size
    boxes, scores, labels = DetectorNetwork(model)(x)    # x: [B, 3, H, W] normalized, already resized (exported)

Preprocessing: torchvision's GeneralizedRCNNTransform is configured with `fixed_size` (a plain bilinear resize to
the config's input size, aspect ratio not kept) and ImageNet mean/std on 0-1 RGB. The exported graph
(`DetectorNetwork`) starts after it: resize and normalize are done by our preprocessing (`pipelines.ops.preprocess`,
from the manifest's input spec: mean/std times 255 on 0-255 RGB), and boxes come out in network-input pixels
(the caller scales them to the original image).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.image_list import ImageList
from torchvision.ops import FeaturePyramidNetwork, MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from pipelines.datasets.classes import ROAD_DISTRESS_CLASSES

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # RGB, on 0-1 pixels (torchvision's GeneralizedRCNNTransform)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DetectorConfig:
    """Everything that defines a FactorNet Faster R-CNN, its input and its postprocess defaults.

    class_names: foreground names; label 0 is the background, label i is class_names[i - 1].
    input_size: (height, width) of the network input in pixels, multiples of 32 (no padding in the graph).
    stage_blocks / stage_widths: FactorBlocks per stage and each sub-factor's width (a block outputs 4 * width
    channels); stage i runs at stride 8 * 2**i. Without FPN the last stage feeds the RPN and RoI heads and
    anchor_sizes all sit on it; with FPN every stage plus a max-pooled level gets one anchor size each.
    """

    name: str
    class_names: tuple[str, ...] = ROAD_DISTRESS_CLASSES
    input_size: tuple[int, int] = (608, 608)
    stem_channels: int = 64  # 7x7 stem conv, and the 1x1 conv after it
    conv_channels: int = 192  # the 3x3 conv before the stages
    stage_blocks: tuple[int, ...] = (2, 4)
    stage_widths: tuple[int, ...] = (64, 128)
    fpn: bool = False
    fpn_channels: int = 256
    anchor_sizes: tuple[int, ...] = (32, 64, 128, 256)  # pixels, on the network input
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    rpn_pre_nms_top_n: int = 1000  # inference; per feature level
    rpn_post_nms_top_n: int = 300  # inference
    rpn_nms_thresh: float = 0.7
    roi_output_size: int = 7
    representation_size: int = 1024  # TwoMLPHead width
    box_score_thresh: float = 0.05
    box_nms_thresh: float = 0.5
    box_detections_per_img: int = 100  # also the exported graph's fixed number of output rows
    image_mean: tuple[float, float, float] = IMAGENET_MEAN
    image_std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        def fail(message: str):
            raise ValueError(f"DetectorConfig {self.name!r}: {message}")

        if not self.class_names or len(set(self.class_names)) != len(self.class_names):
            fail(f"class_names {list(self.class_names)} must be distinct and non-empty (foreground only)")
        height, width = self.input_size
        if height <= 0 or width <= 0 or height % 32 or width % 32:
            fail(f"input_size {self.input_size} must be (height, width), positive multiples of 32 pixels")
        if not self.stage_blocks or len(self.stage_blocks) != len(self.stage_widths) or min(self.stage_blocks) < 1:
            fail(f"stage_blocks {self.stage_blocks} and stage_widths {self.stage_widths} need one entry >= 1 per stage")
        if min(self.stage_widths) < 1 or self.stem_channels < 1 or self.conv_channels < 1:
            fail("widths must be positive channel counts")
        if self.fpn and len(self.anchor_sizes) != self.num_feature_levels:
            fail(
                f"with fpn, give one anchor size per level ({self.num_feature_levels}: {len(self.stage_blocks)} "
                f"stages + a pooled level), got {self.anchor_sizes}"
            )
        if not 0 <= self.box_score_thresh < 1 or not 0 < self.box_nms_thresh <= 1 or not 0 < self.rpn_nms_thresh <= 1:
            fail("thresholds must be in [0, 1)")
        if self.box_detections_per_img < 1 or self.rpn_pre_nms_top_n < 1 or self.rpn_post_nms_top_n < 1:
            fail("box_detections_per_img, rpn_pre_nms_top_n and rpn_post_nms_top_n must be >= 1")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            fail(f"image_mean {self.image_mean} / image_std {self.image_std} need 3 values each, std > 0")

    @property
    def num_classes(self) -> int:
        """Classes of the box predictor, background included."""
        return len(self.class_names) + 1

    @property
    def num_feature_levels(self) -> int:
        return len(self.stage_blocks) + 1 if self.fpn else 1

    @property
    def mean_255(self) -> tuple[float, float, float]:
        """The mean on 0-255 RGB (our preprocessing: x = (rgb - mean_255) / std_255, same as torchvision's)."""
        return tuple(float(m) * 255.0 for m in self.image_mean)

    @property
    def std_255(self) -> tuple[float, float, float]:
        return tuple(float(s) * 255.0 for s in self.image_std)


DETECTOR_CONFIGS = MappingProxyType(
    {
        cfg.name: cfg
        for cfg in (
            # The paper's shape: one stride-16 map (no FPN), 4 anchor sizes x 3 ratios, VOC-sized input.
            DetectorConfig(name="factornet"),
            DetectorConfig(
                name="factornet_fpn",
                stage_blocks=(2, 4, 2),
                stage_widths=(64, 128, 160),
                fpn=True,
                anchor_sizes=(32, 64, 128, 256),
            ),
            # Tests and smoke training: a few hundred thousand parameters, 320x320.
            DetectorConfig(
                name="factornet_small",
                input_size=(320, 320),
                stem_channels=16,
                conv_channels=32,
                stage_blocks=(1, 1),
                stage_widths=(8, 16),
                anchor_sizes=(32, 64, 128),
                rpn_pre_nms_top_n=300,
                rpn_post_nms_top_n=100,
                representation_size=128,
                box_detections_per_img=50,
            ),
            DetectorConfig(
                name="factornet_small_fpn",
                input_size=(320, 320),
                stem_channels=16,
                conv_channels=32,
                stage_blocks=(1, 1),
                stage_widths=(8, 16),
                fpn=True,
                fpn_channels=32,
                anchor_sizes=(32, 64, 128),
                rpn_pre_nms_top_n=300,
                rpn_post_nms_top_n=100,
                representation_size=128,
                box_detections_per_img=50,
            ),
        )
    }
)


def get_detector_config(name: str, **overrides) -> DetectorConfig:
    """The registered config `name`, with fields replaced by `overrides` (e.g. class_names=("pothole",),
    input_size=(480, 640))."""
    if name not in DETECTOR_CONFIGS:
        raise KeyError(f"unknown detector config {name!r}; valid names: {', '.join(sorted(DETECTOR_CONFIGS))}")
    fields = {f.name for f in dataclasses.fields(DetectorConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"get_detector_config({name!r}): unknown override(s) {unknown}; valid fields: {sorted(fields)}")
    for key, value in overrides.items():
        if isinstance(value, list):
            overrides[key] = tuple(value)
    return dataclasses.replace(DETECTOR_CONFIGS[name], **overrides)


# ------------------------------------------------------------------------------------------------ backbone
def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    """k x k conv ("same" padding) + BatchNorm + ReLU; keys `0.weight`, `1.weight/bias/running_*`."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def max_pool(stride: int) -> nn.MaxPool2d:
    """3x3 max pool, padding 1: stride 1 keeps the size, stride 2 halves it (rounding up)."""
    return nn.MaxPool2d(kernel_size=3, stride=stride, padding=1)


class FactorBlock(nn.Module):
    """Four parallel sub-factors concatenated on channels: x [B, C, H, W] -> [B, 4 * width, H, W].

    pool: 3x3 max pool (stride 1) then 1x1 conv; conv3/conv5/conv7: 1x1 reduction to `width` then the k x k conv.
    """

    def __init__(self, in_channels: int, width: int):
        super().__init__()
        self.pool = nn.Sequential(max_pool(1), conv_bn_relu(in_channels, width, 1))
        self.conv3 = nn.Sequential(conv_bn_relu(in_channels, width, 1), conv_bn_relu(width, width, 3))
        self.conv5 = nn.Sequential(conv_bn_relu(in_channels, width, 1), conv_bn_relu(width, width, 5))
        self.conv7 = nn.Sequential(conv_bn_relu(in_channels, width, 1), conv_bn_relu(width, width, 7))
        self.out_channels = 4 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.pool(x), self.conv3(x), self.conv5(x), self.conv7(x)], dim=1)


class FactorNet(nn.Module):
    """x [B, 3, H, W] -> OrderedDict {"0": stage 0 at stride 8, "1": stage 1 at stride 16, ...}."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.stem = nn.Sequential(conv_bn_relu(3, cfg.stem_channels, 7, stride=2), max_pool(2))
        self.reduce = nn.Sequential(
            conv_bn_relu(cfg.stem_channels, cfg.stem_channels, 1),
            conv_bn_relu(cfg.stem_channels, cfg.conv_channels, 3),
            max_pool(2),
        )
        stages, channels = [], cfg.conv_channels
        for index, (blocks, width) in enumerate(zip(cfg.stage_blocks, cfg.stage_widths)):
            layers: list[nn.Module] = [max_pool(2)] if index else []
            for _ in range(blocks):
                layers.append(FactorBlock(channels, width))
                channels = 4 * width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.ModuleList(stages)
        self.stage_channels = [4 * w for w in cfg.stage_widths]

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        x = self.reduce(self.stem(x))
        features = OrderedDict()
        for index, stage in enumerate(self.stages):
            x = stage(x)
            features[str(index)] = x
        return features


class FactorNetBackbone(nn.Module):
    """What Faster R-CNN calls the backbone: FactorNet (`body`) and optionally an FPN (`fpn`) over its stages.

    x [B, 3, H, W] -> OrderedDict of feature maps with `out_channels` channels each: {"0": last stage} without FPN;
    {"0", "1", ..., "pool"} with FPN (strides 8, 16, ..., and a max-pooled coarsest level).
    """

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.body = FactorNet(cfg)
        if cfg.fpn:
            self.fpn = FeaturePyramidNetwork(
                self.body.stage_channels, cfg.fpn_channels, extra_blocks=LastLevelMaxPool()
            )
            self.out_channels = cfg.fpn_channels
        else:
            self.fpn = None
            self.out_channels = self.body.stage_channels[-1]

    @property
    def feature_names(self) -> list[str]:
        """Names of the maps the RoI pooling reads (all but the pooled FPN level)."""
        return [str(i) for i in range(len(self.body.stages))] if self.fpn is not None else ["0"]

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        features = self.body(x)
        if self.fpn is not None:
            return self.fpn(features)
        return OrderedDict([("0", list(features.values())[-1])])


# ------------------------------------------------------------------------------------------------ detector
class FactorNetDetector(FasterRCNN):
    """torchvision's FasterRCNN on a FactorNetBackbone, configured by `cfg` (its train/eval API unchanged)."""

    def __init__(self, cfg: DetectorConfig):
        backbone = FactorNetBackbone(cfg)
        if cfg.fpn:
            sizes = tuple((s,) for s in cfg.anchor_sizes)
        else:
            sizes = (tuple(cfg.anchor_sizes),)
        anchors = AnchorGenerator(sizes=sizes, aspect_ratios=(tuple(cfg.aspect_ratios),) * len(sizes))
        roi_pool = MultiScaleRoIAlign(
            featmap_names=backbone.feature_names, output_size=cfg.roi_output_size, sampling_ratio=2
        )
        box_head = TwoMLPHead(backbone.out_channels * cfg.roi_output_size**2, cfg.representation_size)
        height, width = cfg.input_size
        super().__init__(
            backbone,
            min_size=min(height, width),
            max_size=max(height, width),
            image_mean=list(cfg.image_mean),
            image_std=list(cfg.image_std),
            fixed_size=(width, height),
            rpn_anchor_generator=anchors,
            rpn_pre_nms_top_n_test=cfg.rpn_pre_nms_top_n,
            rpn_post_nms_top_n_test=cfg.rpn_post_nms_top_n,
            rpn_nms_thresh=cfg.rpn_nms_thresh,
            box_roi_pool=roi_pool,
            box_head=box_head,
            box_predictor=FastRCNNPredictor(cfg.representation_size, cfg.num_classes),
            box_score_thresh=cfg.box_score_thresh,
            box_nms_thresh=cfg.box_nms_thresh,
            box_detections_per_img=cfg.box_detections_per_img,
        )
        self.cfg = cfg


class DetectorNetwork(nn.Module):
    """The exported graph: a normalized, resized batch -> fixed-size detections in network-input pixels.

    x: [B, 3, H, W] float32, (rgb - mean_255) / std_255 at the config's input size.
    Returns boxes [B, D, 4] float32 x1y1x2y2, scores [B, D] float32 and labels [B, D] int64 (0 = background),
    D = box_detections_per_img, in descending score order; rows past the image's detections are zeros.
    """

    def __init__(self, detector: FactorNetDetector):
        super().__init__()
        self.detector = detector
        self.rows = int(detector.cfg.box_detections_per_img)

    def _pad(self, value: torch.Tensor, row_shape: tuple[int, ...]) -> torch.Tensor:
        """[n, *row_shape] with n <= D -> [D, *row_shape]: zeros appended, cut to D rows, reshaped to constants so
        that the exported graph's outputs have static shapes."""
        filler = torch.zeros((self.rows,) + row_shape, dtype=value.dtype)
        return torch.cat([value, filler])[: self.rows].reshape((self.rows,) + row_shape)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        height, width = self.detector.cfg.input_size
        images = ImageList(x, [(height, width)] * x.shape[0])
        features = self.detector.backbone(x)
        proposals, _ = self.detector.rpn(images, features)
        detections, _ = self.detector.roi_heads(features, proposals, images.image_sizes)
        shapes = {"boxes": (4,), "scores": (), "labels": ()}
        return tuple(torch.stack([self._pad(d[key], row) for d in detections]) for key, row in shapes.items())


def bias_box_predictor(
    model: FactorNetDetector,
    classes: Iterable[int],
    calibration: torch.Tensor,
    logit: float = 3.0,
    spread: float = 2.0,
    objectness_spread: float = 3.0,
) -> None:
    """Make random weights detect something, with well separated scores (tests, benchmarks, parity checks).

    Random init gives near-constant class scores and near-zero, near-tied RPN objectness: ties that make any
    comparison between runtimes fragile. On `calibration` ([B, 3, H, W] normalized input, e.g. a synthetic road
    image) this sets the RPN objectness and the class-score layers to random directions scaled so that their
    logits have a standard deviation of `objectness_spread` and `spread` over the anchors / proposals, and adds
    `logit` to the listed labels' class scores (1..num_classes-1), so that those labels are detected.
    """
    labels = list(classes)
    for label in labels:
        if not 1 <= label < model.cfg.num_classes:
            raise ValueError(f"label {label} out of range 1..{model.cfg.num_classes - 1}")
    network = DetectorNetwork(model).eval()
    _calibrate_linear(network, model.rpn.head.conv, model.rpn.head.cls_logits, calibration, objectness_spread)
    _calibrate_linear(network, model.roi_heads.box_head, model.roi_heads.box_predictor.cls_score, calibration, spread)
    with torch.no_grad():
        for label in labels:
            model.roi_heads.box_predictor.cls_score.bias[label] += logit


def _calibrate_linear(
    network: nn.Module,
    source: nn.Module,
    layer: nn.Module,
    calibration: torch.Tensor,
    spread: float,
    components: int = 8,
) -> None:
    """Set `layer` (a Linear, or a 1x1 Conv2d) to random directions over the features `source` outputs on the
    calibration input, scaled and shifted so that each output has mean 0 and standard deviation `spread`.

    The directions lie in the span of the features' top principal components (where they vary most between
    anchors / proposals): a random direction would mostly read the features' common offset, and scaling its small
    variation up to `spread` would amplify rounding (FP16 weights, another runtime) just as much.
    """
    seen: list[torch.Tensor] = []

    def keep(_module, _inputs, output):
        seen.append(
            output.detach().movedim(1, -1).reshape(-1, output.shape[1]) if output.dim() == 4 else output.detach()
        )

    handle = source.register_forward_hook(keep)
    try:
        with torch.no_grad():
            network(calibration)
    finally:
        handle.remove()
    features = torch.cat(seen).double()  # [N, C]
    with torch.no_grad():
        centered = features - features.mean(dim=0)
        _, _, basis = torch.linalg.svd(centered, full_matrices=False)  # rows: principal directions
        basis = basis[:components]
        direction = torch.randn(layer.weight.shape[0], basis.shape[0], dtype=torch.float64) @ basis
        projected = features @ direction.T  # [N, outputs]
        scale = spread / projected.std(dim=0).clamp_min(1e-12)
        layer.weight.copy_((direction * scale[:, None]).reshape(layer.weight.shape).float())
        layer.bias.copy_((-projected.mean(dim=0) * scale).float())
