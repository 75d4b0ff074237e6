"""Overlay images: each instance's mask tinted in its own colour over the source image, with its box, class and
score. Masks come from the detections' RLE column (pycocotools); overlaps go to the higher score, as in the PNG
label maps under masks/.

    rgb = draw_overlay(image_rgb, instances, score_threshold=0.5)   # uint8 [H, W, 3] -> uint8 [H, W, 3]
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pipelines.ops.image_decode import decode_image
from pipelines.ops.mask_outputs import decode_rle

# Distinct, saturated colours (instance k gets PALETTE[k % len]); tinted at ALPHA over the image.
PALETTE = np.array(
    [
        (230, 25, 75),
        (60, 180, 75),
        (255, 225, 25),
        (0, 130, 200),
        (245, 130, 48),
        (145, 30, 180),
        (70, 240, 240),
        (240, 50, 230),
        (210, 245, 60),
        (250, 190, 212),
        (0, 128, 128),
        (220, 190, 255),
        (170, 110, 40),
        (255, 250, 200),
        (128, 0, 0),
        (170, 255, 195),
        (128, 128, 0),
        (255, 215, 180),
        (0, 0, 128),
        (128, 128, 128),
    ],
    dtype=np.uint8,
)
ALPHA = 0.5


def drawn_instances(instances: list[dict] | None, score_threshold: float) -> list[dict]:
    """The instances to draw: score >= threshold, highest score first."""
    kept = [inst for inst in instances or [] if inst["score"] >= score_threshold]
    return sorted(kept, key=lambda inst: -inst["score"])


def colour(number: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in PALETTE[number % len(PALETTE)])


def tint(pixels: np.ndarray, rgb: tuple[int, int, int]) -> np.ndarray:
    """uint8 [..., 3] -> the pixels blended with `rgb` at ALPHA (rounded)."""
    return np.round((1 - ALPHA) * pixels.astype(np.float32) + ALPHA * np.asarray(rgb, np.float32)).astype(np.uint8)


def paint_masks(image: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
    """Tint mask k (bool [H, W], highest score first) in colour k; a pixel goes to the first mask that has it.
    Only mask pixels change."""
    out = image.copy()
    free = np.ones(image.shape[:2], bool)
    for number, mask in enumerate(masks):
        if mask.shape != image.shape[:2]:
            raise ValueError(
                f"mask {number + 1} is {mask.shape[0]}x{mask.shape[1]} but the image is "
                f"{image.shape[0]}x{image.shape[1]}: the detections belong to another image"
            )
        pixels = mask & free
        out[pixels] = tint(image[pixels], colour(number))
        free &= ~mask
    return out


def _font(height: int):
    try:
        return ImageFont.load_default(size=max(11, min(24, height // 30)))
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def draw_labels(image: np.ndarray, instances: list[dict]) -> np.ndarray:
    """Box outline (2 px, the instance's colour) and a "class score" tag above each box."""
    canvas = Image.fromarray(image)
    draw = ImageDraw.Draw(canvas)
    font = _font(image.shape[0])
    for number, inst in enumerate(instances):
        x1, y1, x2, y2 = (int(v) for v in inst["box"])
        rgb = colour(number)
        draw.rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], outline=rgb, width=2)
        text = f"{inst['class_name']} {inst['score']:.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        tag_h = bottom - top + 4
        ty = y1 - tag_h if y1 - tag_h >= 0 else y1
        draw.rectangle([x1, ty, x1 + right - left + 4, ty + tag_h], fill=rgb)
        ink = (0, 0, 0) if sum(rgb) > 380 else (255, 255, 255)
        draw.text((x1 + 2 - left, ty + 2 - top), text, fill=ink, font=font)
    return np.asarray(canvas)


def draw_overlay(
    image: np.ndarray, instances: list[dict] | None, score_threshold: float = 0.5, boxes: bool = True
) -> np.ndarray:
    """uint8 RGB [H, W, 3] + detections-row instances -> the overlay (uint8 RGB [H, W, 3])."""
    kept = drawn_instances(instances, score_threshold)
    masks = [decode_rle(inst["mask"]) for inst in kept if inst.get("mask") is not None]
    out = paint_masks(image, masks) if len(masks) == len(kept) else image.copy()
    return draw_labels(out, kept) if boxes else out


def load_rgb(path) -> np.ndarray:
    """The image as the job decoded it (pipelines.ops.image_decode: EXIF orientation applied, any mode -> RGB):
    uint8 RGB [H, W, 3], the pixels its masks refer to."""
    with open(path, "rb") as handle:
        return decode_image(handle.read(), str(path), max_pixels=1 << 31)


def thumbnail(image: np.ndarray, width: int = 320) -> Image.Image:
    pil = Image.fromarray(image)
    if pil.width > width:
        pil = pil.resize((width, max(1, round(pil.height * width / pil.width))), Image.LANCZOS)
    return pil
