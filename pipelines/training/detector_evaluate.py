"""The detector's validation in PyTorch: COCO box AP (pycocotools, through `pipelines.report.evaluate`) of
torchvision's
eval-mode detections on the prepared val split, at the original image size.
"""

from __future__ import annotations

import argparse
import json

import torch

from model_export.models.checkpoint import read_state_dict
from model_export.models.factornet_detector import FactorNetDetector, get_detector_config
from pipelines.io import storage
from pipelines.report.evaluate import ap_report, load_ground_truth, subset_ground_truth
from pipelines.training.detector_sources import CocoFolderIndex
from pipelines.training.detector_step import make_detector_batch
from pipelines.training.evaluate import EvalSpec

DetectorEvalSpec = EvalSpec  # what to evaluate on: the same fields as YOLACT's validation


def coco_box_results(
    detections: list[dict], rows: list[dict], input_size: tuple[int, int], category_ids: list[int]
) -> list[dict]:
    """torchvision detections (boxes in input pixels, labels 1-based) -> COCO bbox results at the original size."""
    results = []
    in_h, in_w = input_size
    for det, row in zip(detections, rows):
        sx, sy = float(row["width"]) / in_w, float(row["height"]) / in_h
        for box, score, label in zip(det["boxes"].tolist(), det["scores"].tolist(), det["labels"].tolist()):
            x1, y1, x2, y2 = box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy
            results.append(
                {
                    "image_id": int(row["image_id"]),
                    "category_id": category_ids[int(label) - 1],
                    "score": float(score),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                }
            )
    return results


def evaluate_detector(
    model: torch.nn.Module, index, spec: DetectorEvalSpec, input_size: tuple[int, int], device: torch.device
) -> dict:
    """model: a FactorNetDetector (put in eval mode). Returns the box AP report (all classes, blobs, crack)."""
    ground_truth = load_ground_truth(storage.read_bytes(spec.annotations_uri))
    by_name = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
    category_ids = [by_name.get(name, -1) for name in spec.class_names]
    count = len(index) if not spec.max_images else min(len(index), spec.max_images)
    model.eval()
    results = []
    for start in range(0, count, spec.batch_size):
        indices = list(range(start, min(start + spec.batch_size, count)))
        rows = index.read(indices)
        batch = make_detector_batch(rows, indices, input_size, None, 0, 0).to(device)
        with torch.no_grad():
            detections = model(batch.images)
        results += coco_box_results(
            [{k: v.cpu() for k, v in d.items()} for d in detections],
            [rows[i] for i in indices],
            input_size,
            category_ids,
        )
    if count < len(index):
        ground_truth = subset_ground_truth(ground_truth, {int(index.image_ids[i]) for i in range(count)})
    report = ap_report(ground_truth, results, {"blobs": spec.blob_classes, "crack": ("crack",)}, iou_types=("bbox",))
    report["val_images"] = count
    return report


def main(argv: list[str] | None = None) -> int:
    """python -m pipelines.training.detector_evaluate --checkpoint CKPT --images DIR --annotations FILE
    [--config factornet_small] [--device cpu|cuda]: box AP of a training checkpoint in PyTorch (no Spark)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--annotations", required=True)
    parser.add_argument("--config", default="factornet_small")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    model = FactorNetDetector(get_detector_config(args.config))
    model.load_state_dict(read_state_dict(args.checkpoint))
    device = torch.device(args.device)
    index = CocoFolderIndex.open(args.images, args.annotations, tuple(model.cfg.class_names))
    spec = DetectorEvalSpec(args.annotations, tuple(model.cfg.class_names))
    report = evaluate_detector(model.to(device), index, spec, tuple(model.cfg.input_size), device)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
