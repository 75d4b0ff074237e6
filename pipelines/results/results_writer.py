"""Write: results DataFrame -> detections/ and errors/ (Parquet, appended per committed wave), summary.json,
coco_results.json.

Two writers, one layout:
- `spark`: Spark's Parquet writer for every Hadoop URI (file://, hdfs://, abfss:// with hadoop-azure); its commit
  protocol makes a wave's files visible only when the wave's job commits.
- `azure_sdk` (az:// outputs, clusters without hadoop-azure): each task uploads its own Parquet files with names
  fixed by (run, wave, partition, batch), so a retried or speculative task overwrites instead of duplicating, and a
  blob upload is atomic (never half visible).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pipelines.errors import UsageError
from pipelines.io.storage import Location, spark_read_path
from pipelines.io.uris import store_of
from pipelines.results.result_rows import STAGES
from pipelines.results.result_schema import FRAME_COLUMNS, RESULT_SCHEMA
from pipelines.spark.java_errors import unreachable_storage
from pipelines.spark.session_kind import hadoop_files, session_kind

# The tables' columns, from result_schema.RESULT_SCHEMA. The video frame columns are null for images; tables written
# before they existed get them as nulls when read (read_table), so old outputs stay readable and resumable.
DETECTION_COLUMNS = [
    "path",
    "width",
    "height",
    "instances",
    "mask_path",
    "size",
    "modification_time",
    "timings",
    "model_name",
    "model_sha256",
    "run_id",
    *FRAME_COLUMNS,
]
ERROR_COLUMNS = [
    "path",
    "error_stage AS stage",
    "error_type",
    "error_message AS message",
    "size",
    "modification_time",
    "model_name",
    "model_sha256",
    "run_id",
    *FRAME_COLUMNS,
]
TIMING_FIELDS = [f"{stage}_s" for stage in STAGES]


TABLES = ("detections", "errors")


def choose_writer(output_uri: str) -> str:
    return "azure_sdk" if store_of(output_uri) == "azure_sdk" else "spark"


def write_results(results: DataFrame, output: Location, file_prefix: str = "part") -> dict:
    """Append the ok rows to detections/ and the error rows to errors/; return the wave's aggregates
    (counts, instance count, per-stage seconds), observed while the detections are written (no pass of their own).
    `results` should be persisted by the caller."""
    totals = Observation(f"sparkseg-{file_prefix}")
    observed = results.observe(
        totals,
        F.sum(F.when(F.col("status") == "ok", 1).otherwise(0)).alias("done"),
        F.sum(F.when(F.col("status") == "error", 1).otherwise(0)).alias("failed"),
        F.sum(F.when((F.col("status") == "ok") & F.col("frame_index").isNotNull(), 1).otherwise(0)).alias("frames"),
        F.sum(F.coalesce(F.size("instances"), F.lit(0))).alias("instances"),
        *[F.sum(f"timings.{name}").alias(name) for name in TIMING_FIELDS],
    )
    detections = observed.where("status = 'ok'").select(*DETECTION_COLUMNS)  # the first write: observes every row
    errors = results.where("status = 'error'").selectExpr(*ERROR_COLUMNS)
    append_rows(detections, output / "detections", file_prefix)
    counts = {key: (value or 0) for key, value in totals.get.items()}
    # A wave without failures scans nothing for them (a scan of the persisted results per wave); a
    # Hadoop output still gets its errors/ table, empty, so that it can always be read.
    if counts["failed"]:
        append_rows(errors, output / "errors", file_prefix)
    elif choose_writer(output.uri) == "spark" and not hadoop_path_exists(results.sparkSession, (output / "errors").uri):
        append_rows(errors.limit(0), output / "errors", file_prefix)  # planned empty: reads nothing
    return counts


def append_rows(frame: DataFrame, table: Location, file_prefix: str) -> None:
    """Append `frame` to `table` (detections/ or errors/) with the output's writer (choose_writer)."""
    if choose_writer(table.uri) == "spark":
        frame.write.mode("append").parquet(table.uri)
    else:
        upload_parquet_parts(frame, table, file_prefix)


def upload_parquet_parts(frame: DataFrame, table: Location, file_prefix: str) -> list[str]:
    """Each task writes its rows as Parquet blobs named <prefix>-<partition>-<batch>.parquet under `table`;
    returns their URIs."""
    arrow_schema = arrow_schema_of(frame.schema)

    def upload(batches):
        import io

        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        for number, batch in enumerate(batches):
            if len(batch):
                buffer = io.BytesIO()
                pq.write_table(pa.Table.from_pandas(batch, schema=arrow_schema, preserve_index=False), buffer)
                name = f"{file_prefix}-{partition:05d}-{number:04d}.parquet"
                (table / name).write_bytes_atomic(buffer.getvalue())
                yield pd.DataFrame({"uri": [(table / name).uri]})

    return sorted({row.uri for row in frame.mapInPandas(upload, "uri string").collect()})


def arrow_schema_of(schema: StructType):
    """The Arrow schema of a Spark schema as the azure_sdk writer's files hold it (timestamps in UTC)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    # pyspark 4 needs the session time zone for timestamps; pyspark 3.5 always used UTC and takes no argument
    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


def read_table(
    spark: SparkSession, table: Location | str, files: list[str] | None = None, schema: StructType | None = None
) -> DataFrame | None:
    """detections/ or errors/ (a Location, or a URI with the environment's credentials) as a DataFrame, from either
    writer; None when nothing was written yet. `files`: only these Parquet files of the table (URIs as list_files
    gives them); `schema`: the files' schema (default: the job's, for detections/ and errors/)."""
    table = Location.of(table)
    table_uri = table.uri
    schema = schema or table_schema(spark, table_uri)  # files of runs before the frame columns lack them: read as null
    if choose_writer(table_uri) != "spark":
        return read_uploaded_table(spark, table, files, schema)
    if files is None and not hadoop_path_exists(spark, table_uri):  # a new output: Spark would log a stack trace
        return None
    try:
        reader = spark.read if schema is None else spark.read.schema(schema)
        paths = [spark_read_path(uri) for uri in files] if files is not None else [spark_read_path(table_uri)]
        return with_frame_columns(reader.parquet(*paths)) if paths else None
    except Exception:  # noqa: BLE001  (a directory without Parquet files yet, e.g. a killed first wave)
        return None


def read_uploaded_table(
    spark: SparkSession, table: Location, files: list[str] | None, schema: StructType
) -> DataFrame | None:
    """The azure_sdk writer's Parquet files of `table` (or only `files`), read on the executors (a few files per
    task): the driver lists the file names and never holds the rows. Columns of `schema` a file lacks (files
    written before the frame columns) are read as nulls."""
    files = table.list_files([".parquet"]) if files is None else files
    if not files:
        return None
    arrow_schema = arrow_schema_of(schema)
    store = table.store  # pickles its credentials, resolved here on the driver (executors may lack them)

    def read_files(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq

        for batch in batches:
            for uri in batch.column(0).to_pylist():
                data = pq.read_table(pa.BufferReader(store.read(uri)))
                columns = [
                    data.column(field.name).cast(field.type)
                    if field.name in data.column_names
                    else pa.nulls(data.num_rows, field.type)
                    for field in arrow_schema
                ]
                yield from pa.Table.from_arrays(columns, schema=arrow_schema).to_batches()

    kind = session_kind(spark)
    names = kind.parallelized([(uri,) for uri in files], "uri string", min(len(files), kind.default_parallelism()))
    return names.mapInArrow(read_files, schema)


def table_schema(spark: SparkSession, table_uri: str):
    """The schema the job writes detections/ or errors/ with (from RESULT_SCHEMA; no Spark job), None for other
    tables. Reading with it, Parquet files that lack a column give nulls, whichever file Spark would have sampled."""
    name = table_uri.rstrip("/").rsplit("/", 1)[-1]
    columns = {"detections": DETECTION_COLUMNS, "errors": ERROR_COLUMNS}.get(name)
    if columns is None:
        return None
    run_columns = [StructField(column, StringType()) for column in ("model_name", "model_sha256", "run_id")]
    written = spark.createDataFrame([], StructType(RESULT_SCHEMA.fields + run_columns))
    return written.selectExpr(*columns).schema


def with_frame_columns(table: DataFrame) -> DataFrame:
    """A table read back, with FRAME_COLUMNS added as nulls where it predates them."""
    for name, kind in FRAME_COLUMNS.items():
        if name not in table.columns:
            table = table.withColumn(name, F.lit(None).cast(kind))
    return table


def hadoop_path_exists(spark: SparkSession, uri: str) -> bool:
    """Whether `uri` exists, asked of the Hadoop FileSystem the driver's Spark reads it with (any scheme)."""
    return _on_hadoop_file_system(spark, uri, lambda files: files.exists())


def hadoop_delete(spark: SparkSession, uri: str) -> bool:
    """Delete `uri` (recursively) with the Hadoop FileSystem the driver's Spark writes it with; whether it existed."""
    return _on_hadoop_file_system(spark, uri, lambda files: files.delete())


def _on_hadoop_file_system(spark: SparkSession, uri: str, call: Callable) -> bool:
    try:
        return bool(call(hadoop_files(spark, uri)))
    except UsageError:  # a store this kind of session cannot reach from the driver
        raise
    except Exception as err:  # noqa: BLE001 - py4j wraps the Java exception
        raise unreachable_storage(spark, uri, err) or err from None


def remove_uncommitted_writes(spark: SparkSession, output: Location) -> list[str]:
    """Delete what killed runs' Spark writes left uncommitted in detections/ and errors/ (Hadoop's `_temporary/`);
    returns the URIs removed. The next append would otherwise commit them with its own: Hadoop's FileOutputCommitter
    (v1) moves every committed task under `_temporary/0/` into the table, the killed run's as well, and those rows
    would then be there twice once this run redoes their images. Call only under the output's lock: no other run
    writes there."""
    if choose_writer(output.uri) != "spark":  # the Azure SDK writer uploads finished blobs only
        return []
    leftovers = [(output / name / "_temporary").uri for name in TABLES]
    return [uri for uri in leftovers if hadoop_delete(spark, uri)]


def holds_tables(spark: SparkSession, output: Location) -> bool:
    """Whether detections/ or errors/ exist at `output` (a new output has neither); no Spark job, no listing of a
    table's files on the Hadoop writer's stores."""
    if choose_writer(output.uri) == "spark":
        return any(hadoop_path_exists(spark, (output / name).uri) for name in TABLES)
    return any((output / name).list_files([".parquet"]) for name in TABLES)


def failed_paths(spark: SparkSession, output: Location, run_id: str, limit: int = 10) -> list[str]:
    """The first `limit` paths (sorted) recorded in errors/ by run `run_id`."""
    errors = read_table(spark, output / "errors")
    if errors is None:
        return []
    return [
        row.path
        for row in errors.where(F.col("run_id") == run_id).select("path").orderBy("path").limit(limit).collect()
    ]


def failure_types(spark: SparkSession, output: Location, run_id: str) -> dict[str, int]:
    """{error_type: rows} of the errors/ rows of run `run_id`, the most frequent first (a few types, not paths)."""
    errors = read_table(spark, output / "errors")
    if errors is None:
        return {}
    counts = errors.where(F.col("run_id") == run_id).groupBy("error_type").count().collect()
    return {row.error_type: row["count"] for row in sorted(counts, key=lambda row: (-row["count"], row.error_type))}


def write_summary(output: Location, summary: dict) -> None:
    (output / "summary.json").write_bytes_atomic((json.dumps(summary, indent=2, default=str) + "\n").encode())


def read_summary(output: Location) -> dict | None:
    """The summary.json the last run left at `output` (any store); None where there is none or it is unreadable."""
    location = output / "summary.json"
    try:
        return json.loads(location.read_bytes()) if location.exists() else None
    except (OSError, ValueError):
        return None
