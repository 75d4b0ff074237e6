"""Masks through pycocotools: polygons and RLE to binary masks, areas, boxes, IoU.

Every function takes the image ``height, width`` because COCO polygons do not carry it.
"""

from __future__ import annotations

import numpy as np
from pycocotools import mask as mask_utils

from pipelines.datasets.schema import PolygonMask, RleMask, Segmentation


def to_coco_rle(segmentation: Segmentation, height: int, width: int) -> dict:
    """One compressed pycocotools RLE (``{"size": [h, w], "counts": bytes}``) for any segmentation."""
    if isinstance(segmentation, PolygonMask):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation.polygons, height, width))
    if isinstance(segmentation, RleMask):
        size = [int(segmentation.size[0]), int(segmentation.size[1])]
        if isinstance(segmentation.counts, str):
            return {"size": size, "counts": segmentation.counts.encode("ascii")}
        return mask_utils.frPyObjects({"size": size, "counts": list(segmentation.counts)}, size[0], size[1])
    raise TypeError(f"segmentation must be a PolygonMask or an RleMask, got {type(segmentation).__name__}")


def decode_mask(segmentation: Segmentation, height: int, width: int) -> np.ndarray:
    """mask: [height, width] uint8 of 0/1."""
    return mask_utils.decode(to_coco_rle(segmentation, height, width))


def mask_area(segmentation: Segmentation, height: int, width: int) -> int:
    """Number of mask pixels."""
    return int(mask_utils.area(to_coco_rle(segmentation, height, width)))


def mask_box(segmentation: Segmentation, height: int, width: int) -> tuple[float, float, float, float]:
    """Tight ``(x1, y1, x2, y2)`` around the mask pixels (x2 = last column + 1); all zeros for an empty mask."""
    x, y, w, h = (float(v) for v in mask_utils.toBbox(to_coco_rle(segmentation, height, width)))
    return (x, y, x + w, y + h)


def mask_iou(a: Segmentation, b: Segmentation, height: int, width: int) -> float:
    """Intersection over union of two masks of the same image."""
    iou = mask_utils.iou([to_coco_rle(a, height, width)], [to_coco_rle(b, height, width)], [0])
    return float(iou[0, 0])


def rle_from_mask(mask: np.ndarray, compressed: bool = True) -> RleMask:
    """RleMask of a [height, width] boolean/0-1 mask; ``compressed=False`` gives COCO's list-of-counts form."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be [height, width], got shape {mask.shape}")
    binary = np.asfortranarray(mask.astype(np.uint8) != 0, dtype=np.uint8)
    height, width = binary.shape
    if compressed:
        rle = mask_utils.encode(binary)
        return RleMask(size=(height, width), counts=rle["counts"].decode("ascii"))
    return RleMask(size=(height, width), counts=_uncompressed_counts(binary))


def _uncompressed_counts(binary: np.ndarray) -> list[int]:
    """Run lengths over the column-major pixels, starting with a (possibly empty) run of zeros."""
    flat = binary.ravel(order="F")
    if flat.size == 0:
        return [0]
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate(([0], changes, [flat.size]))
    runs = np.diff(bounds).tolist()
    return ([0] + runs) if flat[0] else runs


def polygon_mask(polygons: list[list[float]], height: int, width: int) -> np.ndarray:
    """mask: [height, width] bool, the pycocotools rasterization of the union of the polygons."""
    return decode_mask(PolygonMask(polygons), height, width).astype(bool)
