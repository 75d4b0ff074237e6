"""Videos under --input: listed with the images, scanned on the executors, split into segments of frames.

A unit of work is a row of UNIT_SCHEMA: an image (the segment fields null) or one segment of a video, frames
[segment_start, segment_end) with their presentation timestamps (`frame_pts`, from video_decode.scan_video). Units
are balanced over partitions together (image_sources.assign_partitions), committed in waves and recorded per
segment in detections/ and errors/ (`segment_start`), so a re-run after a kill redoes only uncommitted segments and
a replaced video (other size or modification time) is redone whole. A video that cannot be scanned, and the
unreadable tail of a truncated one, are units with `segment_error` set: they become errors/ rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.inference import image_sources as src
from pipelines.job_config import VideoSettings
from pipelines.spark.session_kind import session_kind

SEGMENT_FIELDS = [
    T.StructField("segment_start", T.IntegerType(), True),  # first frame_index of the segment
    T.StructField("segment_end", T.IntegerType(), True),  # one past its last frame; null: the whole video
    T.StructField("frame_pts", T.ArrayType(T.LongType()), True),  # pts of frames segment_start .. segment_end - 1
    T.StructField("previous_pts", T.LongType(), True),  # pts of frame segment_start - 1 (fps sampling)
    T.StructField("first_pts", T.LongType(), True),  # pts of frame 0: timestamp_s = (pts - first) x base
    T.StructField("time_base_num", T.LongType(), True),
    T.StructField("time_base_den", T.LongType(), True),
    T.StructField("segment_error", T.StringType(), True),  # "<reason>: <message>" for units that are errors
]
UNIT_SCHEMA = T.StructType(src.LISTING_SCHEMA.fields + SEGMENT_FIELDS)
SEGMENT_COLUMNS = [f.name for f in SEGMENT_FIELDS]


def is_video(path_column, extensions: tuple[str, ...]):
    """Column expression: the path ends with one of the video extensions (case-insensitive). A Java regex with
    Unicode case folding, not lower(): Spark's lower() maps case with ICU, whose first use in a JVM loads ICU's break
    iterators and dictionaries, seconds of the cold first job of every run."""
    if not extensions:
        return F.lit(False)
    quoted = "|".join("\\Q" + ext.replace("\\E", "\\E\\\\E\\Q") + "\\E" for ext in extensions)
    return path_column.rlike(f"(?iu)({quoted})$")


def image_units(images: DataFrame) -> DataFrame:
    """Listing rows of images -> UNIT_SCHEMA rows (segment fields null)."""
    return images.select(
        *src.LISTING_SCHEMA.fieldNames(), *[F.lit(None).cast(f.dataType).alias(f.name) for f in SEGMENT_FIELDS]
    )


def video_units(videos: DataFrame, settings: VideoSettings, fetch_bytes) -> DataFrame:
    """Listing rows of videos (with `content` where the executors cannot read them by path) -> their segments as
    UNIT_SCHEMA rows: one scan per video on the executors, each video in its own task where possible."""
    spark = videos.sparkSession
    count = max(1, min(videos.count(), session_kind(spark).default_parallelism() * 4))
    return videos.repartition(count, "path").mapInPandas(VideoScan(settings, fetch_bytes), UNIT_SCHEMA)


def video_source(record, fetch_bytes):
    """What PyAV opens: the local file by path (`file:` listings; only the parts it needs are read), else the
    bytes (Spark's `content` column, or fetched from the store)."""
    content = getattr(record, "content", None)
    if content is not None:
        return bytes(content)
    if record.path.startswith("file:"):
        return src.local_file_path(record.path)
    if fetch_bytes is None:
        raise FileNotFoundError(f"{record.path}: no bytes could be read")
    return fetch_bytes(record.path)


@dataclass(frozen=True)
class VideoScan:
    """The mapInPandas function: videos -> segment units (picklable; PyAV imported on the executor)."""

    settings: VideoSettings
    fetch_bytes: Callable[[str], bytes] | None = None

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            units = []
            for record in batch.itertuples(index=False):
                units.extend(self.segments(record))
            yield pd.DataFrame(units, columns=UNIT_SCHEMA.fieldNames())

    def segments(self, record) -> list[dict]:
        from pipelines.ops.video_decode import VideoDecodeError, scan_video

        listing = {"path": record.path, "size": record.size, "modification_time": record.modification_time}
        try:
            if not record.size:
                raise VideoDecodeError("empty file (0 bytes)", "empty")
            index = scan_video(video_source(record, self.fetch_bytes))
        except Exception as err:  # noqa: BLE001  (every unreadable video becomes one errors/ row)
            return [error_unit(listing, 0, None, err)]
        pts, step = index.frame_pts, self.settings.segment_frames
        units = [
            {
                **listing,
                "segment_start": start,
                "segment_end": min(start + step, len(pts)),
                "frame_pts": pts[start : start + step],
                "previous_pts": pts[start - 1] if start else None,
                "first_pts": index.first_pts,
                "time_base_num": index.time_base.numerator,
                "time_base_den": index.time_base.denominator,
                "segment_error": None,
            }
            for start in range(0, len(pts), step)
        ]
        if index.truncated:
            units.append(
                error_unit(listing, len(pts), index.declared_frames, VideoDecodeError(index.truncated, "truncated"))
            )
        return units


def error_unit(listing: dict, start: int, end: int | None, err: BaseException) -> dict:
    from pipelines.ops.video_decode import STORE_FAILURE, VideoDecodeError

    if isinstance(err, VideoDecodeError):
        reason = err.reason
    else:  # an OSError: the store failed, not the video (video_inference retries it as a read failure)
        reason = (STORE_FAILURE if isinstance(err, OSError) else "") + type(err).__name__
    return {
        **listing,
        "segment_start": start,
        "segment_end": end,
        "frame_pts": None,
        "previous_pts": None,
        "first_pts": None,
        "time_base_num": None,
        "time_base_den": None,
        "segment_error": f"{reason}: {err}",
    }


def time_base(record) -> Fraction:
    return Fraction(int(record.time_base_num), int(record.time_base_den))


def previous_timestamp_s(record) -> float | None:
    """The presentation time of the frame before a unit's first (what fps sampling decides its first frame from)."""
    if record.previous_pts is None or pd.isna(record.previous_pts):
        return None
    return float((int(record.previous_pts) - int(record.first_pts)) * time_base(record))


def kept_frames(record, settings: VideoSettings) -> int:
    """How many frames of a video unit settings.keeps: the decoder's rule, applied to the unit's frame timestamps."""
    from pipelines.ops.video_decode import timestamp_seconds

    base, first, previous = time_base(record), int(record.first_pts), previous_timestamp_s(record)
    kept = 0
    for offset, pts in enumerate(record.frame_pts):
        timestamp = timestamp_seconds(int(pts), first, base)
        kept += settings.keeps(int(record.segment_start) + offset, timestamp, previous)
        previous = timestamp
    return kept


def expected_rows(units: DataFrame, settings: VideoSettings) -> int:
    """Result rows the units will write, the progress total: one per image and per unit that is an error (an
    unreadable video, a truncated one's tail), and one per frame the readable segments process."""
    singles = units.where(F.col("segment_start").isNull() | F.col("segment_error").isNotNull()).count()
    return singles + expected_frames(units, settings)


def expected_frames(units: DataFrame, settings: VideoSettings) -> int:
    """Frames the readable video units will process. Every frame_stride-th frame counted in the JVM; with fps
    sampling, each unit's frames are counted on the executors by the decoder's own rule (kept_frames)."""
    segments = units.where(F.col("segment_error").isNull() & F.col("segment_start").isNotNull())
    if settings.fps is None:  # frame indices in [start, end) that are multiples of the stride
        stride = F.lit(settings.frame_stride)
        frames = F.ceil(F.col("segment_end") / stride) - F.ceil(F.col("segment_start") / stride)
        row = segments.agg(F.sum(frames).alias("frames")).first()
        return int(row["frames"] or 0)

    def count(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            yield pd.DataFrame({"frames": [sum(kept_frames(r, settings) for r in batch.itertuples())]})

    row = (
        segments.select("segment_start", "frame_pts", "previous_pts", "first_pts", "time_base_num", "time_base_den")
        .mapInPandas(count, "frames long")
        .agg(F.sum("frames").alias("frames"))
        .first()
    )
    return int(row["frames"] or 0)
