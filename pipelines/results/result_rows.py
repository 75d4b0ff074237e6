"""The result rows every inference task returns: their Arrow schema (RESULT_ARROW_SCHEMA, the one declaration of
the result columns: the driver's RESULT_SCHEMA is derived from it), a new row per image or video frame, per-stage
timing and error rows, and the Arrow batches mapInArrow exchanges with Spark. No pyspark, no model: shared by
images (image_inference) and video frames (video_inference)."""

from __future__ import annotations

import time
import traceback
from types import SimpleNamespace

import pyarrow as pa

from pipelines.ops.image_decode import ImageDecodeError
from pipelines.ops.video_decode import VideoDecodeError

STAGES = ("read", "preprocess", "infer", "postprocess", "write")
# Error stages of failures that were not the input's: the storage could not be read or written, the model did not
# load on the executor. Their errors/ rows are no done keys (done_index): the next run tries those images again.
# Every other failure (decode: not a readable image or video; a poison image; the model or postprocess failing on
# the image) stays the image's record until the file changes or a run is forced.
RETRIED_STAGES = ("read", "model", "write")
MAX_MESSAGE = 2000
_MASK = pa.struct([("size", pa.list_(pa.int32())), ("counts", pa.string())])
_INSTANCE = pa.struct(
    [
        ("class_id", pa.int32()),
        ("class_name", pa.string()),
        ("score", pa.float32()),
        ("box", pa.list_(pa.int32())),
        ("mask", _MASK),
    ]
)
RESULT_ARROW_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("status", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("instances", pa.list_(_INSTANCE)),
        ("mask_path", pa.string()),
        ("error_stage", pa.string()),
        ("error_type", pa.string()),
        ("error_message", pa.string()),
        ("size", pa.int64()),
        ("modification_time", pa.timestamp("us", tz="UTC")),
        # video frames (null for images): the frame's 0-based index in presentation order, its presentation time, and
        # the segment [segment_start, segment_end) it was decoded in (the unit of resume; inference.video_sources)
        ("frame_index", pa.int32()),
        ("timestamp_s", pa.float64()),
        ("segment_start", pa.int32()),
        ("segment_end", pa.int32()),
        ("timings", pa.struct([(f"{stage}_s", pa.float64()) for stage in STAGES])),
    ]
)
RESULT_COLUMNS = RESULT_ARROW_SCHEMA.names


def input_records(batch: pa.RecordBatch) -> list[SimpleNamespace]:
    """A mapInArrow input batch (images or video units) -> one record per row, its columns as attributes."""
    return [SimpleNamespace(**row) for row in batch.to_pylist()]


def result_batch(rows: list[dict]) -> pa.RecordBatch:
    """Result rows (dicts with RESULT_COLUMNS and private keys, which are left out) -> a mapInArrow output batch."""
    return pa.RecordBatch.from_pylist(rows, schema=RESULT_ARROW_SCHEMA)


def new_row(record) -> dict:
    return {
        "path": record.path,
        "status": "error",
        "width": None,
        "height": None,
        "instances": None,
        "mask_path": None,
        "error_stage": None,
        "error_type": None,
        "error_message": None,
        "size": getattr(record, "size", None),
        "modification_time": getattr(record, "modification_time", None),
        "frame_index": None,
        "timestamp_s": None,
        "segment_start": None,
        "segment_end": None,
        "timings": {f"{s}_s": 0.0 for s in STAGES},
        "_stage": None,
    }


class timed:
    """Context manager: adds the elapsed seconds to row['timings'] and records the stage for error rows."""

    def __init__(self, row: dict, stage: str) -> None:
        self.row, self.stage = row, stage

    def __enter__(self):
        self.row["_stage"] = self.stage
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.row["timings"][f"{self.stage}_s"] += time.perf_counter() - self.start
        return False


def fail(row: dict, err: BaseException, stage: str | None = None) -> None:
    row["status"] = "error"
    row["error_stage"] = stage or row.get("_stage") or "unknown"
    if isinstance(err, (ImageDecodeError, VideoDecodeError)):
        row["error_stage"] = "decode"
        row["error_type"] = f"{type(err).__name__}.{err.reason}"
    else:
        row["error_type"] = type(err).__name__
    message = str(err) or type(err).__name__
    if not isinstance(err, (ImageDecodeError, VideoDecodeError, ValueError, OSError)):
        message += " | " + "".join(traceback.format_exception_only(type(err), err)).strip()
    row["error_message"] = message[:MAX_MESSAGE]
    row["instances"] = None
