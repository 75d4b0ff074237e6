"""Local inputs are listed by the executors, or by the driver up to a bound of names (pipelines.io.local_listing,
image_sources.local_files_listing): the same rows as Spark's file index, which lists on the driver, for every name
users have."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines.inference import image_sources as src
from pipelines.io.local_listing import walk_entry, walk_top
from tests.test_input_names import EMPTY_NAME, GLOB_NAMES, GOOD_NAMES, write_tree

HIDDEN_NAMES = [
    ".hidden.jpg",
    "_SUCCESS.jpg",
    "_metadata.jpg",
    "c/_common_metadata 2.jpg",
    "_temporary/0/part.jpg",
    ".cache/x.jpg",
    "c/.partial.jpg",
]
OTHER_NAMES = ["notes.txt", "a/b/picture.jpg.txt"]


def tricky_tree(root: Path) -> None:
    write_tree(root, GOOD_NAMES + GLOB_NAMES + HIDDEN_NAMES + OTHER_NAMES + ["deep/1/2/3/4/five.jpg"])
    (root / EMPTY_NAME).write_bytes(b"")
    os.symlink(root / "a" / "b", root / "linked dir")  # a directory symlink: walked
    os.symlink(root / "d" / "plain.jpg", root / "linked.jpg")  # a file symlink: its target's size
    os.symlink(root / "missing.jpg", root / "broken.jpg")  # a broken symlink: not a file


def rows(frame) -> list[tuple]:
    return sorted((row.path, row.size, row.modification_time) for row in frame.collect())


def test_the_executors_list_what_sparks_file_index_lists(spark, tmp_path):
    images = tmp_path / "in put [1] #2"
    tricky_tree(images)
    extensions = [".jpg", ".jpeg", ".png"]

    ours = rows(src.find_images(spark, str(images), extensions).scanned)  # small: walked on the driver
    by_executors = src.local_files_listing(spark, str(images), extensions, recursive=True, driver_max_files=0)
    assert rows(by_executors) == ours
    # the directories were dealt over the tasks (the spark fixture has 2 cores)
    assert by_executors.select(F.spark_partition_id()).distinct().count() == 2
    sparks = rows(src.spark_file_index(spark, str(images), extensions).complete())
    assert [(path, size) for path, size, _ in ours] == [(path, size) for path, size, _ in sparks]
    # modification times to the millisecond, as Hadoop's; Spark's index gives zero-byte files none
    assert [row for row in ours if row[1]] == [row for row in sparks if row[1]]
    assert all(row[2] is not None for row in ours)
    names = {path[len(f"file:{images}/") :] for path, _, _ in ours}
    assert names == {
        *GOOD_NAMES,
        *GLOB_NAMES,
        EMPTY_NAME,
        "deep/1/2/3/4/five.jpg",
        "linked.jpg",
        "linked dir/UPPER CASE.JPG",
    }


def test_not_recursive_is_the_files_directly_under_the_root(spark, tmp_path):
    """Spark's index refuses a tree with subdirectories when not recursive (CONFLICTING_DIRECTORY_STRUCTURES); the
    executors list the root's own files."""
    images = tmp_path / "images"
    write_tree(images, ["top.jpg", "Top 2.JPG", "sub/below.jpg", ".hidden.jpg"])
    listed = rows(src.find_images(spark, f"file://{images}/", [".jpg"], recursive=False).scanned)
    assert [path for path, _, _ in listed] == [f"file:{images}/Top 2.JPG", f"file:{images}/top.jpg"]
    single = rows(src.find_images(spark, str(images / "sub" / "below.jpg"), [".jpg"]).scanned)
    assert [path for path, _, _ in single] == [f"file:{images}/sub/below.jpg"]


def test_a_directory_symlink_back_into_its_ancestors_is_walked_once(tmp_path):
    """Hadoop's listing would follow it forever; the walk skips a link that leads back into its own ancestors."""
    images = tmp_path / "images"
    write_tree(images, ["a/x.jpg", "y.jpg"])
    os.symlink(images, images / "a" / "up")
    os.symlink(images / "a", images / "a again")
    entries = list(walk_top(str(images), (".jpg",), recursive=True))
    listed = sorted(found.path for entry in entries for found in walk_entry(entry, (".jpg",)))
    assert listed == [f"file:{images}/a again/x.jpg", f"file:{images}/a/x.jpg", f"file:{images}/y.jpg"]


def test_an_input_of_underscored_photos_says_they_are_skipped_as_hidden(tmp_path):
    """Cameras name Adobe RGB photos `_DSC0001.JPG`: a listing skips them as Hadoop's hidden files, and the message of
    a run that lists nothing says so (names starting with '.' are not counted, nor hidden directories, nor the
    output under the input)."""
    write_tree(
        tmp_path / "in",
        ["_DSC0001.JPG", "day 2/_DSC0002.jpg", "._DSC0003.JPG", "_raw/_DSC0004.JPG", "_notes.txt", "out/_DSC0005.JPG"],
    )
    message = src.nothing_listed(str(tmp_path / "in"), [".jpg"], output_prefix_=f"file:{tmp_path}/in/out/")
    assert "; 2 files with those endings are skipped for a name starting with '_' (e.g. _DSC" in message
    assert "rename them without the leading '_'" in message
    flat = src.nothing_listed(str(tmp_path / "in"), [".jpg"], recursive=False)
    assert "; 1 file with those endings is skipped for a name starting with '_' (e.g. _DSC0001.JPG;" in flat
    assert "starting with '_'" not in src.nothing_listed(str(tmp_path / "in"), [".png"])


def test_a_missing_input_is_an_input_error_before_any_job(spark, tmp_path):
    with pytest.raises(src.InputError, match="does not exist: check --input"):
        src.find_images(spark, str(tmp_path / "nowhere"), [".jpg"])


def test_an_input_with_no_listed_file_says_what_it_holds(tmp_path):
    """A run that lists nothing logs why (image_sources.nothing_listed): the endings it lists, and for a local
    input the endings of the visible files there (phone photos in HEIC, GIFs); hidden names are not counted, nor
    the output under the input."""
    write_tree(
        tmp_path / "in", ["IMG_0001.HEIC", "trip/IMG_0002.heic", "anim.GIF", "notes", ".hidden.jpg", "out/mask.png"]
    )
    message = src.nothing_listed(str(tmp_path / "in"), [".jpg", ".png"], output_prefix_=f"file:{tmp_path}/in/out/")
    assert f"no file under {tmp_path / 'in'} ends with .jpg, .png" in message
    assert "holds 4 other files, ending with (none), .gif, .heic:" in message and ".png" not in message.split(";")[1]
    assert "holds 1+ other files" in src.nothing_listed(str(tmp_path / "in"), [".jpg"], recursive=False, sample=1)
    remote = src.nothing_listed("hdfs://namenode/photos", [".jpg"])
    assert remote.startswith("no file under hdfs://namenode/photos ends with .jpg (") and "holds" not in remote
