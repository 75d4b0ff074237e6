"""Network input from a decoded image, exactly as the manifest's `input` section says (YOLACT FastBaseTransform:
float32, bilinear resize without antialias and without keeping the aspect ratio, then (x - mean) / std)."""
from __future__ import annotations

import numpy as np

from pipelines.ops.image_ops import resize_bilinear


def preprocess_rgb(rgb: np.ndarray, input_spec: dict) -> np.ndarray:
    """rgb: [H, W, 3] uint8 RGB (or [H, W, 4]: RGB + a padding byte, as `decode_image(shared_memory=True)` may
    give; the fourth channel is resized along and dropped) -> [3, S_h, S_w] float32 in the manifest's channel
    order, normalized."""
    _, _, height, width = input_spec["shape"]
    resize = input_spec.get("resize", {})
    if resize.get("mode", "bilinear") != "bilinear" or resize.get("keep_aspect_ratio", False):
        raise ValueError(f"unsupported resize {resize}: this sparkseg supports bilinear without aspect ratio")
    # uint8 in: the resize reads (as float32) only the source rows/cols it needs, never a float copy of the image
    image = resize_bilinear(rgb, (int(height), int(width)))[..., :3]
    if input_spec.get("channel_order", "RGB") == "BGR":
        image = image[..., ::-1]
    mean = np.asarray(input_spec["mean"], dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(input_spec["std"], dtype=np.float32).reshape(-1, 1, 1)
    chw = np.ascontiguousarray(image.transpose(2, 0, 1))   # normalized per channel plane: contiguous inner loops
    chw -= mean
    chw /= std
    return chw
