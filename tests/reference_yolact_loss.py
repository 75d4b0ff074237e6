"""The YOLACT loss as it was before it was vectorized (pipelines/training/yolact_loss.py and the matching of
pipelines/training/boxes.py at commit 03496ed, one Python loop per image and per object), kept verbatim as the
reference tests/test_training_loss_vectorized.py compares the batched loss with. Not used by the library."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipelines.ops.yolact_postprocess import VARIANCES


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


LOSS_KEYS = ("box", "conf", "mask", "semantic")


@dataclass(frozen=True)
class LossConfig:
    pos_iou: float = 0.5
    neg_iou: float = 0.4
    negpos_ratio: int = 3
    bbox_alpha: float = 1.5
    conf_alpha: float = 1.0
    mask_alpha: float = 6.125
    semantic_alpha: float = 1.0
    masks_to_train: int = 100


@dataclass
class Targets:
    """Ground truth of one augmented image: boxes [G, 4] relative point form, labels [G] 0-based foreground
    classes, masks [G, S, S] float32 in [0, 1] at the network input size; seed drives masks_to_train sampling."""

    boxes: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor
    seed: int = 0


@dataclass(frozen=True)
class Normalizer:
    """What the sums of a whole global batch are divided by: positives (box, conf, mask) and images (semantic)."""

    num_positives: int
    num_images: int

    def apply(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        positives = float(max(self.num_positives, 1))
        images = float(max(self.num_images, 1))
        return {k: v / (images if k == "semantic" else positives) for k, v in sums.items()}


class YolactLoss:
    """loss = YolactLoss(cfg, priors); matches = loss.match(targets); sums = loss.sums(outputs, targets, matches);
    terms = Normalizer(num_positives(matches), len(targets)).apply(sums)."""

    def __init__(self, cfg: LossConfig, priors: torch.Tensor):
        self.cfg = cfg
        self.priors = priors  # [N, 4] center-size

    def match(self, targets: list[Targets]) -> list[Match]:
        return [match(t.boxes, t.labels, self.priors, self.cfg.pos_iou, self.cfg.neg_iou) for t in targets]

    def sums(
        self, outputs: dict[str, torch.Tensor], targets: list[Targets], matches: list[Match]
    ) -> dict[str, torch.Tensor]:
        """outputs: Yolact train-mode dict (loc [B, N, 4], conf [B, N, C] logits, mask [B, N, k], proto
        [B, Ph, Pw, k], segm [B, C-1, h, w]) -> unnormalized sums {box, conf, mask, semantic}, scalars."""
        conf_t = torch.stack([m.conf for m in matches])  # [B, N]
        loc_t = torch.stack([m.loc for m in matches])  # [B, N, 4]
        positive = conf_t > 0
        box = F.smooth_l1_loss(outputs["loc"][positive], loc_t[positive], reduction="sum") * self.cfg.bbox_alpha
        conf = self.conf_sum(outputs["conf"], conf_t) * self.cfg.conf_alpha
        mask = outputs["proto"].new_zeros(())
        semantic = outputs["segm"].new_zeros(())
        for i, (target, m) in enumerate(zip(targets, matches)):
            mask = mask + self.mask_sum(outputs["proto"][i], outputs["mask"][i], target, m)
            semantic = semantic + self.semantic_sum(outputs["segm"][i], target)
        return {
            "box": box,
            "conf": conf,
            "mask": mask * self.cfg.mask_alpha,
            "semantic": semantic * self.cfg.semantic_alpha,
        }

    def conf_sum(self, conf: torch.Tensor, conf_t: torch.Tensor) -> torch.Tensor:
        """conf [B, N, C] logits, conf_t [B, N] -> cross entropy summed over positives and mined negatives."""
        negatives = hard_negatives(conf, conf_t, self.cfg.negpos_ratio)
        chosen = (conf_t > 0) | negatives
        return F.cross_entropy(conf[chosen], conf_t[chosen], reduction="sum")

    def mask_sum(self, proto: torch.Tensor, coeffs: torch.Tensor, target: Targets, m: Match) -> torch.Tensor:
        """proto [Ph, Pw, k], coeffs [N, k] of one image -> sum over its (sampled) positives of the cropped BCE
        divided by the matched box's area in proto pixels."""
        positive = torch.nonzero(m.positive).squeeze(1)
        if positive.numel() == 0:
            return proto.new_zeros(())
        mask_h, mask_w = proto.shape[:2]
        with torch.no_grad():
            gt = downsample_masks(target.masks, (mask_h, mask_w))  # [G, Ph, Pw] 0/1
        total = positive.numel()
        if total > self.cfg.masks_to_train:
            # the sample is drawn on the CPU whatever the device: the same positives on every device and rank
            generator = torch.Generator(device="cpu").manual_seed(int(target.seed))
            order = torch.randperm(total, generator=generator, device="cpu")
            positive = positive[order[: self.cfg.masks_to_train].to(positive.device)]
        gt_index = m.gt_index[positive]
        boxes = m.gt_box[positive]  # [P, 4]
        mask_t = gt[gt_index].permute(1, 2, 0)  # [Ph, Pw, P]
        pred = torch.sigmoid(proto @ coeffs[positive].t())  # [Ph, Pw, P]
        pred = crop(pred, boxes)
        bce = F.binary_cross_entropy(torch.clamp(pred, 0, 1), mask_t, reduction="none").sum(dim=(0, 1))
        size = center_size(boxes)
        per_mask = bce / (size[:, 2] * mask_w) / (size[:, 3] * mask_h)
        return per_mask.sum() * (total / positive.numel())

    @staticmethod
    def semantic_sum(segm: torch.Tensor, target: Targets) -> torch.Tensor:
        """segm [C-1, h, w] logits of one image -> BCE-with-logits summed over pixels / (h * w)."""
        classes, h, w = segm.shape
        with torch.no_grad():
            segment_t = torch.zeros_like(segm)
            if target.masks.shape[0]:
                small = downsample_masks(target.masks, (h, w))
                for obj, label in enumerate(target.labels.tolist()):
                    segment_t[label] = torch.max(segment_t[label], small[obj])
        return F.binary_cross_entropy_with_logits(segm, segment_t, reduction="sum") / (h * w)


def hard_negatives(conf: torch.Tensor, conf_t: torch.Tensor, negpos_ratio: int) -> torch.Tensor:
    """[B, N] bool: per image the negpos_ratio * positives background priors with the largest
    ``logsumexp(conf) - conf[:, 0]`` (never positives or neutrals; at most N - 1)."""
    with torch.no_grad():
        score = torch.logsumexp(conf, dim=2) - conf[:, :, 0]  # [B, N]
        score[conf_t != 0] = 0  # positives and neutrals are never negatives
        _, order = score.sort(dim=1, descending=True, stable=True)
        _, rank = order.sort(dim=1, stable=True)
        num_pos = (conf_t > 0).sum(dim=1, keepdim=True)
        num_neg = torch.clamp(negpos_ratio * num_pos, max=conf_t.shape[1] - 1)
        return (rank < num_neg) & (conf_t == 0)


def downsample_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[G, H, W] float masks -> [G, h, w] 0/1 float: bilinear (align_corners=False), then > 0.5."""
    if masks.shape[0] == 0:
        return masks.new_zeros((0, *size))
    small = F.interpolate(masks[None], size=size, mode="bilinear", align_corners=False)[0]
    return small.gt(0.5).float()


def num_positives(matches: list[Match]) -> int:
    return int(sum(int(m.positive.sum()) for m in matches))
