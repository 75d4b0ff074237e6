"""Where a detector rank reads its samples from: the prepared Parquet shards (`ShardIndex`, the Spark job) or,
without Spark, a COCO folder read directly (`CocoFolderIndex`: one machine, e.g. a GPU box with no Java). Both
give the same rows (image_id, file_name, width, height, image bytes, labels 0-based, boxes x1y1x2y2 flattened),
in ascending image_id order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipelines.datasets import coco_to_dataset
from pipelines.datasets.coco import parse_coco_json
from pipelines.errors import UsageError


@dataclass
class CocoFolderIndex:
    """Every annotated image of a COCO folder (images/ + annotations.json), by ascending image id."""

    root: str
    rows: list[dict]
    image_ids: np.ndarray

    @classmethod
    def open(cls, images: str | Path, annotations: str | Path, class_names: tuple[str, ...]) -> CocoFolderIndex:
        images, annotations = Path(images), Path(annotations)
        if not annotations.is_file() or not images.is_dir():
            raise UsageError(
                f"{annotations} / {images}: need a COCO annotations file and its images folder "
                "(python -m pipelines.datasets.synthetic_roads --format coco makes one)"
            )
        dataset = coco_to_dataset(parse_coco_json(annotations.read_bytes(), str(annotations)), str(annotations))
        wanted = {name: i for i, name in enumerate(class_names)}
        unknown = sorted(c.name for c in dataset.categories if c.name not in wanted)
        if unknown:
            raise UsageError(f"{annotations}: categories {unknown} are not model classes {list(class_names)}")
        class_of = {c.id: wanted[c.name] for c in dataset.categories}
        rows = []
        for image in sorted(dataset.images, key=lambda im: im.id):
            objects = [a for a in image.annotations if not a.iscrowd]
            if not objects:
                continue
            rows.append(
                {
                    "image_id": int(image.id),
                    "file_name": image.file_name,
                    "width": int(image.width),
                    "height": int(image.height),
                    "path": str(images / image.file_name),
                    "labels": [class_of[a.category_id] for a in objects],
                    "boxes": [float(v) for a in objects for v in a.box],
                }
            )
        if not rows:
            raise UsageError(f"{annotations}: no annotated images to train on")
        return cls(str(images), rows, np.asarray([r["image_id"] for r in rows], np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, indices) -> dict[int, dict]:
        out = {}
        for index in {int(i) for i in indices}:
            row = dict(self.rows[index])
            try:
                row["image"] = Path(row["path"]).read_bytes()
            except OSError as err:
                raise UsageError(
                    f"{row['path']}: listed in the annotations but cannot be read ({err.strerror}): "
                    "fix or remove it, or train with jobs/train_detector.py (its preparation skips "
                    "such images)"
                ) from None
            out[index] = row
        return out
