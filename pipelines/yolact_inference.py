"""YOLACT on executors: the shared image-inference stages plus YOLACT's postprocess (the numpy Detect and mask
assembly of `pipelines.yolact_postprocess`, the one implementation the PyTorch eval path also calls)."""
from __future__ import annotations

from dataclasses import dataclass

from pipelines import yolact_postprocess as yp
from pipelines.image_inference import ExecutorModel, ImageInference, timed


@dataclass(frozen=True)
class YolactInference(ImageInference):
    """Instances with COCO RLE masks and a PNG label map per image."""

    def postprocess_one(self, row: dict, raw: dict, model: ExecutorModel) -> None:
        from pipelines.mask_outputs import LabelMapBuilder, encode_rle

        with timed(row, "postprocess"):
            post = {k: self.postprocess[k] for k in ("conf_thresh", "nms_thresh", "top_k", "max_num_detections")}
            det = yp.detect(raw["loc"], raw["conf"], raw["mask"], model.arrays["priors"],
                            nms=self.postprocess.get("nms", "fast"), **post)
            width, height = row["width"], row["height"]
            boxes = yp.box_pixels(det.boxes, width, height)
            labels = LabelMapBuilder(height, width) if self.write_masks else None
            instances = []
            for i, mask in enumerate(yp.instance_masks(det, raw["proto"], width, height)):
                class_id = int(det.classes[i])
                instances.append({
                    "class_id": class_id,
                    "class_name": self.class_names[class_id] if class_id < len(self.class_names) else str(class_id),
                    "score": float(det.scores[i]), "box": [int(v) for v in boxes[i]], "mask": encode_rle(mask)})
                if labels is not None:
                    labels.add(mask)
            row["instances"] = instances
        if labels is not None:
            self.write_label_map(row, labels)
