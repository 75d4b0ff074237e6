"""The result rows every inference task returns: their RESULT_COLUMNS (typed by result_schema.RESULT_SCHEMA on the
driver), a new row per image or video frame, per-stage timing and error rows. No pyspark, no model: shared by
images (image_inference) and video frames (video_inference)."""
from __future__ import annotations

import time
import traceback

from pipelines.ops.image_decode import ImageDecodeError
from pipelines.ops.video_decode import VideoDecodeError

STAGES = ("read", "preprocess", "infer", "postprocess", "write")
MAX_MESSAGE = 2000
RESULT_COLUMNS = ["path", "status", "width", "height", "instances", "mask_path", "error_stage", "error_type",
                  "error_message", "size", "modification_time", "frame_index", "timestamp_s", "segment_start",
                  "segment_end", "timings"]


def new_row(record) -> dict:
    return {"path": record.path, "status": "error", "width": None, "height": None, "instances": None,
            "mask_path": None, "error_stage": None, "error_type": None, "error_message": None,
            "size": getattr(record, "size", None), "modification_time": getattr(record, "modification_time", None),
            "frame_index": None, "timestamp_s": None, "segment_start": None, "segment_end": None,
            "timings": {f"{s}_s": 0.0 for s in STAGES}, "_stage": None}


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
