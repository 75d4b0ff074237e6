"""Video input (issue 17): videos under --input beside images, split into segments spread over tasks, one
detections/ row per processed frame, unreadable videos and tails as errors/ rows, resume per segment. The tests
encode their own small videos with PyAV from synthetic road scenes (160x120)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from pipelines.datasets.synthetic_roads import RoadSceneConfig, render_scene
from pipelines.inference import image_sources as src
from pipelines.inference.inference_job import run
from pipelines.inference.job_plan import plan_job
from pipelines.inference.resume import work_units
from pipelines.job_cli import build_config, parse_args
from pipelines.results.done_index import done_keys
from pipelines.results.incremental import current_detections
from pipelines.results.results_writer import FRAME_COLUMNS, read_table
from tests.job_helpers import job_config, read_rows
from tests.test_faults import kill_after_a_committed_wave, start_job


def road_frames(count: int, seed: int = 7, scenes: int = 10) -> list[np.ndarray]:
    """`count` 160x120 RGB frames: a few synthetic road scenes, each slowly panning (every frame differs)."""
    rng = np.random.default_rng(seed)
    config = RoadSceneConfig(width=160, height=120, min_instances=2, max_instances=4)
    images = [render_scene(rng, config).image for _ in range(scenes)]
    per_scene = -(-count // scenes)
    return [np.ascontiguousarray(np.roll(images[i // per_scene], 2 * (i % per_scene), axis=1)) for i in range(count)]


def encode_video(
    path: Path,
    frames: list[np.ndarray],
    fps: int = 30,
    b_frames: int = 0,
    gop: int = 30,
    container_format: str | None = None,
) -> Path:
    """H.264 (libx264) at `fps`, `b_frames` consecutive B-frames and a keyframe every `gop` frames."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        stream.options = {"bf": str(b_frames), "g": str(gop), "keyint_min": str(gop), "crf": "20", "preset": "veryfast"}
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def decoded_frames(path: Path) -> list[np.ndarray]:
    """Every frame of the video, decoded from the start by PyAV in presentation order (the reference)."""
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def video_config(input_dir: Path, output_dir: Path, **video) -> dict:
    config = job_config(input_dir, output_dir)
    config["input"]["video"].update(video)
    return config


def frame_rows(spark, output: Path, name: str) -> list:
    rows = [r for r in read_rows(spark, output, "detections") if r.path.endswith("/" + name)]
    return sorted(rows, key=lambda r: r.frame_index)


def instances(row) -> list[dict]:
    return [inst.asDict(recursive=True) for inst in row.instances or []]


@pytest.fixture(scope="module")
def clip_10s(tmp_path_factory) -> Path:
    """10 s at 30 frames/s (300 frames), beside every 5th of its frames as decoded by PyAV, saved as PNG images
    (frames/000005.png is frame 5): one input directory, so each run also processes the frames as images."""
    clip = encode_video(tmp_path_factory.mktemp("clip") / "in" / "clip.mp4", road_frames(300))
    (clip.parent / "frames").mkdir()
    for index, rgb in enumerate(decoded_frames(clip)):
        if index % 5 == 0:
            Image.fromarray(rgb).save(clip.parent / "frames" / f"{index:06d}.png")
    return clip


def test_stride_1_and_5_give_exact_frames_and_timestamps_and_detections_equal_to_images(
    spark, clip_10s, tmp_path, capsys
):
    every = run(spark, video_config(clip_10s.parent, tmp_path / "every"))
    capsys.readouterr()
    fifth = run(spark, video_config(clip_10s.parent, tmp_path / "fifth", frame_stride=5))
    # the progress total is exact: segment [256, 300) holds 8 multiples of 5, not ceil(44 / 5) = 9
    assert "[sparkseg] 120/120 images+frames (100%)" in capsys.readouterr().err
    rows = frame_rows(spark, tmp_path / "every", "clip.mp4")
    assert [r.frame_index for r in rows] == list(range(300))
    assert [r.timestamp_s for r in rows] == pytest.approx([i / 30 for i in range(300)], abs=1e-9)
    sampled = frame_rows(spark, tmp_path / "fifth", "clip.mp4")
    assert [r.frame_index for r in sampled] == list(range(0, 300, 5))
    assert [r.timestamp_s for r in sampled] == pytest.approx([i / 30 for i in range(0, 300, 5)], abs=1e-9)
    assert every["counts"]["frames"] == 300 and fifth["counts"]["frames"] == 60
    assert every["counts"]["videos"] == 1 and every["counts"]["done"] == 360  # + the 60 PNG images
    assert all((r.width, r.height, r.segment_start) == (160, 120, 0) for r in rows[:256])
    assert (tmp_path / "every" / "masks" / "clip.mp4" / "000005.png").is_file()
    assert sampled[1].mask_path.endswith("/masks/clip.mp4/000005.png")

    # the same decoded frames as PNG images through the job: identical detections
    for output in ("every", "fifth"):
        by_image = {
            int(Path(r.path).stem): r
            for r in read_rows(spark, tmp_path / output, "detections")
            if r.path.endswith(".png")
        }
        assert sorted(by_image) == list(range(0, 300, 5))
        assert sum(len(r.instances) for r in by_image.values()) > 0, "the model finds something in road scenes"
        assert all(r.frame_index is None and r.timestamp_s is None for r in by_image.values())
        frames = {r.frame_index: r for r in (rows if output == "every" else sampled)}
        for index, image_row in by_image.items():
            assert instances(frames[index]) == instances(image_row), f"{output}: frame {index}"


def first_frames_at_or_after(fps: Fraction, frame_times: list[Fraction], stride: int = 1) -> list[int]:
    """The documented rule, applied to exact frame times: for every k >= 0, the first frame whose time is at or
    after k/fps (once, however many k fall on it), kept only when its index is also a multiple of `stride`."""
    chosen, k = [], 0
    while k / fps <= frame_times[-1]:
        first = next(i for i, t in enumerate(frame_times) if t >= k / fps)
        if first not in chosen:
            chosen.append(first)
        k += 1
    return [i for i in chosen if i % stride == 0]


@pytest.fixture(scope="module")
def clip_3s(tmp_path_factory) -> Path:
    """3 s at 30 frames/s (90 frames: frame i at i/30 s), with B-frames (decode order != presentation order)."""
    return encode_video(
        tmp_path_factory.mktemp("clip3") / "in" / "clip.mp4", road_frames(90, seed=17, scenes=3), b_frames=2, gop=15
    )


@pytest.mark.parametrize(
    "fps, stride, head",
    [
        ("12", 1, [0, 3, 5, 8, 10, 13, 15, 18, 20, 23]),  # 1/12 s = 2.5 frames: every other boundary on a frame
        ("9", 2, [0, 4, 10, 14, 20, 24, 30, 34, 40, 44]),  # 1/9 s = 3.33 frames (0, 4, 7, 10, 14, 17, ...), even only
    ],
)
def test_fps_keeps_the_first_frame_at_or_after_every_1_over_f_seconds(
    spark, clip_3s, tmp_path, fps, stride, head, capsys
):
    output = tmp_path / "out"
    flags = ["--input", str(clip_3s.parent), "--output", str(output), "--fps", fps, "--frame-stride", str(stride)]
    config = video_config(clip_3s.parent, output)
    config["input"]["video"] = {**build_config(parse_args(flags))["input"]["video"], "segment_frames": 16}
    assert (config["input"]["video"]["fps"], config["input"]["video"]["frame_stride"]) == (float(fps), stride)

    times = [Fraction(i, 30) for i in range(90)]
    expected = first_frames_at_or_after(Fraction(fps), times, stride)
    assert expected[:10] == head, "the reference rule itself"
    summary = run(spark, config)
    rows = frame_rows(spark, output, "clip.mp4")
    # segments of 16 frames: whether a segment's first frame (16, 32, 48, 64, 80; some kept, some not) is kept is
    # decided from the frame before it, in the previous segment
    assert [r.frame_index for r in rows] == expected
    assert [r.timestamp_s for r in rows] == pytest.approx([float(times[i]) for i in expected], abs=1e-9)
    assert all(r.segment_start <= r.frame_index < r.segment_end for r in rows)
    assert summary["counts"]["frames"] == len(expected) and summary["counts"]["failed"] == 0
    assert f"[sparkseg] {len(expected)}/{len(expected)} images+frames (100%)" in capsys.readouterr().err


def test_long_b_frame_video_is_split_over_tasks_without_missing_or_duplicate_frames(spark, tmp_path):
    videos = tmp_path / "in"
    clip = encode_video(videos / "long.mp4", road_frames(100, seed=3), b_frames=3, gop=12)
    Image.fromarray(road_frames(1, seed=5)[0]).save(videos / "still.png")
    config = video_config(videos, tmp_path / "out", segment_frames=16)  # 7 segments > 16 frames x 2 partitions

    # the units the inference tasks get: the video's segments lie in both partitions
    plan = plan_job(config, "yolact")
    listing = src.list_images(spark, plan.input_uri, [".png", ".mp4"])
    n_videos = 1
    units = work_units(spark, plan, listing, plan.config.input.video, n_videos)
    balanced = src.balanced(src.assign_partitions(units, 2, order=("path", "segment_start")), 2)
    placed = balanced.rdd.mapPartitionsWithIndex(
        lambda part, rows: [(part, row.segment_start) for row in rows if row.segment_start is not None]
    ).collect()
    assert sorted(start for _, start in placed) == list(range(0, 100, 16))
    assert {part for part, _ in placed} == {0, 1}, "the long video's segments go to several tasks"

    summary = run(spark, config)
    rows = frame_rows(spark, tmp_path / "out", "long.mp4")
    assert [r.frame_index for r in rows] == list(range(100)), "every frame exactly once across segment boundaries"
    assert sorted({r.segment_start for r in rows}) == list(range(0, 100, 16))
    assert all(r.segment_start <= r.frame_index < r.segment_end for r in rows)
    assert summary["counts"]["done"] == 101 and summary["counts"]["failed"] == 0  # 100 frames + the image
    reference = decoded_frames(clip)
    assert len(reference) == 100
    image_rows = [r for r in read_rows(spark, tmp_path / "out", "detections") if r.path.endswith("still.png")]
    assert len(image_rows) == 1 and image_rows[0].frame_index is None and image_rows[0].segment_start is None


def test_truncated_empty_and_fake_videos_are_error_rows_and_readable_frames_are_kept(spark, tmp_path, capsys):
    videos = tmp_path / "in"
    whole = encode_video(tmp_path / "whole.mkv", road_frames(90, seed=11), container_format="matroska")
    data = whole.read_bytes()
    videos.mkdir()
    (videos / "truncated.mkv").write_bytes(data[: len(data) * 6 // 10])
    (videos / "empty.mp4").write_bytes(b"")
    (videos / "notes.mp4").write_text("not a video, just text named .mp4\n")
    summary = run(spark, video_config(videos, tmp_path / "out", segment_frames=32))  # returns: the job exits 0

    kept = frame_rows(spark, tmp_path / "out", "truncated.mkv")
    assert 0 < len(kept) < 90
    assert [r.frame_index for r in kept] == list(range(len(kept)))
    errors = {Path(r.path).name: r for r in read_rows(spark, tmp_path / "out", "errors")}
    assert sorted(errors) == ["empty.mp4", "notes.mp4", "truncated.mkv"], "one errors/ row per broken video"
    tail = errors["truncated.mkv"]
    assert tail.error_type == "VideoDecodeError.truncated" and tail.frame_index == len(kept)
    assert (tail.segment_start, tail.segment_end) == (len(kept), 90) and "truncated.mkv" in tail.message
    assert errors["empty.mp4"].error_type == "VideoDecodeError.empty"
    assert errors["notes.mp4"].error_type == "VideoDecodeError.unreadable"
    assert errors["notes.mp4"].segment_start == 0 and errors["notes.mp4"].segment_end is None
    assert summary["counts"]["frames"] == len(kept) and summary["counts"]["failed"] == 3
    assert summary["failed_types"] == {
        "VideoDecodeError.empty": 1,
        "VideoDecodeError.truncated": 1,
        "VideoDecodeError.unreadable": 1,
    }
    rows = len(kept) + 3  # the progress total counts the error rows too (was len(kept): 103 % at the end)
    assert f"[sparkseg] {rows}/{rows} images+frames (100%)" in capsys.readouterr().err


def test_driver_killed_mid_video_resumes_with_every_frame_exactly_once(spark, tmp_path):
    videos = tmp_path / "in"
    encode_video(videos / "clip.mp4", road_frames(32, seed=13), b_frames=2, gop=10)  # 4 segments, 2 waves
    output = tmp_path / "out"
    config = tmp_path / "waves.yaml"
    config.write_text("input:\n  video:\n    segment_frames: 8\nrun:\n  commit_every: 2\n  progress_interval_s: 1\n")
    args = (
        "--config",
        str(config),
        "--input",
        str(videos),
        "--output",
        str(output),
        "--partitions",
        "2",
        "--master",
        "local[2,4]",
    )
    job = start_job(*args)
    try:
        kill_after_a_committed_wave(output, job)
    finally:
        job.kill()
    committed = sorted({r.segment_start for r in read_rows(spark, output, "detections")})
    assert 0 < len(committed) < 4
    rerun = start_job(*args)
    log = rerun.communicate(timeout=900)[0].decode(errors="replace")
    assert rerun.returncode == 0, log[-3000:]
    assert f"({len(committed)} already done for this model)" in log, log[-2000:]
    rows = read_rows(spark, output, "detections")
    assert sorted(r.frame_index for r in rows) == list(range(32)), "every frame exactly once"
    assert not [p for p in output.rglob("*") if "_temporary" in str(p) or ".tmp" in p.name]


def test_tables_written_before_the_frame_columns_stay_readable(spark, tmp_path):
    """An output whose older Parquet files lack the video columns: read with them null, beside new files."""
    table = tmp_path / "out" / "detections"
    old = spark.createDataFrame(
        [("file:/in/a.jpg", 1, "m", "20260101T000000Z-old")],
        "path string, size long, model_sha256 string, run_id string",
    )
    old.withColumn("modification_time", old.size.cast("timestamp")).write.parquet(str(table))
    new = spark.createDataFrame(
        [("file:/in/v.mp4", 2, "m", "20260102T000000Z-new", 0, 0.0, 0, 8)],
        "path string, size long, model_sha256 string, run_id string, frame_index int, "
        "timestamp_s double, segment_start int, segment_end int",
    )
    new.withColumn("modification_time", new.size.cast("timestamp")).write.mode("append").parquet(str(table))
    rows = {r.path: r for r in read_table(spark, str(table)).collect()}
    assert set(FRAME_COLUMNS) <= set(rows["file:/in/a.jpg"].asDict())
    assert rows["file:/in/a.jpg"].frame_index is None and rows["file:/in/v.mp4"].segment_end == 8
    keys = sorted(
        tuple(r)
        for r in done_keys(spark, str(tmp_path / "out"), "m", retries=3).select("path", "segment_start").collect()
    )
    assert keys == [("file:/in/a.jpg", None), ("file:/in/v.mp4", 0)]
    assert current_detections(spark, str(tmp_path / "out")).count() == 2


def test_is_video_matches_extensions_case_insensitively(spark):
    """is_video (a Spark regex, not lower()) agrees with Python's case-insensitive suffix test, also for non-ASCII
    names and extensions holding regex characters."""
    from pyspark.sql import functions as F

    from pipelines.inference.video_sources import is_video

    extensions = (".mp4", ".m+v", ".a\\Eb", ".ÉTÉ")
    paths = [
        "file:/a/clip.mp4",
        "file:/a/CLIP.MP4",
        "file:/a/clip.Mp4.jpg",
        "file:/a/x.m+v",
        "file:/a/x.mmv",
        "file:/a/x.A\\eB",
        "file:/a/x.ab",
        "file:/a/été.été",
        "file:/a/mp4",
        "file:/a/ü.MP4 ",
        "file:/a/b c.mP4",
    ]
    frame = spark.createDataFrame([(p,) for p in paths], "path string")
    got = {
        row.path: row.video
        for row in frame.select("path", is_video(F.col("path"), extensions).alias("video")).collect()
    }
    assert got == {p: p.lower().endswith(tuple(e.lower() for e in extensions)) for p in paths}
    assert not frame.where(is_video(F.col("path"), ())).count()


def test_the_report_draws_the_top_video_frames_on_the_frames_themselves(spark, tmp_path):
    """The report reads a video's current records per frame and draws an overlay on the decoded frame itself."""
    from pipelines.report import overlays as ov
    from pipelines.report import render
    from pipelines.report.tables import read_output

    videos = tmp_path / "in"
    clip = encode_video(videos / "clip.mp4", road_frames(12, seed=5), fps=10)
    (videos / "broken.mp4").write_bytes(b"not a video")
    run(spark, video_config(videos, tmp_path / "out"))
    tables = read_output(tmp_path / "out")
    frames = [(Path(r["path"]).name, r["frame_index"]) for r in tables.detections]
    assert frames == [("clip.mp4", i) for i in range(12)]
    assert [(Path(r["path"]).name, r["frame_index"]) for r in tables.errors] == [("broken.mp4", None)]

    rows = render.gather(tmp_path / "out", limit=3, score_threshold=0.3)
    index = render.render_overlays(rows)
    assert len(index["images"]) == 3 and not index["missing"]
    reference = decoded_frames(clip)
    for entry in index["images"]:
        row = next(r for r in tables.detections if r["frame_index"] == entry["frame_index"])
        assert entry["name"] == f"clip.mp4 frame {row['frame_index']} ({row['timestamp_s']:.2f} s)"
        assert entry["overlay"] == f"overlays/clip.mp4/{row['frame_index']:06d}.png"
        expected = ov.draw_overlay(reference[row["frame_index"]], ov.drawn_instances(row["instances"], 0.3), 0.3)
        drawn = np.asarray(Image.open(tmp_path / "out" / entry["overlay"]))
        assert np.array_equal(drawn, expected)
    assert "broken.mp4" in render.write_report(tmp_path / "out", rows).read_text()
