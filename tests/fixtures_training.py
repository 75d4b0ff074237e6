"""Tiny training data for the training tests: a few small synthetic road images plus one image without
annotations, one corrupt (truncated) image and one listed but missing file; and a tiny training config."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
from pipelines.training.config import TrainConfig, load_train_config

REPO = Path(__file__).resolve().parents[1]
TINY_IMAGES = 16
BAD_ENTRIES = {"no_annotations": "blank_road.jpg", "corrupt": "corrupt_road.jpg", "missing": "missing_road.jpg"}


def make_tiny_roads(out: Path, count: int = TINY_IMAGES, seed: int = 77) -> Path:
    """out/images/*.jpg + out/annotations.json with the three bad entries appended."""
    generate_road_dataset(
        out, count, seed, RoadSceneConfig(width=96, height=72, min_instances=1, max_instances=3, formats=("coco",))
    )
    coco = json.loads((out / "annotations.json").read_text())
    first = coco["images"][0]
    first_annotations = [a for a in coco["annotations"] if a["image_id"] == first["id"]]
    next_image = max(im["id"] for im in coco["images"]) + 1
    next_annotation = max(a["id"] for a in coco["annotations"]) + 1
    images = out / "images"
    shutil.copy(images / first["file_name"], images / BAD_ENTRIES["no_annotations"])
    (images / BAD_ENTRIES["corrupt"]).write_bytes((images / first["file_name"]).read_bytes()[:200])
    for reason, name in BAD_ENTRIES.items():
        coco["images"].append({**first, "id": next_image, "file_name": name})
        if reason != "no_annotations":
            for ann in first_annotations:
                coco["annotations"].append({**ann, "id": next_annotation, "image_id": next_image})
                next_annotation += 1
        next_image += 1
    (out / "annotations.json").write_text(json.dumps(coco))
    return out


@pytest.fixture(scope="session")
def tiny_roads(tmp_path_factory) -> Path:
    return make_tiny_roads(tmp_path_factory.mktemp("tiny_roads"))


@pytest.fixture(scope="session")
def tiny_prepared(tmp_path_factory) -> Path:
    """One prepared-shards directory shared by the runs of a session (prepared once, then reused)."""
    return tmp_path_factory.mktemp("tiny_prepared")


def tiny_config(data: Path, prepared: Path, run_dir: Path, **overrides) -> TrainConfig:
    """64 x 64 input, global batch 4 in micro-batches of 2, 1 thread per rank, a handful of steps."""
    os.environ.setdefault("PYSPARK_PYTHON", str(REPO / ".venv" / "bin" / "python"))
    base = {
        "run_dir": str(run_dir),
        "data.images": str(data / "images"),
        "data.annotations": str(data / "annotations.json"),
        "data.prepared": str(prepared),
        "data.num_shards": 2,
        "data.val_fraction": 0.25,
        "model.max_size": 64,
        "distributed.threads_per_process": 1,
        "train.epochs": 3,
        "train.max_steps": 3,
        "train.global_batch": 4,
        "train.micro_batch": 2,
        "train.warmup_steps": 2,
        "train.lr": 0.001,
        "train.lr_milestones": [],
        "checkpoint.every_steps": 0,
        "eval.every_epochs": 0,
        "tracking.mlflow_uri": str(run_dir / "mlruns"),
        "tracking.progress_bar": False,
        "tracking.plots": False,
    }
    base.update(overrides)
    return load_train_config(None, base)
