"""Bilinear resampling that matches ``torch.nn.functional.interpolate``.

Matches ``mode='bilinear', align_corners=False, antialias=False`` with ``size=`` given (no scale factor): the same
float32 source-index arithmetic and the same operation order as torch's generic CPU kernel (interpolate along the
width, then along the height; torch's vectorized kernels round differently, by a few ulps). The tables (which source
pixels, which weights) are built here in numpy; the
per-pixel loop is `compiled_loops.resample`, which reads only the source rows the output needs.
"""

from __future__ import annotations

import functools

import numpy as np

from pipelines.ops import compiled_loops

AxisTable = tuple[np.ndarray, np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=1024)
def bilinear_axis(in_size: int, out_size: int) -> AxisTable:
    """Source pixels and weights of one axis of a bilinear resize (align_corners=False, torch's float32 math).

    Returns ``i0, i1`` ([out_size] int64 source indices, ``i0 <= i1 <= i0 + 1``, both non-decreasing) and ``w1``
    ([out_size] float32 weight of ``i1``; the weight of ``i0`` is ``1 - w1`` in float32). Cached (never write to
    them): an executor's images mostly share a few sizes, and the tables' numpy calls cost more per image than
    the lookup.
    """
    in_size, out_size = int(in_size), int(out_size)
    if in_size < 1 or out_size < 1:
        raise ValueError(f"bilinear_axis: sizes must be >= 1, got in_size={in_size}, out_size={out_size}")
    if in_size == out_size:  # torch copies: lambda0 = 1, lambda1 = 0
        same = np.arange(out_size, dtype=np.int64)
        return same, same.copy(), np.zeros(out_size, dtype=np.float32)
    scale = np.float32(in_size) / np.float32(out_size)
    # torch computes scale * (dst + 0.5) - 0.5 as one fused multiply-add in float32 (one rounding). The float64
    # product of two float32 values is exact, so rounding the float64 result once to float32 gives the same value.
    dst = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
    src = (np.float64(scale) * dst.astype(np.float64) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    w1 = np.clip(src - i0.astype(np.float32), np.float32(0), np.float32(1)).astype(np.float32)
    i1 = i0 + (i0 < in_size - 1)
    return i0, i1, w1


def resize_bilinear(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize over the first two axes like torch ``F.interpolate(bilinear, align_corners=False)``.

    x: [H, W] or [H, W, C], any numeric dtype (read as float32). size: (height, width) of the output.
    Returns float32 [height, width(, C)].
    """
    x, height, width = _resize_source(x, size, "resize_bilinear", (2, 3))
    trailing = x.shape[2:]
    channels = int(np.prod(trailing)) if trailing else 1
    flat = x.reshape(x.shape[0], x.shape[1] * channels)  # [H, W * C]: a view
    out = np.empty((height, width * channels), dtype=np.float32)
    compiled_loops.resample(
        flat, *bilinear_axis(x.shape[0], height), *channel_columns(bilinear_axis(x.shape[1], width), channels), out
    )
    return out.reshape((height, width) + trailing)


def resize_normalized_planes(
    x: np.ndarray, size: tuple[int, int], channels: tuple[int, ...], mean: np.ndarray, std: np.ndarray
) -> np.ndarray:
    """``(resize_bilinear(x, size)[..., channels] - mean) / std`` as planes, in one pass: x [H, W, C] (read as
    float32); channels: which of x's channels make the output planes, in order (e.g. (2, 1, 0) for BGR from RGB; a
    channel not named is never resampled); mean, std: one float32 per output plane. Returns float32
    [len(channels), height, width], equal bit for bit to the resize followed by numpy's subtraction and division."""
    x, height, width = _resize_source(x, size, "resize_normalized_planes", (3,))
    if not channels or min(channels) < 0 or max(channels) >= x.shape[2]:
        raise ValueError(f"resize_normalized_planes: channels {channels} must name channels of x's {x.shape[2]}")
    mean = np.ascontiguousarray(mean, dtype=np.float32).reshape(len(channels))
    std = np.ascontiguousarray(std, dtype=np.float32).reshape(len(channels))
    flat = x.reshape(x.shape[0], -1)  # [H, W * C]: a view
    out = np.empty((len(channels), height, width), dtype=np.float32)
    compiled_loops.resample_planes(
        flat,
        *bilinear_axis(x.shape[0], height),
        *_plane_table(x.shape[1], width, x.shape[2], tuple(int(c) for c in channels)),
        mean,
        std,
        out,
    )
    return out


def resized_twice_above(x: np.ndarray, middle: tuple[int, int], size: tuple[int, int], threshold: float) -> np.ndarray:
    """``resize_bilinear(resize_bilinear(plane, middle), size) > threshold`` for each plane of x (the values of
    torch's generic kernel, twice), without the middle images: only their pixels that the second resize reads are
    made (a downsample reads at most two rows and two columns per output pixel: a quarter of the middle image for a
    factor of 4). x: [N, H, W] uint8 or float32 (0/1 masks at the augmentation window's size); returns bool
    [N, *size]."""
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"resized_twice_above: x must be [N, H, W], got shape {x.shape}")
    out = np.empty((x.shape[0], int(size[0]), int(size[1])), dtype=np.bool_)
    if x.shape[0] == 0:
        return out
    x, height, width = _resize_source(x.reshape(-1, x.shape[2]), size, "resized_twice_above", (2,))
    x = x.reshape(out.shape[0], -1, x.shape[1])
    rows_out, rows_mid = _through_middle(x.shape[1], int(middle[0]), height)
    cols_out, cols_mid = _through_middle(x.shape[2], int(middle[1]), width)
    made = np.empty((rows_mid[0].shape[0], cols_mid[0].shape[0]), dtype=np.float32)
    limit = np.float32(threshold)
    for plane, target in zip(x, out):
        compiled_loops.resample(plane, *rows_mid, *cols_mid, made)
        compiled_loops.resample_above(made, *rows_out, *cols_out, limit, target)
    return out


@functools.lru_cache(maxsize=4096)
def _through_middle(in_size: int, middle: int, out_size: int) -> tuple[AxisTable, AxisTable]:
    """One axis of two resizes in a row, in_size -> middle -> out_size: (the second's table with its indices into
    the middle pixels it reads, the first's table cut to those pixels), both still non-decreasing. Cached: the
    tables' numpy work costs more than the kernels for the few masks of an image (never write to them)."""
    i0, i1, w1 = bilinear_axis(middle, out_size)
    needed = np.unique(np.concatenate([i0, i1]))
    return (
        (np.searchsorted(needed, i0), np.searchsorted(needed, i1), w1),
        tuple(part[needed] for part in bilinear_axis(in_size, middle)),
    )


def _resize_source(
    x: np.ndarray, size: tuple[int, int], caller: str, ndims: tuple[int, ...]
) -> tuple[np.ndarray, int, int]:
    """(x as the resize kernels read it: C-contiguous uint8 or float32, other dtypes cast to float32; the output
    height; its width), or a ValueError naming the caller when x is empty or has another number of axes than ndims,
    or size is not (height, width) with both >= 1."""
    x = np.asarray(x)
    if x.ndim not in ndims or x.shape[0] < 1 or x.shape[1] < 1:
        shapes = " or ".join(("[H, W]", "[H, W, C]")[n - 2] for n in ndims)
        raise ValueError(f"{caller}: x must be a non-empty {shapes} array, got shape {x.shape}")
    if len(size) != 2 or int(size[0]) < 1 or int(size[1]) < 1:
        raise ValueError(f"{caller}: size must be (height, width) with both >= 1, got {size!r}")
    if x.dtype not in (np.uint8, np.float32):
        x = x.astype(np.float32)  # what the resize reads anyway; the kernels are compiled for uint8 and float32
    return np.ascontiguousarray(x), int(size[0]), int(size[1])


@functools.lru_cache(maxsize=1024)
def _plane_table(in_size: int, out_size: int, channels: int, picks: tuple[int, ...]) -> AxisTable:
    """plane_columns of bilinear_axis(in_size, out_size), cached as bilinear_axis is (never write to it)."""
    return plane_columns(bilinear_axis(in_size, out_size), channels, picks)


def plane_columns(cols: AxisTable, channels: int, picks: tuple[int, ...]) -> AxisTable:
    """An axis table of pixel columns -> the columns of a [H, W * channels] view (interleaved channels) that make
    planes of the channels `picks`, plane-major: all of the first pick's columns, then the second's, ..."""
    i0, i1, w1 = cols
    planes = np.asarray(picks, dtype=np.int64)[:, None]
    return ((i0 * channels + planes).ravel(), (i1 * channels + planes).ravel(), np.tile(w1, len(planes)))


def channel_columns(cols: AxisTable, channels: int) -> AxisTable:
    """An axis table of pixel columns -> the same for the columns of a [H, W * channels] view (interleaved
    channels): source index i becomes i * channels + c, each weight repeated per channel."""
    if channels == 1:
        return cols
    i0, i1, w1 = cols
    offsets = np.arange(channels, dtype=np.int64)
    return (
        (i0[:, None] * channels + offsets).ravel(),
        (i1[:, None] * channels + offsets).ravel(),
        np.repeat(w1, channels),
    )
