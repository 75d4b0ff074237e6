"""Paint synthetic asphalt and road-distress instances into a float canvas ([H, W, 3], 0..255, RGB).

Every ``paint_*`` function changes exactly the pixels of the mask it is given ([H, W] bool) and no others, so an
instance's mask is precisely what was painted.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from pipelines.datasets.road_geometry import Blob, erode

Window = tuple[slice, slice]


def smooth_noise(rng: np.random.Generator, height: int, width: int, cell: float) -> np.ndarray:
    """noise: [height, width] float32, about unit spread, varying over ``cell`` px (bicubic upsampled grid)."""
    cell = max(float(cell), 1.0)
    grid = rng.standard_normal((int(height / cell) + 3, int(width / cell) + 3), dtype=np.float32)
    up = np.asarray(Image.fromarray(grid).resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
    return up / max(float(up.std()), 1e-6)


def gauss(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    """Zero-mean normal noise of spread ``sigma``: float32 array of ``shape``."""
    noise = rng.standard_normal(shape, dtype=np.float32)
    noise *= np.float32(sigma)
    return noise


def asphalt(rng: np.random.Generator, height: int, width: int) -> tuple[np.ndarray, float]:
    """(canvas [H, W, 3] float32, tone): grey aggregate texture around the mean grey level ``tone``."""
    tone = float(rng.uniform(78.0, 128.0))
    tint = (1.0 + rng.uniform(-0.035, 0.035, 3)).astype(np.float32)
    grey = tone + 7.0 * smooth_noise(rng, height, width, max(height, width) / 5.0)
    grey += 4.0 * smooth_noise(rng, height, width, 10.0)
    grey += gauss(rng, (height, width), 8.0)
    stones = rng.random((height, width), dtype=np.float32)
    grey[stones < 0.012] += np.float32(rng.uniform(18.0, 40.0))
    grey[stones > 0.992] -= np.float32(22.0)
    return grey[..., None] * tint, tone


def paint_lane_marking(canvas: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> None:
    """Worn white or yellow road paint (background, not an instance)."""
    window, m = _local(mask)
    h, w = m.shape
    colour = np.array([222.0, 222.0, 214.0] if rng.random() < 0.6 else [214.0, 178.0, 62.0], dtype=np.float32)
    wear = 0.88 + 0.07 * smooth_noise(rng, h, w, 6.0)
    local = colour * wear[..., None] + gauss(rng, (h, w, 1), 6.0)
    _put(canvas, window, m, local)


def paint_pothole(canvas: np.ndarray, mask: np.ndarray, blob: Blob, rng: np.random.Generator, tone: float) -> None:
    """A dark hole, darkest at the centre, with gravel specks and a lighter broken rim along the outline."""
    window, m = _local(mask)
    gx, gy = _pixel_centres(window)
    rho = np.clip(blob.normalized_radius(gx, gy), 0.0, 1.0)
    theta = np.arctan2(gy - blob.center[1], gx - blob.center[0])
    rim_start = rng.uniform(0.74, 0.84) + 0.05 * np.cos(3.0 * theta + rng.uniform(0.0, 2.0 * np.pi))
    h, w = m.shape
    inner = tone * rng.uniform(0.3, 0.45) * (0.7 + 0.5 * rho**2) + gauss(rng, (h, w), 9.0)
    inner += np.where(rng.random((h, w)) < 0.04, rng.uniform(15.0, 35.0), 0.0)
    rim = tone * rng.uniform(1.08, 1.3) + gauss(rng, (h, w), 10.0)
    grey = np.where(rho >= rim_start, rim, inner).astype(np.float32)
    _put(canvas, window, m, grey[..., None] * np.array([1.05, 1.0, 0.93], dtype=np.float32))


def paint_patch(canvas: np.ndarray, mask: np.ndarray, rng: np.random.Generator, tone: float) -> None:
    """Newer (darker) or older (lighter) asphalt of its own finer texture, sealed by a dark tar seam."""
    window, m = _local(mask)
    h, w = m.shape
    fresh = rng.random() < 0.6
    level = tone * (rng.uniform(0.66, 0.82) if fresh else rng.uniform(1.15, 1.3))
    grey = level + 3.0 * smooth_noise(rng, h, w, 8.0) + gauss(rng, (h, w), 5.0 if fresh else 7.0)
    seam = m & ~erode(m, int(rng.integers(2, 5)))
    grey = np.where(seam, rng.uniform(28.0, 45.0) + gauss(rng, (h, w), 5.0), grey).astype(np.float32)
    tint = (1.0 + rng.uniform(-0.02, 0.02, 3)).astype(np.float32)
    _put(canvas, window, m, grey[..., None] * tint)


def paint_puddle(canvas: np.ndarray, mask: np.ndarray, blob: Blob, rng: np.random.Generator) -> None:
    """Smooth blue-grey water reflecting a sky gradient, with a darker wet edge."""
    window, m = _local(mask)
    gx, gy = _pixel_centres(window)
    h, w = m.shape
    direction = rng.uniform(0.0, 2.0 * np.pi)
    along = ((gx - blob.center[0]) * np.cos(direction) + (gy - blob.center[1]) * np.sin(direction)) / blob.reach
    sky = 22.0 * along + 9.0 * smooth_noise(rng, h, w, max(6.0, blob.reach / 3.0))
    base = np.array([108.0, 120.0, 138.0], dtype=np.float32) * rng.uniform(0.82, 1.15)
    colour = base + sky[..., None] * np.array([1.0, 1.0, 1.1], dtype=np.float32)
    colour += gauss(rng, (h, w, 1), 1.5)
    edge = m & ~erode(m, 2)
    colour = np.where(edge[..., None], colour * 0.72, colour)
    _put(canvas, window, m, colour.astype(np.float32))


def paint_crack(canvas: np.ndarray, mask: np.ndarray, rng: np.random.Generator, tone: float) -> None:
    """A dark line, darker along its core."""
    window, m = _local(mask)
    h, w = m.shape
    grey = tone * rng.uniform(0.42, 0.55) + gauss(rng, (h, w), 5.0)
    core = erode(m, 1)
    grey = np.where(core, tone * rng.uniform(0.18, 0.3) + gauss(rng, (h, w), 4.0), grey)
    _put(canvas, window, m, np.repeat(grey.astype(np.float32)[..., None], 3, axis=2))


def to_uint8(canvas: np.ndarray) -> np.ndarray:
    """image: [H, W, 3] uint8, rounded and clipped."""
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def _local(mask: np.ndarray) -> tuple[Window, np.ndarray]:
    """The tight window around the mask and the mask inside it."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if len(rows) == 0:
        raise ValueError("cannot paint an empty mask")
    window = (slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
    return window, mask[window]


def _pixel_centres(window: Window) -> tuple[np.ndarray, np.ndarray]:
    ys = np.arange(window[0].start, window[0].stop, dtype=np.float64) + 0.5
    xs = np.arange(window[1].start, window[1].stop, dtype=np.float64) + 0.5
    return np.meshgrid(xs, ys)


def _put(canvas: np.ndarray, window: Window, m: np.ndarray, local: np.ndarray) -> None:
    region = canvas[window]
    region[m] = local[m]
