"""An output under its own input: the job's results there (label maps are PNGs) are no inputs, in every listing,
so a second run does not read them as new images."""

from __future__ import annotations

import pytest

from pipelines.inference import image_sources as src
from pipelines.inference.inference_job import run
from tests.job_helpers import job_config
from tests.test_input_names import write_tree

EXTENSIONS = [".jpg", ".png"]


def test_the_output_prefix_in_each_listings_spelling(spark, tmp_path):
    images = tmp_path / "in put"
    assert src.output_prefix(spark, str(images), str(images / "out")) == f"file:{images}/out/"
    assert src.output_prefix(spark, f"file://{images}/", f"{images}/a/out/") == f"file:{images}/a/out/"
    assert src.output_prefix(spark, str(images), f"{images} 2/out") is None  # a sibling, not under it
    assert src.output_prefix(spark, str(images), str(tmp_path)) is None
    assert src.output_prefix(spark, "az://c/in", "az://c/in/out") == "az://c/in/out/"
    assert src.output_prefix(spark, "az://c/in", "az://d/in/out") is None
    abfs = "abfs://c@acct.dfs.core.windows.net"  # the same container spelled with its account
    assert src.output_prefix(spark, "az://c/in", f"{abfs}/in/out") == "az://c/in/out/"
    assert src.output_prefix(spark, f"{abfs}/in", "az://c/in/out") == f"{abfs}/in/out/"
    assert src.output_prefix(spark, f"{abfs}/in", "abfs://c@other.dfs.core.windows.net/in/out") is None
    # qualified by the URI's Hadoop FileSystem (its host must resolve; no name node is asked)
    hdfs = "hdfs://localhost:1/in"
    assert src.output_prefix(spark, hdfs, f"{hdfs}/out/") == f"{hdfs}/out/"
    assert src.output_prefix(spark, hdfs, f"{images}/out") is None
    for same in (
        (str(images), f"file://{images}/"),
        ("az://c/in", "az://c/in/"),
        ("az://c/in", f"{abfs}/in"),
        (hdfs, "hdfs://localhost:1/in/"),
    ):
        with pytest.raises(src.InputError, match="--output is the --input directory"):
            src.output_prefix(spark, *same)


def test_every_listing_leaves_the_output_out(spark, tmp_path):
    images = tmp_path / "in put"
    write_tree(images, ["a.jpg", "sub/b.png", "out 2/c.jpg", "out/masks/a.jpg.png", "out/masks/sub/b.png.png"])
    (images / "out" / "empty.jpg").write_bytes(b"")  # zero-byte: Spark's index holds it, its scan does not
    (images / "zero.jpg").write_bytes(b"")
    prefix = src.output_prefix(spark, str(images), str(images / "out"))
    expected = sorted(f"file:{images}/{name}" for name in ["a.jpg", "sub/b.png", "out 2/c.jpg", "zero.jpg"])

    found = src.find_images(spark, str(images), EXTENSIONS, output_uri=str(images / "out"))
    assert found.excluded == prefix
    assert sorted(row.path for row in found.complete().collect()) == expected
    walked = src.ImageListing(src.local_files_listing(spark, str(images), EXTENSIONS, True, driver_max_files=0))
    assert sorted(row.path for row in walked.excluding(prefix).complete().collect()) == expected
    # the local walks (the driver's and the executors') do not enter the output at all
    output = str(images / "out")
    for limit in (0, 100):
        skipped = src.local_files_listing(spark, str(images), EXTENSIONS, True, driver_max_files=limit, skip=output)
        assert sorted(row.path for row in skipped.collect()) == expected
    indexed = src.spark_file_index(spark, str(images), EXTENSIONS).excluding(prefix)
    listing, counts = src.whole_listing(indexed, lambda frame: (frame.count(),))
    assert sorted(row.path for row in listing.collect()) == expected and counts == (4,)


def test_a_second_run_into_an_output_under_its_input_finds_nothing_new(spark, tmp_path):
    from tests.conftest import SAMPLES

    images = tmp_path / "images"
    images.mkdir()
    for name in ["synthetic_road_1.jpg", "synthetic_road_2.jpg"]:
        (images / name).write_bytes((SAMPLES / "images" / name).read_bytes())
    first = run(spark, job_config(images, images / "results"))
    assert (first["counts"]["inputs"], first["counts"]["done"]) == (2, 2)
    assert list((images / "results" / "masks").glob("*.png"))  # label maps the next listing would see
    second = run(spark, job_config(images, images / "results"))
    assert {k: second["counts"][k] for k in ("inputs", "skipped", "done")} == {"inputs": 2, "skipped": 2, "done": 0}
