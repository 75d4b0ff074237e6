"""YOLACT's Detect in numpy: priors, box decoding, and Detect's candidates and NMS (Fast, per-class, cross-class),
from one image's network outputs to its :class:`Detections` in descending score order.

Follows the reference (dbolya/yolact; docs/yolact.md, sections "Priors", "Box decoding" and "Fast NMS") and does its
math in float32 like the reference. The masks of the detections: pipelines.ops.yolact_postprocess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipelines.ops import compiled_loops

NMS_CHOICES = ("fast", "per_class", "cross_class")
VARIANCES = (0.1, 0.2)  # center, size


# ------------------------------------------------------------------------------------ priors (docs/yolact.md, "Priors")
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


# ---------------------------------------------------------------------------- decoding (docs/yolact.md, "Box decoding")
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


# ---------------------------------------------------------------------------------- Detect (docs/yolact.md, "Fast NMS")
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
    """Fast NMS per class (docs/yolact.md, "Fast NMS") over each class's top_k candidates (order [C, K] rows of loc
    and priors [n, 4], ranked [C, K] their scores, descending along each row: compiled_loops.class_top_k) -> (boxes
    [n, 4], class rows, candidate cols, scores) of the kept entries, class-major, as far as the max_num_detections
    best kept entries need: the decision of each class's entries scoring >= tau, tau lowered until at least
    max_num_detections of them are kept. Exact: an entry's decision depends only on the higher-scored entries of its
    class (all scoring >= tau too), and every entry left undecided scores below tau, so below every kept entry
    returned. Only the boxes of the entries decided are decoded (decode_boxes row by row gives the same values): a
    few hundred of R50's 19,248 priors, where an untrained model makes every prior a candidate; the other rows of
    `boxes` are NaN."""
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
    Compiled (compiled_loops.fast_nms_keep), each decision stopping at its first overlap, instead of numpy's whole
    [c, D, D] IoU blocks."""
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
    """Fast NMS over each candidate's best class (the reference's cc_fast_nms; docs/yolact.md, "Fast NMS")."""
    classes = scores.argmax(axis=0)
    best = scores[classes, np.arange(scores.shape[1])]
    order = np.argsort(-best, kind="stable")[:top_k]
    iou = np.triu(pairwise_iou(boxes[order], boxes[order]), k=1)
    kept = order[iou.max(axis=0) <= nms_thresh]
    return Detections(boxes=boxes[kept], coeffs=coeffs[kept], classes=classes[kept].astype(np.int64), scores=best[kept])
