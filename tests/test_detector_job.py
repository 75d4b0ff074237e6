"""The detection job (`inference_job.run(..., family="detector")` and jobs/infer_detector.py) on a real local
SparkSession, with a random-init FactorNet Faster R-CNN export and synthetic road images."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.inference.detector_inference import detector_instances
from pipelines.inference.image_sources import InputError
from pipelines.inference.inference_job import run
from pipelines.inference.single_process import infer_files
from pipelines.job_config import load_config
from tests.bad_inputs import build_bad_input_corpus
from tests.conftest import REPO, SAMPLES
from tests.fixtures_detector import detector_export, road_images  # noqa: F401
from tests.job_helpers import JOB_RUNTIME, job_config, read_rows


def test_detector_instances_drop_padding_and_scale_to_the_original_image():
    boxes = np.float32([[160, 120, 320, 240], [0, 0, 32, 16], [10, 10, 20, 20], [0, 0, 0, 0]])
    scores = np.float32([0.9, 0.5, 0.05, 0.0])
    labels = np.int64([2, 4, 1, 0])
    instances = detector_instances(boxes, scores, labels, (320, 320), 640, 480, 0.05, ("pothole", "crack"))
    assert [(i["class_id"], i["class_name"], i["box"], i["mask"]) for i in instances] == [
        (1, "crack", [320, 180, 640, 360], None),
        (3, "3", [0, 0, 64, 24], None),
    ]
    assert [i["score"] for i in instances] == pytest.approx([0.9, 0.5])
    assert detector_instances(boxes, scores, labels, (320, 320), 640, 480, 0.95, ("a",)) == []


def test_spark_job_equals_single_process_run(spark, detector_export, road_images, tmp_path):
    output = tmp_path / "out"
    summary = run(spark, job_config(road_images, output, detector_export), family="detector")
    paths = sorted(road_images.iterdir())
    assert summary["counts"]["inputs"] == summary["counts"]["done"] == len(paths)
    assert summary["counts"]["failed"] == 0 and "RANDOM WEIGHTS" in summary["model"]["note"]
    reference = {
        row["path"]: row
        for row in infer_files(
            detector_export, [str(p) for p in paths], str(output), str(road_images), JOB_RUNTIME, family="detector"
        )
    }
    rows = read_rows(spark, output, "detections")
    assert {row.path for row in rows} == set(reference)
    total = 0
    for row in rows:
        ref = reference[row.path]
        assert ref["status"] == "ok"
        assert (row.width, row.height) == (ref["width"], ref["height"])
        assert [i.class_id for i in row.instances] == [i["class_id"] for i in ref["instances"]]
        assert [i.class_name for i in row.instances] == [i["class_name"] for i in ref["instances"]]
        np.testing.assert_array_equal(
            [i.score for i in row.instances], np.float32([i["score"] for i in ref["instances"]])
        )
        assert [list(i.box) for i in row.instances] == [i["box"] for i in ref["instances"]]
        for inst in row.instances:
            x1, y1, x2, y2 = inst.box
            assert 0 <= x1 <= x2 <= row.width and 0 <= y1 <= y2 <= row.height
            assert inst.mask is None and inst.class_name in ("pothole", "crack", "patch", "puddle")
        assert row.mask_path is None
        total += len(row.instances)
    assert total > 0 and total == summary["counts"]["instances"]
    assert not (output / "masks").exists()


def test_bad_inputs_are_recorded_in_errors(spark, detector_export, road_images, tmp_path):
    corpus = tmp_path / "mixed"
    expected = build_bad_input_corpus(corpus, include_large=False)
    for path in sorted(road_images.iterdir())[:2]:
        shutil.copy(path, corpus / path.name)
        expected[path.name] = "ok"
    output = tmp_path / "out"
    summary = run(spark, job_config(corpus, output, detector_export, partitions=3), family="detector")
    detections = {Path(r.path).name: r for r in read_rows(spark, output, "detections")}
    errors = {Path(r.path).name: r for r in read_rows(spark, output, "errors")}
    assert not set(detections) & set(errors), "an image is in both detections/ and errors/"
    extensions = tuple(load_config()["input"]["extensions"])
    listed = {name for name in expected if Path(name).suffix.lower() in extensions}
    assert set(detections) | set(errors) == listed
    for name in listed:
        if expected[name] == "ok":
            assert name in detections, f"{name} should have been processed: {errors.get(name)}"
        else:
            assert errors[name].stage == "decode" and errors[name].message, name
    assert summary["counts"]["failed"] == len(errors) > 0
    assert sum(len(detections[p.name].instances) for p in sorted(road_images.iterdir())[:2]) > 0


def test_a_model_of_the_other_family_is_refused_before_any_task(spark, detector_export, road_images, tmp_path):
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))
    yolact = SAMPLES / "models" / "yolact_default"
    with pytest.raises(InputError, match="'yolact' model; this job needs a detector export"):
        run(spark, job_config(road_images, tmp_path / "a", yolact), family="detector")
    with pytest.raises(InputError, match="'detector' model; this job needs a yolact export"):
        run(spark, job_config(road_images, tmp_path / "b", detector_export), family="yolact")
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_job_script_end_to_end(detector_export, road_images, tmp_path):
    """`python jobs/infer_detector.py` in its own process (its own local Spark), as a user runs it."""
    output = tmp_path / "out"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "infer_detector.py"),
            "--model",
            str(detector_export),
            "--input",
            str(road_images),
            "--output",
            str(output),
            "--master",
            "local[1]",
            "--precision",
            "f32",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    count = len(list(road_images.iterdir()))
    assert f"done {count}, failed 0" in done.stdout
    summary = json.loads((output / "summary.json").read_text())
    assert summary["counts"]["done"] == count and summary["model"]["name"] == "factornet_small"
    assert summary["config"]["spark"]["app_name"] == "sparkseg-infer-detector"
