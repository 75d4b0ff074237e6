"""The road-distress detector on executors: the shared image-inference stages plus the detector's postprocess.

The exported graph (`model_export.models.factornet_detector.DetectorNetwork`) already ran the RPN, the RoI heads
and per-class NMS; its outputs are a fixed number of rows in network-input pixels, zero-padded. Here: drop the
padding and anything at or below the manifest's score threshold, scale boxes to the original image. Boxes only
(mask None), no label map. `output.score_threshold` (when set) replaces the manifest's score_thresh.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.inference.image_inference import ExecutorModel, ImageInference, timed
from pipelines.ops import yolact_postprocess as yp


def detector_instances(
    boxes: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    input_size: tuple[int, int],
    width: int,
    height: int,
    score_thresh: float,
    class_names: tuple[str, ...],
) -> list[dict]:
    """One image's raw outputs -> instances in original-image pixels, in the graph's (descending score) order.

    boxes: [D, 4] x1y1x2y2 in network-input pixels; scores: [D]; labels: [D] 1-based (0: background / padding).
    input_size: (height, width) of the network input; width, height: the original image in pixels.
    Rows kept: score > score_thresh and label > 0. class_id is the 0-based foreground index (label - 1), as in
    YOLACT rows; box is int pixels x1, y1, x2, y2 (the same conversion as YOLACT: `box_pixels`).
    """
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    scores = np.asarray(scores, np.float32).reshape(-1)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    keep = (scores > np.float32(score_thresh)) & (labels > 0)
    in_height, in_width = input_size
    relative = boxes[keep] / np.float32([in_width, in_height, in_width, in_height])
    pixels = yp.box_pixels(relative, width, height)
    instances = []
    for box, score, label in zip(pixels, scores[keep], labels[keep]):
        class_id = int(label) - 1
        instances.append(
            {
                "class_id": class_id,
                "class_name": class_names[class_id] if class_id < len(class_names) else str(class_id),
                "score": float(score),
                "box": [int(v) for v in box],
                "mask": None,
            }
        )
    return instances


@dataclass(frozen=True)
class DetectorInference(ImageInference):
    """Instances with boxes and scores, no masks."""

    def postprocess_one(self, row: dict, raw: dict, model: ExecutorModel) -> None:
        with timed(row, "postprocess"):
            _, _, in_height, in_width = self.input_spec["shape"]
            row["instances"] = detector_instances(
                raw["boxes"],
                raw["scores"],
                raw["labels"],
                (int(in_height), int(in_width)),
                row["width"],
                row["height"],
                self.written_score_threshold("score_thresh"),
                self.class_names,
            )
