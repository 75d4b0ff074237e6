"""YOLACT postprocess in numpy: priors, box decoding, Detect (Fast / per-class / cross-class NMS), mask assembly.

The one implementation used by the Spark executors (no torch there) and by the PyTorch eval path. It follows the
reference (dbolya/yolact, see /work/shared/yolact/SPEC.md sections 3, 5, 6, 7) and does its math in float32 like
the reference. Per image: ``detect(loc, conf, mask, priors)`` -> :class:`Detections`, then
``postprocess(det, proto, width, height)``, ``instance_masks(...)`` one mask at a time, or ``box_masks(...)``: each
mask only over its box's window; ``mask_blocks(...).encode`` gives every mask's RLE counts and paints the label map
in one compiled call (what the executors write, never building a full-size mask).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipelines.ops import compiled_loops
from pipelines.ops.image_ops import AxisTable, bilinear_axis

if TYPE_CHECKING:
    from pipelines.ops.mask_outputs import LabelMapBuilder

NMS_CHOICES = ("fast", "per_class", "cross_class")
VARIANCES = (0.1, 0.2)  # center, size
CROP_PADDING = 1  # proto pixels added on each side of the box before cropping the masks
MASK_THRESHOLD = 0.5  # a pixel is in the mask iff its probability is > this (strict)
_NO_LABEL_MAP = np.zeros((0, 0), np.uint8)  # compiled_loops.encode_masks' "no label map to paint"


# ----------------------------------------------------------------------------------------------------- priors (SPEC 3)
def make_priors(
    feature_sizes: Sequence[tuple[int, int]],
    pred_scales: Sequence[float],
    aspect_ratios: Sequence[float] = (1.0, 0.5, 2.0),
    max_size: int = 550,
    square_anchors: bool = True,
) -> np.ndarray:
    """Anchors for all levels: [N, 4] float32 (cx, cy, w, h) relative to the image, N = sum(h*w*len(ratios)).

    feature_sizes: (height, width) of each prediction level's conv output, P3 first; pred_scales: anchor size in
    pixels per level (divided by ``max_size``). Order per level: row, column, aspect ratio. With
    ``square_anchors`` (all released v1 configs) every anchor is square: h = w.
    """
    if len(feature_sizes) != len(pred_scales):
        raise ValueError(
            f"make_priors: got {len(feature_sizes)} feature_sizes but {len(pred_scales)} pred_scales; "
            "give one scale per level"
        )
    priors = []
    for (conv_h, conv_w), scale in zip(feature_sizes, pred_scales):
        for j in range(conv_h):
            y = (j + 0.5) / conv_h
            for i in range(conv_w):
                x = (i + 0.5) / conv_w
                for ar in aspect_ratios:
                    r = math.sqrt(ar)
                    w = scale * r / max_size
                    h = w if square_anchors else scale / r / max_size
                    priors.append((x, y, w, h))
    return np.asarray(priors, dtype=np.float64).reshape(-1, 4).astype(np.float32)


# ------------------------------------------------------------------------------------------------ decoding (SPEC 5)
def decode_boxes(loc: np.ndarray, priors: np.ndarray) -> np.ndarray:
    """loc: [N, 4] offsets (dx, dy, dw, dh); priors: [N, 4] (cx, cy, w, h) -> [N, 4] float32 relative x1y1x2y2
    (not clipped). x2 = x1 + w, as in the reference."""
    loc = np.asarray(loc, dtype=np.float32)
    priors = np.asarray(priors, dtype=np.float32)
    if loc.ndim != 2 or loc.shape[1] != 4 or priors.shape != loc.shape:
        raise ValueError(f"decode_boxes: loc and priors must both be [N, 4], got {loc.shape} and {priors.shape}")
    center = priors[:, :2] + loc[:, :2] * VARIANCES[0] * priors[:, 2:]
    size = priors[:, 2:] * np.exp(loc[:, 2:] * VARIANCES[1])
    top_left = center - size / 2
    return np.concatenate([top_left, top_left + size], axis=1)


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of x1y1x2y2 boxes, no +1: a [..., A, 4], b [..., B, 4] -> [..., A, B] float32 (0/0 gives NaN)."""
    a = a[..., :, None, :]
    b = b[..., None, :, :]
    inter_w = np.maximum(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0)
    inter_h = np.maximum(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0)
    inter = inter_w * inter_h
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (area_a + area_b - inter)


# -------------------------------------------------------------------------------------------------- Detect (SPEC 6)
@dataclass
class Detections:
    """Detections of one image, in descending score order."""

    boxes: np.ndarray  # [n, 4] float32, relative x1y1x2y2 (not clipped)
    coeffs: np.ndarray  # [n, mask_dim] float32 mask coefficients
    classes: np.ndarray  # [n] int64, 0-based foreground class index
    scores: np.ndarray  # [n] float32

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def take(self, index: np.ndarray) -> Detections:
        """The detections at ``index`` (int indices or a bool [n] mask), in that order."""
        return Detections(
            boxes=self.boxes[index], coeffs=self.coeffs[index], classes=self.classes[index], scores=self.scores[index]
        )

    @classmethod
    def empty(cls, mask_dim: int = 32) -> Detections:
        return cls(
            boxes=np.zeros((0, 4), np.float32),
            coeffs=np.zeros((0, mask_dim), np.float32),
            classes=np.zeros(0, np.int64),
            scores=np.zeros(0, np.float32),
        )


def detect(
    loc: np.ndarray,
    conf: np.ndarray,
    mask: np.ndarray,
    priors: np.ndarray,
    *,
    conf_thresh: float = 0.05,
    nms_thresh: float = 0.5,
    top_k: int = 200,
    max_num_detections: int = 100,
    nms: str = "fast",
) -> Detections:
    """Detect for one image (reference eval defaults).

    loc: [N, 4] offsets; conf: [N, C] softmaxed scores, column 0 = background; mask: [N, mask_dim] coefficients;
    priors: [N, 4] (cx, cy, w, h). Priors whose best foreground score is > conf_thresh are candidates (all their
    class scores are kept, also those <= conf_thresh). ``nms``:

    - ``"fast"`` (eval default): per class the top_k candidates by score, Fast NMS (a box is dropped when any
      higher-scored box of its class, kept or not, has IoU > nms_thresh with it); then the max_num_detections
      best over all classes.
    - ``"per_class"`` (traditional): per class the candidates with score > conf_thresh, greedy NMS (only kept
      boxes suppress, IoU > nms_thresh); then the max_num_detections best over all classes.
    - ``"cross_class"``: each candidate's best class only, top_k by score, Fast NMS across classes; no
      max_num_detections cap (as the reference).
    Returns ``Detections.empty(mask_dim)`` when no prior is a candidate.
    """
    if nms not in NMS_CHOICES:
        raise ValueError(f"detect: nms={nms!r} is not a known NMS; choose one of {', '.join(NMS_CHOICES)}")
    loc, conf, mask, priors = _check_detect_inputs(loc, conf, mask, priors)
    if top_k < 1 or max_num_detections < 1:
        raise ValueError(f"detect: top_k and max_num_detections must be >= 1, got {top_k}, {max_num_detections}")
    if nms == "fast":  # candidates and each class's top_k in one compiled pass over conf
        candidates, order, ranked = compiled_loops.class_top_k(
            np.ascontiguousarray(conf), np.float32(conf_thresh), int(top_k)
        )
    else:
        foreground = np.ascontiguousarray(conf[:, 1:].T)  # [C, N]: one transposing copy, rows reduced fast
        candidates = np.flatnonzero(foreground.max(axis=0) > conf_thresh)
    if candidates.size == 0:
        return Detections.empty(mask.shape[1])
    every = candidates.size == loc.shape[0]  # common for untrained or low-threshold models
    loc, priors = (loc, priors) if every else (loc[candidates], priors[candidates])  # [n, 4] each
    coeffs = mask if every else mask[candidates]  # [n, mask_dim]

    if nms == "fast":
        boxes, rows, cols, kept_scores = _fast_nms(loc, priors, order, ranked, nms_thresh, max_num_detections)
    else:
        boxes = decode_boxes(loc, priors)  # [n, 4]
        scores = foreground if every else np.take(foreground, candidates, axis=1)  # [C, n]
        if nms == "cross_class":
            return _cross_class_nms(boxes, coeffs, scores, nms_thresh, top_k)
        rows, cols = _per_class_nms(boxes, scores, nms_thresh, conf_thresh)
        kept_scores = scores[rows, cols]
    best = np.argsort(-kept_scores, kind="stable")[:max_num_detections]
    rows, cols = rows[best], cols[best]
    return Detections(boxes=boxes[cols], coeffs=coeffs[cols], classes=rows.astype(np.int64), scores=kept_scores[best])


def _check_detect_inputs(loc, conf, mask, priors):
    loc, conf, mask, priors = (np.asarray(a, dtype=np.float32) for a in (loc, conf, mask, priors))
    n = loc.shape[0] if loc.ndim == 2 else -1
    problems = []
    if loc.ndim != 2 or loc.shape[1] != 4:
        problems.append(f"loc must be [N, 4], got {loc.shape}")
    if conf.ndim != 2 or conf.shape[0] != n or conf.shape[1] < 2:
        problems.append(f"conf must be [N, C] with C >= 2 (column 0 = background), got {conf.shape}")
    if mask.ndim != 2 or mask.shape[0] != n:
        problems.append(f"mask must be [N, mask_dim], got {mask.shape}")
    if priors.shape != (n, 4):
        problems.append(f"priors must be [N, 4], got {priors.shape}")
    if problems:
        raise ValueError("detect: " + "; ".join(problems) + " (one image, no batch axis; N = number of priors)")
    return loc, conf, mask, priors


def _fast_nms(loc, priors, order, ranked, nms_thresh, max_num_detections):
    """Fast NMS per class (SPEC 6.2) over each class's top_k candidates (order [C, K] rows of loc and priors [n, 4],
    ranked [C, K] their scores, descending along each row: compiled_loops.class_top_k) -> (boxes [n, 4], class
    rows, candidate cols, scores) of the kept entries, class-major, as far as the max_num_detections best kept
    entries need: the decision of each class's entries scoring >= tau, tau lowered until at least
    max_num_detections of them are kept. Exact: an entry's decision depends only on the higher-scored entries of
    its class (all scoring >= tau too), and every entry left undecided scores below tau, so below every kept entry
    returned (R50 550, 80 classes x top_k 200: detect ~60 -> ~8 ms here). Only the boxes of the entries decided
    are decoded (decode_boxes row by row gives the same values): ~400 of R50's 19,248 priors, where an untrained
    model makes every prior a candidate; the other rows of `boxes` are NaN."""
    descending = np.sort(ranked, axis=None)[::-1]
    boxes = np.full(loc.shape, np.nan, dtype=np.float32)
    decoded = np.zeros(loc.shape[0], dtype=bool)
    budget = 4 * max_num_detections
    while True:
        tau = descending[budget - 1] if budget < descending.size else -np.inf
        depth = (ranked >= tau).sum(axis=1)
        needed = order[np.arange(order.shape[1]) < depth[:, None]]
        needed = np.unique(needed[~decoded[needed]])
        boxes[needed] = decode_boxes(loc[needed], priors[needed])
        decoded[needed] = True
        keep = _fast_nms_prefixes(boxes, order, depth, nms_thresh)
        if tau == -np.inf or np.count_nonzero(keep) >= max_num_detections:
            break
        budget *= 4
    rows = np.broadcast_to(np.arange(order.shape[0])[:, None], order.shape)
    return boxes, rows[keep], order[keep], ranked[keep]


def _fast_nms_prefixes(boxes, order, depth, nms_thresh) -> np.ndarray:
    """Fast NMS decisions of the first depth[c] entries of each class row of order [C, K] -> keep [C, K] bool
    (False beyond each class's depth): entry j is kept iff no higher-scored entry i < j of its class has
    IoU > nms_thresh with it (pairwise_iou's values; a NaN IoU drops it, as numpy's max over them would).
    Compiled (compiled_loops.fast_nms_keep), each decision stopping at its first overlap: the [c, D, D] IoU blocks
    in numpy took ~1 ms per R50 image."""
    keep = np.zeros(order.shape, dtype=bool)
    compiled_loops.fast_nms_keep(
        np.ascontiguousarray(boxes, dtype=np.float32),
        np.ascontiguousarray(order),
        depth.astype(np.int64),
        np.float32(nms_thresh),
        keep,
    )
    return keep


def _greedy_nms(boxes: np.ndarray, nms_thresh: float, block: int = 256) -> np.ndarray:
    """boxes [n, 4] in descending score order -> indices of the kept ones, ascending.

    Greedy: a box is kept unless a kept higher-scored box has IoU > nms_thresh with it. IoUs are computed a block
    of rows at a time (rows not yet suppressed, against the boxes from the block on), so memory is block * n.
    """
    n = len(boxes)
    suppressed = np.zeros(n, dtype=bool)
    for start in range(0, n, block):
        rows = start + np.flatnonzero(~suppressed[start : start + block])
        if rows.size == 0:
            continue
        overlaps = pairwise_iou(boxes[rows], boxes[start:]) > nms_thresh  # [rows, n - start]
        for row, row_overlaps in zip(rows.tolist(), overlaps):
            if not suppressed[row]:
                suppressed[row + 1 :] |= row_overlaps[row + 1 - start :]
    return np.flatnonzero(~suppressed)


def _per_class_nms(boxes, scores, nms_thresh, conf_thresh):
    """Traditional NMS per class -> (class rows, candidate cols) of the kept entries, class-major."""
    rows, cols = [], []
    for c, class_scores in enumerate(scores):
        above = np.flatnonzero(class_scores > conf_thresh)
        if above.size == 0:
            continue
        ranked = above[np.argsort(-class_scores[above], kind="stable")]
        kept = ranked[_greedy_nms(boxes[ranked], nms_thresh)]
        rows.append(np.full(kept.size, c, dtype=np.int64))
        cols.append(kept)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(rows), np.concatenate(cols)


def _cross_class_nms(boxes, coeffs, scores, nms_thresh, top_k) -> Detections:
    """Fast NMS over each candidate's best class (SPEC 6, cc_fast_nms)."""
    classes = scores.argmax(axis=0)
    best = scores[classes, np.arange(scores.shape[1])]
    order = np.argsort(-best, kind="stable")[:top_k]
    iou = np.triu(pairwise_iou(boxes[order], boxes[order]), k=1)
    kept = order[iou.max(axis=0) <= nms_thresh]
    return Detections(boxes=boxes[kept], coeffs=coeffs[kept], classes=classes[kept].astype(np.int64), scores=best[kept])


# ------------------------------------------------------------------------------------------- mask assembly (SPEC 7)
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
    """Yield one :class:`BoxMask` per detection, in score order (SPEC 7), computed box-locally (:func:`mask_blocks`,
    then :func:`_box_mask`)."""
    blocks = mask_blocks(det, proto, width, height, crop)
    return (blocks.box_mask(i) for i in range(len(blocks)))


def mask_blocks(det: Detections, proto: np.ndarray, width: int, height: int, crop: bool = True) -> MaskBlocks:
    """The probabilities each detection's mask is upsampled from (SPEC 7): sigmoid(proto @ coeffs), zeroed outside
    the box padded by 1 proto pixel (``crop``); each mask is then bilinear (align_corners=False) to (height, width),
    > 0.5, computed box-locally (:func:`_box_mask`: only over the output rows/cols whose bilinear sources include a
    proto pixel > 0.5, within the padded box; everywhere else the value is provably <= 0.5, so the full-size mask
    equals the full computation exactly). With ``crop`` the probabilities too are computed only inside each padded
    box (_cropped_blocks): the same values, so the same masks, at a cost that grows with the boxes' area (never
    more than over the whole proto: 2-core Xeon, 100 boxes covering the whole 64 x 64 or 138 x 138 proto, 2.5 and
    9.1 ms against 2.5 and 9.3; boxes of 5-50 % of the side, 1.3 and 3.8 against 2.3 and 8.6); without, each
    block is the whole proto. proto: [Ph, Pw, mask_dim] (NHWC without batch).
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
    """SPEC 7: (classes int64 [n], scores float32 [n], boxes int64 [n, 4] pixel x1y1x2y2, masks bool [n, H, W])."""
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
