"""pipelines.report.render draws what detections/ says: a hand-made detection's overlay paints exactly its mask's
pixels,
overlaps go to the higher score, boxes and tags stay on the box; failed images are named (CLI summary, report)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from pipelines.job_cli import print_summary
from pipelines.ops.mask_outputs import encode_rle
from pipelines.report import overlays as ov
from pipelines.report import render
from pipelines.report.tables import read_output

H, W = 160, 200
GREY = (90, 90, 90)
MASK_TYPE = pa.struct([("size", pa.list_(pa.int32())), ("counts", pa.string())])
INSTANCE_TYPE = pa.struct(
    [
        ("class_id", pa.int32()),
        ("class_name", pa.string()),
        ("score", pa.float32()),
        ("box", pa.list_(pa.int32())),
        ("mask", MASK_TYPE),
    ]
)


def instance(class_id, name, score, mask):
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return {
        "class_id": class_id,
        "class_name": name,
        "score": score,
        "mask": encode_rle(mask),
        "box": [int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1],
    }


def hand_made_output(tmp_path, instances, errors=()):
    """An output as the job writes it (one detections row, optional error rows) over one grey PNG."""
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (W, H), GREY).save(images / "grey.png")
    out = tmp_path / "out"
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    detections = pa.table(
        {
            "path": [f"file:{images}/grey.png"],
            "width": [W],
            "height": [H],
            "instances": pa.array([instances], pa.list_(INSTANCE_TYPE)),
            "mask_path": [None],
            "modification_time": [when],
            "model_sha256": ["m"],
            "run_id": ["20260101T000000Z-a"],
        }
    )
    (out / "detections").mkdir(parents=True)
    pq.write_table(detections, out / "detections" / "part-0.parquet")
    (out / "errors").mkdir()
    pq.write_table(
        pa.table(
            {
                "path": [f"file:{images}/{e}" for e in errors],
                "stage": ["read"] * len(errors),
                "error_type": ["ImageDecodeError"] * len(errors),
                "message": ["not an image"] * len(errors),
                "modification_time": pa.array([when] * len(errors), pa.timestamp("us", "UTC")),
                "model_sha256": ["m"] * len(errors),
                "run_id": ["20260101T000000Z-a"] * len(errors),
            }
        ),
        out / "errors" / "part-0.parquet",
    )
    (out / "summary.json").write_text(
        json.dumps(
            {
                "run_id": "20260101T000000Z-a",
                "input": str(images),
                "model": {"name": "hand", "sha256": "m", "note": None, "classes": ["a", "b"]},
                "counts": {"inputs": 1 + len(errors), "done": 1, "failed": len(errors), "skipped": 0, "instances": 2},
            }
        )
    )
    return out


def masks():
    first = np.zeros((H, W), bool)
    first[50:100, 20:120] = True
    first[60:70, 40:44] = False  # a hole: not painted
    second = np.zeros((H, W), bool)
    second[80:140, 90:180] = True  # overlaps `first` at rows 80..99, cols 90..119
    return first, second


def test_overlay_paints_exactly_the_masks_pixels_higher_score_on_top(tmp_path):
    first, second = masks()
    out = hand_made_output(
        tmp_path,
        [instance(0, "a", 0.9, first), instance(1, "b", 0.7, second), instance(1, "b", 0.2, np.ones((H, W), bool))],
    )  # below the threshold
    row = read_output(out).detections[0]
    grey = np.full((H, W, 3), GREY, np.uint8)
    painted = ov.draw_overlay(grey, row["instances"], score_threshold=0.5, boxes=False)
    changed = (painted != grey).any(axis=-1)
    assert np.array_equal(changed, first | second)  # exactly the masks' pixels, nothing else
    assert (painted[first] == ov.tint(np.array(GREY, np.uint8), ov.colour(0))).all()  # overlap: the 0.9 one
    assert (painted[second & ~first] == ov.tint(np.array(GREY, np.uint8), ov.colour(1))).all()

    # The CLI's overlay: the same tint inside the masks; boxes and tags only on the box outline and above it.
    assert render.main(["--output", str(out), "--score-threshold", "0.5"]) == 0
    drawn = np.asarray(Image.open(out / "overlays" / "grey.png.png").convert("RGB"))
    decorated = (drawn != painted).any(axis=-1)
    outline = np.zeros((H, W), bool)
    for mask in (first, second):
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        y1, y2, x1, x2 = rows[0], rows[-1], cols[0], cols[-1]
        ring = np.zeros((H, W), bool)
        ring[y1 : y2 + 1, x1 : x2 + 1] = True
        ring[y1 + 2 : y2 - 1, x1 + 2 : x2 - 1] = False  # 2 px box outline
        outline |= ring
    tags = np.zeros((H, W), bool)
    for mask in (first, second):  # "class score" tags sit above their boxes
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        tags[rows[0] - 25 : rows[0], cols[0] : cols[0] + 90] = True
    assert decorated.any() and not (decorated & ~outline & ~tags).any()
    index = json.loads((out / "overlays" / "index.json").read_text())
    assert index["images"][0]["classes"] == ["a", "b"] and index["images"][0]["drawn"] == 2


def test_failed_images_are_named_in_the_report_and_the_cli_summary(tmp_path, capsys):
    first, _ = masks()
    out = hand_made_output(tmp_path, [instance(0, "a", 0.9, first)], errors=["broken.jpg", "empty.png"])
    report = render.render(out)
    html = report.read_text()
    assert "2 failed images" in html and "broken.jpg" in html and "empty.png" in html
    assert (out / "report_files" / "class_counts.png").is_file()

    summary = {
        "counts": {"inputs": 13, "done": 1, "failed": 12, "skipped": 0, "instances": 1},
        "input": "/in",
        "output": "/out",
        "images_per_second": 1.0,
        "wall_seconds": 1.0,
        "partitions": 1,
        "stage_seconds": {},
        "model": {"name": "m", "sha256": "0" * 64, "note": "what it is for"},
        "failed_images": [f"/in/bad{i:02d}.jpg" for i in range(10)],
        "report": str(report),
        "failed_types": {"ImageDecodeError.corrupt": 11, "AzureStorageError": 1},
    }
    print_summary(summary)
    printed = capsys.readouterr().out
    assert "failed by type: 11 ImageDecodeError.corrupt, 1 AzureStorageError" in printed
    assert "failed: /in/bad00.jpg" in printed and "failed: /in/bad09.jpg" in printed
    assert "and 2 more failed images in /out/errors" in printed
    assert f"report: {report}" in printed and "NOTE: what it is for" in printed


def test_input_root_finds_moved_images(tmp_path):
    moved = tmp_path / "downloaded"
    (moved / "a").mkdir(parents=True)
    moved_image = render.source_file("hdfs://nn:8020/data/in/a/x.jpg", "hdfs://nn:8020/data/in", moved)
    assert moved_image == moved / "a" / "x.jpg"
    assert render.source_file("file:/data/in/a/x.jpg", "/data/in", None).as_posix() == "/data/in/a/x.jpg"
    assert render.source_file("abfss://c@acct.dfs.core.windows.net/other/x.jpg", "/data/in", moved) == moved / "x.jpg"


def traced_peak(call):
    """(call(), the peak of the Python memory it allocated: tracemalloc, the same allocations on every machine)."""
    import tracemalloc

    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_report_keeps_only_what_it_draws(tmp_path):
    """render.gather streams the current rows once: its top rows, class counts, score bins and first errors are
    those of the rows read_output holds, while it holds a few hundred rows (Python memory a fraction of
    read_output's on 6,000 images of 30 instances: tracemalloc counts the same allocations on every machine)."""
    from pipelines.report.page import MAX_ERROR_ROWS

    rng = np.random.default_rng(3)
    n, per_image, n_errors = 6000, 30, MAX_ERROR_ROWS + 200
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    names = ["a", "b", "c"]
    instances = [
        [
            {"class_id": int(k), "class_name": names[k], "score": float(s), "box": [0, 0, 4, 4], "mask": None}
            for k, s in zip(rng.integers(0, 3, per_image), rng.random(per_image).astype(np.float32))
        ]
        for _ in range(n)
    ]
    out = tmp_path / "out"
    (out / "detections").mkdir(parents=True)
    (out / "errors").mkdir()
    common = {
        "modification_time": pa.array([when] * n, pa.timestamp("us", "UTC")),
        "model_sha256": ["m"] * n,
        "run_id": ["20260101T000000Z-a"] * n,
    }
    pq.write_table(
        pa.table(
            {
                "path": [f"file:/in/{i:05d}.jpg" for i in range(n)],
                "width": [W] * n,
                "height": [H] * n,
                "instances": pa.array(instances, pa.list_(INSTANCE_TYPE)),
                "mask_path": [None] * n,
                **common,
            }
        ),
        out / "detections" / "part-0.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "path": [f"file:/in/bad/{i:05d}.jpg" for i in rng.permutation(n_errors)],
                "stage": ["decode"] * n_errors,
                "error_type": ["ImageDecodeError"] * n_errors,
                "message": ["not an image"] * n_errors,
                **{k: v[:n_errors] for k, v in common.items()},
            }
        ),
        out / "errors" / "part-0.parquet",
    )
    (out / "summary.json").write_text(
        json.dumps(
            {"run_id": "20260101T000000Z-a", "input": "/in", "model": {"name": "m", "sha256": "m", "classes": names}}
        )
    )

    tables, held = traced_peak(lambda: read_output(out))
    rows, streamed = traced_peak(lambda: render.gather(out, limit=7, score_threshold=0.5))
    assert streamed < held / 4, (streamed, held)

    def top(row):
        return max([i["score"] for i in row["instances"] if i["score"] >= 0.5], default=0.0)

    expected = sorted(tables.detections, key=lambda r: (-top(r), r["path"]))[:7]
    assert [r["path"] for r in rows.top] == [r["path"] for r in expected] and rows.top[0]["instances"]
    assert rows.images_total == n
    everything = [i for r in tables.detections for i in r["instances"]]
    for name in names:
        scores = [i["score"] for i in everything if i["class_name"] == name]
        images = sum(
            any(i["class_name"] == name and i["score"] >= 0.5 for i in r["instances"]) for r in tables.detections
        )
        assert rows.classes[name] == [sum(s >= 0.5 for s in scores), len(scores), images]
        assert rows.score_bins[name] == np.histogram(scores, bins=20, range=(0, 1))[0].tolist()
    assert rows.errors_total == n_errors == len(tables.errors)
    assert rows.errors == tables.errors[:MAX_ERROR_ROWS]
    assert render.write_report(out).is_file()  # counts only, no overlays


def job_table(rows: list[dict], error: bool = False) -> pa.Table:
    """detections/ or errors/ rows with the job's column types (what Spark reads them with)."""
    from pipelines.results.result_rows import RESULT_ARROW_SCHEMA

    names = (
        ["path", "error_stage", "error_type", "error_message"]
        if error
        else ["path", "width", "height", "instances", "mask_path"]
    ) + ["size", "modification_time", "frame_index"]
    fields = [
        RESULT_ARROW_SCHEMA.field(n).with_name({"error_stage": "stage", "error_message": "message"}.get(n, n))
        for n in names
    ] + [pa.field("model_sha256", pa.string()), pa.field("run_id", pa.string())]
    schema = pa.schema(fields)
    return pa.Table.from_pylist([{f.name: row.get(f.name) for f in fields} for row in rows], schema=schema)


def given(row: dict) -> dict:
    """A row's columns that are not null (pyarrow gives only the columns a file has)."""
    return {key: value for key, value in row.items() if value is not None}


def two_runs_output(tmp_path):
    """An output of two runs in several Parquet files (job types): images replaced and re-run (their older records
    superseded), a replaced image that now fails, earlier failures that now succeed, video frames, another model's
    rows; 612 current detection rows, 60 current errors."""
    rng = np.random.default_rng(11)
    names = ["a", "b", "c"]
    first, second = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)

    def detection(path, run, when, model="m", frame=None):
        count = int(rng.integers(0, 6))
        instances = [
            {"class_id": int(k), "class_name": names[k], "score": float(s), "box": [0, 0, 4, 4], "mask": None}
            for k, s in zip(rng.integers(0, 3, count), rng.random(count).astype(np.float32))
        ]
        return {
            "path": path,
            "width": W,
            "height": H,
            "instances": instances,
            "size": 100,
            "modification_time": when,
            "frame_index": frame,
            "model_sha256": model,
            "run_id": run,
        }

    def error(path, run, when):
        return {
            "path": path,
            "error_stage": "decode",
            "error_type": "ImageDecodeError",
            "error_message": "not an image",
            "size": 100,
            "modification_time": when,
            "model_sha256": "m",
            "run_id": run,
        }

    run_a, run_b = "20260101T000000Z-a", "20260102T000000Z-b"
    images = [f"file:/in/{i:04d} x.jpg" for i in range(600)]
    bad = [f"file:/in/bad/{i:03d}.jpg" for i in range(60)]
    out = tmp_path / "out"
    (out / "detections").mkdir(parents=True)
    (out / "errors").mkdir()
    files = {
        "detections/part-a0.parquet": [detection(p, run_a, first) for p in images[:300]],
        "detections/part-a1.parquet": [detection(p, run_a, first) for p in images[300:]]
        + [detection("file:/in/clip.mp4", run_a, first, frame=f) for f in range(12)]
        + [detection(p, run_a, first, model="other") for p in images[:40]],
        "detections/part-b0.parquet": [detection(p, run_b, second) for p in images[:50] + bad[:10]]
        + [detection("file:/in/clip.mp4", run_b, first, frame=f) for f in range(4)],
        "errors/part-a0.parquet": [error(p, run_a, first) for p in bad],
        "errors/part-b0.parquet": [error(p, run_b, second) for p in images[50:60]],
    }
    for name, rows in files.items():
        pq.write_table(job_table(rows, error=name.startswith("errors")), out / name)
    (out / "summary.json").write_text(
        json.dumps({"run_id": run_b, "input": "/in", "model": {"name": "m", "sha256": "m", "classes": names}})
    )
    return out


def test_the_job_gathers_the_report_rows_with_spark_as_the_local_reader_does(spark, tmp_path):
    """The job's report rows (spark_rows: partitions gathered on the executors, merged in a tree) equal render.gather's
    on two_runs_output; the job draws with them beyond LOCAL_REPORT_MAX_RECORDS, and the CLI with --spark."""
    from pipelines.inference.job_summary import LOCAL_REPORT_MAX_RECORDS, render_report
    from pipelines.io.storage import Location
    from pipelines.report.spark_rows import gather_with_spark

    out = two_runs_output(tmp_path)
    for limit in (7, 0, None):
        local = render.gather(out, limit=limit, score_threshold=0.5)
        gathered = gather_with_spark(spark, Location(str(out)), limit=limit, score_threshold=0.5)
        assert gathered.images_total == local.images_total == 600 - 10 + 10 + 12
        assert gathered.errors_total == local.errors_total == 50 + 10
        assert [(r["path"], r["frame_index"]) for r in gathered.top] == [
            (r["path"], r["frame_index"]) for r in local.top
        ]
        assert [given(r) for r in gathered.top] == [given(r) for r in local.top]  # Spark's rows name every column
        assert len(local.top) == {7: 7, 0: 612, None: 0}[limit]
        assert gathered.classes == local.classes and gathered.score_bins == local.score_bins
        assert [given(r) for r in gathered.errors] == [given(r) for r in local.errors]
        assert (gathered.root, gathered.summary) == (local.root, local.summary)
    large = {"table": {"images": LOCAL_REPORT_MAX_RECORDS, "errors": 1, "superseded_rows": 0}}
    assert render_report(spark, Location(str(out)), large) == str(out / "report.html")
    index = json.loads((out / "overlays" / "index.json").read_text())
    assert index["images_total"] == 612 and len(index["missing"]) == 100  # /in holds no image here
    (out / "overlays" / "index.json").unlink()
    assert render.main(["--output", str(out), "--spark", "--limit", "7"]) == 0  # the CLI's --spark: the same
    index = json.loads((out / "overlays" / "index.json").read_text())
    assert index["images_total"] == 612 and [m["path"] for m in index["missing"]] == [
        r["path"] for r in render.gather(out, limit=7, score_threshold=0.5).top
    ]
