"""coco_results.json: the job's current detections in the COCO results format, for pycocotools."""

from __future__ import annotations

import json
import os
import tempfile

from pyspark.sql import SparkSession

from pipelines.io.storage import Location
from pipelines.io.uris import is_local, to_local_path
from pipelines.results.incremental import current_detections  # the newest row per path (replaced images)


def write_coco_results(spark: SparkSession, output: Location | str, image_ids: dict[str, int] | None = None) -> int:
    """coco_results.json (the COCO results format: [{image_id, category_id, bbox xywh, score, segmentation RLE}])
    for pycocotools, streamed from detections/ row by row into a local temporary file, then moved into place:
    the driver never holds all masks. image_id comes from `image_ids` (file name -> id, e.g. read from a COCO
    ground-truth file) or the 1-based order of the paths; category_id is the 1-based class id."""
    output = Location.of(output)
    table = current_detections(spark, output)
    count = 0
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8")
    with handle:
        handle.write("[")
        rows = table.select("path", "instances").orderBy("path").toLocalIterator() if table is not None else []
        for number, row in enumerate(rows, start=1):
            name = row.path.rsplit("/", 1)[-1]
            image_id = image_ids.get(name, number) if image_ids else number
            for inst in row.instances or []:
                x1, y1, x2, y2 = inst.box
                result = {
                    "image_id": image_id,
                    "category_id": inst.class_id + 1,
                    "score": round(float(inst.score), 5),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                }
                if inst.mask is not None:
                    result["segmentation"] = {"size": list(inst.mask.size), "counts": inst.mask.counts}
                handle.write(("," if count else "") + "\n" + json.dumps(result))
                count += 1
        handle.write("\n]\n")
    target = output / "coco_results.json"
    if is_local(target.uri):
        os.replace(handle.name, to_local_path(target.uri))
    else:
        with open(handle.name, "rb") as source:
            target.write_bytes_atomic(source.read())
        os.unlink(handle.name)
    return count
