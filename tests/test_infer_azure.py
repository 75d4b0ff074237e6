"""The inference job against Azure Blob storage (Azurite): images read through the Azure SDK path (listed and read on
the executors), detections/errors/masks/summary written back, read back by the test; no secret in
anything written."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.inference.inference_job import run
from pipelines.ops.mask_outputs import read_label_map_png
from tests.conftest import SAMPLES
from tests.fixtures_azurite import ACCOUNT_KEY
from tests.job_helpers import job_config


def test_job_reads_and_writes_azure_blob_storage(spark, azurite, monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    container = azurite.create_container("images")
    client = azurite.service_client().get_container_client(container)
    names = []
    for number, path in enumerate(sorted((SAMPLES / "images").glob("*.jpg"))[:3]):
        name = f"landing/day{number % 2}/{path.name}"
        client.upload_blob(name, path.read_bytes())
        names.append(name)
    client.upload_blob("landing/broken.jpg", b"not a jpeg")
    client.upload_blob("landing/notes.txt", b"ignored: not an image extension")

    config = job_config(tmp_path, tmp_path, partitions=2)
    config["input"]["uri"] = f"az://{container}/landing"
    config["output"]["uri"] = f"az://{container}/out"
    summary = run(spark, config)
    assert summary["counts"] == {
        "inputs": 4,
        "skipped": 0,
        "done": 3,
        "failed": 1,
        "units": 4,
        "videos": 0,
        "frames": 0,
        "instances": summary["counts"]["instances"],
    }

    blobs = {b.name: b for b in client.list_blobs(name_starts_with="out/")}
    detections = pa.concat_tables(
        [pq.read_table(io.BytesIO(client.download_blob(n).readall())) for n in blobs if n.startswith("out/detections/")]
    ).to_pylist()
    errors = pa.concat_tables(
        [pq.read_table(io.BytesIO(client.download_blob(n).readall())) for n in blobs if n.startswith("out/errors/")]
    ).to_pylist()
    assert sorted(r["path"] for r in detections) == sorted(f"az://{container}/{n}" for n in names)
    assert [r["path"] for r in errors] == [f"az://{container}/landing/broken.jpg"]
    assert errors[0]["stage"] == "decode"
    for row in detections:
        mask_blob = row["mask_path"].removeprefix(f"az://{container}/")
        assert mask_blob in blobs
        label_map = read_label_map_png(client.download_blob(mask_blob).readall())
        assert label_map.shape == (row["height"], row["width"])
    written = json.loads(client.download_blob("out/summary.json").readall())
    assert written["counts"] == summary["counts"]
    assert not [name for name in blobs if "_sparkseg_attempts" in name], "crash markers removed after the wave"

    again = run(spark, config)  # resume works on Azure too
    assert again["counts"]["skipped"] == 4 and again["counts"]["done"] == 0

    everything = b"".join(client.download_blob(n).readall() for n in client.list_blobs(name_starts_with="out/"))
    for secret in (ACCOUNT_KEY.encode(), azurite.connection_string.encode()):
        assert secret not in everything


def test_a_blob_table_is_read_on_the_executors_with_old_files_given_null_frame_columns(spark, azurite):
    """The azure_sdk writer's tables are read by the executors, the driver holding only the file names (a 10^7-row
    history must not pass through it), with the credentials the driver resolved; a file from before the video
    frame columns reads them as nulls, as Spark's reader does for the Hadoop writer's files."""
    from pipelines.io.azure_credentials import AzureCredentials
    from pipelines.io.storage import Location
    from pipelines.results.result_schema import FRAME_COLUMNS
    from pipelines.results.results_writer import arrow_schema_of, read_table, table_schema

    container = azurite.create_container()
    table = Location(f"az://{container}/out/errors", AzureCredentials(connection_string=azurite.connection_string))
    assert read_table(spark, table) is None
    schema = arrow_schema_of(table_schema(spark, table.uri))
    rows = [
        {
            "path": f"az://{container}/in/{n}.jpg",
            "stage": "decode",
            "error_type": "ValueError",
            "message": "not a jpeg",
            "size": n,
            "modification_time": None,
            "model_name": "m",
            "model_sha256": "s",
            "run_id": f"run-{n}",
            "frame_index": n if n % 2 else None,
        }
        for n in range(6)
    ]
    for start in range(0, 6, 2):  # three files, the first without the frame columns
        part = pa.Table.from_pylist(rows[start : start + 2], schema=schema)
        if start == 0:
            part = part.drop_columns(list(FRAME_COLUMNS))
        buffer = io.BytesIO()
        pq.write_table(part, buffer)
        (table / f"part-{start}.parquet").write_bytes_atomic(buffer.getvalue())

    frame = read_table(spark, table)
    assert "MapInArrow" in frame._jdf.queryExecution().executedPlan().toString()  # rows made by executor tasks
    read = sorted((row.asDict() for row in frame.collect()), key=lambda row: row["size"])
    expected = [{**row, "frame_index": None if row["size"] < 2 else row["frame_index"]} for row in rows]
    assert [{key: row[key] for key in expected[0]} for row in read] == expected
    assert all(row[name] is None for row in read[:2] for name in FRAME_COLUMNS)


def test_blobs_the_store_would_not_read_are_tried_again_by_the_next_run(spark, azurite, monkeypatch, tmp_path):
    """Archived blobs (a lifecycle policy moved them to the archive tier) are listed but cannot be read until they
    are rehydrated: every image and the video is a `read` error, not a decode error, so the run after the
    rehydration does them all."""
    from pipelines.results.incremental import current_detections, current_errors, table_counts
    from tests.test_video_input import encode_video, road_frames

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    container = azurite.create_container("archived")
    client = azurite.service_client().get_container_client(container)
    images = [path.name for path in sorted((SAMPLES / "images").glob("*.jpg"))[:2]]
    for name in images:
        client.upload_blob(f"in/{name}", (SAMPLES / "images" / name).read_bytes())
    client.upload_blob("in/clip.mp4", encode_video(tmp_path / "clip.mp4", road_frames(6)).read_bytes())
    for name in [*images, "clip.mp4"]:
        client.get_blob_client(f"in/{name}").set_standard_blob_tier("Archive")
    config = job_config(tmp_path, tmp_path / "out")
    config["input"]["uri"] = f"az://{container}/in"
    config["run"]["max_error_fraction"] = 1.0
    first = run(spark, config)
    assert first["counts"]["done"] == 0 and first["counts"]["failed"] == 3
    errors = {row.path.rsplit("/", 1)[1]: row for row in current_errors(spark, str(tmp_path / "out")).collect()}
    assert sorted(errors) == sorted([*images, "clip.mp4"])
    assert {(row.stage, row.error_type) for row in errors.values()} == {("read", "AzureStorageError")}, errors
    assert "archived blob" in errors["clip.mp4"].message

    for name in [*images, "clip.mp4"]:
        client.get_blob_client(f"in/{name}").set_standard_blob_tier("Hot")
    second = run(spark, config)
    assert second["counts"]["skipped"] == 0 and second["counts"]["failed"] == 0
    assert second["counts"]["done"] == 2 + 6  # two images, six frames
    assert current_errors(spark, str(tmp_path / "out")).count() == 0
    assert (
        second["table"]
        == table_counts(spark, str(tmp_path / "out"))
        == {"images": 8, "errors": 0, "superseded_rows": 3}
    )
    assert {row.path.rsplit("/", 1)[1] for row in current_detections(spark, str(tmp_path / "out")).collect()} == {
        *images,
        "clip.mp4",
    }
