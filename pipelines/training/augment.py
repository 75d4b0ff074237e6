"""SSD-style training augmentation for YOLACT (facts: dbolya/yolact utils/augmentations.py, SSDAugmentation).

Geometric part: zoom out (expand onto a mean-filled canvas up to ``expand_max_ratio`` x), random crop (30-100 % of
each side, aspect 0.5-2, keeps the objects whose box centre is inside; 1 in 6 draws keeps the whole image),
horizontal mirror. Then (``to_network_input``) a bilinear resize to the square network input (aspect ratio not
kept), the photometric distortion (brightness; contrast before or after saturation/hue in HSV) and
(x - mean) / std. The reference distorts colours first, at full resolution; here it runs after the resize (far
fewer pixels; the colour operations are per pixel, so crop and mirror commute with them, and only the expand fill
colour and the interpolation order differ). Every random draw comes from the
``np.random.Generator`` passed in, so a sample's augmentation depends only on its seed (same on every rank, same
after a resume).

The geometry is drawn on the boxes alone (``draw_geometry``: which window of the source image the augmented image
is, whether it is mirrored, which objects it keeps); then only that window is made (``crop_image``,
``crop_masks``): the same pixels as filling the expand canvas (up to 16x the image) and cropping it, without the
canvas, and without the masks of the objects the crop drops.

Arrays: image [H, W, 3] uint8 (or float32) RGB 0-255; masks [G, H, W] float32 0/1; boxes [G, 4] float32 absolute pixel
x1y1x2y2; labels [G] int64 0-based foreground classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipelines.ops.image_ops import resized_twice_above
from pipelines.training import photometric
from pipelines.training.resize import resize_bilinear

CROP_MODES = (None, 0.1, 0.3, 0.7, 0.9, -1.0)  # None: whole image; the min-IoU values are never enforced (the
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
    min_box_px: float = 2.0  # objects narrower or lower than this at the network input are dropped


@dataclass
class Sample:
    image: np.ndarray
    masks: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class Geometry:
    """Where an augmented image lies in its source image: rows top..top+height and columns left..left+width of the
    source (negative or beyond it where the expand canvas is: the fill), mirrored left-right if ``mirror``; the
    objects it keeps (``objects`` [G'], their indices in the source, in order) with their boxes [G', 4] float32
    pixels of the augmented image and labels [G']."""

    top: int
    left: int
    height: int
    width: int
    mirror: bool
    objects: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray

    @classmethod
    def whole(cls, height: int, width: int, boxes: np.ndarray, labels: np.ndarray) -> Geometry:
        """The source image as it is (no augmentation)."""
        return cls(0, 0, height, width, False, np.arange(len(labels)), boxes, labels)

    def within(self, height: int, width: int) -> bool:
        """Whether the window lies inside a source of height x width (no fill)."""
        return self.top >= 0 and self.left >= 0 and self.top + self.height <= height and self.left + self.width <= width

    def overlap(self, height: int, width: int) -> tuple[tuple[slice, slice], tuple[slice, slice]] | None:
        """Where the window meets a source of height x width: ((source rows, source columns), (rows, columns) of
        the augmented image they land on; mirrored: reversed, they land on the mirrored columns); None where they
        do not meet."""
        y0, y1 = min(max(self.top, 0), height), min(max(self.top + self.height, 0), height)
        x0, x1 = min(max(self.left, 0), width), min(max(self.left + self.width, 0), width)
        if y1 <= y0 or x1 <= x0:
            return None
        x0_out, x1_out = x0 - self.left, x1 - self.left
        if self.mirror:
            x0_out, x1_out = self.width - x1_out, self.width - x0_out
        return (slice(y0, y1), slice(x0, x1)), (slice(y0 - self.top, y1 - self.top), slice(x0_out, x1_out))


def augment(sample: Sample, rng: np.random.Generator, cfg: AugmentConfig, mean_rgb: np.ndarray) -> Sample:
    """The geometric augmentations (not the final resize); returns a new Sample (its image and masks the window
    of the source that draw_geometry drew)."""
    height, width = sample.image.shape[:2]
    geometry = draw_geometry(height, width, sample.boxes, sample.labels, rng, cfg)
    image = crop_image(sample.image, geometry, fill_value(sample.image.dtype, mean_rgb))
    return Sample(image, crop_masks(sample.masks[geometry.objects], geometry), geometry.boxes, geometry.labels)


def to_network_input(
    pixels: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    size: int,
    mean_rgb: np.ndarray | None,
    std_rgb: np.ndarray | None,
    min_box_px: float,
    rng: np.random.Generator | None = None,
    distort: bool = False,
    deferred: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """pixels [h, w, 3] uint8 (or [h, w, 4]: RGBX, the padding channel not used), boxes [G, 4] pixels, labels [G]
    -> resized to size x size (bilinear, align_corners=False, no antialias, like the inference preprocess), colours
    distorted (``distort``, draws from ``rng``) and normalized. Returns image [3, S, S] (possibly a strided view),
    boxes [G', 4] relative x1y1x2y2, labels [G'], and which of the G objects are kept [G] bool: those whose resized
    box is thinner than min_box_px are dropped (their masks go through ``resize_masks``). deferred (a list): the
    colour draws are appended to it instead of applied, and the image is returned resized but neither distorted nor
    normalized, as uint8 (``batches.finish_images`` does both later, batched, on the device): torch's uint8 resize
    is faster than the float one, a quarter of the bytes go between processes and to a GPU, and it differs
    from the rounded float resize by at most one level (its fixed-point weights). RGBX pixels go to it as they are
    (it works on 4-byte pixels: no unpacking of 3-byte ones and packing back; each channel is resized on its own,
    so R, G and B are those of an RGB image) and the padding channel is dropped from its output."""
    height, width = pixels.shape[:2]
    if deferred is None:
        pixels = np.ascontiguousarray(pixels[..., :3], dtype=np.float32)
    else:
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    image = resize_bilinear(torch.from_numpy(pixels).permute(2, 0, 1)[None], (size, size))[0, :3]
    if deferred is not None:
        deferred.append(photometric.draw(rng) if distort else photometric.PhotometricDraw())
    else:
        if distort:
            distorted = photometric_distort(image.permute(1, 2, 0).numpy(), rng)
            image = torch.from_numpy(np.ascontiguousarray(distorted)).permute(2, 0, 1)
        image = (image - torch.from_numpy(mean_rgb)[:, None, None]) / torch.from_numpy(std_rgb)[:, None, None]
    boxes = torch.from_numpy(np.asarray(boxes, dtype=np.float32).reshape(-1, 4).copy())
    boxes[:, 0::2] /= width
    boxes[:, 1::2] /= height
    boxes = boxes.clamp(0.0, 1.0)
    keep = ((boxes[:, 2] - boxes[:, 0]) * size > min_box_px) & ((boxes[:, 3] - boxes[:, 1]) * size > min_box_px)
    labels = torch.from_numpy(np.asarray(labels, dtype=np.int64).reshape(-1))[keep]
    return image, boxes[keep], labels, keep.numpy()


def resize_masks(masks: np.ndarray, size: int) -> torch.Tensor:
    """[G, h, w] 0/1 -> [G, S, S] float32 (bilinear, align_corners=False, no antialias), from float32 masks."""
    masks = torch.from_numpy(np.ascontiguousarray(masks, dtype=np.float32))
    return resize_bilinear(masks[None], (size, size))[0]


def resized_mask_bits(masks: np.ndarray, size: int, mask_sizes: list[tuple[int, int]]) -> dict:
    """[G, h, w] 0/1 -> {(mh, mw): [G, mh, mw] bool}: ``loss_targets.downsample_bits(resize_masks(masks, size), (mh,
    mw))`` for each of mask_sizes (the values of torch's generic kernel, as ``image_ops.resized_twice_above`` makes
    them), without the [G, S, S] float masks: a third of their pixels are made, the ones the downsamples read."""
    return {
        tuple(map(int, small)): torch.from_numpy(resized_twice_above(masks, (size, size), small, 0.5))
        for small in mask_sizes
    }


# ------------------------------------------------------------------------------------------------ photometric
def photometric_distort(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[H, W, 3] float RGB 0-255 -> distorted float32 (pipelines.training.photometric: draws, then applies them)."""
    return photometric.apply_numpy(image, photometric.draw(rng))


rgb_to_hsv, hsv_to_rgb = photometric.rgb_to_hsv, photometric.hsv_to_rgb


# ------------------------------------------------------------------------------------------------- geometric
def draw_geometry(
    height: int, width: int, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig
) -> Geometry:
    """Expand, random crop and mirror of a height x width source with boxes [G, 4] pixels and labels [G], drawn
    from rng (the reference's draws, in its order); no pixel is touched."""
    boxes = np.asarray(boxes).astype(np.float32)
    objects = np.arange(len(boxes))
    top = left = 0
    if cfg.expand and rng.integers(2) == 0:
        canvas_h, canvas_w, shift_y, shift_x = expand_placement(height, width, rng, cfg.expand_max_ratio)
        top, left, height, width = -shift_y, -shift_x, canvas_h, canvas_w
        boxes = boxes + np.float32([shift_x, shift_y, shift_x, shift_y])
    if cfg.sample_crop and len(boxes):
        found = random_crop(height, width, boxes, rng)
        if found is not None:
            rect, inside = found
            boxes, objects, labels = crop_boxes(boxes, inside, rect), objects[inside], labels[inside]
            rows, cols = range(height)[rect[1] : rect[3]], range(width)[rect[0] : rect[2]]
            top, left, height, width = top + rows.start, left + cols.start, len(rows), len(cols)
    mirror = bool(cfg.mirror and rng.integers(2) == 1)
    if mirror:
        boxes = boxes.copy()
        boxes[:, 0::2] = width - boxes[:, 2::-2]
    return Geometry(top, left, height, width, mirror, objects, boxes, labels)


def expand_placement(height: int, width: int, rng: np.random.Generator, max_ratio: float) -> tuple[int, int, int, int]:
    """The zoom-out canvas, ratio x larger (ratio in [1, max_ratio]): its height, width, and where the image's
    top-left corner goes in it (top, left)."""
    ratio = rng.uniform(1, max_ratio)
    left = int(rng.uniform(0, width * ratio - width))
    top = int(rng.uniform(0, height * ratio - height))
    return int(height * ratio), int(width * ratio), top, left


def random_crop(
    height: int, width: int, boxes: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray] | None:
    """A random window of a height x width image that keeps at least one object centre: (rect [4] int x1y1x2y2,
    inside [G] bool: the objects whose centre it holds); None: the whole image (a draw chose it, or no try
    found one)."""
    for _ in range(CROP_MODE_DRAWS):
        mode = CROP_MODES[int(rng.integers(len(CROP_MODES)))]
        if mode is None:
            return None
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
            if inside.any():
                return rect, inside
    return None


def crop_boxes(boxes: np.ndarray, inside: np.ndarray, rect: np.ndarray) -> np.ndarray:
    """The boxes [G, 4] of the objects inside the crop rect, clipped to it, in its pixels: [G', 4] float32."""
    kept = boxes[inside].copy()
    kept[:, :2] = np.maximum(kept[:, :2], rect[:2]) - rect[:2]
    kept[:, 2:] = np.minimum(kept[:, 2:], rect[2:]) - rect[:2]
    return kept.astype(np.float32)


def fill_value(dtype: np.dtype, mean_rgb: np.ndarray, channels: int = 3) -> np.ndarray:
    """The expand canvas colour in the image's type: the mean colour, rounded for a uint8 image; [channels]: 3, or
    4 for RGBX pixels (``decode_image(shared_memory=True)``), the padding channel 0."""
    colour = np.rint(mean_rgb) if dtype == np.uint8 else mean_rgb
    return np.pad(colour, (0, channels - 3))


def crop_image(image: np.ndarray, geometry: Geometry, fill: np.ndarray) -> np.ndarray:
    """image [H, W, C] -> the geometry's window [height, width, C], mirrored as it is: a new C-contiguous array of
    the image's type (image may be a decoder's read-only buffer); fill [C] where the window leaves the image (the
    expand canvas)."""
    g = geometry
    height, width, channels = image.shape
    if g.within(height, width):
        window = image[g.top : g.top + g.height, g.left : g.left + g.width]
        return flip_columns(window) if g.mirror else np.array(window)
    out = np.empty((g.height, g.width, channels), image.dtype)
    row = np.empty((g.width, channels), image.dtype)
    row[:] = fill
    overlap = g.overlap(height, width)
    if overlap is None:
        out[:] = row
        return out
    (source_rows, source_cols), (rows, cols) = overlap
    fill_outside(out, rows, cols, row)
    part = image[source_rows, source_cols]
    out[rows, cols] = flip_columns(part) if g.mirror else part
    return out


def crop_masks(masks: np.ndarray, geometry: Geometry) -> np.ndarray:
    """masks [G', H, W] of the source's kept objects (geometry.objects, in order) -> [G', height, width] in the
    geometry's window, mirrored as it is (the masks' type, 0 where the window leaves the image)."""
    window = np.zeros((len(masks), geometry.height, geometry.width), masks.dtype)
    overlap = geometry.overlap(*masks.shape[1:])
    if overlap is not None and len(masks):
        (source_rows, source_cols), (rows, cols) = overlap
        part = masks[:, source_rows, source_cols]
        window[:, rows, cols] = part[:, :, ::-1] if geometry.mirror else part
    return window


def fill_outside(array: np.ndarray, rows: slice, cols: slice, row: np.ndarray) -> None:
    """Set array [h, w, ...] outside array[rows, cols] to row [w, ...] (each row of it: one pattern copied)."""
    array[: rows.start] = row
    array[rows.stop :] = row
    array[rows, : cols.start] = row[: cols.start]
    array[rows, cols.stop :] = row[cols.stop :]


def flip_columns(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of array [h, w, ...] (positive strides) with its columns reversed: 4-byte pixels (RGBX
    uint8 [h, w, 4], read-only ones too) as one uint32 each in numpy, others with torch's flip (several times faster
    than numpy's copy of a reversed view of 3-byte pixels)."""
    if array.dtype == np.uint8 and array.shape[2:] == (4,):
        return np.ascontiguousarray(array.view(np.uint32)[:, ::-1]).view(np.uint8)
    return torch.from_numpy(array).flip(1).contiguous().numpy()
