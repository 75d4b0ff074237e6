"""The summary's table counts come from each run's own records plus a small index (<output>/_sparkseg_counts.json),
and equal a full rescan of the output (incremental.table_counts) after any sequence of incremental runs and on a new
output; an index that does not match the tables (missing, or behind a killed run) is rebuilt by one rescan."""
from __future__ import annotations

import json

from pipelines.results.incremental import table_counts
from pipelines.inference.inference_job import run
from pipelines.results.table_index import INDEX_NAME
from tests.job_helpers import job_config
from tests.test_incremental import write_image


def test_counts_after_incremental_runs_equal_a_full_rescan(spark, tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    index = output / INDEX_NAME

    def stale_index():   # as if a run died after its writes, before its index update
        data = json.loads(index.read_text())
        data["rows"]["detections"] -= 1
        index.write_text(json.dumps(data))

    steps = [
        ("first run", lambda: [write_image(images / f"{n}.jpg", seed) for seed, n in enumerate("abc")]),
        ("a replaced, d new", lambda: (write_image(images / "a.jpg", 10, (80, 60)), write_image(images / "d.jpg", 4))),
        ("c broken", lambda: (images / "c.jpg").write_bytes(b"no longer a jpeg")),
        ("nothing new", lambda: None),
        ("c fixed, index gone", lambda: (write_image(images / "c.jpg", 12), index.unlink())),
        ("b replaced, index stale", lambda: (write_image(images / "b.jpg", 13), stale_index())),
        ("e new", lambda: write_image(images / "e.jpg", 14)),
    ]
    for what, change in steps:
        change()
        summary = run(spark, job_config(images, output))
        assert summary["table"] == table_counts(spark, str(output), summary["model"]["sha256"]), what
        assert json.loads(index.read_text())["models"][summary["model"]["sha256"]] == summary["table"], what
    assert summary["table"] == {"images": 5, "errors": 0, "superseded_rows": 4}   # old a, c (twice), b
    # a new output's first run (its counts need no rescan), with an error among its records
    (images / "f.jpg").write_bytes(b"not a jpeg")
    summary = run(spark, job_config(images, tmp_path / "new"))
    assert summary["table"] == table_counts(spark, str(tmp_path / "new"), summary["model"]["sha256"])
    assert summary["table"] == {"images": 5, "errors": 1, "superseded_rows": 0}
