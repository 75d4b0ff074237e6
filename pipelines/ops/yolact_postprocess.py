"""YOLACT postprocess in numpy: priors, box decoding, Detect (Fast / per-class / cross-class NMS), mask assembly.

The one implementation used by the Spark executors (no torch there) and by the PyTorch eval path. It follows the
reference (dbolya/yolact; docs/yolact.md, sections "Priors", "Box decoding", "Fast NMS", "Mask assembly" and
"Crop") and does its math in float32 like the reference. Per image: ``detect(loc, conf, mask, priors)`` ->
:class:`Detections`, then ``postprocess(det, proto, width, height)``, ``instance_masks(...)`` one mask at a time,
or ``box_masks(...)``: each mask only over its box's window; ``mask_blocks(...).encode`` gives every mask's RLE
counts and paints the label map in one compiled call (what the executors write, never building a full-size mask).

This module is the entry point: Detect and the box side (priors, decoding) live in pipelines.ops.yolact_detect and
are re-exported here; the mask assembly is this module's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipelines.ops import compiled_loops
from pipelines.ops.image_ops import AxisTable, bilinear_axis
from pipelines.ops.yolact_detect import NMS_CHOICES as NMS_CHOICES
from pipelines.ops.yolact_detect import VARIANCES as VARIANCES
from pipelines.ops.yolact_detect import Detections as Detections
from pipelines.ops.yolact_detect import decode_boxes as decode_boxes
from pipelines.ops.yolact_detect import detect as detect
from pipelines.ops.yolact_detect import make_priors as make_priors
from pipelines.ops.yolact_detect import pairwise_iou as pairwise_iou

if TYPE_CHECKING:
    from pipelines.ops.mask_outputs import LabelMapBuilder

CROP_PADDING = 1  # proto pixels added on each side of the box before cropping the masks
MASK_THRESHOLD = 0.5  # a pixel is in the mask iff its probability is > this (strict)
_NO_LABEL_MAP = np.zeros((0, 0), np.uint8)  # compiled_loops.encode_masks' "no label map to paint"


# ---------------------------------------------------------------------- mask assembly (docs/yolact.md, "Mask assembly")
def _sanitize(a: np.ndarray, b: np.ndarray, size: int, padding: int) -> tuple[np.ndarray, np.ndarray]:
    """Relative coordinates -> float32 pixels: sorted, x1 = max(x1 - padding, 0), x2 = min(x2 + padding, size)."""
    a = a * np.float32(size)
    b = b * np.float32(size)
    low = np.maximum(np.minimum(a, b) - np.float32(padding), np.float32(0))
    high = np.minimum(np.maximum(a, b) + np.float32(padding), np.float32(size))
    return low, high


def box_pixels(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """[n, 4] relative x1y1x2y2 -> int64 [n, 4] pixel x1y1x2y2.

    Per axis, as the reference: scaled by the image size in float32, sorted, x1 clamped below at 0 and x2 above at
    the size, then truncated toward zero. (A box lying wholly outside the image keeps x1 > width or x2 < 0.)
    """
    width, height = _check_image_size(width, height)
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    x1, x2 = _sanitize(boxes[:, 0], boxes[:, 2], width, 0)
    y1, y2 = _sanitize(boxes[:, 1], boxes[:, 3], height, 0)
    return np.stack([x1, y1, x2, y2], axis=1).astype(np.int64)


def mask_logits(coeffs: np.ndarray, proto: np.ndarray) -> np.ndarray:
    """coeffs: [n, mask_dim]; proto: [Ph, Pw, mask_dim] -> float32 [Ph, Pw, n] = proto @ coeffs (one matmul)."""
    proto = np.asarray(proto, dtype=np.float32)
    coeffs = np.asarray(coeffs, dtype=np.float32)
    if proto.ndim != 3 or coeffs.ndim != 2 or proto.shape[2] != coeffs.shape[1]:
        raise ValueError(
            f"proto must be [Ph, Pw, mask_dim] (NHWC without batch) matching coeffs [n, mask_dim]; "
            f"got proto {proto.shape} and coeffs {coeffs.shape}"
        )
    height, width, mask_dim = proto.shape
    return (proto.reshape(-1, mask_dim) @ coeffs.T).reshape(height, width, len(coeffs))


def sigmoid_inplace(x: np.ndarray) -> np.ndarray:
    """x (contiguous float32) -> 1 / (1 + exp(-x)), in place, op by op: the one order every mask uses (numpy's
    vectorized exp on contiguous memory gives each element the same value wherever it sits)."""
    np.negative(x, out=x)
    with np.errstate(over="ignore"):
        np.exp(x, out=x)
    x += np.float32(1)
    np.divide(np.float32(1), x, out=x)
    return x


def mask_probabilities(coeffs: np.ndarray, proto: np.ndarray) -> np.ndarray:
    """coeffs: [n, mask_dim]; proto: [Ph, Pw, mask_dim] -> float32 [n, Ph, Pw] = sigmoid(proto @ coeffs)."""
    logits = mask_logits(coeffs, proto)
    return sigmoid_inplace(np.ascontiguousarray(np.moveaxis(logits, 2, 0)))


def crop_windows(
    boxes: np.ndarray, proto_height: int, proto_width: int, padding: int = CROP_PADDING
) -> tuple[np.ndarray, np.ndarray]:
    """Which proto rows/cols each box keeps: pixel (r, c) is kept iff y1 <= r < y2 and x1 <= c < x2, with the
    box scaled to proto pixels, sorted and padded by ``padding`` (float compare, as the reference's crop).
    Returns keep_rows [n, Ph] bool, keep_cols [n, Pw] bool."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    x1, x2 = _sanitize(boxes[:, 0], boxes[:, 2], proto_width, padding)
    y1, y2 = _sanitize(boxes[:, 1], boxes[:, 3], proto_height, padding)
    cols = np.arange(proto_width, dtype=np.float32)
    rows = np.arange(proto_height, dtype=np.float32)
    keep_cols = (cols >= x1[:, None]) & (cols < x2[:, None])
    keep_rows = (rows >= y1[:, None]) & (rows < y2[:, None])
    return keep_rows, keep_cols


def crop_masks(probs: np.ndarray, boxes: np.ndarray, padding: int = CROP_PADDING) -> np.ndarray:
    """probs: [n, Ph, Pw]; boxes: [n, 4] relative x1y1x2y2 -> probs zeroed outside each (padded) box."""
    keep_rows, keep_cols = crop_windows(boxes, probs.shape[1], probs.shape[2], padding)
    return probs * (keep_rows[:, :, None] & keep_cols[:, None, :])


@dataclass
class BoxMask:
    """One detection's mask over its output window: ``mask[r, c]`` is image pixel (top + r, left + c); every pixel
    outside the window is False. mask: bool [h, w] with 0 <= top, top + h <= height (same for left/width)."""

    top: int
    left: int
    mask: np.ndarray

    def full(self, height: int, width: int) -> np.ndarray:
        """The image-size bool [height, width] mask."""
        out = np.zeros((height, width), dtype=bool)
        out[self.top : self.top + self.mask.shape[0], self.left : self.left + self.mask.shape[1]] = self.mask
        return out


@dataclass
class MaskBlocks:
    """An image's mask probabilities before upsampling, one block per detection in score order: block i is
    ``buffer[starts[i]:][:rows * cols]`` as [rows, cols] = shapes[i] ((0, 0): an empty mask), whose [0, 0] is proto
    pixel origins[i] (rows and cols may extend one pixel past the proto: zeros there, as the crop makes them);
    row_axis, col_axis: the proto -> image bilinear tables. Built by :func:`mask_blocks`."""

    buffer: np.ndarray  # float32 [total]
    starts: np.ndarray  # int64 [n]
    shapes: np.ndarray  # int64 [n, 2]
    origins: np.ndarray  # int64 [n, 2]
    row_axis: AxisTable
    col_axis: AxisTable

    def __len__(self) -> int:
        return len(self.starts)

    def box_mask(self, i: int) -> BoxMask:
        """Mask i over its window (_box_mask; an empty block gives an empty one, as in encode)."""
        rows, cols = (int(v) for v in self.shapes[i])
        block = self.buffer[self.starts[i] : self.starts[i] + rows * cols].reshape(rows, cols)
        return _box_mask(block, self.row_axis, self.col_axis, (int(self.origins[i, 0]), int(self.origins[i, 1])))

    def encode(self, labels: LabelMapBuilder | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every mask as box_mask(i) gives it, in one compiled call (compiled_loops.encode_masks): (the COCO counts
        uint32 of every mask in the image, one after another; ends int64 [n]: mask i's counts end there), for
        `mask_outputs.encode_rle_counts`. With ``labels``, the next len(self) labels are reserved and mask i is
        painted with the i-th of them where the map is still 0."""
        painted, first = labels.reserve(len(self)) if labels is not None else (_NO_LABEL_MAP, 1)
        height, width = len(self.row_axis[0]), len(self.col_axis[0])
        return compiled_loops.encode_masks(
            self.buffer,
            self.starts,
            self.shapes,
            self.origins,
            *self.row_axis,
            *self.col_axis,
            MASK_THRESHOLD,
            height,
            width,
            painted,
            first,
        )


def box_masks(det: Detections, proto: np.ndarray, width: int, height: int, crop: bool = True) -> Iterator[BoxMask]:
    """Yield one :class:`BoxMask` per detection, in score order (docs/yolact.md, "Mask assembly"), computed
    box-locally (:func:`mask_blocks`, then :func:`_box_mask`)."""
    blocks = mask_blocks(det, proto, width, height, crop)
    return (blocks.box_mask(i) for i in range(len(blocks)))


def mask_blocks(det: Detections, proto: np.ndarray, width: int, height: int, crop: bool = True) -> MaskBlocks:
    """The probabilities each detection's mask is upsampled from (docs/yolact.md, "Mask assembly" and "Crop"):
    sigmoid(proto @ coeffs), zeroed outside the box padded by 1 proto pixel (``crop``); each mask is then bilinear
    (align_corners=False) to (height, width), > 0.5, computed box-locally (:func:`_box_mask`: only over the output
    rows/cols whose bilinear sources include a proto pixel > 0.5, within the padded box; everywhere else the value
    is provably <= 0.5, so the full-size mask equals the full computation exactly). With ``crop`` the probabilities
    too are computed only inside each padded box (_cropped_blocks): the same values, so the same masks, at a cost
    that grows with the boxes' area (never more than over the whole proto); without, each block is the whole proto.
    proto: [Ph, Pw, mask_dim] (NHWC without batch).
    """
    width, height = _check_image_size(width, height)
    logits = mask_logits(det.coeffs, proto)  # [Ph, Pw, n]
    proto_height, proto_width, n = logits.shape
    row_axis = bilinear_axis(proto_height, height)
    col_axis = bilinear_axis(proto_width, width)
    if crop:
        keep_rows, keep_cols = crop_windows(det.boxes, proto_height, proto_width)
        return _cropped_blocks(logits, _spans(keep_rows), _spans(keep_cols), row_axis, col_axis)
    probs = sigmoid_inplace(np.ascontiguousarray(np.moveaxis(logits, 2, 0)))  # [n, Ph, Pw]
    size = proto_height * proto_width
    return MaskBlocks(
        probs.reshape(-1),
        np.arange(n, dtype=np.int64) * size,
        np.tile(np.array([[proto_height, proto_width]], np.int64), (n, 1)),
        np.zeros((n, 2), np.int64),
        row_axis,
        col_axis,
    )


def _cropped_blocks(
    logits: np.ndarray, row_spans: np.ndarray, col_spans: np.ndarray, row_axis: AxisTable, col_axis: AxisTable
) -> MaskBlocks:
    """mask_blocks with the crop, each mask's probabilities computed only inside its padded box (proto rows and
    cols [start, stop) of row_spans[i], col_spans[i]: int64 [n, 2]), in a block with a one-pixel margin of zeros for
    the bilinear sources just outside the box: zeros, as the crop makes them. The same values, windows and masks as
    over the whole proto. The blocks lie one after another in one buffer, margins -inf, filled in one compiled call
    (compiled_loops.fill_blocks), and one sigmoid covers them all (sigmoid(-inf) is 0 exactly; numpy's exp gives an
    element the same value wherever it sits): no Python per mask. logits: [Ph, Pw, n]."""
    start = np.stack([row_spans[:, 0], col_spans[:, 0]], 1)  # [n, 2]: (row, col)
    stop = np.stack([row_spans[:, 1], col_spans[:, 1]], 1)
    present = (stop > start).all(axis=1, keepdims=True)
    shapes = np.where(present, stop - start + 2, 0)  # proto rows start-1..stop, cols start-1..stop
    origins = np.where(present, start - 1, 0)
    sizes = shapes[:, 0] * shapes[:, 1]
    starts = np.cumsum(sizes) - sizes
    buffer = np.full(int(sizes.sum()), -np.inf, dtype=np.float32)
    compiled_loops.fill_blocks(buffer, starts, shapes, origins, np.ascontiguousarray(logits, dtype=np.float32))
    sigmoid_inplace(buffer)
    return MaskBlocks(buffer, starts, shapes, origins, row_axis, col_axis)


def _spans(keep: np.ndarray) -> np.ndarray:
    """keep [n, P] bool, each row one run of True (crop_windows) -> int64 [n, 2]: per row its [start, stop) ((0, 0)
    if none)."""
    if keep.shape[1] == 0:
        return np.zeros((keep.shape[0], 2), np.int64)
    start = keep.argmax(axis=1)
    stop = keep.shape[1] - keep[:, ::-1].argmax(axis=1)
    return np.where(keep.any(axis=1, keepdims=True), np.stack([start, stop], 1), 0).astype(np.int64)


def _box_mask(probs: np.ndarray, row_axis: AxisTable, col_axis: AxisTable, origin: tuple[int, int] = (0, 0)) -> BoxMask:
    """bilinear(probs) > 0.5 over the output window whose bilinear sources (i0 or i1) fall between the first and
    the last proto row (col) holding a pixel > 0.5, in one compiled call (compiled_loops.mask_window); an empty
    BoxMask where no pixel is > 0.5. probs: a mask's probabilities over the proto, or a block of them whose
    [0, 0] is proto pixel `origin` (the tables' source indices are the proto's).

    Exact: every output value is (a*wx0 + b*wx1)*wy0 + (c*wx0 + d*wx1)*wy1 in float32 with weights >= 0 and
    fl(1 - w) + w rounding to 1, so when its four sources are all <= 0.5 (zeros of the crop included) it is
    <= 0.5 (rounding is monotone, and x * 0.5 is exact): such pixels are False without being computed.
    """
    top, left, window = compiled_loops.mask_window(probs, origin[0], origin[1], *row_axis, *col_axis, MASK_THRESHOLD)
    return BoxMask(int(top), int(left), window)


def instance_masks(
    det: Detections, proto: np.ndarray, width: int, height: int, crop: bool = True
) -> Iterator[np.ndarray]:
    """Yield one bool [height, width] mask per detection, in score order: :func:`box_masks` placed in the image.
    Only one full-size mask exists at a time."""
    width, height = _check_image_size(width, height)
    boxes = box_masks(det, proto, width, height, crop)
    return (box.full(height, width) for box in boxes)


def assemble_masks(det: Detections, proto: np.ndarray, width: int, height: int, crop: bool = True) -> np.ndarray:
    """All masks at once: bool [n, height, width] (see :func:`box_masks`)."""
    width, height = _check_image_size(width, height)
    masks = np.zeros((len(det), height, width), dtype=bool)
    for i, box in enumerate(box_masks(det, proto, width, height, crop)):
        masks[i, box.top : box.top + box.mask.shape[0], box.left : box.left + box.mask.shape[1]] = box.mask
    return masks


def postprocess(
    det: Detections, proto: np.ndarray, width: int, height: int, crop: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mask assembly (docs/yolact.md): (classes int64 [n], scores float32 [n], boxes int64 [n, 4] pixel x1y1x2y2,
    masks bool [n, H, W])."""
    return (
        det.classes.copy(),
        det.scores.copy(),
        box_pixels(det.boxes, width, height),
        assemble_masks(det, proto, width, height, crop),
    )


def _check_image_size(width, height) -> tuple[int, int]:
    if int(width) != width or int(height) != height or int(width) < 1 or int(height) < 1:
        raise ValueError(f"image width and height must be positive integers (pixels), got {width!r}, {height!r}")
    return int(width), int(height)
