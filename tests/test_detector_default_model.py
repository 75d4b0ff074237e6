"""The bundled detector (samples/models/detector_default, scripts/train_default_detector.sh) is trained: through
jobs/infer_detector.py on a few fresh synthetic road images (a seed training never used) it finds the blobs
(pothole, patch, puddle) with well placed boxes (pycocotools, through pipelines.report.evaluate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
from pipelines.inference.model_manifest import load_manifest
from pipelines.report.evaluate import evaluate_output
from tests.conftest import REPO, SAMPLES

MODEL_DIR = SAMPLES / "models" / "detector_default"
SEED, IMAGES = 4242, 6  # training used seed 2, the bundle's reported val split seed 3
BLOBS = ("pothole", "patch", "puddle")


def test_bundled_detector_finds_the_blobs_of_fresh_synthetic_images(tmp_path):
    manifest = load_manifest(MODEL_DIR)
    assert manifest.trained and "SYNTHETIC" in manifest.data["note"]
    assert sorted(p.name for p in MODEL_DIR.iterdir()) == ["manifest.json", "model.bin", "model.xml", "parity.json"]
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) <= 30 * 1024 * 1024

    data = tmp_path / "val"
    generate_road_dataset(data, IMAGES, SEED, RoadSceneConfig(formats=("coco",)))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    job = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "infer_detector.py"),
            "--model",
            str(MODEL_DIR),
            "--input",
            str(data / "images"),
            "--output",
            str(tmp_path / "out"),
            "--partitions",
            "1",
            "--master",
            "local[1]",
            "--batch-size",
            str(IMAGES),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"]["done"] == IMAGES and summary["counts"]["failed"] == 0

    evaluation = evaluate_output(
        tmp_path / "out", data / "annotations.json", score_threshold=0.5, groups={"blobs": BLOBS}
    )
    per_class = evaluation["per_class"]
    found = {name: (per_class[name]["found"], per_class[name]["ground_truth"]) for name in BLOBS}
    print(
        f"bundled detector on {IMAGES} fresh synthetic images: blobs found {found}, "
        f"box AP blobs {evaluation['overall']['box_ap_blobs']:.3f}"
    )
    assert sum(g for _, g in found.values()) > 0
    assert all(f == g for f, g in found.values()), found  # every blob found at IoU >= 0.5, score >= 0.5
    assert evaluation["overall"]["box_ap_blobs"] >= 0.5
