"""YOLACT on executors: the shared image-inference stages plus YOLACT's postprocess (the numpy Detect and mask
assembly of `pipelines.ops.yolact_postprocess`, the one implementation the PyTorch eval path also calls)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.inference.image_inference import ExecutorModel, ImageInference, timed
from pipelines.ops import yolact_postprocess as yp


@dataclass(frozen=True)
class YolactInference(ImageInference):
    """Instances with COCO RLE masks (``masks`` rle or rle_and_png) and a PNG label map per image (rle_and_png).

    Masks are assembled, RLE-encoded and painted box-locally, all of an image's in one compiled call
    (`yp.mask_blocks(...).encode`, then `encode_rle_counts`): the cost grows with the area of the boxes, not with
    image pixels x detections, and there is no Python per mask.
    """

    def postprocess_one(self, row: dict, raw: dict, model: ExecutorModel) -> None:
        from pipelines.ops.mask_outputs import LabelMapBuilder, encode_rle_counts

        with timed(row, "postprocess"):
            post = {k: self.postprocess[k] for k in ("conf_thresh", "nms_thresh", "top_k", "max_num_detections")}
            det = yp.detect(
                raw["loc"],
                raw["conf"],
                raw["mask"],
                model.arrays["priors"],
                nms=self.postprocess.get("nms", "fast"),
                **post,
            )
            det = det.take(det.scores > np.float32(self.written_score_threshold("conf_thresh")))
            width, height = row["width"], row["height"]
            boxes = yp.box_pixels(det.boxes, width, height)
            names = self.class_names
            instances = [
                {
                    "class_id": class_id,
                    "score": score,
                    "box": box,
                    "mask": None,
                    "class_name": names[class_id] if class_id < len(names) else str(class_id),
                }
                for class_id, score, box in zip(det.classes.tolist(), det.scores.tolist(), boxes.tolist())
            ]
            labels = LabelMapBuilder(height, width) if self.masks == "rle_and_png" else None
            if self.masks != "none":
                counts, ends = yp.mask_blocks(det, raw["proto"], width, height).encode(labels)
                for instance, rle in zip(instances, encode_rle_counts(counts, ends, height, width)):
                    instance["mask"] = rle
            row["instances"] = instances
        if labels is not None:
            self.write_label_map(row, labels)
