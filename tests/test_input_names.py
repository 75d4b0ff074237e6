"""File and blob names as users have them: spaces, %, #, +, non-ASCII letters, uppercase extensions, a real zero-byte
file, Hadoop glob characters ([ ] { } * ? \\). Every input ends up exactly once in detections/ or errors/, under the
one path spelling the listing gives; the counts equal the number of files; a re-run skips them all (its resume keys
match)."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from pipelines.inference import image_sources as src
from pipelines.inference.inference_job import run
from tests.conftest import SAMPLES
from tests.job_helpers import DEFAULT_MODEL_DIR, job_config, read_rows

GOOD_NAMES = [
    "a/b/UPPER CASE.JPG",
    "c/straße ünïcode.jpg",
    "c/100% #1 a+b.jpeg",
    "d/p%20already escaped.Png",
    "d/plain.jpg",
]
EMPTY_NAME = "c/zero byte ü.jpg"
GLOB_NAMES = ["g/photo [1].jpg", "g/a{b,c}.jpg", "g/star*.jpg", "g/why?.jpg", "g/back\\slash.jpg", "h [2]/x.jpg"]


def write_tree(root: Path, names: list[str]) -> None:
    sources = [SAMPLES / "images" / "coffee.jpg", SAMPLES / "images" / "camera.png"]
    for name in names:
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sources[name.lower().endswith(".png")], target)


def test_every_local_name_is_counted_once_and_resumed(spark, tmp_path):
    images, output = tmp_path / "in put", tmp_path / "out"
    write_tree(images, GOOD_NAMES)
    (images / EMPTY_NAME).write_bytes(b"")
    expected = {f"file:{images / name}" for name in GOOD_NAMES}

    summary = run(spark, job_config(images, output))
    assert summary["counts"]["inputs"] == len(GOOD_NAMES) + 1
    assert (summary["counts"]["done"], summary["counts"]["failed"]) == (len(GOOD_NAMES), 1)
    detections = read_rows(spark, output, "detections")
    errors = read_rows(spark, output, "errors")
    assert sorted(row.path for row in detections) == sorted(expected)
    assert [(row.path, row.error_type) for row in errors] == [(f"file:{images / EMPTY_NAME}", "ImageDecodeError.empty")]

    # a new file beside the done ones: only it is read (the partial to-do path), then everything is skipped
    write_tree(images, ["e/new one #2.jpg"])
    second = run(spark, job_config(images, output))
    assert (second["counts"]["skipped"], second["counts"]["done"]) == (len(GOOD_NAMES) + 1, 1)
    third = run(spark, job_config(images, output))
    assert third["counts"]["skipped"] == third["counts"]["inputs"] == len(GOOD_NAMES) + 2
    paths = [row.path for row in read_rows(spark, output, "detections")]
    assert len(paths) == len(set(paths)) == len(GOOD_NAMES) + 1


def test_file_uris_name_the_output_and_the_model_as_they_name_the_input(spark, tmp_path, monkeypatch):
    """`file:/a b` (Hadoop's spelling, which inputs take) is the directory "/a b" for --output and --model too,
    whatever the working directory; however input and output are spelled (plain or file:, through a symlink or
    not), a re-run finds the results and every path written has one spelling."""
    images, output, elsewhere = tmp_path / "in", tmp_path / "out put", tmp_path / "cwd"
    write_tree(images, ["plain.jpg"])
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(images)
    monkeypatch.chdir(elsewhere)
    summary = run(spark, job_config(images, f"file:{output}", model_dir=f"file:{DEFAULT_MODEL_DIR}"))
    assert summary["counts"]["done"] == 1 and (output / "summary.json").is_file()
    assert list(elsewhere.iterdir()) == []
    assert run(spark, job_config(images, output))["counts"]["skipped"] == 1
    write_tree(images, ["second.jpg"])
    again = run(spark, job_config(f"file:{tmp_path / 'link'}", f"file://{output}/"))
    assert (again["counts"]["skipped"], again["counts"]["done"]) == (1, 1)
    rows = read_rows(spark, output, "detections")
    assert sorted(row.path for row in rows) == [f"file:{images / 'plain.jpg'}", f"file:{images / 'second.jpg'}"]
    assert sorted(row.mask_path for row in rows) == [f"{output}/masks/plain.jpg.png", f"{output}/masks/second.jpg.png"]


def test_a_run_names_the_underscored_photos_it_skipped(spark, tmp_path, caplog):
    """Names starting with '_' are hidden (Hadoop's rule, which every store's listing follows): a run that lists
    other images too says how many it skipped and what to do (a camera's Adobe RGB photos are `_DSC0001.JPG`)."""
    images = tmp_path / "in"
    write_tree(images, ["DSC0002.JPG", "_DSC0001.JPG"])
    with caplog.at_level("WARNING", logger="pipelines.inference.resume"):
        assert run(spark, job_config(images, tmp_path / "out"))["counts"]["inputs"] == 1
    assert "1 file with those endings is skipped for a name starting with '_' (e.g. _DSC0001.JPG;" in caplog.text


def test_a_name_that_is_not_utf8_is_the_files_own_error_naming_what_to_do(spark, tmp_path):
    """Linux names are bytes: a Latin-1 `café.jpg` cannot be spelled in a Spark string. It is listed with U+FFFD for
    its bad bytes (as Hadoop's listing spells it), recorded once as its own error saying to rename it, and not
    tried again by the next run."""
    images = tmp_path / "in"
    write_tree(images, ["plain.jpg"])
    os.link(images / "plain.jpg", os.fsencode(images) + b"/caf\xe9.jpg")
    summary = run(spark, job_config(images, tmp_path / "out"))
    assert (summary["counts"]["done"], summary["counts"]["failed"]) == (1, 1)
    [error] = read_rows(spark, tmp_path / "out", "errors")
    assert (error.path, error.error_type) == (f"file:{images}/caf\ufffd.jpg", "ImageDecodeError.name_not_utf8")
    assert "rename it with a UTF-8 name" in error.message
    assert run(spark, job_config(images, tmp_path / "out"))["counts"]["skipped"] == 2


def test_names_with_glob_characters_are_names(spark, tmp_path):
    """Spark's file readers expand Hadoop globs in every path they are given ("photo [1].jpg" means "photo 1.jpg"):
    input and output directories and file names with glob characters are read as themselves."""
    images, output = tmp_path / "in [1]", tmp_path / "out {a,b}"
    write_tree(images, GLOB_NAMES)
    expected = sorted(f"file:{images / name}" for name in GLOB_NAMES)

    summary = run(spark, job_config(images, output))
    assert (summary["counts"]["inputs"], summary["counts"]["done"]) == (len(GLOB_NAMES), len(GLOB_NAMES))
    assert sorted(row.path for row in read_rows(spark, output, "detections")) == expected
    assert run(spark, job_config(images, output))["counts"]["skipped"] == len(GLOB_NAMES)  # read the table back

    # the binaryFile read of a partial to-do by its paths (how hdfs:// and abfss:// inputs get their bytes)
    listing = src.list_images(spark, str(images), [".jpg"])
    todo = listing.where(~F.col("path").endswith("x.jpg"))
    read = src.with_content(spark, todo, todo.count(), str(images), [".jpg"], True, all_listed=False).collect()
    assert sorted(row.path for row in read) == [path for path in expected if not path.endswith("/x.jpg")]
    assert all(len(row.content) == row.size > 0 for row in read)


def test_every_blob_name_is_counted_once_and_resumed(spark, azurite, monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    container = azurite.create_container("names")
    client = azurite.service_client().get_container_client(container)
    source = tmp_path / "source"
    write_tree(source, GOOD_NAMES)
    for name in GOOD_NAMES:
        client.upload_blob(f"landing/{name}", (source / name).read_bytes())
    client.upload_blob(f"landing/{EMPTY_NAME}", b"")

    config = job_config(tmp_path, tmp_path, partitions=2)
    config["input"]["uri"] = f"az://{container}/landing"
    config["output"]["uri"] = f"az://{container}/out"
    summary = run(spark, config)

    def table(name: str) -> list[dict]:
        parts = [
            blob.name for blob in client.list_blobs(name_starts_with=f"out/{name}/") if blob.name.endswith(".parquet")
        ]
        return pa.concat_tables(
            [pq.read_table(io.BytesIO(client.download_blob(part).readall())) for part in parts]
        ).to_pylist()

    assert summary["counts"]["inputs"] == len(GOOD_NAMES) + 1
    assert (summary["counts"]["done"], summary["counts"]["failed"]) == (len(GOOD_NAMES), 1)
    assert sorted(row["path"] for row in table("detections")) == sorted(
        f"az://{container}/landing/{name}" for name in GOOD_NAMES
    )
    assert [(row["path"], row["error_type"]) for row in table("errors")] == [
        (f"az://{container}/landing/{EMPTY_NAME}", "ImageDecodeError.empty")
    ]
    again = run(spark, config)
    assert again["counts"]["skipped"] == len(GOOD_NAMES) + 1 and again["counts"]["done"] == 0
