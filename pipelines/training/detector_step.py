"""The detector's training inputs and step: prepared rows -> 0-1 RGB images at the network input size and
torchvision targets; one global batch = micro-batches with gradient accumulation (and DDP's all-reduce).

A sample's augmentation is drawn from ``np.random.default_rng([seed, epoch, index])`` (as for YOLACT), and the
torch generator that torchvision's RPN / RoI samplers draw from is reseeded per micro-batch from
(seed, step, micro-batch): the same step computes the same losses after a resume.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from model_export.models.factornet_detector import IMAGENET_MEAN
from pipelines.ops.image_decode import decode_image
from pipelines.training.augment import AugmentConfig, Sample, crop_image, draw_geometry, fill_value
from pipelines.training.batches import sample_seed
from pipelines.training.resize import resize_bilinear

LOSS_KEYS = ("loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg")
EXPAND_FILL_RGB = np.float32(IMAGENET_MEAN) * 255.0  # the zoom-out canvas colour: the normalization's mean


@dataclass
class DetectorBatch:
    images: list[torch.Tensor]  # [3, H, W] RGB in 0-1 at the network input size
    targets: list[dict]  # {"boxes": [G, 4] x1y1x2y2 input pixels, "labels": [G] 1-based}
    indices: list[int]

    def to(self, device: torch.device) -> DetectorBatch:
        return DetectorBatch(
            [image.to(device) for image in self.images],
            [{k: v.to(device) for k, v in t.items()} for t in self.targets],
            self.indices,
        )


def row_to_detector_sample(row: dict) -> Sample:
    """A prepared row -> image [H, W, 3] uint8, boxes [G, 4] pixels, labels [G] 0-based; masks [G, 0, 0] (none)."""
    image = decode_image(bytes(row["image"]), row["file_name"])
    boxes = np.asarray(row["boxes"], dtype=np.float32).reshape(-1, 4)
    labels = np.asarray(row["labels"], dtype=np.int64).reshape(-1)
    return Sample(image=image, masks=np.zeros((len(labels), 0, 0), np.uint8), boxes=boxes, labels=labels)


def _geometric(sample: Sample, rng: np.random.Generator, cfg: AugmentConfig) -> Sample:
    """The geometric augmentations of the image and its boxes (augment.draw_geometry, then only the window made)."""
    height, width = sample.image.shape[:2]
    geometry = draw_geometry(height, width, sample.boxes, sample.labels, rng, cfg)
    image = crop_image(sample.image, geometry, fill_value(sample.image.dtype, EXPAND_FILL_RGB))
    return Sample(image, sample.masks[: len(geometry.labels)], geometry.boxes, geometry.labels)


def to_detector_input(sample: Sample, input_size: tuple[int, int], min_box_px: float) -> tuple[torch.Tensor, dict]:
    """Bilinear resize (align_corners=False, no antialias: the inference preprocess) to (height, width), 0-1
    RGB; boxes scaled to input pixels, those thinner than min_box_px dropped; labels 1-based (0: background)."""
    height, width = sample.image.shape[:2]
    out_h, out_w = input_size
    image = torch.from_numpy(np.ascontiguousarray(sample.image, dtype=np.float32)).permute(2, 0, 1)[None]
    image = resize_bilinear(image, (out_h, out_w))[0] / 255.0
    boxes = torch.from_numpy(np.asarray(sample.boxes, dtype=np.float32).reshape(-1, 4).copy())
    boxes[:, 0::2] = (boxes[:, 0::2] * (out_w / width)).clamp(0, out_w)
    boxes[:, 1::2] = (boxes[:, 1::2] * (out_h / height)).clamp(0, out_h)
    keep = ((boxes[:, 2] - boxes[:, 0]) > min_box_px) & ((boxes[:, 3] - boxes[:, 1]) > min_box_px)
    labels = torch.from_numpy(np.asarray(sample.labels, dtype=np.int64).reshape(-1))[keep] + 1
    return image.clamp(0.0, 1.0).contiguous(), {"boxes": boxes[keep], "labels": labels}


def make_detector_batch(
    rows: dict[int, dict],
    indices: list[int],
    input_size: tuple[int, int],
    augment_cfg: AugmentConfig | None,
    seed: int,
    epoch: int,
) -> DetectorBatch:
    """augment_cfg None: no augmentation (validation)."""
    images, targets = [], []
    for index in indices:
        sample = row_to_detector_sample(rows[index])
        if augment_cfg is not None:
            sample = _geometric(sample, sample_seed(seed, epoch, index), augment_cfg)
        min_box = augment_cfg.min_box_px if augment_cfg is not None else 0.0
        image, target = to_detector_input(sample, input_size, min_box)
        images.append(image)
        targets.append(target)
    return DetectorBatch(images, targets, list(indices))


def micro_batch_seed(seed: int, step: int, micro_index: int) -> int:
    """The torch seed of one micro-batch's RPN / RoI sampling (same for every strategy and after a resume)."""
    return int(np.random.default_rng([seed, step, micro_index, 7]).integers(2**62))


def detector_step(
    model: torch.nn.Module,
    batches: list[DetectorBatch],
    micro_offset: int,
    micro_total: int,
    seed: int,
    step: int,
    device: torch.device,
) -> torch.Tensor:
    """Forward/backward of this rank's micro-batches; gradients = the mean over the global batch's micro-batches
    (DDP averages over ranks: each rank scales by its own count). Returns the loss terms (LOSS_KEYS order) summed
    over this rank's micro-batches, divided by micro_total (sum them over ranks for the global mean)."""
    per_rank = len(batches)
    terms = torch.zeros(len(LOSS_KEYS))
    for number, batch in enumerate(batches):
        torch.manual_seed(micro_batch_seed(seed, step, micro_offset + number))
        batch = batch.to(device)
        last = number == per_rank - 1
        sync = model.no_sync() if hasattr(model, "no_sync") and not last else nullcontext()
        with sync:
            losses = model(batch.images, batch.targets)
            total = sum(losses[k] for k in LOSS_KEYS) / per_rank
            total.backward()
        terms += torch.stack([losses[k].detach().float().cpu() for k in LOSS_KEYS]) / micro_total
    return terms
