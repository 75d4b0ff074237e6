"""Incremental (scheduled) runs: which rows of an output are current.

Each run processes only the images not yet recorded for its model, keyed by (path, size, modification time) in
`inference_job.todo_listing`: new images, images REPLACED since (other size or modification time), and images whose
last failure was not their own (result_rows.RETRIED_STAGES). detections/ and errors/ are append-only, so a replaced
image then has two records: the old one and the new one (and its PNG label map under masks/ was overwritten by the
new run, so the old row's `mask_path` now shows the new masks).
The CURRENT record of a path is the one written by the newest run: run ids begin with the run's UTC start time
(`20260101T000000Z-1a2b3c4d`), and the run lock keeps runs on one output from overlapping, so run ids sort by time;
ties (two runs started in the same second) go to the newer image modification time. A video's records are per
frame, written by one run or, segment by segment, by several (a killed run and the one that resumed it): its
current records are the newest of each frame among those of its newest version and kind (ranked_keys).

A path's current record may be an error: a replaced image that no longer decodes is in current_errors and no
longer in current_detections. Images deleted from the input keep their last record (nothing here reads the input).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.io.storage import Location
from pipelines.results.results_writer import TABLES, read_table


def current_records(
    spark: SparkSession, output: Location | str, model_sha256: str | None = None
) -> dict[str, DataFrame]:
    """{"detections": DataFrame, "errors": DataFrame} holding only the current record of every path (rows of the
    tables as written, same columns). `output`: a Location, or a URI read with the environment's credentials.
    `model_sha256` first restricts both tables to that model's rows. Tables not written yet are absent."""
    tables = read_tables(spark, output, model_sha256)
    if not tables:
        return {}
    current = renamed_keys(_ranked_keys(tables).where("rank = 1"), "current_", with_run=True)
    return {
        name: frame.join(
            current.where(F.col("table") == name).drop("table"), same_record("current_", with_run=True), "left_semi"
        )
        for name, frame in tables.items()
    }


def renamed_keys(keys: DataFrame, prefix: str, with_run: bool = False) -> DataFrame:
    """Record keys (path, frame_index[, run_id], and `table` where present) with the key columns renamed
    <prefix><name>, to join back onto the tables they come from (no ambiguous self-join)."""
    names = ("path", "frame_index", "run_id") if with_run else ("path", "frame_index")
    extra = ["table"] if "table" in keys.columns else []
    return keys.select(*[F.col(name).alias(prefix + name) for name in names], *extra)


def same_record(prefix: str, with_run: bool = False):
    """Join condition: a record's key (path, frame_index[, run_id]; frame_index null for images) equals the
    renamed_keys columns <prefix>path, <prefix>frame_index[, <prefix>run_id]."""
    condition = (F.col("path") == F.col(prefix + "path")) & F.col("frame_index").eqNullSafe(
        F.col(prefix + "frame_index")
    )
    return condition & (F.col("run_id") == F.col(prefix + "run_id")) if with_run else condition


def current_detections(
    spark: SparkSession, output: Location | str, model_sha256: str | None = None
) -> DataFrame | None:
    """detections/ with one row per path: the newest run's, and only where that newest record is not an error.
    None when nothing was written yet."""
    return current_records(spark, output, model_sha256).get("detections")


def current_errors(spark: SparkSession, output: Location | str, model_sha256: str | None = None) -> DataFrame | None:
    """errors/ with one row per path whose newest record is an error. None when no error was written yet."""
    return current_records(spark, output, model_sha256).get("errors")


def table_counts(spark: SparkSession, output: Location | str, model_sha256: str | None = None) -> dict:
    """What the output holds: {"images": paths whose current record is a detection row, "errors": paths whose
    current record is an error, "superseded_rows": older records of replaced or recomputed images}. Ranks every
    record of the output: the job's summary uses table_index.counts_after_run, which reads only this run's paths."""
    counts = {"images": 0, "errors": 0, "superseded_rows": 0}
    tables = read_tables(spark, output, model_sha256)
    if tables:
        for row in _ranked_keys(tables).groupBy("table", (F.col("rank") == 1).alias("current")).count().collect():
            key = ("images" if row.table == "detections" else "errors") if row.current else "superseded_rows"
            counts[key] += row["count"]
    return counts


def read_tables(spark: SparkSession, output: Location | str, model_sha256: str | None) -> dict:
    tables = {}
    for name in TABLES:
        frame = read_table(spark, Location.of(output) / name)
        if frame is not None:
            tables[name] = frame if model_sha256 is None else frame.where(F.col("model_sha256") == model_sha256)
    return tables


def record_keys(tables: dict[str, DataFrame]) -> DataFrame:
    """(path, frame_index, run_id, size, modification_time, table) of every record of `tables` ({"detections":
    frame, ...}); a record is an image (frame_index null) or one video frame (a video's error rows: the first frame
    not decoded, or null for a video not readable at all)."""
    keys: DataFrame | None = None
    for name, frame in tables.items():
        part = frame.select("path", "frame_index", "run_id", "size", "modification_time", F.lit(name).alias("table"))
        keys = part if keys is None else keys.unionByName(part)
    if keys is None:
        raise ValueError("record_keys: no tables given")
    return keys


def ranked_keys(keys: DataFrame) -> DataFrame:
    """Transform: record_keys rows + `rank`; rank 1 is a current record. A path's records that count are those of
    its newest record's file version (size, modification time: a replaced video's frames beyond its new length are
    superseded) and kind (a whole-file record, frame_index null, or frames: a video read whole or in segments
    supersedes its earlier "could not be read" row, and the other way round); among them, the newest run's record
    of each frame (of the file, for an image)."""
    newest_first = (F.col("run_id").desc(), F.col("modification_time").desc_nulls_last())
    by_path = Window.partitionBy("path").orderBy(*newest_first)
    live = (
        F.col("size").eqNullSafe(F.first("size").over(by_path))
        & F.col("modification_time").eqNullSafe(F.first("modification_time").over(by_path))
        & (F.col("frame_index").isNull() == F.first(F.col("frame_index").isNull()).over(by_path))
    )
    by_record = Window.partitionBy("path", "frame_index", "live").orderBy(*newest_first)
    return (
        keys.withColumn("live", live)
        .withColumn("rank", F.when(F.col("live"), F.row_number().over(by_record)).otherwise(F.lit(2)))
        .drop("live")
    )


def _ranked_keys(tables: dict[str, DataFrame]) -> DataFrame:
    return ranked_keys(record_keys(tables))
