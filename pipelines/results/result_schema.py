"""RESULT_SCHEMA: the Spark types of the result rows (result_rows.RESULT_COLUMNS, in that order), one schema for every
model family (`mask` is null for box-only models), and the detections/ and errors/ tables' columns come from it.

Declared as pyspark types, not as a DDL string: the JVM parses a DDL string with its SQL parser, whose first use in
a process costs ~0.2 s of the driver's planning. Driver-side: executors build rows by column name (result_rows),
without pyspark.
"""
from __future__ import annotations

from pyspark.sql.types import (ArrayType, DoubleType, FloatType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

from pipelines.results.result_rows import STAGES

MASK_TYPE = StructType([StructField("size", ArrayType(IntegerType())), StructField("counts", StringType())])
INSTANCES_TYPE = ArrayType(StructType([
    StructField("class_id", IntegerType()), StructField("class_name", StringType()),
    StructField("score", FloatType()), StructField("box", ArrayType(IntegerType())), StructField("mask", MASK_TYPE)]))
# video frames (null for images): the frame's 0-based index in presentation order, its presentation time, and the
# segment [segment_start, segment_end) it was decoded in (the unit of resume; pipelines.inference.video_sources)
FRAME_COLUMNS = {"frame_index": IntegerType(), "timestamp_s": DoubleType(), "segment_start": IntegerType(),
                 "segment_end": IntegerType()}
RESULT_SCHEMA = StructType([
    StructField("path", StringType()), StructField("status", StringType()),
    StructField("width", IntegerType()), StructField("height", IntegerType()),
    StructField("instances", INSTANCES_TYPE), StructField("mask_path", StringType()),
    StructField("error_stage", StringType()), StructField("error_type", StringType()),
    StructField("error_message", StringType()),
    StructField("size", LongType()), StructField("modification_time", TimestampType()),
    *[StructField(name, kind) for name, kind in FRAME_COLUMNS.items()],
    StructField("timings", StructType([StructField(f"{stage}_s", DoubleType()) for stage in STAGES])),
])
