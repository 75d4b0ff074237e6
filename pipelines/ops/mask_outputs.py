"""Instance masks as outputs: COCO RLE per instance, and one PNG label map per image.

RLE is pycocotools' compressed format (column-major), with `counts` as str so it fits a JSON/Parquet string
column: {"size": [H, W], "counts": "..."}.

A label map is [H, W] with 0 = background and i = instance i (1-based, in the order given, which is score
descending). Where instances overlap, the higher-scoring one wins (on equal scores, the earlier one). It is uint8
when there are fewer than 256 instances, else uint16, and is stored as an 8-bit or 16-bit grayscale PNG.
`LabelMapBuilder` builds one mask at a time, so a caller never holds all of an image's masks at once.

Box-local masks (a bool window at (top, left) of an otherwise empty image, what the executors produce) are encoded
and painted without a full-size mask: `encode_rle_box` builds the column-major runs of the full image arithmetically
(the zeros outside the window are never materialized) and gives the same bytes as `pycocotools.mask.encode` of the
full-size mask; `LabelMapBuilder.add_box` paints only the window. The executors do both for all of an image's masks
in one compiled call (`yolact_postprocess.MaskBlocks.encode` into `LabelMapBuilder.reserve`'s labels) and compress
the counts with `encode_rle_counts`: the same bytes and pixels. Label-map PNGs are deflated by zlib-ng (the same
format as zlib's, faster at level 1 with the run-length strategy).
"""

from __future__ import annotations

import binascii
import io
import struct
from collections.abc import Iterable, Sequence

import numpy as np
from PIL import Image
from pycocotools import mask as coco_mask
from zlib_ng import zlib_ng

from pipelines.ops import compiled_loops

MAX_INSTANCES = 65535  # labels must fit a 16-bit PNG
PNG_COMPRESS_LEVEL = 1  # zlib level of label-map and overlay PNGs: faster than Pillow's default 6


def encode_rle(mask: np.ndarray) -> dict:
    """bool (or 0/1 integer) [H, W] -> {"size": [H, W], "counts": str} (COCO compressed RLE)."""
    binary = _as_binary_mask(mask)
    rle = coco_mask.encode(np.asfortranarray(binary.astype(np.uint8)))
    return {"size": [int(rle["size"][0]), int(rle["size"][1])], "counts": rle["counts"].decode("ascii")}


def encode_rle_box(mask: np.ndarray, top: int, left: int, height: int, width: int) -> dict:
    """A box-local bool mask [h, w] placed at (top, left) in an all-False [height, width] image -> the COCO RLE of
    that full-size image, equal byte for byte to `encode_rle` of it. Cost grows with h * w, not height * width."""
    counts = rle_counts_box(mask, top, left, height, width)
    rle = coco_mask.frPyObjects({"size": [height, width], "counts": counts}, height, width)
    return {"size": [int(height), int(width)], "counts": rle["counts"].decode("ascii")}


def encode_rle_counts(counts: np.ndarray, ends: np.ndarray, height: int, width: int) -> list[dict]:
    """Uncompressed COCO counts of several masks of a [height, width] image, one after another (mask i's end at
    ends[i]: compiled_loops.encode_masks) -> their RLEs as `encode_rle_box` gives them, compressed in one call."""
    if len(ends) == 0:
        return []
    bounds = [0, *ends.tolist()]  # slices, not np.split: its per-piece swapaxes calls cost more than the slicing
    pieces = [counts[start:stop] for start, stop in zip(bounds, bounds[1:])]
    rles = coco_mask.frPyObjects([{"size": [height, width], "counts": piece} for piece in pieces], height, width)
    return [{"size": [int(height), int(width)], "counts": rle["counts"].decode("ascii")} for rle in rles]


def rle_counts_box(mask: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """Uncompressed COCO counts (uint32 [k]) of a box-local mask placed in a [height, width] image.

    Column-major runs, starting with a (possibly empty) run of zeros, no trailing empty run, as pycocotools'
    rleEncode (compiled_loops.rle_counts).
    """
    binary = _as_binary_mask(mask)
    h, w = binary.shape
    top, left, height, width = int(top), int(left), int(height), int(width)
    if height < 1 or width < 1:
        raise ValueError(f"image size must be at least 1x1, got height={height}, width={width}")
    if h and w and (top < 0 or left < 0 or top + h > height or left + w > width):
        raise ValueError(f"box mask {h}x{w} at (top={top}, left={left}) does not fit a {height}x{width} image")
    return compiled_loops.rle_counts(binary, top, left, height, width)


def decode_rle(rle: dict) -> np.ndarray:
    """COCO RLE (compressed counts as str or bytes, or uncompressed counts as a list) -> bool [H, W]."""
    height, width = (int(value) for value in rle["size"])
    counts = rle["counts"]
    if isinstance(counts, list):
        coco_rle = coco_mask.frPyObjects({"size": [height, width], "counts": counts}, height, width)
    else:
        coco_rle = {"size": [height, width], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
    return coco_mask.decode(coco_rle).astype(bool)


def rle_area(rle: dict) -> int:
    """Number of foreground pixels of a compressed RLE, without decoding it."""
    counts = rle["counts"]
    return int(
        coco_mask.area(
            {"size": list(rle["size"]), "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
        )
    )


class LabelMapBuilder:
    """Paints instance masks into a label map one at a time.

    Call `add(mask)` in score-descending order: the k-th call gets label k and paints only pixels that are still
    background, so higher-scoring instances win overlaps. Pass `score=` to have the order checked.
    """

    def __init__(self, height: int, width: int):
        if height < 1 or width < 1:
            raise ValueError(f"label map size must be at least 1x1, got height={height}, width={width}")
        self.height = height
        self.width = width
        self.count = 0
        self._labels = np.zeros((height, width), np.uint8)
        self._last_score: float | None = None

    def add(self, mask: np.ndarray | dict, score: float | None = None) -> int:
        """Paint the next instance (bool [H, W] or an RLE dict); returns its label."""
        if score is not None:
            if self._last_score is not None and score > self._last_score:
                raise ValueError(
                    f"instance {self.count + 1} has score {score} above the previous "
                    f"{self._last_score}: add masks in score-descending order"
                )
            self._last_score = score
        if self.count + 1 > MAX_INSTANCES:
            raise ValueError(f"more than {MAX_INSTANCES} instances cannot be stored in a 16-bit label map")
        binary = decode_rle(mask) if isinstance(mask, dict) else _as_binary_mask(mask)
        self._check_shape(binary)
        self.count += 1
        if self.count == 256:
            self._labels = self._labels.astype(np.uint16)
        _paint(self._labels, binary, self.count)
        return self.count

    def add_box(self, mask: np.ndarray, top: int, left: int) -> int:
        """Paint the next instance given box-locally: bool [h, w] at (top, left), False elsewhere (no order check
        by score: call in score-descending order). Touches only the window. Returns its label."""
        if self.count + 1 > MAX_INSTANCES:
            raise ValueError(f"more than {MAX_INSTANCES} instances cannot be stored in a 16-bit label map")
        binary = _as_binary_mask(mask)
        h, w = binary.shape
        if h and w and (top < 0 or left < 0 or top + h > self.height or left + w > self.width):
            raise ValueError(
                f"box mask {h}x{w} at (top={top}, left={left}) does not fit the {self.height}x{self.width} label map"
            )
        self.count += 1
        if self.count == 256:
            self._labels = self._labels.astype(np.uint16)
        if h and w:
            _paint(self._labels[top : top + h, left : left + w], binary, self.count)
        return self.count

    def reserve(self, n: int) -> tuple[np.ndarray, int]:
        """Labels for the next n instances, for a caller that paints them itself (compiled_loops.encode_masks):
        (the label map, uint16 if the count reaches 256; first, the first of the n labels). Paint the k-th of them
        (k = 0 .. n - 1) with label first + k, only where the map is still 0, in score-descending order."""
        if self.count + n > MAX_INSTANCES:
            raise ValueError(f"more than {MAX_INSTANCES} instances cannot be stored in a 16-bit label map")
        first = self.count + 1
        self.count += n
        if self.count >= 256 and self._labels.dtype == np.uint8:
            self._labels = self._labels.astype(np.uint16)
        return self._labels, first

    def label_map(self) -> np.ndarray:
        """The labels so far: uint8 [H, W] (fewer than 256 instances) or uint16 [H, W]."""
        return self._labels.copy()

    def png(self) -> bytes:
        return label_map_png(self._labels)

    def _check_shape(self, mask: np.ndarray) -> None:
        if mask.shape != (self.height, self.width):
            raise ValueError(
                f"mask {self.count + 1} is {mask.shape[0]}x{mask.shape[1]} (HxW) but the label map "
                f"is {self.height}x{self.width}: masks must be at the image's resolution"
            )


def label_map(masks: Iterable[np.ndarray], scores: Sequence[float], height: int, width: int) -> np.ndarray:
    """Instance masks (bool [H, W] each) + their scores -> uint8 or uint16 [H, W] label map.

    Label i is the i-th mask as given. Overlaps go to the higher score. If scores are already descending
    (the usual case) masks are consumed one at a time; otherwise they are held to be painted in score order.
    """
    score_values = np.asarray(list(scores), dtype=np.float64).reshape(-1)
    builder = LabelMapBuilder(height, width)
    if np.all(score_values[:-1] >= score_values[1:]):
        for mask in _exactly(masks, len(score_values)):
            builder.add(mask)
        return builder.label_map()
    held = list(_exactly(masks, len(score_values)))
    if len(held) > MAX_INSTANCES:
        raise ValueError(f"more than {MAX_INSTANCES} instances cannot be stored in a 16-bit label map")
    labels = np.zeros((height, width), np.uint8 if len(held) < 256 else np.uint16)
    for index in np.argsort(-score_values, kind="stable"):
        mask = _as_binary_mask(held[index])
        if mask.shape != (height, width):
            raise ValueError(f"mask {index + 1} is {mask.shape} but the label map is {(height, width)}")
        _paint(labels, mask, int(index) + 1)
    return labels


def label_map_png(labels: np.ndarray) -> bytes:
    """uint8 [H, W] -> 8-bit grayscale PNG; uint16 [H, W] -> 16-bit grayscale PNG.

    Written here rather than by Pillow, which runs PNG's adaptive row filtering (all five filters tried on every
    row) with no way to turn it off, slower even at zlib level 0 than rows stored unfiltered (filter type 0) and
    deflated with zlib's run-length strategy, which also suits label maps (long runs of one label) better: smaller
    files than Pillow's at level 1. zlib-ng deflates them faster than zlib into streams of the same size. Any PNG
    reader decodes it.
    """
    if labels.ndim != 2 or labels.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"label map must be uint8 or uint16 [H, W], got {labels.dtype} {labels.shape}")
    height, width = labels.shape
    if height < 1 or width < 1:
        raise ValueError(f"label map must be at least 1x1, got {height}x{width}")
    depth = 8 * labels.dtype.itemsize
    scanlines = np.zeros((height, 1 + width * labels.dtype.itemsize), np.uint8)  # each row: filter byte 0 + row
    scanlines[:, 1:] = labels.astype(">u2", copy=False).view(np.uint8) if depth == 16 else labels
    deflate = zlib_ng.compressobj(PNG_COMPRESS_LEVEL, zlib_ng.DEFLATED, 15, 8, zlib_ng.Z_RLE)
    pixels = deflate.compress(scanlines.data) + deflate.flush()
    header = struct.pack(">IIBBBBB", width, height, depth, 0, 0, 0, 0)  # grayscale, deflate, no interlace
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b"")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", binascii.crc32(data, binascii.crc32(kind)))


def read_label_map_png(data: bytes) -> np.ndarray:
    """A label-map PNG -> uint8 or uint16 [H, W], the dtype as stored."""
    with Image.open(io.BytesIO(data)) as image:
        if image.mode in ("L", "P"):
            return np.array(image, dtype=np.uint8)
        if image.mode.startswith("I;16"):
            return np.array(image).astype(np.uint16)
        if image.mode == "I":  # older Pillow opens 16-bit grayscale PNGs as "I"
            values = np.array(image)
            if values.min() < 0 or values.max() > MAX_INSTANCES:
                raise ValueError(f"label map PNG has values outside 0..{MAX_INSTANCES}")
            return values.astype(np.uint16)
        raise ValueError(f"label map PNG must be 8- or 16-bit grayscale, got Pillow mode {image.mode!r}")


def _paint(labels: np.ndarray, mask: np.ndarray, label: int) -> None:
    """labels[mask & background] = label, in place (labels may be a view: a window of the label map)."""
    compiled_loops.paint(labels, mask, label)


def _as_binary_mask(mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"a mask must be 2-D [H, W], got shape {mask.shape}")
    if mask.dtype == bool:
        return mask
    if np.issubdtype(mask.dtype, np.integer):
        return mask != 0
    raise ValueError(f"a mask must be bool or 0/1 integers, got {mask.dtype}: threshold soft masks first")


def _exactly(masks: Iterable[np.ndarray], count: int) -> Iterable[np.ndarray]:
    """Yields the masks, raising if there are not exactly `count` of them (one per score)."""
    seen = 0
    for mask in masks:
        seen += 1
        if seen > count:
            raise ValueError(f"more masks than scores ({count})")
        yield mask
    if seen != count:
        raise ValueError(f"{seen} masks but {count} scores: give one score per mask")
