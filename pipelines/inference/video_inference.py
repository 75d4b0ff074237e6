"""Executor side: one video segment unit (video_sources.UNIT_SCHEMA) -> result rows, one per processed frame.

Frames are decoded (video_decode.decode_segment), sampled (VideoSettings.keeps), preprocessed like images and run
through the task's model in batches of `frames_per_batch`, with the same postprocess as images; masks go to
masks/<relative video path>/<frame_index:06d>.png. A segment that cannot be decoded (or the part of it after
the first bad frame) becomes one error row naming the video, the segment and why; the frames before stay.
"""

from __future__ import annotations

import time

import pandas as pd

from pipelines.ops.preprocess import preprocess_rgb
from pipelines.ops.video_decode import STORE_FAILURE, VideoDecodeError, decode_segment
from pipelines.results.result_rows import fail, new_row


def is_segment(record) -> bool:
    value = getattr(record, "segment_start", None)
    return value is not None and not pd.isna(value)


def segment_bounds(record) -> tuple[int, int | None]:
    end = record.segment_end
    return int(record.segment_start), (None if end is None or pd.isna(end) else int(end))


def segment_rows(task, record, guard=None) -> list[dict]:
    """All result rows of one segment unit for `task` (an ImageInference)."""
    start, end = segment_bounds(record)

    def frame_row(frame_index: int | None) -> dict:
        row = new_row(record)
        row.update(frame_index=frame_index, segment_start=start, segment_end=end)
        return row

    if record.segment_error is not None:
        reason, _, message = str(record.segment_error).partition(": ")
        row = frame_row(start if end is not None else None)
        text = f"{record.path}: {segment_name(start, end)}: {message}"
        if reason.startswith(STORE_FAILURE):  # the store, not the video: a read failure, tried again next run
            fail(row, OSError(text), stage="read")
            row["error_type"] = reason[len(STORE_FAILURE) :]
        else:
            fail(row, VideoDecodeError(text, reason))
        return [row]
    rows, pending = [], []
    try:
        if guard is not None:
            key = f"{record.path}#segment={start}"  # a poison segment, not the whole video
            guard.check(key)
            guard.in_flight([key])
        # Spark-side module: images need none of it
        from pipelines.inference.video_sources import previous_timestamp_s, time_base, video_source

        frames = decode_segment(
            video_source(record, task.fetch_bytes),
            start,
            [int(p) for p in record.frame_pts],
            int(record.first_pts),
            time_base(record),
            task.video.keeps,
            previous_timestamp_s(record),
        )
        while True:
            began = time.perf_counter()
            frame = next(frames, None)
            if frame is None:
                break
            row = frame_row(frame.frame_index)
            row["timestamp_s"] = frame.timestamp_s
            row["timings"]["read_s"] += time.perf_counter() - began
            rows.append(row)
            began = time.perf_counter()
            tensor = preprocess_rgb(frame.rgb, task.input_spec)
            row["height"], row["width"] = int(frame.rgb.shape[0]), int(frame.rgb.shape[1])
            row["timings"]["preprocess_s"] += time.perf_counter() - began
            pending.append((row, tensor))
            if len(pending) >= task.frames_per_batch:
                task.infer_and_postprocess(pending)
                pending = []
    except Exception as err:  # noqa: BLE001  (the rest of the segment is one error row; decoded frames stay)
        first_missing = getattr(err, "frame_index", None)
        row = frame_row(first_missing if first_missing is not None else start)
        if isinstance(err, VideoDecodeError):
            err = VideoDecodeError(f"{record.path}: {segment_name(start, end)}: {err}", err.reason, first_missing)
        fail(row, err, stage="read" if isinstance(err, OSError) else "decode")  # OSError: the store failed
        rows.append(row)
    if pending:
        task.infer_and_postprocess(pending)
    return rows


def segment_name(start: int, end: int | None) -> str:
    return "the whole video" if end is None else f"segment frames [{start}, {end})"
