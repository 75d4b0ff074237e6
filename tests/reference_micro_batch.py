"""Micro-batches as they were made before the input workers were sped up (pipelines/training/batches.py,
augment.py and yolact_loss.py's PackedTargets.pack / downsample_masks at commit b2186a6: the image and every mask
expanded onto a full canvas, then cropped, mirrored and resized as float; photometric.draw is unchanged), kept
verbatim as the reference tests/test_training_augment_speed_equal.py compares the new code with, bit for bit, and
scripts/bench_loader.py times it against. Not used by the library."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pycocotools import mask as mask_utils

from pipelines.ops.image_decode import decode_image
from pipelines.training import photometric
from pipelines.training.augment import AugmentConfig, Sample
from pipelines.training.batches import InputSpec, MicroBatch
from pipelines.training.loss_targets import PackedTargets, Targets

CROP_MODES = (None, 0.1, 0.3, 0.7, 0.9, -1.0)
CROP_TRIES = 50
CROP_MODE_DRAWS = 20


# ------------------------------------------------------------------------------------------------ batches.py
def row_to_sample(row: dict) -> Sample:
    image = decode_image(bytes(row["image"]), row["file_name"])
    height, width = image.shape[:2]
    rles = [{"size": [height, width], "counts": counts.encode("ascii")} for counts in row["rles"]]
    masks = np.moveaxis(mask_utils.decode(rles), 2, 0) if rles else np.zeros((0, height, width), np.uint8)
    boxes = np.asarray(row["boxes"], dtype=np.float32).reshape(-1, 4)
    return Sample(image=image, masks=masks, boxes=boxes, labels=np.asarray(row["labels"], dtype=np.int64))


def sample_seed(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index])


def make_micro_batch(
    rows: dict[int, dict],
    indices: list[int],
    spec: InputSpec,
    augment_cfg: AugmentConfig | None,
    seed: int,
    epoch: int,
    mask_sizes: list[tuple[int, int]] | None = None,
) -> MicroBatch:
    mean = np.asarray(spec.mean_rgb, dtype=np.float32)
    std = np.asarray(spec.std_rgb, dtype=np.float32)
    images, targets = [], []
    deferred = [] if mask_sizes is not None else None
    for index in indices:
        sample = row_to_sample(rows[index])
        rng = sample_seed(seed, epoch, index)
        if augment_cfg is not None:
            sample = augment(sample, rng, augment_cfg, mean)
        min_box = augment_cfg.min_box_px if augment_cfg is not None else 0.0
        distort = augment_cfg is not None and augment_cfg.photometric
        image, boxes, labels, masks = to_network_input(sample, spec.size, mean, std, min_box, rng, distort, deferred)
        images.append(image)
        targets.append(Targets(boxes=boxes, labels=labels, masks=masks, seed=int(rng.integers(2**31))))
    if mask_sizes is None:
        return MicroBatch(images=torch.stack(images), targets=targets, indices=list(indices))
    return MicroBatch(
        images=torch.stack(images),
        targets=pack(targets, mask_sizes),
        indices=list(indices),
        colour=photometric.draws_tensor(deferred),
    )


# ------------------------------------------------------------------------------------------------ augment.py
def augment(sample: Sample, rng: np.random.Generator, cfg: AugmentConfig, mean_rgb: np.ndarray) -> Sample:
    image = sample.image
    masks, boxes, labels = sample.masks, sample.boxes.astype(np.float32), sample.labels
    if cfg.expand and rng.integers(2) == 0:
        image, masks, boxes = expand(image, masks, boxes, rng, cfg.expand_max_ratio, mean_rgb)
    if cfg.sample_crop and len(boxes):
        image, masks, boxes, labels = random_sample_crop(image, masks, boxes, labels, rng)
    if cfg.mirror and rng.integers(2) == 1:
        width = image.shape[1]
        image, masks = image[:, ::-1], masks[:, :, ::-1]
        boxes = boxes.copy()
        boxes[:, 0::2] = width - boxes[:, 2::-2]
    return Sample(image, masks, boxes, labels)


def to_network_input(
    sample: Sample,
    size: int,
    mean_rgb: np.ndarray | None,
    std_rgb: np.ndarray | None,
    min_box_px: float,
    rng: np.random.Generator | None = None,
    distort: bool = False,
    deferred: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    height, width = sample.image.shape[:2]
    pixels = np.ascontiguousarray(sample.image, dtype=np.float32 if deferred is None else np.uint8)
    image = F.interpolate(
        torch.from_numpy(pixels).permute(2, 0, 1)[None], size=(size, size), mode="bilinear", align_corners=False
    )[0]
    if deferred is not None:
        deferred.append(photometric.draw(rng) if distort else photometric.PhotometricDraw())
    else:
        if distort:
            distorted = photometric.apply_numpy(image.permute(1, 2, 0).numpy(), photometric.draw(rng))
            image = torch.from_numpy(np.ascontiguousarray(distorted)).permute(2, 0, 1)
        image = (image - torch.from_numpy(mean_rgb)[:, None, None]) / torch.from_numpy(std_rgb)[:, None, None]
    boxes = torch.from_numpy(np.asarray(sample.boxes, dtype=np.float32).reshape(-1, 4).copy())
    boxes[:, 0::2] /= width
    boxes[:, 1::2] /= height
    boxes = boxes.clamp(0.0, 1.0)
    keep = ((boxes[:, 2] - boxes[:, 0]) * size > min_box_px) & ((boxes[:, 3] - boxes[:, 1]) * size > min_box_px)
    labels = torch.from_numpy(np.asarray(sample.labels, dtype=np.int64).reshape(-1))[keep]
    kept = np.flatnonzero(keep.numpy())
    masks = torch.from_numpy(np.ascontiguousarray(sample.masks[kept], dtype=np.float32))
    if masks.shape[0]:
        masks = F.interpolate(masks[None], size=(size, size), mode="bilinear", align_corners=False)[0]
    else:
        masks = torch.zeros(0, size, size)
    return image.contiguous(), boxes[keep], labels, masks


def expand(image, masks, boxes, rng, max_ratio: float, mean_rgb: np.ndarray):
    height, width, _ = image.shape
    ratio = rng.uniform(1, max_ratio)
    left = int(rng.uniform(0, width * ratio - width))
    top = int(rng.uniform(0, height * ratio - height))
    canvas = np.empty((int(height * ratio), int(width * ratio), 3), dtype=image.dtype)
    canvas[:] = np.rint(mean_rgb) if canvas.dtype == np.uint8 else mean_rgb
    canvas[top : top + height, left : left + width] = image
    big_masks = np.zeros((masks.shape[0], canvas.shape[0], canvas.shape[1]), dtype=masks.dtype)
    big_masks[:, top : top + height, left : left + width] = masks
    return canvas, big_masks, boxes + np.float32([left, top, left, top])


def random_sample_crop(image, masks, boxes, labels, rng):
    height, width, _ = image.shape
    for _ in range(CROP_MODE_DRAWS):
        mode = CROP_MODES[int(rng.integers(len(CROP_MODES)))]
        if mode is None:
            break
        for _ in range(CROP_TRIES):
            w = rng.uniform(0.3 * width, width)
            h = rng.uniform(0.3 * height, height)
            if h / w < 0.5 or h / w > 2:
                continue
            left = rng.uniform(0, width - w)
            top = rng.uniform(0, height - h)
            rect = np.array([int(left), int(top), int(left + w), int(top + h)])
            centers = (boxes[:, :2] + boxes[:, 2:]) / 2.0
            inside = (
                (rect[0] < centers[:, 0])
                & (rect[1] < centers[:, 1])
                & (rect[2] > centers[:, 0])
                & (rect[3] > centers[:, 1])
            )
            if not inside.any():
                continue
            kept = boxes[inside].copy()
            kept[:, :2] = np.maximum(kept[:, :2], rect[:2]) - rect[:2]
            kept[:, 2:] = np.minimum(kept[:, 2:], rect[2:]) - rect[:2]
            return (
                image[rect[1] : rect[3], rect[0] : rect[2]],
                masks[inside][:, rect[1] : rect[3], rect[0] : rect[2]],
                kept.astype(np.float32),
                labels[inside],
            )
    return image, masks, boxes, labels


# -------------------------------------------------------------------------------------------- yolact_loss.py
def pack(targets: list[Targets], mask_sizes: list[tuple[int, int]]) -> PackedTargets:
    """PackedTargets.pack with mask_sizes."""
    batch, slots = len(targets), max((int(t.labels.shape[0]) for t in targets), default=0)
    first = targets[0].masks
    device = first.device
    boxes = torch.zeros(batch, slots, 4, dtype=torch.float32, device=device)
    labels = torch.full((batch, slots), -1, dtype=torch.long, device=device)
    for b, t in enumerate(targets):
        count = int(t.labels.shape[0])
        boxes[b, :count] = t.boxes
        labels[b, :count] = t.labels
    packed = PackedTargets(boxes, labels, labels >= 0, [int(t.seed) for t in targets])
    packed.small_masks = {}
    for size in mask_sizes:
        small = torch.zeros(batch, slots, *size, dtype=torch.uint8, device=device)
        for b, t in enumerate(targets):
            small[b, : t.masks.shape[0]] = downsample_masks(t.masks, size).to(torch.uint8)
        packed.small_masks[tuple(size)] = small
    return packed


def downsample_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if masks.shape[0] == 0:
        return masks.new_zeros((0, *size))
    small = F.interpolate(masks[None].float(), size=size, mode="bilinear", align_corners=False)[0]
    return small.gt(0.5).float()
