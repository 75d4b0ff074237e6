"""The report's rows (report_rows.ReportRows) of a job's output, gathered by Spark: what the job's `output.overlays`
draws after a large run, and `python -m pipelines.report.render --spark`.

The current records are ranked by Spark (pipelines.results.incremental) and each partition's rows gathered on the
executors into one ReportRows (`limit` rows, the counts, the first errors), so that the driver receives one partial
result per partition whatever the number of images, and merges them. Through mapInArrow, which classic and Spark
Connect sessions both run (an RDD's treeAggregate is classic only). `python -m pipelines.report.render` streams a local
output with pyarrow instead, through the same ReportRows, unless given --spark.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from pipelines.io.storage import Location
from pipelines.report.report_rows import DEFAULT_LIMIT, DEFAULT_THRESHOLD, ReportRows
from pipelines.report.tables import DETECTION_COLUMNS, ERROR_COLUMNS, local_output, summary_model_records
from pipelines.results.incremental import current_records, read_tables
from pipelines.results.summary_file import read_summary


def gather_with_spark(
    spark: SparkSession, output: Location, limit: int | None = DEFAULT_LIMIT, score_threshold: float = DEFAULT_THRESHOLD
) -> ReportRows:
    """render.gather's rows of a local `output`, gathered by Spark (OutputError for an output that is not local:
    the report's files are written there)."""
    root = local_output(output.uri)
    summary = read_summary(output)

    def current(model: str | None) -> dict[str, DataFrame]:
        has_rows = any(not frame.isEmpty() for frame in read_tables(spark, output, model).values())
        return current_records(spark, output, model) if has_rows else {}

    _, tables = summary_model_records(root, summary, current)
    rows = ReportRows(score_threshold, limit, root, summary)
    for name, columns, add in (
        ("detections", DETECTION_COLUMNS, ReportRows.add_detection),
        ("errors", ERROR_COLUMNS, ReportRows.add_error),
    ):
        if name in tables:
            frame = tables[name]
            gather = partition_rows(add, score_threshold, limit)
            partials = frame.select(*[c for c in columns if c in frame.columns]).mapInArrow(gather, "rows binary")
            for partial in partials.collect():
                rows.merged(pickle.loads(partial["rows"]))
    return rows.finished()


def partition_rows(
    add: Callable, score_threshold: float, limit: int | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executors' side: a partition's rows added to one ReportRows (`add`: ReportRows.add_detection or
    add_error, a row as a dict), pickled into a one-row batch."""

    def gather(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = ReportRows(score_threshold, limit)
        for batch in batches:
            for row in batch.to_pylist():
                add(rows, row)
        yield pa.RecordBatch.from_pydict({"rows": [pickle.dumps(rows)]}, schema=pa.schema([("rows", pa.binary())]))

    return gather
