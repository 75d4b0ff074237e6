"""Box arithmetic and SSD prior matching in torch, for the YOLACT loss (facts: dbolya/yolact layers/box_utils.py).

Boxes are relative to the network input: point form ``(x1, y1, x2, y2)`` or center-size ``(cx, cy, w, h)``.
The numpy decode used at inference lives in ``pipelines.ops.yolact_postprocess`` (VARIANCES are shared from there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelines.ops.yolact_postprocess import VARIANCES
from pipelines.training.fused import FusedOnCuda


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


def match(
    truths: torch.Tensor, labels: torch.Tensor, priors: torch.Tensor, pos_thresh: float = 0.5, neg_thresh: float = 0.4
) -> Match:
    """Match priors to ground truth (SSD rule, YOLACT thresholds).

    truths: [G, 4] point form; labels: [G] 0-based foreground classes; priors: [N, 4] center-size.
    Each prior takes its best-overlapping object: IoU >= pos_thresh -> positive, < neg_thresh -> background, in
    between -> neutral. Every object also claims its single best prior (forced positive), highest overlaps first,
    so no object goes untrained. G = 0 gives all background.
    """
    num_priors = priors.shape[0]
    if truths.shape[0] == 0:
        zeros = torch.zeros(num_priors, dtype=torch.long, device=priors.device)
        return Match(
            conf=zeros,
            gt_index=zeros.clone(),
            loc=priors.new_zeros(num_priors, 4),
            gt_box=priors.new_zeros(num_priors, 4),
        )
    overlaps = jaccard(truths, point_form(priors))  # [G, N]
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


# ------------------------------------------------------------------------------------------- batched (training)
@dataclass
class MaskSlots:
    """Where the kept positives (at most masks_to_train per image) go in the mask term's [B, count] slots:
    image_idx, prior_idx, slot_idx [P] (P kept positives in the batch), count (the most any image keeps), scale [B]
    (positives / kept of each image); everything the host needs is counted once, when they are made."""

    image_idx: torch.Tensor
    prior_idx: torch.Tensor
    slot_idx: torch.Tensor
    count: int
    scale: torch.Tensor
    limit: int  # the masks_to_train it was drawn for
    positives: int  # every positive of the batch, kept or not (read with the draw's counts)


@dataclass
class BatchMatch:
    """Per-prior targets of a batch of B images (N priors), on the priors' device: conf [B, N] long (0 background,
    -1 neutral, c + 1 class c), gt_index [B, N] long (the object of image b a prior is matched to), loc [B, N, 4]
    encoded offsets, gt_box [B, N, 4] point form; zeros where an image has no object."""

    conf: torch.Tensor
    gt_index: torch.Tensor
    loc: torch.Tensor
    gt_box: torch.Tensor
    slots: MaskSlots | None = None  # set by YolactLoss.match
    counts: list[int] | None = None  # positives of each image, as the host read them with the matching

    @property
    def positive(self) -> torch.Tensor:
        return self.conf > 0

    def __len__(self) -> int:
        return int(self.conf.shape[0])

    def __getitem__(self, i: int) -> Match:
        return Match(self.conf[i], self.gt_index[i], self.loc[i], self.gt_box[i])


def jaccard_batch(box_a: torch.Tensor, box_b: torch.Tensor) -> torch.Tensor:
    """IoU of point-form boxes: [B, A, 4] x [N, 4] -> [B, A, N]."""
    max_xy = torch.min(box_a[:, :, None, 2:], box_b[None, None, :, 2:])
    min_xy = torch.max(box_a[:, :, None, :2], box_b[None, None, :, :2])
    inter = torch.clamp(max_xy - min_xy, min=0).prod(dim=3)
    area_a = ((box_a[..., 2] - box_a[..., 0]) * (box_a[..., 3] - box_a[..., 1]))[:, :, None]
    area_b = ((box_b[:, 2] - box_b[:, 0]) * (box_b[:, 3] - box_b[:, 1]))[None, None, :]
    return inter / (area_a + area_b - inter)


def match_batch(
    truths: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    priors: torch.Tensor,
    pos_thresh: float = 0.5,
    neg_thresh: float = 0.4,
) -> BatchMatch:
    """``match`` for a padded batch, on the data's device: truths [B, G, 4] point form, labels [B, G], valid
    [B, G] bool (real objects first, padding after), priors [N, 4] center-size. Same result as ``match`` per
    image. The forced best-prior rule: when the objects' best priors are distinct (the usual case) each object
    simply takes its own (what the greedy rule gives then); otherwise the greedy rule runs batched over images
    (one iteration per object slot, no host round trip inside). The host reads the device once (on a GPU a wait
    for the stream): whether the greedy rule is needed, with the positives each image would then have (``counts``).
    """
    batch, slots = labels.shape
    num_priors = priors.shape[0]
    if slots == 0:
        zeros = torch.zeros(batch, num_priors, dtype=torch.long, device=priors.device)
        return BatchMatch(
            zeros,
            zeros.clone(),
            priors.new_zeros(batch, num_priors, 4),
            priors.new_zeros(batch, num_priors, 4),
            counts=[0] * batch,
        )
    overlaps, best_truth_overlap, best_truth_idx, claimed, repeated = best_overlaps(truths, valid, priors)
    objects = torch.arange(slots, device=labels.device).expand(batch, slots)
    *targets, read = match_targets(
        truths,
        labels,
        valid,
        priors,
        best_truth_overlap,
        best_truth_idx,
        claimed,
        objects,
        repeated,
        pos_thresh,
        neg_thresh,
    )
    read = read.tolist()  # the one read on the host: [repeated, positives of each image]
    if read[0]:  # two objects of an image want the same best prior (rare): the greedy rule's targets
        objects, claimed = _greedy_forced(overlaps, valid)
        *targets, read = match_targets(
            truths,
            labels,
            valid,
            priors,
            best_truth_overlap,
            best_truth_idx,
            claimed,
            objects,
            torch.zeros_like(repeated),
            pos_thresh,
            neg_thresh,
        )
        read = read.tolist()
    return BatchMatch(*targets, counts=read[1:])


def _best_overlaps(truths: torch.Tensor, valid: torch.Tensor, priors: torch.Tensor):
    """match_batch's first part: overlaps [B, G, N] (padding rows -1), each prior's best object (overlap and index
    [B, N]), each object's best prior [B, G] (padding: distinct dummy priors N + slot) and whether an image has two
    objects with the same best prior ([] bool)."""
    batch, slots = valid.shape
    num_priors = priors.shape[0]
    overlaps = jaccard_batch(truths, point_form(priors)).masked_fill(~valid[:, :, None], -1.0)  # [B, G, N]
    best_truth_overlap, best_truth_idx = overlaps.max(dim=1)  # [B, N]
    best_prior_idx = overlaps.max(dim=2)[1]  # [B, G]
    slot_ids = torch.arange(slots, device=valid.device).expand(batch, slots)
    claimed = torch.where(valid, best_prior_idx, num_priors + slot_ids)
    ordered = claimed.sort(dim=1)[0]
    return overlaps, best_truth_overlap, best_truth_idx, claimed, (ordered[:, 1:] == ordered[:, :-1]).any()


def _match_targets(
    truths: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    priors: torch.Tensor,
    best_truth_overlap: torch.Tensor,
    best_truth_idx: torch.Tensor,
    claimed: torch.Tensor,
    objects: torch.Tensor,
    repeated: torch.Tensor,
    pos_thresh: float,
    neg_thresh: float,
):
    """match_batch's second part: the forced matches (object [B, G] claims prior [B, G]) written over each prior's
    best object, then the per-prior targets (conf, gt_index, loc, gt_box) and what the host reads of them in one
    copy: [1 + B] int64, repeated (the first part's [] bool) then the positives of each image."""
    batch, slots = labels.shape
    num_priors = priors.shape[0]
    # scatter into N + G columns: padding slots land past the priors and are cut off
    overlap_ext = torch.cat([best_truth_overlap, best_truth_overlap.new_zeros(batch, slots)], dim=1)
    idx_ext = torch.cat([best_truth_idx, best_truth_idx.new_zeros(batch, slots)], dim=1)
    overlap_ext.scatter_(1, claimed, 2.0)
    idx_ext.scatter_(1, claimed, objects)
    best_truth_overlap, best_truth_idx = overlap_ext[:, :num_priors], idx_ext[:, :num_priors]
    conf = labels.gather(1, best_truth_idx).long() + 1
    conf = torch.where(best_truth_overlap < pos_thresh, -1, conf)
    conf = torch.where(best_truth_overlap < neg_thresh, 0, conf)
    matched = truths.gather(1, best_truth_idx[:, :, None].expand(batch, num_priors, 4))  # [B, N, 4]
    has_objects = valid.any(dim=1)[:, None]
    conf = torch.where(has_objects, conf, 0)
    loc = encode(matched.reshape(-1, 4), priors.repeat(batch, 1)).reshape(batch, num_priors, 4)
    loc = torch.where(has_objects[:, :, None], loc, 0.0)
    matched = torch.where(has_objects[:, :, None], matched, 0.0)
    read = torch.cat([repeated.reshape(1).long(), (conf > 0).sum(dim=1)])
    return conf, torch.where(has_objects, best_truth_idx, 0), loc, matched, read


# on a GPU each part is one compiled graph (eager: ~25 and ~30 small kernels that the host launches one by one)
best_overlaps = FusedOnCuda(_best_overlaps)
match_targets = FusedOnCuda(_match_targets)


def _greedy_forced(overlaps: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's greedy forced matching, batched: overlaps [B, G, N] (padding rows -1) -> (object [B, G],
    prior [B, G]) claimed at iteration t; iterations past an image's object count claim dummy column N + t."""
    batch, slots, num_priors = overlaps.shape
    overlaps = overlaps.clone()
    counts = valid.sum(dim=1)
    rows = torch.arange(batch, device=overlaps.device)
    objects, priors_taken = [], []
    for t in range(slots):
        best_prior_overlap, best_prior_idx = overlaps.max(dim=2)  # [B, G]
        j = best_prior_overlap.argmax(dim=1)  # [B]
        i = best_prior_idx[rows, j]  # [B]
        active = counts > t
        overlaps[rows, :, i] = torch.where(active[:, None], -1.0, overlaps[rows, :, i])
        overlaps[rows, j, :] = torch.where(active[:, None], -1.0, overlaps[rows, j, :])
        objects.append(torch.where(active, j, 0))
        priors_taken.append(torch.where(active, i, num_priors + t))
    return torch.stack(objects, dim=1), torch.stack(priors_taken, dim=1)


def crop_batch(masks: torch.Tensor, boxes: torch.Tensor, padding: int = 1) -> torch.Tensor:
    """``crop`` for a batch: masks [B, h, w, K], boxes [B, K, 4] relative point form."""
    _, h, w, _ = masks.shape
    x1, x2 = _sanitize(boxes[..., 0], boxes[..., 2], w, padding)  # [B, K]
    y1, y2 = _sanitize(boxes[..., 1], boxes[..., 3], h, padding)
    cols = torch.arange(w, dtype=x1.dtype, device=x1.device)[None, None, :, None]
    rows = torch.arange(h, dtype=y1.dtype, device=y1.device)[None, :, None, None]
    keep = (
        (cols >= x1[:, None, None])
        & (cols < x2[:, None, None])
        & (rows >= y1[:, None, None])
        & (rows < y2[:, None, None])
    )
    return masks * keep.to(masks.dtype)
