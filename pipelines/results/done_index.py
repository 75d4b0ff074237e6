"""The output's done keys for resume planning, from a compact index instead of every file of its history.

detections/ and errors/ grow by a few files every run (one per task and wave): after a year of hourly runs, an
anti-join over the tables themselves would open tens of thousands of small files on every run, however few images
are new. `<output>/_sparkseg_done/` keeps the keys of both tables' records (KEY_COLUMNS, every model, one row per
record; `retry` marks an errors/ row whose stage is in result_rows.RETRIED_STAGES: done_keys counts those) in a
few Parquet files, in two levels, as a log-structured merge does: `base` and `recent`. Its `index.json`
names each level's files, rows and the table files it covers. A run reads both levels and only the table files
neither covers. Once more than COMPACT_AFTER_FILES table files are not covered, the end of a run merges them into
`recent`, or, when `recent` would then hold more than 1/BASE_RATIO of `base`'s rows, merges everything into `base`
(so `base` is rewritten only each time the history grew by that fraction). A level is rewritten into the one of its
two slots index.json does not name, then index.json is rewritten: a run killed midway leaves the old index whole
and in use.

The index is only ever a shortcut: tables that no longer hold every file it covers (files deleted by hand) are read
whole, and the next rewrite starts again from the tables. Runs on one output never overlap (the run lock), so one
run at a time writes it.
"""

from __future__ import annotations

import json
import logging

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.io.storage import Location
from pipelines.results.result_rows import RETRIED_STAGES
from pipelines.results.results_writer import TABLES, choose_writer, read_table, upload_parquet_parts
from pipelines.spark.session_kind import session_kind

log = logging.getLogger(__name__)
INDEX_DIR = "_sparkseg_done"
INDEX_MANIFEST = "index.json"
COMPACT_AFTER_FILES = 32  # table files read besides the index before a run merges them into it
ROWS_PER_INDEX_FILE = 4_000_000  # ~100 MB of keys
BASE_RATIO = 8  # recent holds at most 1/8 of base's rows
KEY_SCHEMA = T.StructType(
    [
        T.StructField("model_sha256", T.StringType()),
        T.StructField("path", T.StringType()),
        T.StructField("size", T.LongType()),
        T.StructField("modification_time", T.TimestampType()),
        T.StructField("segment_start", T.IntegerType()),
        T.StructField("segment_end", T.IntegerType()),
        # an errors/ row of a failure that was not the input's (null in an index written before: done)
        T.StructField("retry", T.BooleanType()),
    ]
)
KEY_COLUMNS = KEY_SCHEMA.fieldNames()


def table_file_names(output: Location) -> dict[str, dict[str, str]]:
    """{table: {file name: URI}} of detections/ and errors/ Parquet files (one listing per table; hidden files and
    directories, e.g. a killed write's _temporary/, skipped as Spark's reader skips them)."""
    found = {}
    for name in TABLES:
        try:
            files = (output / name).list_files([".parquet"])
        except FileNotFoundError:  # no such table yet (a local output)
            files = []
        found[name] = {uri.rsplit("/", 1)[-1]: uri for uri in files}
    return found


def read_manifest(output: Location) -> dict | None:
    manifest = output / INDEX_DIR / INDEX_MANIFEST
    try:
        return json.loads(manifest.read_bytes()) if manifest.exists() else None
    except (OSError, ValueError) as err:  # unreadable: the tables are read whole, and the index rewritten
        log.warning("%s: unreadable (%s); resume planning reads the tables whole", manifest.uri, err)
        return None


def usable_manifest(
    output: Location, files_now: dict[str, dict[str, str]], manifest: dict | None = None
) -> dict | None:
    """index.json (or `manifest`, read from it) when every table file it covers is still there, else None."""
    manifest = read_manifest(output) if manifest is None else manifest
    if manifest is None or not isinstance(manifest.get("levels"), dict):
        return None
    if any(not names <= files_now[table].keys() for table, names in covered_files(manifest).items()):
        log.info("%s: table files it covers are gone; resume planning reads the tables whole", output.uri)
        return None
    return manifest


def covered_files(manifest: dict | None) -> dict[str, set[str]]:
    """{table: names of its files whose keys the index holds}."""
    covered: dict[str, set[str]] = {table: set() for table in TABLES}
    for level in ((manifest or {}).get("levels") or {}).values():
        for table in TABLES:
            covered[table].update(level["covers"].get(table, ()))
    return covered


def read_keys(
    spark: SparkSession, output: Location, levels: list[dict], table_files: dict[str, list[str] | None]
) -> DataFrame | None:
    """KEY_COLUMNS of the index `levels` and of the table files `table_files` ({table: URIs, or None for all of its
    files, listed by Spark's reader}); None for none."""
    parts: list[DataFrame | None] = []
    for level in levels:
        slot = output / INDEX_DIR / level["slot"]
        if level["files"]:
            parts.append(
                read_table(spark, slot, files=[(slot / name).uri for name in level["files"]], schema=KEY_SCHEMA)
            )
    for table in TABLES:
        files = table_files.get(table, [])
        frame = read_table(spark, output / table, files=files) if files is None or files else None
        if frame is not None:
            retry = (
                F.coalesce(F.col("stage").isin(*RETRIED_STAGES), F.lit(False)) if table == "errors" else F.lit(False)
            )
            parts.append(frame.withColumn("retry", retry))
    selected = [part.select(*KEY_COLUMNS) for part in parts if part is not None]
    if not selected:
        return None
    keys = selected[0]
    for part in selected[1:]:
        keys = keys.unionByName(part)
    return keys


def all_done_keys(
    spark: SparkSession, output: Location, files_now: dict[str, dict[str, str]] | None = None
) -> DataFrame | None:
    """KEY_COLUMNS of every record of every model in detections/ and errors/, from the index and the table files it
    does not cover (`files_now`: table_file_names(output), listed by the caller). None when nothing is written."""
    files_now = table_file_names(output) if files_now is None else files_now
    manifest = usable_manifest(output, files_now)
    levels = list(((manifest or {}).get("levels") or {}).values())
    return read_keys(spark, output, levels, uncovered_files(files_now, covered_files(manifest)))


def uncovered_files(files_now: dict[str, dict[str, str]], covered: dict[str, set[str]]) -> dict[str, list[str] | None]:
    """{table: URIs of its files the index does not cover; None where it covers none (the whole table is read)}."""
    return {
        table: [uri for name, uri in sorted(files_now[table].items()) if name not in covered[table]]
        if covered[table]
        else None
        for table in TABLES
    }


def done_keys(
    spark: SparkSession,
    output: Location | str,
    model_sha256: str,
    retries: int,
    files_now: dict[str, dict[str, str]] | None = None,
) -> DataFrame | None:
    """(path, size, modification_time, segment_start, segment_end) of the records of this model that are done: every
    detections/ row, every errors/ row of a failure that was the input's, and a failure that was not (`retry`) once
    it happened more than `retries` times to that key (not deduplicated: an anti-join needs no distinct;
    segment_start is null for images, a video's records are per segment). None when nothing has been written yet."""
    keys = all_done_keys(spark, Location.of(output), files_now)
    if keys is None:
        return None
    keys = keys.where(F.col("model_sha256") == model_sha256).drop("model_sha256")
    final = keys.where(~F.coalesce(F.col("retry"), F.lit(False))).drop("retry")
    given_up = (
        keys.where(F.col("retry"))
        .drop("retry")
        .groupBy(*final.columns)
        .count()
        .where(F.col("count") > retries)
        .drop("count")
    )
    return final.unionByName(given_up)


def update_after_run(
    spark: SparkSession, output: Location, files_now: dict[str, dict[str, str]] | None = None
) -> str | None:
    """At the end of a run (under its lock): when more than COMPACT_AFTER_FILES table files are not covered by the
    index, merge them into a level of it. Returns the level rewritten ("recent", "base"), None when none was.
    `files_now`: table_file_names(output), listed by the caller. A failure is a warning: the run's results are
    committed, and the index is only a shortcut (the next run reads the files it does not cover, and tries again)."""
    try:
        return merge_uncovered_files(spark, output, files_now)
    except Exception as err:  # noqa: BLE001 (storage or Spark errors alike)
        first_line = (str(err).strip().splitlines() or [""])[0][:300]
        log.warning(
            "%s: the resume index was not updated (%s: %s); the next run reads the table files it does not "
            "cover and tries again",
            (output / INDEX_DIR).uri,
            type(err).__name__,
            first_line,
        )
        return None


def merge_uncovered_files(
    spark: SparkSession, output: Location, files_now: dict[str, dict[str, str]] | None = None
) -> str | None:
    """update_after_run's merge, failures raised."""
    files_now = table_file_names(output) if files_now is None else files_now
    written = read_manifest(output) or {}
    manifest = usable_manifest(output, files_now, written)
    levels = dict((manifest or {}).get("levels") or {})
    covered = covered_files(manifest)
    uncovered = uncovered_files(files_now, covered)
    if sum(len(files_now[table]) - len(covered[table]) for table in TABLES) <= COMPACT_AFTER_FILES:
        return None
    base, recent = levels.get("base"), levels.get("recent")
    new_rows = _count(read_keys(spark, output, [], uncovered)) if base is not None else 0
    if base is not None and BASE_RATIO * ((recent or {}).get("rows", 0) + new_rows) <= base["rows"]:
        # recent's keys and the new files' into recent's other slot
        keys = read_keys(spark, output, [recent] if recent else [], uncovered)
        covers = {table: sorted(files_now[table].keys() - set(base["covers"].get(table, ()))) for table in TABLES}
        name = "recent"
    else:  # everything into base; recent emptied
        keys = read_keys(spark, output, [level for level in (base, recent) if level], uncovered)
        covers = {table: sorted(files_now[table]) for table in TABLES}
        name = "base"
        levels.pop("recent", None)
    assert keys is not None  # past COMPACT_AFTER_FILES uncovered files, there are keys to read
    in_use = ((written.get("levels") or {}).get(name) or {}).get("slot")  # even where unusable: left whole
    slot = f"{name}-b" if in_use == f"{name}-a" else f"{name}-a"
    written_rows = Observation(f"sparkseg-done-index-{name}")
    files = write_keys(spark, keys.observe(written_rows, F.count(F.lit(1)).alias("rows")), output / INDEX_DIR / slot)
    rows = written_rows.get["rows"]
    levels[name] = {"slot": slot, "files": [uri.rsplit("/", 1)[-1] for uri in files], "rows": rows, "covers": covers}
    (output / INDEX_DIR / INDEX_MANIFEST).write_bytes_atomic((json.dumps({"levels": levels}) + "\n").encode())
    log.info("%s: resume index level %s rewritten (%d keys)", output.uri, name, rows)
    return name


def write_keys(spark: SparkSession, keys: DataFrame, slot: Location) -> list[str]:
    """Write `keys` as the Parquet files of an index slot (whatever an earlier rewrite left there is replaced or,
    for blobs, never named again); returns their URIs."""
    keys = keys.coalesce(session_kind(spark).default_parallelism())
    if choose_writer(slot.uri) == "spark":
        keys.write.mode("overwrite").option("maxRecordsPerFile", ROWS_PER_INDEX_FILE).parquet(slot.uri)
        return slot.list_files([".parquet"])
    # blobs named by partition and batch, overwritten by the slot's next rewrite; a longer earlier rewrite's other
    # blobs stay, never read (index.json names this rewrite's)
    return upload_parquet_parts(keys, slot, "keys")


def _count(frame: DataFrame | None) -> int:
    return 0 if frame is None else frame.count()
