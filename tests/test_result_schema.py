"""The result rows' Spark types: the columns executors fill (result_rows.RESULT_COLUMNS, no pyspark there) and the
driver's RESULT_SCHEMA are one list, typed as the tables have been written since video frames were added."""

from __future__ import annotations

from pyspark.sql.types import _parse_datatype_string

from pipelines.results.result_rows import RESULT_COLUMNS
from pipelines.results.result_schema import RESULT_SCHEMA

# The detections/ and errors/ tables' contract, as the job declared it before the schema became pyspark types
WRITTEN_SINCE_VIDEO = (
    "path string, status string, width int, height int, instances array<struct<class_id:int, class_name:string, "
    "score:float, box:array<int>, mask:struct<size:array<int>, counts:string>>>, mask_path string, "
    "error_stage string, error_type string, error_message string, size long, modification_time timestamp, "
    "frame_index int, timestamp_s double, segment_start int, segment_end int, "
    "timings struct<read_s:double, preprocess_s:double, infer_s:double, postprocess_s:double, write_s:double>"
)


def test_the_schema_types_the_columns_executors_fill_in_their_order():
    assert RESULT_SCHEMA.names == RESULT_COLUMNS


def test_the_schema_is_the_tables_contract(spark):
    assert RESULT_SCHEMA == _parse_datatype_string(WRITTEN_SINCE_VIDEO)
