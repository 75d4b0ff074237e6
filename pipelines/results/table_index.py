"""The summary's `table` counts (what the output holds) from this run's own records plus a small persisted index,
instead of ranking every record of the output's history on every run.

`<output>/_sparkseg_counts.json` holds, per model sha256, incremental.table_counts' numbers ({"images", "errors",
"superseded_rows"}), the total rows of detections/ and errors/ (all models) they describe, and a digest of each
table's file names then. Before a run (under its lock), tables whose files are still the ones the index saw hold
its rows: nothing is opened (rows_before_run), and that total bounds the run's done keys (its broadcast). After it:
- the index is trusted only when the tables now hold exactly its rows plus this run's (known as above, else Parquet
  row counts read from every file's footer); anything else (no index yet, a model it never counted, a run killed
  between its writes and its index update) means one full rescan (incremental.table_counts), whose result becomes
  the new index;
- this run's paths are the only ones whose current records changed: theirs are counted without this run's rows
  and with them (incremental.ranked_keys), and the difference moves the counts. Only those paths' records are read
  (a semi-join on this run's paths, column-pruned), and a run with nothing new reads none.
Runs on one output never overlap (the run lock) and run ids sort by start time, so this run's records are the newest.
"""

from __future__ import annotations

import hashlib
import json
import logging

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.io.storage import Location
from pipelines.results.done_index import table_file_names
from pipelines.results.incremental import TABLES, ranked_keys, read_tables, record_keys, table_counts
from pipelines.results.results_writer import read_table

log = logging.getLogger(__name__)
INDEX_NAME = "_sparkseg_counts.json"


def table_rows(spark: SparkSession, output: Location) -> dict[str, int]:
    """{"detections": rows, "errors": rows} of every model (Parquet counts come from the footers)."""
    rows = {}
    for name in TABLES:
        frame = read_table(spark, output / name)
        rows[name] = frame.count() if frame is not None else 0
    return rows


def table_files(output: Location, files_now: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """{table: a digest of its Parquet files' names} (`files_now`: done_index.table_file_names(output), listed by
    the caller; else one listing per table), no file opened."""
    files_now = table_file_names(output) if files_now is None else files_now
    return {table: hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest() for table, names in files_now.items()}


def rows_before_run(output: Location, files_now: dict[str, dict[str, str]] | None = None) -> dict[str, int] | None:
    """{"detections": rows, "errors": rows} (all models) when the tables hold exactly the files the index saw, as its
    rows; None when unknown (no index, an index older than file digests, files added or removed since).
    `files_now`: the tables' files, as table_files takes them."""
    index = read_index(output) or {}
    rows = index.get("rows") or {}
    if "files" not in index or any(t not in rows for t in TABLES):
        return None
    return {t: int(rows[t]) for t in TABLES} if index["files"] == table_files(output, files_now) else None


def read_index(output: Location) -> dict | None:
    index = output / INDEX_NAME
    try:
        if not index.exists():
            return None
        return json.loads(index.read_bytes())
    except (OSError, ValueError) as err:  # unreadable: counted afresh, and rewritten
        log.warning("%s: unreadable (%s); the table counts are computed afresh", index.uri, err)
        return None


def write_index(output: Location, counts: dict) -> None:
    index = output / INDEX_NAME
    try:
        index.write_bytes_atomic((json.dumps(counts, indent=1, sort_keys=True) + "\n").encode())
    except OSError as err:  # the job's results stand; the next run rescans once
        log.warning("%s: not written (%s); the next run counts the tables afresh", index.uri, err)


def counts_after_run(
    spark: SparkSession,
    output: Location,
    model_sha256: str,
    run_id: str,
    written: dict[str, int],
    one_record_per_key: bool = False,
    new_output: bool = False,
    rows_before: dict[str, int] | None = None,
    files_now: dict[str, dict[str, str]] | None = None,
) -> dict:
    """incremental.table_counts(output, model) after run `run_id`, which appended `written` rows
    ({"detections": n, "errors": m}); updates the index. `one_record_per_key`: the run wrote at most one record per
    image or video frame (runs without videos: a video unit that fails writes one error row per segment).
    `new_output`: neither table existed when the run took the output's lock, so they hold its rows and no others
    (nothing to count). `rows_before`: rows_before_run's answer under the run's lock (the run added `written`).
    `files_now`: the tables' files after the run, as table_files takes them."""
    index = read_index(output) or {}
    if new_output or rows_before is not None:
        before = dict.fromkeys(TABLES, 0) if new_output or rows_before is None else rows_before
        rows = {t: before[t] + written.get(t, 0) for t in TABLES}
    else:
        rows = table_rows(spark, output)
    known = index.get("rows") or {}
    models = dict(index.get("models") or {})
    trusted = model_sha256 in models and all(rows[t] == int(known.get(t, -1)) + written.get(t, 0) for t in TABLES)
    if one_record_per_key and all(rows[t] == written.get(t, 0) for t in TABLES):
        # the tables hold this run's records and nothing else (a new output): each one is current
        counts = {"images": written.get("detections", 0), "errors": written.get("errors", 0), "superseded_rows": 0}
        models = {}
    elif trusted:
        counts = dict(models[model_sha256])
        if any(written.values()):
            counts = apply_run(spark, output, model_sha256, run_id, counts, written)
    else:
        counts = table_counts(spark, output, model_sha256)
        if not all(rows[t] == int(known.get(t, -1)) + written.get(t, 0) for t in TABLES):
            models = {}  # rows the index never saw (other models' too): those models are counted afresh later
    models[model_sha256] = counts
    write_index(output, {"rows": rows, "files": table_files(output, files_now), "models": models})
    return counts


def apply_run(
    spark: SparkSession, output: Location, model_sha256: str, run_id: str, counts: dict, written: dict[str, int]
) -> dict:
    """`counts` before run `run_id` -> after it: only the paths it wrote changed, so their current records are
    counted without its rows and with them; the difference moves the counts, and the rest of its rows supersede."""
    keys = record_keys(read_tables(spark, output, model_sha256))
    touched = keys.where(F.col("run_id") == run_id).select(F.col("path").alias("touched_path")).distinct()
    records = keys.join(touched, F.col("path") == F.col("touched_path"), "left_semi")

    def current(frame) -> dict[str, int]:
        return {
            row.table: row["count"] for row in ranked_keys(frame).where("rank = 1").groupBy("table").count().collect()
        }

    before, after = current(records.where(F.col("run_id") != run_id)), current(records)
    gained = {table: after.get(table, 0) - before.get(table, 0) for table in TABLES}
    return {
        "images": counts["images"] + gained["detections"],
        "errors": counts["errors"] + gained["errors"],
        "superseded_rows": counts["superseded_rows"] + sum(written.values()) - sum(gained.values()),
    }
