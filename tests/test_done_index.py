"""Resume planning reads a compact index of the done keys (<output>/_sparkseg_done) and only the table files it does
not cover: the keys it gives always equal those of every table file, however the index was left (levels merged,
table files deleted by hand, a rewrite killed before index.json named it), and the files a run opens for them do
not grow with the number of earlier runs."""

from __future__ import annotations

import datetime as dt
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.io.storage import Location
from pipelines.results import done_index
from pipelines.results.done_index import COMPACT_AFTER_FILES, INDEX_DIR, done_keys, update_after_run
from pipelines.results.result_rows import RETRIED_STAGES
from pipelines.results.results_writer import arrow_schema_of, table_schema

KEYS = ("path", "size", "modification_time", "segment_start", "segment_end")


class History:
    """detections/ and errors/ of an output written file by file, as runs write them (pyarrow: no job needed)."""

    def __init__(self, spark, output: Location):
        self.output, self.files = output, 0
        self.schemas = {
            name: arrow_schema_of(table_schema(spark, (output / name).uri)) for name in ("detections", "errors")
        }

    def add_files(self, count: int, rows_per_file: int, table: str = "detections") -> None:
        for _ in range(count):
            number, self.files = self.files, self.files + 1
            rows = [
                {
                    "path": f"file:/in/{number:05d}-{row}.jpg",
                    "size": 1000 + row,
                    "modification_time": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(hours=row),
                    "model_sha256": "model-a" if row % 3 else "model-b",
                    "run_id": f"run-{number:05d}",
                    "segment_start": 30 * row if row % 4 == 1 else None,
                    "segment_end": 30 * row + 30 if row % 4 == 1 else None,
                }
                for row in range(rows_per_file)
            ]
            if table == "errors":  # final failures and retried ones (read, model, write: not done)
                for row in rows:
                    row["stage"] = ("decode", "read", "postprocess", "model", "write")[row["size"] % 5]
            buffer = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows, schema=self.schemas[table]), buffer)
            (self.output / table / f"part-{number:05d}-c000.snappy.parquet").write_bytes_atomic(buffer.getvalue())

    def keys(self, model: str, retries: int = 0) -> list[tuple]:
        """Every done record's key of `model`, read from every table file with pyarrow (the reference): a failure
        that was not the input's (each key here has one record) is done only where `retries` is 0."""
        found = []
        for table in ("detections", "errors"):
            for uri in (self.output / table).list_files([".parquet"]) if (self.output / table).exists() else []:
                for row in pq.read_table(io.BytesIO(self.output.sibling(uri).read_bytes())).to_pylist():
                    if row["model_sha256"] == model and (retries == 0 or row.get("stage") not in RETRIED_STAGES):
                        found.append(key_of(row))
        return sorted(found, key=repr)


def planned_keys(spark, output: Location, model: str, retries: int = 0) -> tuple[list[tuple], int]:
    """done_keys as resume planning reads them, and the number of files that read opens."""
    keys = done_keys(spark, output, model, retries)
    return sorted((key_of(row.asDict()) for row in keys.collect()), key=repr), len(keys._jdf.inputFiles())


def key_of(row: dict) -> tuple:
    """A record's key, its time as epoch seconds (Spark gives naive local datetimes, pyarrow aware UTC ones)."""
    mtime = row["modification_time"]
    return tuple(mtime.timestamp() if key == "modification_time" and mtime else row[key] for key in KEYS)


def index_levels(output: Location) -> dict:
    return json.loads((output / INDEX_DIR / "index.json").read_bytes())["levels"]


def test_done_keys_from_the_index_equal_every_table_files_and_open_few_files(spark, tmp_path):
    output = Location(str(tmp_path / "out"))
    history = History(spark, output)
    history.add_files(100, 10)
    history.add_files(3, 4, table="errors")
    assert update_after_run(spark, output) == "base"  # no index yet: everything into base
    steps = [
        (lambda: None, None),  # nothing new: nothing rewritten
        (lambda: history.add_files(COMPACT_AFTER_FILES, 1), None),  # up to the bound: read as they are
        (lambda: history.add_files(1, 1, table="errors"), "recent"),  # past it: merged into recent
        (lambda: history.add_files(COMPACT_AFTER_FILES + 1, 1), "recent"),  # recent again, into its other slot
        (lambda: history.add_files(COMPACT_AFTER_FILES + 1, 3), "base"),
    ]  # recent > base / 8: all into base
    for number, (change, rewritten) in enumerate(steps):
        change()
        assert update_after_run(spark, output) == rewritten, number
        levels = index_levels(output)
        for model, retries in (("model-a", 0), ("model-a", 1), ("model-b", 1)):
            keys, opened = planned_keys(spark, output, model, retries)
            assert keys == history.keys(model, retries), (number, model, retries)
            index_files = sum(len(level["files"]) for level in levels.values())
            assert opened <= index_files + COMPACT_AFTER_FILES, (number, opened)
    assert set(index_levels(output)) == {"base"}
    assert planned_keys(spark, output, "model-a")[1] == len(index_levels(output)["base"]["files"])


def test_deleted_table_files_or_a_killed_rewrite_leave_the_keys_those_of_the_tables(spark, tmp_path):
    output = Location(str(tmp_path / "out"))
    history = History(spark, output)
    history.add_files(COMPACT_AFTER_FILES + 1, 5)
    assert update_after_run(spark, output) == "base"
    # a rewrite killed before index.json named it: whatever it left in the other slot is never read
    junk = History(spark, output / INDEX_DIR / "base-b")
    junk.add_files(2, 5)
    assert planned_keys(spark, output, "model-a")[0] == history.keys("model-a")
    # a covered table file deleted by hand: the tables are read whole, and the next rewrite starts from them
    covered = index_levels(output)["base"]["covers"]["detections"][0]
    (tmp_path / "out" / "detections" / covered).unlink()
    assert done_index.usable_manifest(output, done_index.table_file_names(output)) is None
    assert planned_keys(spark, output, "model-a")[0] == history.keys("model-a")
    history.add_files(COMPACT_AFTER_FILES + 1, 1)
    assert update_after_run(spark, output) == "base"
    assert index_levels(output)["base"]["slot"] == "base-b"
    for model in ("model-a", "model-b"):
        assert planned_keys(spark, output, model)[0] == history.keys(model)


def test_the_index_of_a_blob_output(spark, azurite):
    from pipelines.io.azure_credentials import AzureCredentials

    output = Location(
        f"az://{azurite.create_container()}/out", AzureCredentials(connection_string=azurite.connection_string)
    )
    history = History(spark, output)
    history.add_files(COMPACT_AFTER_FILES + 1, 4)
    history.add_files(1, 4, table="errors")
    assert update_after_run(spark, output) == "base"
    history.add_files(3, 1)
    for model in ("model-a", "model-b"):
        keys, opened = planned_keys(spark, output, model)
        assert keys == history.keys(model)


def test_the_levels_cover_every_table_file_once(spark, tmp_path):
    output = Location(str(tmp_path / "out"))
    history = History(spark, output)
    history.add_files(50, 20)
    update_after_run(spark, output)
    history.add_files(COMPACT_AFTER_FILES + 1, 1)
    assert update_after_run(spark, output) == "recent"
    levels = index_levels(output)
    base, recent = (set(levels[name]["covers"]["detections"]) for name in ("base", "recent"))
    assert not base & recent and base | recent == set(done_index.table_file_names(output)["detections"])
    assert levels["base"]["rows"] == 50 * 20 and levels["recent"]["rows"] == COMPACT_AFTER_FILES + 1


def test_an_index_that_cannot_be_written_is_a_warning_and_planning_reads_the_tables(spark, tmp_path, caplog):
    output = Location(str(tmp_path / "out"))
    history = History(spark, output)
    history.add_files(COMPACT_AFTER_FILES + 1, 2)
    (tmp_path / "out" / INDEX_DIR).write_bytes(b"a file where the index's directory should be")
    with caplog.at_level("WARNING", logger="pipelines.results.done_index"):
        assert update_after_run(spark, output) is None
    assert "the resume index was not updated" in caplog.text
    for model in ("model-a", "model-b"):
        assert planned_keys(spark, output, model)[0] == history.keys(model)
