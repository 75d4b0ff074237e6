"""Network input from a decoded image, exactly as the manifest's `input` section says (YOLACT FastBaseTransform:
float32, bilinear resize without antialias and without keeping the aspect ratio, then (x - mean) / std)."""

from __future__ import annotations

import numpy as np

from pipelines.ops.image_ops import resize_normalized_planes


def preprocess_rgb(rgb: np.ndarray, input_spec: dict) -> np.ndarray:
    """rgb: [H, W, 3] uint8 RGB (or [H, W, 4]: RGB + a padding byte, as `decode_image(shared_memory=True)` may
    give; the fourth channel is not read) -> [3, S_h, S_w] float32 in the manifest's channel
    order, normalized."""
    _, _, height, width = input_spec["shape"]
    resize = input_spec.get("resize", {})
    if resize.get("mode", "bilinear") != "bilinear" or resize.get("keep_aspect_ratio", False):
        raise ValueError(f"unsupported resize {resize}: this sparkseg supports bilinear without aspect ratio")
    # one pass from the uint8 pixels to the normalized planes: only the source rows/cols the output needs are read
    # (as float32), the padding channel is never resampled, and no [H, W, 3] float image is built and transposed
    channels = (2, 1, 0) if input_spec.get("channel_order", "RGB") == "BGR" else (0, 1, 2)
    return resize_normalized_planes(
        rgb, (int(height), int(width)), channels, np.asarray(input_spec["mean"]), np.asarray(input_spec["std"])
    )
