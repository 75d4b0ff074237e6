"""The YOLACT executor postprocess as it was before box-local masks (issue 13), kept ONLY as the reference that
tests compare the new code against and that `make bench-executor` measures as "before". Not used by the job.

Per detection it builds a full image-size bool mask (windowed bilinear upsample of the cropped prototype mask,
> 0.5), RLE-encodes the full-size mask with pycocotools and paints a full-size label map; PNG at zlib's default
level; preprocess converts the whole decoded image to float32 before resizing. Self-contained (numpy, pycocotools,
Pillow) so that changes to pipelines/ cannot change the reference.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image
from pycocotools import mask as coco_mask

BLOCK_ELEMENTS = 1 << 18
CROP_PADDING = 1
MASK_THRESHOLD = 0.5


# --------------------------------------------------------------------------- bilinear (old pipelines/ops/image_ops.py)
def bilinear_axis(in_size: int, out_size: int):
    if in_size == out_size:
        same = np.arange(out_size, dtype=np.int64)
        return same, same.copy(), np.zeros(out_size, dtype=np.float32)
    scale = np.float32(in_size) / np.float32(out_size)
    dst = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
    src = (np.float64(scale) * dst.astype(np.float64) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    w1 = np.clip(src - i0.astype(np.float32), np.float32(0), np.float32(1)).astype(np.float32)
    i1 = i0 + (i0 < in_size - 1)
    return i0, i1, w1


def bilinear_row_blocks(x, rows, cols, block_elements: int = BLOCK_ELEMENTS):
    y0, y1, wy1 = rows
    x0, x1, wx1 = cols
    n_out_rows, n_out_cols = len(y0), len(x0)
    if n_out_rows == 0 or n_out_cols == 0:
        return
    trailing = x.shape[2:]
    channels = int(np.prod(trailing)) if trailing else 1
    col_shape = (1, n_out_cols) + (1,) * len(trailing)
    wx0 = (np.float32(1) - wx1).reshape(col_shape)
    wx1 = wx1.reshape(col_shape)
    src_rows = np.unique(np.concatenate([y0, y1]))
    by_width = np.empty((len(src_rows), n_out_cols) + trailing, dtype=np.float32)
    step = max(1, block_elements // max(1, x.shape[1] * channels, n_out_cols * channels))
    for start in range(0, len(src_rows), step):
        src = np.asarray(x[src_rows[start : start + step]], dtype=np.float32)
        left = np.take(src, x0, axis=1)
        left *= wx0
        right = np.take(src, x1, axis=1)
        right *= wx1
        left += right
        by_width[start : start + step] = left
    p0 = np.searchsorted(src_rows, y0)
    p1 = np.searchsorted(src_rows, y1)
    row_extra = (1,) * (1 + len(trailing))
    wy0 = np.float32(1) - wy1
    step = max(1, block_elements // (n_out_cols * channels))
    for start in range(0, n_out_rows, step):
        sl = slice(start, min(start + step, n_out_rows))
        top = np.take(by_width, p0[sl], axis=0)
        top *= wy0[sl].reshape((-1,) + row_extra)
        bottom = np.take(by_width, p1[sl], axis=0)
        bottom *= wy1[sl].reshape((-1,) + row_extra)
        top += bottom
        yield sl, top


def resize_bilinear(x, size):
    height, width = int(size[0]), int(size[1])
    out = np.empty((height, width) + x.shape[2:], dtype=np.float32)
    for sl, block in bilinear_row_blocks(x, bilinear_axis(x.shape[0], height), bilinear_axis(x.shape[1], width)):
        out[sl] = block
    return out


# ------------------------------------------------------------------------ preprocess (old pipelines/ops/preprocess.py)
def preprocess_rgb(rgb: np.ndarray, input_spec: dict) -> np.ndarray:
    """rgb: [H, W, 3] uint8 -> [3, S_h, S_w] float32 (the whole image converted to float32 first)."""
    _, _, height, width = input_spec["shape"]
    image = resize_bilinear(rgb.astype(np.float32, copy=False), (int(height), int(width)))
    if input_spec.get("channel_order", "RGB") == "BGR":
        image = image[..., ::-1]
    image = (image - np.asarray(input_spec["mean"], np.float32)) / np.asarray(input_spec["std"], np.float32)
    return np.ascontiguousarray(image.transpose(2, 0, 1))


# ------------------------------------------------------------- mask assembly (old pipelines/ops/yolact_postprocess.py)
def _sanitize(a, b, size, padding):
    a = a * np.float32(size)
    b = b * np.float32(size)
    low = np.maximum(np.minimum(a, b) - np.float32(padding), np.float32(0))
    high = np.minimum(np.maximum(a, b) + np.float32(padding), np.float32(size))
    return low, high


def box_pixels(boxes, width, height):
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    x1, x2 = _sanitize(boxes[:, 0], boxes[:, 2], width, 0)
    y1, y2 = _sanitize(boxes[:, 1], boxes[:, 3], height, 0)
    return np.stack([x1, y1, x2, y2], axis=1).astype(np.int64)


def mask_probabilities(coeffs, proto):
    proto = np.asarray(proto, dtype=np.float32)
    coeffs = np.asarray(coeffs, dtype=np.float32)
    height, width, mask_dim = proto.shape
    logits = proto.reshape(-1, mask_dim) @ coeffs.T
    with np.errstate(over="ignore"):
        probs = np.float32(1) / (np.float32(1) + np.exp(-logits))
    return np.ascontiguousarray(probs.T).reshape(-1, height, width)


def crop_windows(boxes, proto_height, proto_width, padding=CROP_PADDING):
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    x1, x2 = _sanitize(boxes[:, 0], boxes[:, 2], proto_width, padding)
    y1, y2 = _sanitize(boxes[:, 1], boxes[:, 3], proto_height, padding)
    cols = np.arange(proto_width, dtype=np.float32)
    rows = np.arange(proto_height, dtype=np.float32)
    return ((rows >= y1[:, None]) & (rows < y2[:, None]), (cols >= x1[:, None]) & (cols < x2[:, None]))


def instance_masks(det, proto, width, height, crop=True):
    """Yield one full-size bool [height, width] mask per detection, in score order."""
    probs = mask_probabilities(det.coeffs, proto)
    n, proto_height, proto_width = probs.shape
    if crop:
        keep_rows, keep_cols = crop_windows(det.boxes, proto_height, proto_width)
        probs *= keep_rows[:, :, None] & keep_cols[:, None, :]
    else:
        keep_rows = np.ones((n, proto_height), dtype=bool)
        keep_cols = np.ones((n, proto_width), dtype=bool)
    row_axis = bilinear_axis(proto_height, height)
    col_axis = bilinear_axis(proto_width, width)
    for i in range(n):
        out = np.zeros((height, width), dtype=bool)
        rows, cols = np.flatnonzero(keep_rows[i]), np.flatnonzero(keep_cols[i])
        if rows.size and cols.size:
            r0, r1 = _output_window(row_axis, rows[0], rows[-1])
            c0, c1 = _output_window(col_axis, cols[0], cols[-1])
            window = out[r0:r1, c0:c1]
            for sl, block in bilinear_row_blocks(
                probs[i], tuple(a[r0:r1] for a in row_axis), tuple(a[c0:c1] for a in col_axis)
            ):
                np.greater(block, MASK_THRESHOLD, out=window[sl])
        yield out


def _output_window(axis, first, last):
    i0, i1, _ = axis
    return int(np.searchsorted(i1, first, side="left")), int(np.searchsorted(i0, last, side="right"))


# ------------------------------------------------------------------------- outputs (old pipelines/ops/mask_outputs.py)
def encode_rle(mask: np.ndarray) -> dict:
    rle = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(rle["size"][0]), int(rle["size"][1])], "counts": rle["counts"].decode("ascii")}


class LabelMapBuilder:
    def __init__(self, height: int, width: int):
        self.count = 0
        self.labels = np.zeros((height, width), np.uint8)

    def add(self, mask: np.ndarray) -> None:
        self.count += 1
        if self.count == 256:
            self.labels = self.labels.astype(np.uint16)
        self.labels[mask & (self.labels == 0)] = self.count

    def png(self) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(self.labels)).save(buffer, "PNG")
        return buffer.getvalue()


# ------------------------------------------------------------------ per image (old YolactInference.postprocess_one)
def postprocess_image(det, proto, width: int, height: int, class_names, labels: bool = True):
    """Detections -> (instances as the job wrote them, LabelMapBuilder or None)."""
    boxes = box_pixels(det.boxes, width, height)
    builder = LabelMapBuilder(height, width) if labels else None
    instances = []
    for i, mask in enumerate(instance_masks(det, proto, width, height)):
        class_id = int(det.classes[i])
        instances.append(
            {
                "class_id": class_id,
                "class_name": class_names[class_id] if class_id < len(class_names) else str(class_id),
                "score": float(det.scores[i]),
                "box": [int(v) for v in boxes[i]],
                "mask": encode_rle(mask),
            }
        )
        if builder is not None:
            builder.add(mask)
    return instances, builder
