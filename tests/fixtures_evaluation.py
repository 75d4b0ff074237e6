"""One run of the bundled default YOLACT over a fresh SYNTHETIC val split, shared by the tests that judge results
(tests/test_training_default_model.py, test_evaluate.py, test_render_browser.py): the job runs once per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

VAL_SEED = 20261122  # training used seed 1 (scripts/train_default_models.sh)
VAL_IMAGES = 40
BROKEN = "not_an_image.jpg"  # not in the annotations
ROAD_GROUPS = {"blobs": ("pothole", "patch", "puddle"), "crack": ("crack",)}


@dataclass(frozen=True)
class ValRun:
    data: Path  # images/ (+ BROKEN) and annotations.json (COCO, the generator's exact masks)
    output: Path  # the job's output (read it; copy it before writing into it)
    summary: dict

    @property
    def annotations(self) -> Path:
        return self.data / "annotations.json"


@pytest.fixture(scope="session")
def bundled_val_run(spark, tmp_path_factory) -> ValRun:
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.inference.inference_job import run
    from pipelines.job_config import load_config
    from tests.conftest import SAMPLES

    root = tmp_path_factory.mktemp("bundled-val")
    data = root / "val"
    generate_road_dataset(data, VAL_IMAGES, VAL_SEED, RoadSceneConfig(formats=("coco",)))
    (data / "images" / BROKEN).write_bytes(b"not a JPEG")  # a failed image: named in the summary and report
    config = load_config()
    config["input"]["uri"] = str(data / "images")
    config["output"]["uri"] = str(root / "out")
    config["model"]["dir"] = str(SAMPLES / "models" / "yolact_default")
    config["inference"].update({"partitions": 2, "batch_size": 4, "precision": "f32"})
    config["run"]["progress_interval_s"] = 0
    config["output"]["overlays"] = True  # the job draws overlays/ and report.html itself
    return ValRun(data, root / "out", run(spark, config))
