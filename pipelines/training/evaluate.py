"""Validation in PyTorch: val loss (no augmentation, batch norm on running statistics) and COCO box / mask AP with
pycocotools. Detections come from ``pipelines.ops.yolact_postprocess`` (the numpy Detect and mask assembly the
Spark job uses), at the original image size; AP comes from ``pipelines.report.evaluate`` (the torch-free implementation
that also evaluates a job's output).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pycocotools import mask as mask_utils

from pipelines.io import storage
from pipelines.ops import yolact_postprocess as yp
from pipelines.report.evaluate import ap_report, load_ground_truth, subset_ground_truth
from pipelines.training.batches import InputSpec, make_micro_batch
from pipelines.training.yolact_loss import LOSS_KEYS, Normalizer, YolactLoss, num_positives


@dataclass(frozen=True)
class EvalSpec:
    annotations_uri: str  # COCO ground truth of the val images (prepare's val_annotations.json)
    class_names: tuple[str, ...]
    blob_classes: tuple[str, ...] = ("pothole", "patch", "puddle")
    max_images: int = 0
    batch_size: int = 8


def eval_outputs(model: torch.nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """Train-mode outputs (logits, segm) with batch norm on its running statistics."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    with torch.no_grad():
        return model(images)


def coco_results(
    outputs: dict[str, torch.Tensor], priors: np.ndarray, rows: list[dict], category_ids: list[int], post: dict
) -> list[dict]:
    """COCO result entries (bbox and RLE segmentation) of a batch, via the numpy Detect and mask assembly."""
    results = []
    conf = torch.softmax(outputs["conf"], dim=-1).numpy()
    for i, row in enumerate(rows):
        det = yp.detect(outputs["loc"][i].numpy(), conf[i], outputs["mask"][i].numpy(), priors, **post)
        width, height = int(row["width"]), int(row["height"])
        boxes = yp.box_pixels(det.boxes, width, height)
        for k, mask in enumerate(yp.instance_masks(det, outputs["proto"][i].numpy(), width, height)):
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            x1, y1, x2, y2 = (int(v) for v in boxes[k])
            results.append(
                {
                    "image_id": int(row["image_id"]),
                    "category_id": category_ids[int(det.classes[k])],
                    "score": float(det.scores[k]),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "segmentation": {"size": rle["size"], "counts": rle["counts"].decode("ascii")},
                }
            )
    return results


def evaluate(
    model: torch.nn.Module, index, spec: EvalSpec, input_spec: InputSpec, loss: YolactLoss, post: dict
) -> dict:
    """model: a full Yolact on any device (its train/eval mode is changed); the loss and the postprocess run on
    the CPU. Returns val loss terms and the AP report."""
    ground_truth = load_ground_truth(storage.read_bytes(spec.annotations_uri))
    by_name = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
    category_ids = [by_name.get(name, -1) for name in spec.class_names]
    count = len(index) if not spec.max_images else min(len(index), spec.max_images)
    priors = loss.priors.cpu().numpy()
    sums = torch.zeros(len(LOSS_KEYS))
    positives, results = 0, []
    for start in range(0, count, spec.batch_size):
        indices = list(range(start, min(start + spec.batch_size, count)))
        rows = index.read(indices)
        mb = make_micro_batch(rows, indices, input_spec, None, 0, 0)
        device = next(model.parameters()).device
        outputs = {k: v.float().cpu() for k, v in eval_outputs(model, mb.images.to(device)).items()}
        matches = loss.match(mb.targets)
        positives += num_positives(matches)
        with torch.no_grad():
            batch_sums = loss.sums(outputs, mb.targets, matches)
        sums += torch.stack([batch_sums[k] for k in LOSS_KEYS])
        results += coco_results(outputs, priors, [rows[i] for i in indices], category_ids, post)
    terms = Normalizer(positives, count).apply(dict(zip(LOSS_KEYS, sums)))
    image_ids = {int(index.image_ids[i]) for i in range(count)}
    if count < len(index):  # evaluate against the images we ran only
        ground_truth = subset_ground_truth(ground_truth, image_ids)
    report = ap_report(ground_truth, results, {"blobs": spec.blob_classes, "crack": ("crack",)})
    report.update({f"val_{k}": float(v) for k, v in terms.items()})
    report["val_loss"] = float(sum(terms.values()))
    report["val_images"] = count
    return report
