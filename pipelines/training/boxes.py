"""Box arithmetic and SSD prior matching in torch, for the YOLACT loss (facts: dbolya/yolact layers/box_utils.py).

Boxes are relative to the network input: point form ``(x1, y1, x2, y2)`` or center-size ``(cx, cy, w, h)``.
The numpy decode used at inference lives in ``pipelines.yolact_postprocess`` (VARIANCES are shared from there).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelines.yolact_postprocess import VARIANCES


def point_form(boxes: torch.Tensor) -> torch.Tensor:
    """[N, 4] (cx, cy, w, h) -> [N, 4] (x1, y1, x2, y2)."""
    return torch.cat((boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2), dim=1)


def center_size(boxes: torch.Tensor) -> torch.Tensor:
    """[N, 4] (x1, y1, x2, y2) -> [N, 4] (cx, cy, w, h)."""
    return torch.cat(((boxes[:, 2:] + boxes[:, :2]) / 2, boxes[:, 2:] - boxes[:, :2]), dim=1)


def jaccard(box_a: torch.Tensor, box_b: torch.Tensor) -> torch.Tensor:
    """IoU of point-form boxes: [A, 4] x [B, 4] -> [A, B] (no +1)."""
    max_xy = torch.min(box_a[:, None, 2:], box_b[None, :, 2:])
    min_xy = torch.max(box_a[:, None, :2], box_b[None, :, :2])
    inter = torch.clamp(max_xy - min_xy, min=0).prod(dim=2)
    area_a = ((box_a[:, 2] - box_a[:, 0]) * (box_a[:, 3] - box_a[:, 1]))[:, None]
    area_b = ((box_b[:, 2] - box_b[:, 0]) * (box_b[:, 3] - box_b[:, 1]))[None, :]
    return inter / (area_a + area_b - inter)


def encode(matched: torch.Tensor, priors: torch.Tensor) -> torch.Tensor:
    """Regression targets: matched [N, 4] point form, priors [N, 4] center-size -> [N, 4] offsets
    (dx, dy, dw, dh), the inverse of ``yolact_postprocess.decode_boxes``."""
    center = ((matched[:, :2] + matched[:, 2:]) / 2 - priors[:, :2]) / (VARIANCES[0] * priors[:, 2:])
    size = torch.log((matched[:, 2:] - matched[:, :2]) / priors[:, 2:]) / VARIANCES[1]
    return torch.cat([center, size], dim=1)


@dataclass
class Match:
    """Per-prior targets of one image (N priors).

    conf: [N] long, 0 background, -1 neutral (ignored), c + 1 for foreground class c;
    gt_index: [N] long, the ground-truth object each prior is matched to (meaningful where conf > 0);
    loc: [N, 4] encoded offsets to that object's box; gt_box: [N, 4] its point-form box.
    """

    conf: torch.Tensor
    gt_index: torch.Tensor
    loc: torch.Tensor
    gt_box: torch.Tensor

    @property
    def positive(self) -> torch.Tensor:
        return self.conf > 0


def match(truths: torch.Tensor, labels: torch.Tensor, priors: torch.Tensor, pos_thresh: float = 0.5,
          neg_thresh: float = 0.4) -> Match:
    """Match priors to ground truth (SSD rule, YOLACT thresholds).

    truths: [G, 4] point form; labels: [G] 0-based foreground classes; priors: [N, 4] center-size.
    Each prior takes its best-overlapping object: IoU >= pos_thresh -> positive, < neg_thresh -> background, in
    between -> neutral. Every object also claims its single best prior (forced positive), highest overlaps first,
    so no object goes untrained. G = 0 gives all background.
    """
    num_priors = priors.shape[0]
    if truths.shape[0] == 0:
        zeros = torch.zeros(num_priors, dtype=torch.long, device=priors.device)
        return Match(conf=zeros, gt_index=zeros.clone(), loc=priors.new_zeros(num_priors, 4),
                     gt_box=priors.new_zeros(num_priors, 4))
    overlaps = jaccard(truths, point_form(priors))          # [G, N]
    best_truth_overlap, best_truth_idx = overlaps.max(dim=0)
    for _ in range(truths.shape[0]):
        best_prior_overlap, best_prior_idx = overlaps.max(dim=1)
        j = int(best_prior_overlap.argmax())
        i = int(best_prior_idx[j])
        overlaps[:, i] = -1
        overlaps[j, :] = -1
        best_truth_overlap[i] = 2.0
        best_truth_idx[i] = j
    conf = labels[best_truth_idx].long() + 1
    conf[best_truth_overlap < pos_thresh] = -1
    conf[best_truth_overlap < neg_thresh] = 0
    matched = truths[best_truth_idx]
    return Match(conf=conf, gt_index=best_truth_idx, loc=encode(matched, priors), gt_box=matched)


def crop(masks: torch.Tensor, boxes: torch.Tensor, padding: int = 1) -> torch.Tensor:
    """Zero masks [h, w, n] outside their boxes [n, 4] (relative point form), each side padded by ``padding``
    proto pixels, float compare (as ``yolact_postprocess.crop_windows``)."""
    h, w, _ = masks.shape
    x1, x2 = _sanitize(boxes[:, 0], boxes[:, 2], w, padding)
    y1, y2 = _sanitize(boxes[:, 1], boxes[:, 3], h, padding)
    cols = torch.arange(w, dtype=x1.dtype, device=x1.device)[None, :, None]
    rows = torch.arange(h, dtype=y1.dtype, device=y1.device)[:, None, None]
    keep = (cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2)
    return masks * keep.to(masks.dtype)


def _sanitize(a: torch.Tensor, b: torch.Tensor, size: int, padding: int) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = a * size, b * size
    return torch.clamp(torch.min(a, b) - padding, min=0), torch.clamp(torch.max(a, b) + padding, max=size)
