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

Everything runs batched on the data's device: targets are padded to the batch's largest object count
(``PackedTargets``), matching is ``boxes.match_batch``, and the mask term assembles the kept positives of all
images at once (padded to the largest kept count); no Python loop per image or object on the way (only the
``masks_to_train`` draw, per image with more positives than that, is made on the CPU so that it is the same on
every device). The loss is computed in float32 whatever autocast the forward pass ran under.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from pipelines.training.boxes import BatchMatch, MaskSlots, center_size, crop_batch, match_batch
from pipelines.training.fused import FusedOnCuda
from pipelines.training.loss_targets import PackedTargets

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


@dataclass(frozen=True)
class Normalizer:
    """What the sums of a whole global batch are divided by: positives (box, conf, mask) and images (semantic)."""

    num_positives: int
    num_images: int

    def apply(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        positives = float(max(self.num_positives, 1))
        images = float(max(self.num_images, 1))
        return {k: v / (images if k == "semantic" else positives) for k, v in sums.items()}


def as_packed(targets) -> PackedTargets:
    return targets if isinstance(targets, PackedTargets) else PackedTargets.pack(list(targets))


class YolactLoss:
    """loss = YolactLoss(cfg, priors); matches = loss.match(targets); sums = loss.sums(outputs, targets, matches);
    terms = Normalizer(num_positives(matches), len(targets)).apply(sums). targets: list[Targets] or
    PackedTargets, on the device the loss runs on (the priors follow the targets' device)."""

    def __init__(self, cfg: LossConfig, priors: torch.Tensor):
        self.cfg = cfg
        self.priors = priors  # [N, 4] center-size
        self._priors_on: dict[torch.device, torch.Tensor] = {}

    def priors_on(self, device: torch.device) -> torch.Tensor:
        if self.priors.device == device:
            return self.priors
        if device not in self._priors_on:
            self._priors_on[device] = self.priors.to(device)
        return self._priors_on[device]

    def match(self, targets) -> BatchMatch:
        """Per-prior targets, and the mask term's layout of kept positives (``MaskSlots``): everything that needs
        the host (counts, the masks_to_train draw) happens here, before the forward pass, so ``sums`` never waits
        for the device."""
        packed = as_packed(targets)
        matches = match_batch(
            packed.boxes,
            packed.labels,
            packed.valid,
            self.priors_on(packed.boxes.device),
            self.cfg.pos_iou,
            self.cfg.neg_iou,
        )
        matches.slots = self.mask_slots(matches, packed.seeds)
        return matches

    def mask_slots(self, matches: BatchMatch, seeds: list[int]) -> MaskSlots:
        # the positives per image: read with the matching (match_batch), else here (the one read on the host)
        counts = matches.counts if matches.counts is not None else matches.positive.sum(dim=1).tolist()
        kept, scale = self.kept_positives(matches.positive, seeds, counts)
        kept_counts = [min(count, self.cfg.masks_to_train) for count in counts]
        # sized from the counts, so that finding the kept positives does not wait for the device
        image_idx, prior_idx = torch.nonzero_static(kept, size=sum(kept_counts)).unbind(1)
        slot_idx = (kept.long().cumsum(dim=1) - 1)[image_idx, prior_idx]
        return MaskSlots(
            image_idx, prior_idx, slot_idx, max(kept_counts, default=0), scale, self.cfg.masks_to_train, sum(counts)
        )

    def sums(self, outputs: dict[str, torch.Tensor], targets, matches: BatchMatch) -> dict[str, torch.Tensor]:
        """outputs: Yolact train-mode dict (loc [B, N, 4], conf [B, N, C] logits, mask [B, N, k], proto
        [B, Ph, Pw, k], segm [B, C-1, h, w]) -> unnormalized sums {box, conf, mask, semantic}, float32 scalars.
        On a GPU the four terms run as one compiled graph (``loss_sums``), forward and backward."""
        packed = as_packed(targets)
        layout = self.layout(matches, packed)
        proto, segm = outputs["proto"], outputs["segm"]
        with torch.autocast("cuda" if proto.is_cuda else "cpu", enabled=False):
            return loss_sums(
                outputs["loc"],
                outputs["conf"],
                outputs["mask"],
                proto,
                segm,
                matches.conf,
                matches.loc,
                matches.gt_box,
                matches.gt_index,
                layout.image_idx,
                layout.prior_idx,
                layout.slot_idx,
                layout.scale,
                layout.count,
                packed.masks_at(proto.shape[1:3]),
                packed.masks_at(segm.shape[2:]),
                packed.labels,
                packed.valid,
                self.cfg,
            )

    def layout(self, matches: BatchMatch, targets) -> MaskSlots:
        """The kept positives' slots: the ones ``match`` made (drawn for this config's masks_to_train), else new."""
        if matches.slots is None or matches.slots.limit != self.cfg.masks_to_train:
            return self.mask_slots(matches, as_packed(targets).seeds)
        return matches.slots

    def conf_sum(self, conf: torch.Tensor, conf_t: torch.Tensor) -> torch.Tensor:
        """conf [B, N, C] logits, conf_t [B, N] -> cross entropy summed over positives and mined negatives."""
        return conf_sum(conf, conf_t, self.cfg.negpos_ratio)

    def kept_positives(
        self, positive: torch.Tensor, seeds: list[int], counts: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positive [B, N] -> (kept [B, N] bool: at most masks_to_train per image, a seeded draw; scale [B]
        positives / kept). The draw is made on the CPU (the same positives on every device and rank). counts: the
        positives per image, when the caller has read them already."""
        per_image = positive.sum(dim=1)
        counts = per_image.tolist() if counts is None else counts
        limit = self.cfg.masks_to_train
        over = [(b, c) for b, c in enumerate(counts) if c > limit]
        kept = positive
        if over:
            rank = positive.long().cumsum(dim=1) - 1  # [B, N] order among positives
            selected = torch.ones(positive.shape[0], max(counts), dtype=torch.bool, device="cpu")
            for b, count in over:
                generator = torch.Generator(device="cpu").manual_seed(int(seeds[b]))
                order = torch.randperm(count, generator=generator, device="cpu")
                selected[b] = False
                selected[b, order[:limit]] = True
            # from page-locked memory without a wait on a GPU (a plain copy waits for the stream's queued work)
            selected = (selected.pin_memory() if positive.is_cuda else selected).to(positive.device, non_blocking=True)
            kept = positive & selected.gather(1, rank.clamp(min=0))
        scale = per_image.float() / kept.sum(dim=1).clamp(min=1).float()
        return kept, scale

    def mask_sum(self, proto: torch.Tensor, coeffs: torch.Tensor, targets, matches: BatchMatch) -> torch.Tensor:
        """proto [B, Ph, Pw, k], coeffs [B, N, k] -> the mask term's sum (``mask_sum``) over the (sampled)
        positives."""
        packed = as_packed(targets)
        layout = self.layout(matches, packed)
        return mask_sum(
            proto,
            coeffs,
            matches.gt_box,
            matches.gt_index,
            layout.image_idx,
            layout.prior_idx,
            layout.slot_idx,
            layout.scale,
            layout.count,
            packed.masks_at(proto.shape[1:3]),
        )

    @staticmethod
    def semantic_sum(segm: torch.Tensor, targets) -> torch.Tensor:
        """segm [B, C-1, h, w] logits -> the semantic term's sum (``semantic_sum``)."""
        packed = as_packed(targets)
        return semantic_sum(segm, packed.masks_at(segm.shape[2:]), packed.labels, packed.valid)


def _loss_sums(
    loc: torch.Tensor,
    conf: torch.Tensor,
    coeffs: torch.Tensor,
    proto: torch.Tensor,
    segm: torch.Tensor,
    conf_t: torch.Tensor,
    loc_t: torch.Tensor,
    gt_box: torch.Tensor,
    gt_index: torch.Tensor,
    image_idx: torch.Tensor,
    prior_idx: torch.Tensor,
    slot_idx: torch.Tensor,
    scale: torch.Tensor,
    slots: int,
    gt_proto: torch.Tensor,
    gt_segm: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    cfg: LossConfig,
    mask_bce=None,
) -> dict[str, torch.Tensor]:
    """``YolactLoss.sums`` from tensors only: the model's outputs (any float dtype; computed in float32), the
    matches (conf_t, loc_t, gt_box, gt_index), the MaskSlots (image_idx, prior_idx, slot_idx, scale, slots), the
    ground-truth masks at proto and segm size, labels and valid [B, G]. mask_bce: the cropped BCE's implementation
    (default the plain one)."""
    loc, conf, coeffs, proto, segm = loc.float(), conf.float(), coeffs.float(), proto.float(), segm.float()
    box_each = F.smooth_l1_loss(loc, loc_t, reduction="none").sum(dim=2)
    box = torch.where(conf_t > 0, box_each, 0.0).sum() * cfg.bbox_alpha
    mask = mask_sum(
        proto,
        coeffs,
        gt_box,
        gt_index,
        image_idx,
        prior_idx,
        slot_idx,
        scale,
        slots,
        gt_proto,
        mask_bce or _cropped_mask_bce,
    )
    return {
        "box": box,
        "conf": conf_sum(conf, conf_t, cfg.negpos_ratio) * cfg.conf_alpha,
        "mask": mask * cfg.mask_alpha,
        "semantic": semantic_sum(segm, gt_segm, labels, valid) * cfg.semantic_alpha,
    }


def conf_sum(conf: torch.Tensor, conf_t: torch.Tensor, negpos_ratio: int) -> torch.Tensor:
    """conf [B, N, C] logits, conf_t [B, N] -> cross entropy summed over positives and mined negatives."""
    chosen = (conf_t > 0) | hard_negatives(conf, conf_t, negpos_ratio)
    each = F.cross_entropy(conf.flatten(0, 1), conf_t.clamp(min=0).flatten(), reduction="none")
    return torch.where(chosen.flatten(), each, 0.0).sum()


def mask_sum(
    proto: torch.Tensor,
    coeffs: torch.Tensor,
    gt_box: torch.Tensor,
    gt_index: torch.Tensor,
    image_idx: torch.Tensor,
    prior_idx: torch.Tensor,
    slot_idx: torch.Tensor,
    scale: torch.Tensor,
    slots: int,
    gt_masks: torch.Tensor,
    mask_bce=None,
) -> torch.Tensor:
    """proto [B, Ph, Pw, k], coeffs [B, N, k], the matches' gt_box [B, N, 4] and gt_index [B, N], the MaskSlots of
    the kept positives (image_idx, prior_idx, slot_idx [P], scale [B], slots K), gt_masks [B, G, Ph, Pw] 0/1 -> the
    sum over the kept positives of the cropped BCE divided by the matched box's area in proto pixels, each image's
    times its scale. The kept positives are gathered into [B, K] slots and assembled with one batched matmul.
    mask_bce: the cropped BCE's implementation (default ``cropped_mask_bce``)."""
    batch, mask_h, mask_w, mask_dim = proto.shape
    if slots == 0:
        return proto.sum() * 0.0
    used = torch.zeros(batch, slots, dtype=torch.bool, device=proto.device)
    used[image_idx, slot_idx] = True
    chosen = coeffs.new_zeros(batch, slots, mask_dim)
    chosen[image_idx, slot_idx] = coeffs[image_idx, prior_idx]
    boxes = proto.new_zeros(batch, slots, 4)  # unused slots: whole image
    boxes[..., 2:] = 1.0  # (filled on the device: a tensor from a host list would wait for the step queued)
    boxes[image_idx, slot_idx] = gt_box[image_idx, prior_idx]
    gt_slot = torch.zeros(batch, slots, dtype=torch.long, device=proto.device)
    gt_slot[image_idx, slot_idx] = gt_index[image_idx, prior_idx]
    with torch.no_grad():
        rows = torch.arange(batch, device=proto.device)[:, None]
        mask_t = gt_masks[rows, gt_slot].permute(0, 2, 3, 1).float()  # [B, Ph, Pw, K]
    logits = torch.bmm(proto.reshape(batch, mask_h * mask_w, mask_dim), chosen.transpose(1, 2))
    bce = (mask_bce or cropped_mask_bce)(logits.reshape(batch, mask_h, mask_w, slots), boxes, mask_t)  # [B, K]
    size = center_size(boxes.reshape(-1, 4)).reshape(batch, slots, 4)
    per_mask = bce / (size[..., 2] * mask_w) / (size[..., 3] * mask_h)
    return (torch.where(used, per_mask, 0.0).sum(dim=1) * scale).sum()


def semantic_sum(segm: torch.Tensor, gt_masks: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """segm [B, C-1, h, w] logits, gt_masks [B, G, h, w] 0/1, labels and valid [B, G] -> BCE-with-logits summed over
    pixels / (h * w), summed over images; the target of class c is the union of that class's masks."""
    batch, classes, h, w = segm.shape
    with torch.no_grad():
        segment_t = segm.new_zeros(batch, classes + 1, h * w)  # channel C-1 collects the padding
        if labels.shape[1]:
            small = gt_masks.reshape(batch, -1, h * w).to(segm.dtype)
            channel = torch.where(valid, labels, classes)
            segment_t.scatter_reduce_(1, channel[:, :, None].expand(-1, -1, h * w), small, reduce="amax")
        segment_t = segment_t[:, :classes].reshape(batch, classes, h, w)
    return F.binary_cross_entropy_with_logits(segm, segment_t, reduction="sum") / (h * w)


def _cropped_mask_bce(logits: torch.Tensor, boxes: torch.Tensor, mask_t: torch.Tensor) -> torch.Tensor:
    """logits [B, Ph, Pw, K] (proto @ coeffs), boxes [B, K, 4] relative point form, mask_t [B, Ph, Pw, K] 0/1 ->
    [B, K]: BCE of the sigmoid cropped to its box (in 0..1: the reference's clamp), summed over each mask's pixels.
    A NaN prediction (an overflow upstream) would fail BCE's 0..1 check (an error on the CPU, a device-side assert
    on a GPU): BCE gets 0 there, and the mask's sum is made NaN by its sum of predictions (times 0, without a
    gradient), so that the step is skipped as not finite."""
    pred = crop_batch(torch.sigmoid(logits), boxes)
    return (
        F.binary_cross_entropy(torch.nan_to_num(pred, nan=0.0), mask_t, reduction="none").sum(dim=(1, 2))
        + pred.detach().sum(dim=(1, 2)) * 0
    )


cropped_mask_bce = FusedOnCuda(_cropped_mask_bce)  # ~10 passes each way over [B, Ph, Pw, K] floats unfused
# On a GPU the whole loss is one compiled graph, forward and backward (eager, ~200 small operations that the host
# launches one by one); where it cannot compile, the eager terms with the fused mask BCE run.
loss_sums = FusedOnCuda(_loss_sums, fallback=partial(_loss_sums, mask_bce=cropped_mask_bce))


def hard_negatives(conf: torch.Tensor, conf_t: torch.Tensor, negpos_ratio: int) -> torch.Tensor:
    """[B, N] bool: per image the negpos_ratio * positives background priors with the largest
    ``logsumexp(conf) - conf[:, 0]`` (never positives or neutrals; at most N - 1)."""
    with torch.no_grad():
        score = torch.logsumexp(conf, dim=2) - conf[:, :, 0]  # [B, N]
        score = torch.where(conf_t != 0, 0.0, score)  # positives and neutrals are never negatives
        _, order = score.sort(dim=1, descending=True, stable=True)
        _, rank = order.sort(dim=1, stable=True)
        num_pos = (conf_t > 0).sum(dim=1, keepdim=True)
        num_neg = torch.clamp(negpos_ratio * num_pos, max=conf_t.shape[1] - 1)
        return (rank < num_neg) & (conf_t == 0)


def num_positives(matches) -> int:
    """Positive priors of a BatchMatch (or a list of per-image matches)."""
    if isinstance(matches, BatchMatch):
        return matches.slots.positives if matches.slots is not None else int(matches.positive.sum())
    return int(sum(int(m.positive.sum()) for m in matches))
