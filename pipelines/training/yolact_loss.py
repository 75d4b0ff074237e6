"""The YOLACT training loss (facts: dbolya/yolact layers/modules/multibox_loss.py, yolact_base config).

Four terms; the first three are normalized by the number of positive priors in the whole (global) batch, the
semantic term by the number of images:

- box ``B``: smooth L1 between predicted and encoded offsets of positive priors, x ``bbox_alpha`` (1.5);
- conf ``C``: cross entropy over positives and the hardest negatives, ``negpos_ratio`` (3) negatives per
  positive per image, ranked by ``logsumexp(conf) - conf[0]``; neutral priors (IoU in [0.4, 0.5)) are ignored;
- mask ``M``: per positive, sigmoid(proto @ coeffs) cropped to its matched ground-truth box (padding 1 proto px),
  BCE against the ground-truth mask downsampled to proto size and binarized (> 0.5), summed over pixels and
  divided by the box area in proto pixels, x ``mask_alpha`` (6.125); at most ``masks_to_train`` positives per
  image (a seeded random subset, the loss scaled up by positives/kept);
- semantic ``S``: BCE-with-logits of ``segm`` (one channel per foreground class, P3 size) against the union of
  each class's downsampled masks, summed over pixels / (h * w), x ``semantic_alpha`` (1).

Matching depends only on the targets and the priors, so it runs before the forward pass and the global
normalizers (positives, images) can be summed across ranks first: every micro-batch then contributes its
*sums*, and the step's loss is the same however the global batch is split.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipelines.training.boxes import Match, center_size, crop, match

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

    def sums(self, outputs: dict[str, torch.Tensor], targets: list[Targets],
             matches: list[Match]) -> dict[str, torch.Tensor]:
        """outputs: Yolact train-mode dict (loc [B, N, 4], conf [B, N, C] logits, mask [B, N, k], proto
        [B, Ph, Pw, k], segm [B, C-1, h, w]) -> unnormalized sums {box, conf, mask, semantic}, scalars."""
        conf_t = torch.stack([m.conf for m in matches])        # [B, N]
        loc_t = torch.stack([m.loc for m in matches])          # [B, N, 4]
        positive = conf_t > 0
        box = F.smooth_l1_loss(outputs["loc"][positive], loc_t[positive], reduction="sum") * self.cfg.bbox_alpha
        conf = self.conf_sum(outputs["conf"], conf_t) * self.cfg.conf_alpha
        mask = outputs["proto"].new_zeros(())
        semantic = outputs["segm"].new_zeros(())
        for i, (target, m) in enumerate(zip(targets, matches)):
            mask = mask + self.mask_sum(outputs["proto"][i], outputs["mask"][i], target, m)
            semantic = semantic + self.semantic_sum(outputs["segm"][i], target)
        return {"box": box, "conf": conf, "mask": mask * self.cfg.mask_alpha,
                "semantic": semantic * self.cfg.semantic_alpha}

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
            gt = downsample_masks(target.masks, (mask_h, mask_w))   # [G, Ph, Pw] 0/1
        total = positive.numel()
        if total > self.cfg.masks_to_train:
            # the sample is drawn on the CPU whatever the device: the same positives on every device and rank
            generator = torch.Generator(device="cpu").manual_seed(int(target.seed))
            order = torch.randperm(total, generator=generator, device="cpu")
            positive = positive[order[:self.cfg.masks_to_train].to(positive.device)]
        gt_index = m.gt_index[positive]
        boxes = m.gt_box[positive]                                 # [P, 4]
        mask_t = gt[gt_index].permute(1, 2, 0)                     # [Ph, Pw, P]
        pred = torch.sigmoid(proto @ coeffs[positive].t())         # [Ph, Pw, P]
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
        score = torch.logsumexp(conf, dim=2) - conf[:, :, 0]      # [B, N]
        score[conf_t != 0] = 0                                    # positives and neutrals are never negatives
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
