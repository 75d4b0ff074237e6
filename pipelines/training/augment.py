"""SSD-style training augmentation for YOLACT (facts: dbolya/yolact utils/augmentations.py, SSDAugmentation).

Geometric part (``augment``): zoom out (expand onto a mean-filled canvas up to ``expand_max_ratio`` x), random crop
(30-100 % of each side, aspect 0.5-2, keeps the objects whose box centre is inside; 1 in 6 draws keeps the whole
image), horizontal mirror. Then (``to_network_input``) a bilinear resize to the square network input (aspect ratio
not kept), the photometric distortion (brightness; contrast before or after saturation/hue in HSV) and
(x - mean) / std. The reference distorts colours first, at full resolution; here it runs after the resize (5-20x
fewer pixels; the colour operations are per pixel, so crop and mirror commute with them, and only the expand fill
colour and the interpolation order differ). Every random draw comes from the
``np.random.Generator`` passed in, so a sample's augmentation depends only on its seed (same on every rank, same
after a resume).

Arrays: image [H, W, 3] uint8 (or float32) RGB 0-255; masks [G, H, W] float32 0/1; boxes [G, 4] float32 absolute pixel
x1y1x2y2; labels [G] int64 0-based foreground classes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pipelines.training import photometric

CROP_MODES = (None, 0.1, 0.3, 0.7, 0.9, -1.0)   # None: whole image; the min-IoU values are never enforced (the
#                                                 reference's check is a known no-op, kept there on purpose)
CROP_TRIES = 50
CROP_MODE_DRAWS = 20


@dataclass(frozen=True)
class AugmentConfig:
    """Which augmentations run (reference defaults: all on, expand up to 4x)."""

    photometric: bool = True
    expand: bool = True
    expand_max_ratio: float = 4.0
    sample_crop: bool = True
    mirror: bool = True
    min_box_px: float = 2.0   # objects narrower or lower than this at the network input are dropped


@dataclass
class Sample:
    image: np.ndarray
    masks: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray


def augment(sample: Sample, rng: np.random.Generator, cfg: AugmentConfig, mean_rgb: np.ndarray) -> Sample:
    """The geometric and photometric augmentations (not the final resize); returns a new Sample."""
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


def to_network_input(sample: Sample, size: int, mean_rgb: np.ndarray | None, std_rgb: np.ndarray | None,
                     min_box_px: float, rng: np.random.Generator | None = None, distort: bool = False,
                     deferred: list | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Resize to size x size (bilinear, align_corners=False, no antialias, like the inference preprocess), distort
    colours (``distort``, draws from ``rng``) and normalize. Returns image [3, S, S], boxes [G, 4] relative
    x1y1x2y2, labels [G], masks [G, S, S]; objects whose resized box is thinner than min_box_px are dropped.
    deferred (a list): the colour draws are appended to it instead of applied, and the image is returned resized
    but neither distorted nor normalized, as uint8 (``batches.finish_images`` does both later, batched, on the
    device): torch's uint8 resize is 3-4x faster than the float one, a quarter of the bytes go between processes
    and to a GPU, and it differs from the rounded float resize by at most one level (its fixed-point weights)."""
    height, width = sample.image.shape[:2]
    pixels = np.ascontiguousarray(sample.image, dtype=np.float32 if deferred is None else np.uint8)
    image = F.interpolate(torch.from_numpy(pixels).permute(2, 0, 1)[None], size=(size, size), mode="bilinear",
                          align_corners=False)[0]
    if deferred is not None:
        deferred.append(photometric.draw(rng) if distort else photometric.PhotometricDraw())
    else:
        if distort:
            distorted = photometric_distort(image.permute(1, 2, 0).numpy(), rng)
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


# ------------------------------------------------------------------------------------------------ photometric
def photometric_distort(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[H, W, 3] float RGB 0-255 -> distorted float32 (pipelines.training.photometric: draws, then applies them)."""
    return photometric.apply_numpy(image, photometric.draw(rng))


rgb_to_hsv, hsv_to_rgb = photometric.rgb_to_hsv, photometric.hsv_to_rgb


# ------------------------------------------------------------------------------------------------- geometric
def expand(image, masks, boxes, rng, max_ratio: float, mean_rgb: np.ndarray):
    """Place the image on a canvas ratio x larger (ratio in [1, max_ratio]) filled with the mean colour (rounded
    for a uint8 image: the canvas keeps the image's type)."""
    height, width, _ = image.shape
    ratio = rng.uniform(1, max_ratio)
    left = int(rng.uniform(0, width * ratio - width))
    top = int(rng.uniform(0, height * ratio - height))
    canvas = np.empty((int(height * ratio), int(width * ratio), 3), dtype=image.dtype)
    canvas[:] = np.rint(mean_rgb) if canvas.dtype == np.uint8 else mean_rgb
    canvas[top:top + height, left:left + width] = image
    big_masks = np.zeros((masks.shape[0], canvas.shape[0], canvas.shape[1]), dtype=masks.dtype)
    big_masks[:, top:top + height, left:left + width] = masks
    return canvas, big_masks, boxes + np.float32([left, top, left, top])


def random_sample_crop(image, masks, boxes, labels, rng):
    """Crop a random window that keeps at least one object centre; boxes are clipped to it."""
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
            inside = ((rect[0] < centers[:, 0]) & (rect[1] < centers[:, 1])
                      & (rect[2] > centers[:, 0]) & (rect[3] > centers[:, 1]))
            if not inside.any():
                continue
            kept = boxes[inside].copy()
            kept[:, :2] = np.maximum(kept[:, :2], rect[:2]) - rect[:2]
            kept[:, 2:] = np.minimum(kept[:, 2:], rect[2:]) - rect[:2]
            return (image[rect[1]:rect[3], rect[0]:rect[2]], masks[inside][:, rect[1]:rect[3], rect[0]:rect[2]],
                    kept.astype(np.float32), labels[inside])
    return image, masks, boxes, labels
