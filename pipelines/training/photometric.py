"""SSD photometric distortion (facts: dbolya/yolact utils/augmentations.py PhotometricDistort), split in two: the
random draws (``draw``, made where the image is augmented, from its seeded generator) and applying them, in numpy on
one image [H, W, 3] (``apply_numpy``) or batched in torch on any device [B, 3, H, W] (``apply_torch``; the input
workers leave it to the GPU, where it costs nothing next to the step).

Brightness +-32 (p 0.5); then contrast x[0.5, 1.5] (p 0.5) either before or after saturation x[0.5, 1.5] (p 0.5)
and hue +-18 degrees (p 0.5), as the reference. Values are clipped to 0..255 before HSV. An effect that is off is
an identity (add 0, multiply by 1), so the batched form needs no branch per image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PhotometricDraw:
    """One image's draws: brightness delta (0: off), contrast factor (1: off) and whether it comes before the HSV
    part, saturation factor (1: off), hue delta in degrees (0: off)."""

    brightness: float = 0.0
    contrast: float = 1.0
    contrast_first: bool = False
    saturation: float = 1.0
    hue: float = 0.0


def draw(rng: np.random.Generator) -> PhotometricDraw:
    """The draws photometric distortion makes, in the reference's order."""
    brightness = float(rng.uniform(-32, 32)) if rng.integers(2) else 0.0
    contrast_first = bool(rng.integers(2) == 1)
    contrast = _draw_contrast(rng) if contrast_first else 1.0
    saturation = float(rng.uniform(0.5, 1.5)) if rng.integers(2) else 1.0
    hue = float(rng.uniform(-18.0, 18.0)) if rng.integers(2) else 0.0
    if not contrast_first:
        contrast = _draw_contrast(rng)
    return PhotometricDraw(brightness, contrast, contrast_first, saturation, hue)


def _draw_contrast(rng: np.random.Generator) -> float:
    return float(rng.uniform(0.5, 1.5)) if rng.integers(2) else 1.0


# --------------------------------------------------------------------------------------------------------- numpy
def apply_numpy(image: np.ndarray, d: PhotometricDraw) -> np.ndarray:
    """[H, W, 3] float RGB 0-255 -> distorted float32."""
    if d.brightness:
        image = image + d.brightness
    if d.contrast_first and d.contrast != 1.0:
        image = image * d.contrast
    hsv = rgb_to_hsv(np.clip(image, 0, 255))
    if d.saturation != 1.0:
        hsv[..., 1] *= d.saturation
    if d.hue:
        hsv[..., 0] = np.mod(hsv[..., 0] + d.hue, 360.0)
    image = hsv_to_rgb(hsv)
    if not d.contrast_first and d.contrast != 1.0:
        image = image * d.contrast
    return image.astype(np.float32)


def rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """[..., 3] RGB 0-255 -> [..., 3] (hue degrees 0-360, saturation 0-1, value 0-255)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    value = rgb.max(axis=-1)
    spread = value - rgb.min(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        saturation = np.where(value > 0, spread / value, 0.0)
        safe = np.where(spread > 0, spread, 1.0)
        hue = np.where(value == r, (g - b) / safe, np.where(value == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = np.mod(hue * 60.0, 360.0)
    hue = np.where(spread > 0, hue, 0.0)
    return np.stack([hue, saturation, value], axis=-1).astype(np.float32)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """Inverse of rgb_to_hsv (saturation is clipped to 0..1)."""
    hue, saturation, value = hsv[..., 0], np.clip(hsv[..., 1], 0, 1), hsv[..., 2]
    sector = hue / 60.0
    chroma = value * saturation
    x = chroma * (1 - np.abs(np.mod(sector, 2) - 1))
    zero = np.zeros_like(value)
    index = np.floor(sector).astype(np.int64) % 6
    choices_r = [chroma, x, zero, zero, x, chroma]
    choices_g = [x, chroma, chroma, x, zero, zero]
    choices_b = [zero, zero, x, chroma, chroma, x]
    r, g, b = (np.choose(index, c) for c in (choices_r, choices_g, choices_b))
    m = value - chroma
    return np.stack([r + m, g + m, b + m], axis=-1).astype(np.float32)


# --------------------------------------------------------------------------------------------------------- torch
def draws_tensor(draws: list[PhotometricDraw]) -> torch.Tensor:
    """[B, 5] float32: brightness, contrast, contrast_first, saturation, hue."""
    return torch.tensor(
        [[d.brightness, d.contrast, float(d.contrast_first), d.saturation, d.hue] for d in draws], dtype=torch.float32
    ).reshape(-1, 5)


def apply_torch(images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """images [B, 3, H, W] float RGB 0-255, draws [B, 5] (draws_tensor) on the same device -> distorted [B, 3, H, W].

    The HSV round trip in closed form (hue in sixths of the circle; channel n of (R, G, B) = (5, 3, 1) is
    value - chroma * clamp(min(k, 4 - k), 0, 1) with k = (hue + n) mod 6): rgb_to_hsv / hsv_to_rgb's values within
    float32 rounding (3e-4 of 255 at most), in ~30 element-wise passes over the planes instead of ~100 and no
    6-plane stacks, with the temporaries written in place where they can be."""
    brightness, contrast, first, saturation, hue = (draws[:, i, None, None] for i in range(5))  # each [B, 1, 1]
    before = torch.where(first > 0, contrast, 1.0)
    after = torch.where(first > 0, 1.0, contrast)
    rgb = images.add(brightness[:, None]).mul_(before[:, None]).clamp_(0, 255)
    r, g, b = rgb.unbind(dim=1)
    value = rgb.amax(dim=1)
    spread = value - rgb.amin(dim=1)
    red, green = value == r, value == g  # the largest channel (red first, then green, as rgb_to_hsv)
    sector = torch.where(red, g - b, torch.where(green, b - r, r - g))
    sector.div_(torch.where(spread > 0, spread, 1.0))
    sector += torch.where(red, 0.0, torch.where(green, 2.0, 4.0))  # [-1, 5): the hue / 60 degrees
    sector += hue / 60.0 + 6.0  # rotated, kept positive: (4.7, 11.3)
    chroma = spread.div_(torch.where(value > 0, value, 1.0)).mul_(saturation).clamp_(0, 1).mul_(value)
    out = rgb  # r, g, b are read before their plane is written
    for channel, n in ((0, 5.0), (1, 3.0), (2, 1.0)):
        k = torch.remainder(sector + n, 6.0)
        torch.minimum(k, 4.0 - k, out=k).clamp_(0, 1)
        out[:, channel] = torch.sub(value, k.mul_(chroma), out=k)  # (no out= into a plane: torch.compile)
    return out.mul_(after[:, None])
