"""The bundled default YOLACT is trained: on a fresh synthetic val set (a seed training never used), run through the
Spark inference job, its mask AP@[.5:.95] on the blob-like classes (pothole, patch, puddle) is >= 0.5 (pycocotools).
Cracks are reported, not gated."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
from pipelines.inference_job import run
from pipelines.job_config import load_config
from pipelines.model_manifest import load_manifest
from tests.conftest import SAMPLES

MODEL_DIR = SAMPLES / "models" / "yolact_default"
VAL_SEED = 20261122          # training used seed 1 (scripts/train_default_models.sh)
VAL_IMAGES = 40
BLOB_CLASSES = ("pothole", "patch", "puddle")


def mask_ap(ground_truth: COCO, results: list[dict], category_ids: list[int]) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator = COCOeval(ground_truth, ground_truth.loadRes(results), "segm")
        evaluator.params.catIds = category_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return float(evaluator.stats[0])


def test_bundled_yolact_reaches_blob_mask_ap_on_a_fresh_synthetic_val_split(spark, tmp_path):
    manifest = load_manifest(MODEL_DIR)
    assert manifest.trained, "samples/models/yolact_default must be a trained model (weights.trained)"
    assert sorted(p.name for p in MODEL_DIR.iterdir()) == sorted(
        ["manifest.json", "model.xml", "model.bin", "priors.npy", "parity.json"])
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) <= 30 * 1024 * 1024

    data = tmp_path / "val"
    generate_road_dataset(data, VAL_IMAGES, VAL_SEED, RoadSceneConfig(formats=("coco",)))
    config = load_config()
    config["input"]["uri"] = str(data / "images")
    config["output"]["uri"] = str(tmp_path / "out")
    config["model"]["dir"] = str(MODEL_DIR)
    config["inference"].update({"partitions": 2, "batch_size": 4, "precision": "f32"})
    config["run"]["progress_interval_s"] = 0
    summary = run(spark, config)
    assert summary["counts"]["done"] == VAL_IMAGES and summary["model"]["trained"]

    with contextlib.redirect_stdout(io.StringIO()):
        ground_truth = COCO(str(data / "annotations.json"))
    image_ids = {im["file_name"]: im["id"] for im in ground_truth.dataset["images"]}
    category_ids = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
    results = []
    for row in spark.read.parquet(str(tmp_path / "out" / "detections")).collect():
        for inst in row.instances:
            x1, y1, x2, y2 = inst.box
            results.append({"image_id": image_ids[Path(row.path).name], "category_id": category_ids[inst.class_name],
                            "score": inst.score, "bbox": [x1, y1, x2 - x1, y2 - y1],
                            "segmentation": {"size": list(inst.mask.size), "counts": inst.mask.counts}})
    assert results, "the trained model must detect something"
    blobs = mask_ap(ground_truth, results, [category_ids[n] for n in BLOB_CLASSES])
    cracks = mask_ap(ground_truth, results, [category_ids["crack"]])
    report = {"mask_ap_blobs": round(blobs, 4), "mask_ap_crack": round(cracks, 4), "images": VAL_IMAGES}
    (tmp_path / "ap.json").write_text(json.dumps(report))
    print(f"bundled YOLACT on fresh synthetic val: {report}")
    assert blobs >= 0.5, report
