"""The report's rows (report_rows.ReportRows) of a job's output, gathered by Spark: what the job's `output.overlays`
draws after a large run, and `python -m pipelines.report.render --spark`.

The current records are ranked by Spark (pipelines.results.incremental), each partition's rows are gathered on the
executors and the partial results merged there in a tree, so that the driver receives one ReportRows (`limit` rows,
the counts, the first errors) whatever the number of images. `python -m pipelines.report.render` streams a local
output with pyarrow instead, through the same ReportRows, unless given --spark.
"""

from __future__ import annotations

from functools import partial

from pyspark.sql import DataFrame, SparkSession

from pipelines.io.storage import Location
from pipelines.report.report_rows import DEFAULT_LIMIT, DEFAULT_THRESHOLD, ReportRows, added_spark_row
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
            rows.merged(
                frame.select(*[c for c in columns if c in frame.columns]).rdd.treeAggregate(
                    ReportRows(score_threshold, limit), partial(added_spark_row, add), ReportRows.merged
                )
            )
    return rows.finished()
