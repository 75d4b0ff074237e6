"""COCO box and mask AP (pycocotools) of what a job wrote, against COCO annotations; the one AP implementation
that training's validation (`pipelines.training.evaluate`) uses too. No torch, no Spark.

    python -m pipelines.report.evaluate --output OUT --annotations val/annotations.json [--score-threshold 0.5] \
        [--group blobs=pothole,patch,puddle]

Detections rows are matched to annotated images by the end of their path: a COCO `file_name` (`road_00001.jpg`,
`day 2/road_00001.jpg`) matches the output's image whose path ends with it (`file:/data/roads/day 2/road_00001.jpg`),
the longest such `file_name` where several do; a `file_name` that two images of the output end with is an error
(give it with its folder). Classes are matched by name. Images annotated but absent from the output are left out of
the evaluation (and named); images the job failed on count as images with no detections. Writes OUT/evaluation.json
and, when OUT/report.html exists, refreshes the report page with an evaluation section.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from pipelines.datasets.coco import parse_coco_json
from pipelines.errors import SparkSegError, UsageError, report_error
from pipelines.report.render import write_report
from pipelines.report.report_rows import row_order
from pipelines.report.tables import DETECTION_COLUMNS, iter_current_rows, local_output, output_keys

log = logging.getLogger(__name__)
EVALUATION_NAME = "evaluation.json"


class EvaluationError(UsageError):
    """Annotations and output cannot be evaluated together: the message names both and what to do."""


def load_ground_truth(source: str | Path | bytes | dict) -> COCO:
    """A COCO object from a file path, JSON bytes or a parsed dict (pycocotools prints nothing)."""
    name = "annotations"
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise EvaluationError(f"{path}: no such annotations file; pass a COCO instances JSON")
        name, source = str(path), path.read_bytes()
    data = parse_coco_json(source, name) if isinstance(source, (bytes, str)) else source
    for key in ("images", "annotations", "categories"):
        if not isinstance(data, dict) or key not in data:
            raise EvaluationError(f"{name}: required COCO key '{key}' is missing (a COCO instances file?)")
    with contextlib.redirect_stdout(io.StringIO()):
        ground_truth = COCO()
        ground_truth.dataset = data
        ground_truth.createIndex()
    return ground_truth


def subset_ground_truth(ground_truth: COCO, image_ids: set[int]) -> COCO:
    """Only the images `image_ids` and their annotations."""
    data = dict(ground_truth.dataset)
    data["images"] = [im for im in data["images"] if im["id"] in image_ids]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in image_ids]
    return load_ground_truth(data)


def coco_ap(ground_truth: COCO, results: list[dict], iou_type: str, category_ids: list[int] | None = None) -> dict:
    """AP@[.5:.95], AP50, AP75 for iou_type "bbox" or "segm" (-1 when a category has no ground truth)."""
    if not results:
        return {"ap": 0.0, "ap50": 0.0, "ap75": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        # loadRes adds keys to the dicts it gets (a polygon 'segmentation' to box results): give it copies, so that
        # box-only results stay box-only for the next call (recall_at, per-class AP).
        detections = ground_truth.loadRes([dict(r) for r in results])
        evaluator = COCOeval(ground_truth, detections, iou_type)
        if category_ids is not None:
            evaluator.params.catIds = category_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return {"ap": float(evaluator.stats[0]), "ap50": float(evaluator.stats[1]), "ap75": float(evaluator.stats[2])}


def ap_report(
    ground_truth: COCO,
    results: list[dict],
    groups: Mapping[str, Sequence[str]] | None = None,
    iou_types: Sequence[str] = ("bbox", "segm"),
) -> dict:
    """{box,mask}_{ap,ap50,ap75} over all classes, and with suffix _<group> over each group of class names
    (training: {"blobs": ("pothole", "patch", "puddle"), "crack": ("crack",)}); groups with no known class are
    left out."""
    by_name = {c["name"]: c["id"] for c in ground_truth.loadCats(ground_truth.getCatIds())}
    report = {}
    for iou_type in iou_types:
        prefix = {"bbox": "box", "segm": "mask"}[iou_type]
        for suffix, cats in [("", None)] + [
            (f"_{name}", [by_name[n] for n in names if n in by_name]) for name, names in (groups or {}).items()
        ]:
            if cats == []:
                continue
            for key, value in coco_ap(ground_truth, results, iou_type, cats).items():
                report[f"{prefix}_{key}{suffix}"] = value
    return report


class AnnotatedImages:
    """The annotated images of a COCO file, found by the end of an output path (see the module docstring)."""

    def __init__(self, images: list[dict]):
        self.ids = {self.normalized(image["file_name"]): image["id"] for image in images}
        self.depth = max((name.count("/") + 1 for name in self.ids), default=0)

    @staticmethod
    def normalized(file_name: str) -> str:
        return "/".join(part for part in file_name.replace("\\", "/").split("/") if part not in ("", "."))

    def file_name(self, path: str) -> str | None:
        """The longest annotated file_name that `path` ends with (whole components), or None."""
        parts = path.split("/")
        for depth in range(min(self.depth, len(parts)), 0, -1):
            name = "/".join(parts[-depth:])
            if name in self.ids:
                return name
        return None


def results_from_rows(rows: list[dict], image_ids: dict[str, int], category_ids: dict[str, int]) -> list[dict]:
    """detections/ rows (path, instances) -> COCO result entries; image_ids: {output path: COCO image id}, classes by
    name."""
    results = []
    for row in rows:
        image_id = image_ids.get(row["path"])
        for inst in row.get("instances") or []:
            if image_id is None or inst["class_name"] not in category_ids:
                continue
            x1, y1, x2, y2 = inst["box"]
            result = {
                "image_id": image_id,
                "category_id": category_ids[inst["class_name"]],
                "score": inst["score"],
                "bbox": [x1, y1, x2 - x1, y2 - y1],
            }
            if inst.get("mask") is not None:
                result["segmentation"] = {"size": list(inst["mask"]["size"]), "counts": inst["mask"]["counts"]}
            results.append(result)
    return results


def recall_at(ground_truth: COCO, results: list[dict], threshold: float, iou: float = 0.5) -> dict[int, dict]:
    """Per category id: ground-truth instances, detections with score >= threshold, and how many ground-truth
    instances they find (greedy by score, mask IoU >= `iou`, box IoU for box-only results)."""
    out = {cat: {"ground_truth": 0, "detections": 0, "found": 0} for cat in ground_truth.getCatIds()}
    by_key: dict[tuple[int, int], list[dict]] = {}
    for res in results:
        if res["score"] >= threshold:
            by_key.setdefault((res["image_id"], res["category_id"]), []).append(res)
    for image_id in ground_truth.getImgIds():
        for cat in out:
            gts = ground_truth.loadAnns(ground_truth.getAnnIds(imgIds=[image_id], catIds=[cat], iscrowd=False))
            dts = sorted(by_key.get((image_id, cat), []), key=lambda r: -r["score"])
            out[cat]["ground_truth"] += len(gts)
            out[cat]["detections"] += len(dts)
            if not gts or not dts:
                continue
            segm = all("segmentation" in d for d in dts)
            gt_objs = [ground_truth.annToRLE(g) for g in gts] if segm else [g["bbox"] for g in gts]
            dt_objs = [_rle(d["segmentation"]) for d in dts] if segm else [d["bbox"] for d in dts]
            ious = np.asarray(mask_utils.iou(dt_objs, gt_objs, [0] * len(gts))).reshape(len(dts), len(gts))
            taken = np.zeros(len(gts), bool)
            for row in ious:
                candidates = np.where(~taken & (row >= iou), row, -1.0)
                if candidates.max() >= iou:
                    taken[int(candidates.argmax())] = True
            out[cat]["found"] += int(taken.sum())
    return out


def _rle(segmentation: dict) -> dict:
    counts = segmentation["counts"]
    return {"size": segmentation["size"], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}


def evaluate_output(
    output: str | Path,
    annotations: str | Path | dict,
    score_threshold: float = 0.5,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> dict:
    """COCO AP of the job's current detections in `output` against `annotations`; the evaluation.json content.
    Holds the rows of the annotated images only (and a key per image of the output), so that a labelled sample
    can be evaluated in a large output."""
    root, _, _, keys = output_keys(output)
    ground_truth = load_ground_truth(annotations)
    annotated = AnnotatedImages(ground_truth.dataset["images"])
    image_ids = annotated.ids
    category_ids = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
    detections, in_output, predicted = [], {}, set()  # rows of annotated images, {file_name: path}; classes seen

    def annotated_name(path: str) -> str | None:
        name = annotated.file_name(path)
        if name is not None and in_output.setdefault(name, path) != path:
            raise EvaluationError(
                f"{annotations}: its image '{name}' is the end of two paths of {root}: "
                f"{in_output[name]} and {path}; give its file_name with the folders that tell "
                "them apart"
            )
        return name

    for row in iter_current_rows(root, "detections", keys, DETECTION_COLUMNS):
        predicted.update(inst["class_name"] for inst in row.get("instances") or [])
        if annotated_name(row["path"]) is not None:
            detections.append(row)
    for row in iter_current_rows(root, "errors", keys, ["path", "frame_index", "run_id"]):
        annotated_name(row["path"])
    detections.sort(key=row_order)
    matched = {name: image_ids[name] for name in in_output}
    if not matched:
        raise EvaluationError(
            f"{annotations}: none of its {len(image_ids)} image file names is in {root} "
            "(detections/ or errors/): evaluate the output of a run over the annotated images"
        )
    if predicted and not predicted & set(category_ids):
        raise EvaluationError(
            f"{annotations}: its classes {sorted(category_ids)} share no name with the model's "
            f"{sorted(predicted)}: evaluate against annotations of the model's classes"
        )
    missing = sorted(set(image_ids) - set(in_output))
    if missing:
        log.warning(
            "%d annotated images are not in %s and are left out, e.g. %s", len(missing), root, ", ".join(missing[:5])
        )
    if len(matched) < len(image_ids):
        ground_truth = subset_ground_truth(ground_truth, set(matched.values()))
    results = results_from_rows(detections, {path: image_ids[name] for name, path in in_output.items()}, category_ids)
    has_masks = bool(results) and all("segmentation" in r for r in results)
    iou_types = ("bbox", "segm") if has_masks else ("bbox",)
    report = {
        "annotations": str(annotations),
        "output": str(root),
        "images": len(matched),
        "images_not_in_output": missing[:50],
        "images_not_in_output_count": len(missing),
        "results": len(results),
        "score_threshold": score_threshold,
        "ignored_classes": sorted(predicted - set(category_ids)),
        "overall": ap_report(ground_truth, results, groups, iou_types),
        "per_class": {},
    }
    found = recall_at(ground_truth, results, score_threshold)
    for name, cat in category_ids.items():
        entry = {f"box_{k}": v for k, v in coco_ap(ground_truth, results, "bbox", [cat]).items()}
        if has_masks:
            entry.update({f"mask_{k}": v for k, v in coco_ap(ground_truth, results, "segm", [cat]).items()})
        counts = found[cat]
        entry.update(
            counts, recall=round(counts["found"] / counts["ground_truth"], 4) if counts["ground_truth"] else None
        )
        report["per_class"][name] = entry
    return report


def write_evaluation(output: str | Path, report: dict) -> Path:
    path = local_output(output) / EVALUATION_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="the job's --output (a local directory)")
    parser.add_argument("--annotations", required=True, help="COCO instances JSON of (some of) the input images")
    parser.add_argument(
        "--score-threshold",
        type=float,
        default=0.5,
        help="score for the per-class counts and recall (AP uses every detection)",
    )
    parser.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="NAME=CLASS,CLASS",
        help="also report AP over these classes together as <metric>_NAME (repeatable), e.g. "
        "--group blobs=pothole,patch,puddle",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    groups = {}
    for item in args.group:
        name, sep, classes = item.partition("=")
        if not sep or not name.strip() or not classes.strip():
            parser.error(f"--group {item!r}: write NAME=CLASS,CLASS, e.g. --group blobs=pothole,patch,puddle")
        groups[name.strip()] = tuple(c.strip() for c in classes.split(",") if c.strip())
    try:
        report = evaluate_output(args.output, args.annotations, args.score_threshold, groups)
    except SparkSegError as err:  # EvaluationError, OutputError, AnnotationError: one line, exit 2
        return report_error(err)
    path = write_evaluation(args.output, report)
    overall = report["overall"]
    print(f"sparkseg evaluate: {report['images']} images, {report['results']} detections -> {path}")
    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in overall.items() if "_ap75" not in k))
    for name, entry in report["per_class"].items():
        mask = f", mask AP {entry['mask_ap']:.3f}" if "mask_ap" in entry else ""
        print(
            f"  {name}: box AP {entry['box_ap']:.3f}{mask}; {entry['found']} of {entry['ground_truth']} found "
            f"by {entry['detections']} detections >= {report['score_threshold']}"
        )
    report_page = Path(report["output"]) / "report.html"
    if report_page.is_file():
        print(f"report: {write_report(args.output)}  (open it in a browser)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
