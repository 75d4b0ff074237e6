"""Write: results DataFrame -> detections/ and errors/ (Parquet, appended per committed wave through Spark's
commit protocol, so a killed task or job leaves no partial file visible), summary.json, coco_results.json."""
from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.storage import join_uri, write_bytes_atomic

DETECTION_COLUMNS = ["path", "width", "height", "instances", "mask_path", "size", "modification_time", "timings",
                     "model_name", "model_sha256", "run_id"]
ERROR_COLUMNS = ["path", "error_stage AS stage", "error_type", "error_message AS message", "size", "modification_time",
                 "model_name", "model_sha256", "run_id"]
TIMING_FIELDS = ["read_s", "preprocess_s", "infer_s", "postprocess_s", "write_s"]


def detections_uri(output_uri: str) -> str:
    return join_uri(output_uri, "detections")


def errors_uri(output_uri: str) -> str:
    return join_uri(output_uri, "errors")


def write_results(results: DataFrame, output_uri: str) -> dict:
    """Append the ok rows to detections/ and the error rows to errors/; return the wave's aggregates
    (counts, instance count, per-stage seconds). `results` should be persisted by the caller."""
    results.where("status = 'ok'").select(*DETECTION_COLUMNS).write.mode("append").parquet(detections_uri(output_uri))
    results.where("status = 'error'").selectExpr(*ERROR_COLUMNS).write.mode("append").parquet(errors_uri(output_uri))
    row = results.agg(
        F.sum(F.when(F.col("status") == "ok", 1).otherwise(0)).alias("done"),
        F.sum(F.when(F.col("status") == "error", 1).otherwise(0)).alias("failed"),
        F.sum(F.coalesce(F.size("instances"), F.lit(0))).alias("instances"),
        *[F.sum(f"timings.{name}").alias(name) for name in TIMING_FIELDS],
    ).first()
    return {key: (row[key] or 0) for key in row.asDict()}


def done_keys(spark: SparkSession, output_uri: str, model_sha256: str) -> DataFrame | None:
    """(path, size, modification_time) of every image already recorded for this model, in detections/ or errors/.
    None when nothing has been written yet."""
    frames = []
    for uri in (detections_uri(output_uri), errors_uri(output_uri)):
        try:
            frame = spark.read.parquet(uri)
        except Exception:  # noqa: BLE001  (no output yet: AnalysisException PATH_NOT_FOUND / empty dir)
            continue
        frames.append(frame.where(F.col("model_sha256") == model_sha256).select("path", "size", "modification_time"))
    if not frames:
        return None
    keys = frames[0]
    for frame in frames[1:]:
        keys = keys.unionByName(frame)
    return keys.distinct()


def write_summary(output_uri: str, summary: dict, azure_credentials=None) -> None:
    data = (json.dumps(summary, indent=2, default=str) + "\n").encode()
    write_bytes_atomic(join_uri(output_uri, "summary.json"), data, azure_credentials=azure_credentials)


def write_coco_results(spark: SparkSession, output_uri: str, image_ids: dict[str, int] | None = None) -> int:
    """COCO results format ([{image_id, category_id, bbox xywh, score, segmentation RLE}]) for pycocotools,
    streamed from detections/ (never holding all masks on the driver). image_id comes from `image_ids`
    (file name -> id, e.g. from a COCO ground-truth file) or the 1-based order of the paths."""
    rows = spark.read.parquet(detections_uri(output_uri)).select("path", "instances").orderBy("path")
    count, parts = 0, []
    for number, row in enumerate(rows.toLocalIterator(), start=1):
        name = row.path.rsplit("/", 1)[-1]
        image_id = image_ids.get(name, number) if image_ids else number
        for inst in row.instances or []:
            x1, y1, x2, y2 = inst.box
            parts.append(json.dumps({
                "image_id": image_id, "category_id": inst.class_id + 1, "score": round(float(inst.score), 5),
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "segmentation": {"size": list(inst.mask.size), "counts": inst.mask.counts}}))
            count += 1
    write_bytes_atomic(join_uri(output_uri, "coco_results.json"), ("[" + ",\n".join(parts) + "]\n").encode())
    return count
