"""``batches.window_masks`` (compiled_loops.rle_window: COCO compressed RLEs decoded straight into the augmentation
window) equals decoding each mask full size with pycocotools and cropping and mirroring it (``augment.crop_masks``):
windows inside the image, on each border, past it (the expand canvas) and off it, mirrored or not; empty and full
masks, 1x1, 1xN and Nx1 images, many objects, random masks and rectangles (long runs across columns)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from pipelines.training.augment import Geometry, crop_masks
from pipelines.training.batches import window_masks


def reference(rles: list[str], objects: np.ndarray, height: int, width: int, g: Geometry) -> np.ndarray:
    """The previous window_masks: every kept mask decoded full size, then cropped and mirrored."""
    if not len(objects):
        return np.zeros((0, g.height, g.width), np.uint8)
    decoded = mask_utils.decode([{"size": [height, width], "counts": rles[obj].encode("ascii")} for obj in objects])
    return crop_masks(np.moveaxis(decoded, 2, 0), g)


def rles_of(masks: np.ndarray) -> list[str]:
    return [mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))["counts"].decode("ascii") for m in masks]


def geometry(top: int, left: int, height: int, width: int, mirror: bool, objects: np.ndarray) -> Geometry:
    return Geometry(top, left, height, width, mirror, objects, np.zeros((len(objects), 4), np.float32), objects)


def check(masks: np.ndarray, windows, objects: np.ndarray | None = None) -> None:
    height, width = masks.shape[1:]
    rles = rles_of(masks)
    objects = np.arange(len(masks)) if objects is None else objects
    for (top, left, h, w), mirror in itertools.product(windows, (False, True)):
        g = geometry(top, left, h, w, mirror, objects)
        got, expected = window_masks(rles, objects, height, width, g), reference(rles, objects, height, width, g)
        assert got.dtype == np.uint8 and got.flags.c_contiguous, (top, left, h, w, mirror)
        assert got.shape == expected.shape and np.array_equal(got, expected), (top, left, h, w, mirror)


def border_windows(height: int, width: int) -> list[tuple[int, int, int, int]]:
    """Windows whose edges fall before, on and past each border of the image, and inside it."""
    rows = sorted({-3, -1, 0, 1, height // 2, height - 1, height, height + 2})
    cols = sorted({-3, -1, 0, 1, width // 2, width - 1, width, width + 2})
    return [
        (t, left, b - t, r - left)
        for t, b in itertools.combinations(rows, 2)
        for left, r in itertools.combinations(cols, 2)
    ]


def hand_made(height: int, width: int) -> np.ndarray:
    """Empty, full, each corner pixel, first and last row and column, a centre block, a checkerboard."""
    masks = np.zeros((12, height, width), np.uint8)
    masks[1] = 1
    masks[2, 0, 0] = masks[3, 0, -1] = masks[4, -1, 0] = masks[5, -1, -1] = 1
    masks[6, 0] = 1
    masks[7, -1] = 1
    masks[8, :, 0] = 1
    masks[9, :, -1] = 1
    masks[10, height // 4 : height - height // 4, width // 4 : width - width // 4] = 1
    masks[11] = (np.arange(height)[:, None] + np.arange(width)) % 2
    return masks


@pytest.mark.parametrize("height, width", [(1, 1), (1, 7), (7, 1), (1, 40), (40, 1), (2, 3), (9, 13), (16, 16)])
def test_hand_made_masks_in_windows_on_every_border(height, width):
    check(hand_made(height, width), border_windows(height, width))


@pytest.mark.parametrize("height, width", [(1, 1), (1, 9), (9, 1), (23, 31), (48, 64)])
def test_random_masks(height, width):
    rng = np.random.default_rng(height * 100 + width)
    masks = np.concatenate([rng.random((4, height, width)) < p for p in (0.02, 0.3, 0.7, 0.98)]).astype(np.uint8)
    check(masks, border_windows(height, width))
    kept = rng.permutation(len(masks))[:5]  # some objects, out of order
    check(masks, border_windows(height, width), kept)


def test_rectangles_and_many_objects_full_size():
    """A 480 x 640 image (counts of several 5-bit groups, negative differences), 60 objects: rectangles (runs that
    span whole columns and end mid-column), random blobs, empty and full; random windows of all kinds."""
    rng = np.random.default_rng(7)
    height, width = 480, 640
    masks = np.zeros((60, height, width), np.uint8)
    for m in masks[:40]:
        y0, x0 = rng.integers(0, height), rng.integers(0, width)
        m[y0 : y0 + rng.integers(1, height), x0 : x0 + rng.integers(1, width)] = 1
    masks[40:55] = rng.random((15, height, width)) < rng.random((15, 1, 1))
    masks[55] = 1
    masks[56, :, 100:300] = 1  # whole columns
    masks[57, 5, :] = 1  # one row
    windows = [
        (0, 0, height, width),
        (-100, -150, 700, 900),
        (-100, 200, 300, 600),
        (300, -50, 250, 200),
        (479, 639, 1, 1),
        (0, 639, 480, 1),
        (479, 0, 1, 640),
        (height, 0, 5, 5),
        (0, -10, 10, 10),
    ]
    for _ in range(12):
        top, left = int(rng.integers(-300, height)), int(rng.integers(-400, width))
        windows.append((top, left, int(rng.integers(1, 800)), int(rng.integers(1, 1000))))
    check(masks, windows)
    check(masks, windows[:3], np.array([59, 3, 55, 3]))  # an object twice


def test_no_objects_and_empty_windows():
    masks = hand_made(5, 6)
    check(masks, [(0, 0, 5, 6), (-2, -2, 9, 10), (1, 1, 0, 3), (1, 1, 3, 0)], np.zeros(0, np.int64))
    check(masks, [(1, 1, 0, 3), (1, 1, 3, 0), (0, 0, 0, 0)])
