"""Shapes of the synthetic road-distress instances, as COCO polygons, and small binary morphology.

Polygon coordinates are pixels with pixel ``(row i, column j)`` centred at ``(j + 0.5, i + 0.5)``, the convention
pycocotools rasterizes with. Vertices are rounded to 2 decimals so the polygons written to JSON are exactly the ones
that were rasterized and painted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DECIMALS = 2


@dataclass(frozen=True)
class Blob:
    """An irregular star-shaped outline: an ellipse (``radii`` along its own axes, turned by ``angle`` radians)
    whose radius is scaled by ``1 + sum(amplitude * cos(k * theta + phase))`` over the ``harmonics`` rows."""

    center: tuple[float, float]
    radii: tuple[float, float]
    angle: float
    harmonics: np.ndarray  # [K, 3] rows of (k, amplitude, phase)

    def radius_scale(self, theta: np.ndarray) -> np.ndarray:
        k, amplitude, phase = (self.harmonics[:, i, None] for i in range(3))
        return 1.0 + (amplitude * np.cos(k * theta[None, :] + phase)).sum(axis=0)

    def polygon(self, points: int = 64) -> list[float]:
        """The outline as a flat ``[x0, y0, x1, y1, ...]``."""
        theta = np.linspace(0.0, 2.0 * np.pi, points, endpoint=False)
        r = self.radius_scale(theta)
        u, v = self.radii[0] * r * np.cos(theta), self.radii[1] * r * np.sin(theta)
        xy = _rotate(np.stack([u, v], axis=1), self.angle) + np.asarray(self.center)
        return _flat(xy)

    def normalized_radius(self, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """rho: same shape as ``xs``; 0 at the centre, 1 on the outline, > 1 outside."""
        local = _rotate(np.stack([xs.ravel() - self.center[0], ys.ravel() - self.center[1]], axis=1), -self.angle)
        u, v = local[:, 0] / self.radii[0], local[:, 1] / self.radii[1]
        rho = np.hypot(u, v) / self.radius_scale(np.arctan2(v, u))
        return rho.reshape(xs.shape)

    @property
    def reach(self) -> float:
        """An upper bound of the distance from the centre to the outline, pixels."""
        return max(self.radii) * (1.0 + float(np.abs(self.harmonics[:, 1]).sum()))


def random_blob(
    rng: np.random.Generator, center: tuple[float, float], radius: float, aspect: float, roughness: float
) -> Blob:
    """A blob of mean ``radius`` px, axis ratio ``aspect`` >= 1 and outline wobble ``roughness`` (sum of harmonic
    amplitudes, < 0.5 keeps it star-shaped)."""
    ks = np.arange(2, 7, dtype=np.float64)
    amplitudes = rng.dirichlet(np.ones(len(ks)) * 0.8) * roughness
    phases = rng.uniform(0.0, 2.0 * np.pi, len(ks))
    a = radius * np.sqrt(aspect)
    return Blob(
        center=center,
        radii=(a, radius / np.sqrt(aspect)),
        angle=float(rng.uniform(0.0, np.pi)),
        harmonics=np.stack([ks, amplitudes, phases], axis=1),
    )


def patch_polygon(
    rng: np.random.Generator,
    center: tuple[float, float],
    half_size: tuple[float, float],
    angle: float,
    wobble: float,
    points_per_edge: int = 6,
) -> list[float]:
    """A rectangle-ish outline: ``half_size`` (half width, half height) px turned by ``angle`` radians, every edge
    point moved by up to ``wobble`` px."""
    hw, hh = half_size
    corners = np.array([[-hw, -hh], [hw, -hh], [hw, hh], [-hw, hh]])
    t = np.linspace(0.0, 1.0, points_per_edge, endpoint=False)[:, None]
    edges = [corners[i] + t * (corners[(i + 1) % 4] - corners[i]) for i in range(4)]
    local = np.concatenate(edges, axis=0) + rng.uniform(-wobble, wobble, (4 * points_per_edge, 2))
    return _flat(_rotate(local, angle) + np.asarray(center))


def random_walk(
    rng: np.random.Generator,
    start: np.ndarray,
    heading: float,
    length: float,
    step: float,
    free: np.ndarray,
    turn_sigma: float = 0.3,
    max_bend: float = 0.9,
) -> np.ndarray:
    """points: [n, 2] x, y of a wandering line of about ``length`` px from ``start``.

    It stops early where the next step would leave the image or cross a pixel that is not ``free`` ([H, W] bool).
    ``max_bend``: the heading stays within this many radians of the first one.
    """
    height, width = free.shape
    points = [np.asarray(start, dtype=np.float64)]
    drift = 0.0
    for _ in range(max(1, int(length / step))):
        drift = float(np.clip(drift + rng.normal(0.0, turn_sigma), -max_bend, max_bend))
        direction = np.array([np.cos(heading + drift), np.sin(heading + drift)])
        nxt = points[-1] + direction * step * rng.uniform(0.7, 1.3)
        if not (2.0 <= nxt[0] <= width - 2.0 and 2.0 <= nxt[1] <= height - 2.0):
            break
        if not _segment_free(points[-1], nxt, free):
            break
        points.append(nxt)
    return np.stack(points)


def ribbon_polygon(points: np.ndarray, half_widths: np.ndarray) -> list[float]:
    """The polyline ``points`` [n, 2] widened by ``half_widths`` [n] px on each side (mitred joints), as one
    polygon: the line dilated to a band."""
    if len(points) < 2:
        raise ValueError("a ribbon needs at least 2 points")
    seg = np.diff(points, axis=0)
    seg /= np.maximum(np.linalg.norm(seg, axis=1, keepdims=True), 1e-9)
    seg_normals = np.stack([-seg[:, 1], seg[:, 0]], axis=1)
    normals = np.concatenate([seg_normals[:1], seg_normals[:-1] + seg_normals[1:], seg_normals[-1:]], axis=0)
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-9)
    # Mitre: keep the band's width at the joints (capped for sharp turns).
    cos_half = np.ones(len(points))
    cos_half[1:-1] = np.abs((normals[1:-1] * seg_normals[:-1]).sum(axis=1))
    offsets = normals * (half_widths / np.maximum(cos_half, 0.5))[:, None]
    outline = np.concatenate([points + offsets, (points - offsets)[::-1]], axis=0)
    return _flat(outline)


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """[H, W] bool grown by a (2 radius + 1)^2 square; nothing outside the array counts."""
    out = mask.copy()
    for axis in (0, 1):
        src = out.copy()
        for s in range(1, radius + 1):
            if axis == 0:
                out[s:] |= src[:-s]
                out[:-s] |= src[s:]
            else:
                out[:, s:] |= src[:, :-s]
                out[:, :-s] |= src[:, s:]
    return out


def erode(mask: np.ndarray, radius: int) -> np.ndarray:
    """[H, W] bool shrunk by a (2 radius + 1)^2 square; pixels outside the array count as background."""
    padded = np.pad(mask, radius, constant_values=False)
    return ~dilate(~padded, radius)[radius : -radius or None, radius : -radius or None]


def _segment_free(p: np.ndarray, q: np.ndarray, free: np.ndarray) -> bool:
    n = int(np.ceil(np.linalg.norm(q - p))) + 1
    xs = np.linspace(p[0], q[0], n).astype(np.int64)
    ys = np.linspace(p[1], q[1], n).astype(np.int64)
    return bool(free[ys, xs].all())


def _rotate(xy: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return xy @ np.array([[c, s], [-s, c]])


def _flat(xy: np.ndarray) -> list[float]:
    return [float(v) for v in np.round(xy, DECIMALS).ravel()]
