"""The summary's table counts come from each run's own records plus a small index (<output>/_sparkseg_counts.json),
and equal a full rescan of the output (incremental.table_counts) after any sequence of incremental runs and on a new
output; an index that does not match the tables (missing, behind a killed run, or without the digests of their
files) is rebuilt by one rescan, and one that matches them gives their rows without opening a file."""

from __future__ import annotations

import json

from pipelines.inference.inference_job import run
from pipelines.io.storage import Location
from pipelines.results.incremental import current_detections, table_counts
from pipelines.results.table_index import INDEX_NAME, rows_before_run, table_rows
from tests.job_helpers import job_config
from tests.test_incremental import write_image
from tests.test_video_input import encode_video, road_frames


def test_counts_after_incremental_runs_equal_a_full_rescan(spark, tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    index = output / INDEX_NAME
    indexes = []  # the index before each step's run

    def index_behind_the_last_run():  # as if the last run died after its writes, before its index update
        index.write_bytes(indexes[-2])

    def index_of_an_older_release():  # rows and counts, no digests of the tables' files
        data = json.loads(index.read_text())
        del data["files"]
        index.write_text(json.dumps(data))

    steps = [
        ("first run", lambda: [write_image(images / f"{n}.jpg", seed) for seed, n in enumerate("abc")]),
        ("a replaced, d new", lambda: (write_image(images / "a.jpg", 10, (80, 60)), write_image(images / "d.jpg", 4))),
        ("c broken", lambda: (images / "c.jpg").write_bytes(b"no longer a jpeg")),
        ("nothing new", lambda: None),
        ("c fixed, index gone", lambda: (write_image(images / "c.jpg", 12), index.unlink())),
        (
            "b replaced, index behind the last run",
            lambda: (write_image(images / "b.jpg", 13), index_behind_the_last_run()),
        ),
        ("nothing new, an older release's index", index_of_an_older_release),
        ("e new", lambda: write_image(images / "e.jpg", 14)),
        ("v.mp4 new", lambda: encode_video(images / "v.mp4", road_frames(6))),
        ("v.mp4 replaced by a shorter one", lambda: encode_video(images / "v.mp4", road_frames(3, seed=2))),
        ("w.mp4 not a video", lambda: (images / "w.mp4").write_bytes(b"not a video")),
        ("w.mp4 fixed", lambda: encode_video(images / "w.mp4", road_frames(4, seed=3))),
    ]
    for what, change in steps:
        indexes.append(index.read_bytes() if index.exists() else b"")
        change()
        config = job_config(images, output)
        config["run"]["max_error_fraction"] = 1.0  # some steps' one new input is broken: that run is all errors
        summary = run(spark, config)
        assert summary["table"] == table_counts(spark, str(output), summary["model"]["sha256"]), what
        written = json.loads(index.read_text())
        assert written["models"][summary["model"]["sha256"]] == summary["table"], what
        assert written["rows"] == table_rows(spark, Location.of(str(output))), what
        assert rows_before_run(Location.of(str(output))) == written["rows"], what  # what the next run will trust
    # 5 images and 3 + 4 frames; superseded: old a, c (twice), b, the first v's 6 frames (3 beyond the new length),
    # w's error row
    assert summary["table"] == {"images": 12, "errors": 0, "superseded_rows": 11}
    current = current_detections(spark, str(output)).where("path LIKE '%/v.mp4'").collect()
    assert sorted(row.frame_index for row in current) == [0, 1, 2]
    # a new output's first run (its counts need no rescan), with an error among its records
    (images / "f.jpg").write_bytes(b"not a jpeg")
    summary = run(spark, job_config(images, tmp_path / "new"))
    assert summary["table"] == table_counts(spark, str(tmp_path / "new"), summary["model"]["sha256"])
    assert summary["table"] == {"images": 12, "errors": 1, "superseded_rows": 0}
