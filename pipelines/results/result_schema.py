"""RESULT_SCHEMA: the Spark types of the result rows (result_rows.RESULT_COLUMNS, in that order), one schema for every
model family (`mask` is null for box-only models), and the detections/ and errors/ tables' columns come from it.

Derived from result_rows.RESULT_ARROW_SCHEMA, the Arrow batches the executors return (mapInArrow; no pyspark
there), in Python: not as a DDL string, which the JVM parses with its SQL parser, whose first use in a process
adds to the driver's planning.
"""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema

from pipelines.results.result_rows import RESULT_ARROW_SCHEMA

RESULT_SCHEMA = from_arrow_schema(RESULT_ARROW_SCHEMA)
INSTANCES_TYPE = RESULT_SCHEMA["instances"].dataType
FRAME_COLUMNS = {
    name: RESULT_SCHEMA[name].dataType for name in ("frame_index", "timestamp_s", "segment_start", "segment_end")
}
