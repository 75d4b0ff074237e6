"""The job's own cost: shuffles sized to the job (a small run needs a handful of tasks), waves in rounds of small
tasks, done keys broadcast only below their bound (sort-merge beyond), and no list of to-do paths on the driver for
inputs the executors can read."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from pathlib import Path

from pipelines.inference import image_sources as src
from pipelines.inference.inference_job import run
from pipelines.inference.job_plan import bytes_fetcher, plan_job, tasks_per_wave
from pipelines.inference.model_manifest import load_manifest
from pipelines.inference.resume import count_inputs, todo_listing
from pipelines.inference.video_sources import image_units
from pipelines.inference.waves import index_todo, wave_images
from pipelines.job_config import JobConfig, load_config
from tests.job_helpers import DEFAULT_MODEL_DIR, job_config
from tests.test_incremental import write_image

GROUP = "sparkseg-task-count"


def completed_tasks(spark, group: str) -> list[int]:
    """Per stage, the task attempts that ended in the jobs of `group`, from Spark's status tracker (no listener)."""
    tracker = spark.sparkContext.statusTracker()
    return [
        stage.numCompletedTasks
        for job_id in tracker.getJobIdsForGroup(group)
        for stage in map(tracker.getStageInfo, tracker.getJobInfo(job_id).stageIds)
        if stage is not None
    ]


def test_a_small_run_needs_a_handful_of_tasks(spark, tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    for seed in range(3):
        write_image(images / f"{seed}.jpg", seed)
    context = spark.sparkContext
    before, adaptive = spark.conf.get("spark.sql.shuffle.partitions"), spark.conf.get("spark.sql.adaptive.enabled")
    # Spark's default, as in a session the job does not start (spark-submit's, a notebook's): the job sizes its
    # shuffles from its first query (the listing's count ran 200 tasks)
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        for number, new in enumerate((3, 1)):  # a new output, then a resume with one new image
            if number:
                write_image(images / "new.jpg", 9)
            context.setJobGroup(f"{GROUP}-{number}", "task count")
            summary = run(spark, job_config(images, output))
            assert summary["counts"]["done"] == new
            tasks = completed_tasks(spark, f"{GROUP}-{number}")
            # ~20 small stages (listing, resume, balancing, writes, counts) of at most a few tasks each; with Spark's
            # 200 shuffle partitions one such run took ~700 tasks
            assert max(tasks) <= 2 * context.defaultParallelism and sum(tasks) <= 60, (
                f"run {number}: {sum(tasks)} tasks for {new} images: {tasks}"
            )
            # one job per step, the wave's inference and detections write in one (3 and 11 jobs here; with
            # adaptive execution, which ran each query stage as a job of its own, 7 and 22)
            jobs = context.statusTracker().getJobIdsForGroup(f"{GROUP}-{number}")
            assert len(jobs) <= (4, 12)[number], f"run {number}: {len(jobs)} jobs, stages' tasks {tasks}"
        assert spark.conf.get("spark.sql.shuffle.partitions") == "200", "the job must give the session back as it was"
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert spark.conf.get("spark.sql.adaptive.enabled") == adaptive


def test_a_wave_is_split_into_rounds_of_small_tasks_over_every_core():
    """The progress line's count moves when tasks end: with partitions 0 no task holds more than
    max_images_per_task images, in a multiple of the cores (equal tasks, ending round by round)."""
    default = JobConfig.from_dict(load_config()).inference

    def tasks(parallelism, images, **settings):
        return tasks_per_wave(dataclasses.replace(default, **settings), parallelism, images)

    assert default.partitions == 0 and default.max_images_per_task == 64
    assert tasks(2, 9) == 2 and tasks(2, 128) == 2 and tasks(2, 129) == 4 and tasks(2, 200) == 4
    assert tasks(16, 5000) == 80  # 5 rounds of 16 tasks, 62-63 images each
    assert tasks(2, 10_000_000) == 2 * 64  # one huge wave (run.commit_every 0): larger tasks, not more
    assert tasks(2, 5000, max_images_per_task=0) == 2  # no bound: one task per core
    assert tasks(2, 5000, partitions=6) == 6 and tasks(2, 3, partitions=6) == 3  # set: as given, never > images
    assert tasks(4, 3) == 3 and tasks(2, 0) == 1


def synthetic_done(spark, output: Path, sha256: str, rows: int) -> None:
    """A detections/ table of `rows` records (path, size, modification_time, model_sha256, run_id): no images."""
    mtime = dt.datetime(2026, 1, 1)
    data = [(f"file:/data/{i:06d}.jpg", 1000 + i, mtime, sha256, "20260101T000000Z-done") for i in range(rows)]
    spark.createDataFrame(
        data, "path string, size long, modification_time timestamp, model_sha256 string, run_id string"
    ).write.parquet(str(output / "detections"))


def final_plan(frame) -> str:
    frame.collect()  # with adaptive execution the plan is final only after it ran
    return frame._jdf.queryExecution().executedPlan().toString()


def test_done_keys_are_broadcast_only_below_the_bound(spark, tmp_path):
    manifest = load_manifest(DEFAULT_MODEL_DIR)
    synthetic_done(spark, tmp_path, manifest.model_sha256, rows=6)
    mtime = dt.datetime(2026, 1, 1)
    listing = spark.createDataFrame(
        [(f"file:/data/{i:06d}.jpg", 1000 + i, mtime) for i in range(9)], src.LISTING_SCHEMA
    )
    # the tables' rows known without a pass (table_index.rows_before_run) or not: the same choice
    for (bound, join), table_rows in itertools.product(((5, "SortMergeJoin"), (6, "BroadcastHashJoin")), (None, 6)):
        todo = todo_listing(
            spark,
            listing,
            str(tmp_path),
            manifest,
            force=False,
            broadcast_max_rows=bound,
            table_rows=table_rows,
            retries=3,
        )
        assert sorted(row.path[-10:] for row in todo.collect()) == ["000006.jpg", "000007.jpg", "000008.jpg"]
        plan = final_plan(todo)
        assert join in plan, plan
        if join == "SortMergeJoin":
            assert "Broadcast" not in plan, plan


def test_a_partial_to_do_of_local_files_is_read_on_the_executors(spark, tmp_path):
    """More to-do paths than the driver is allowed to hold (here: none at all): the wave's plan scans only the
    input root (one path), ships no path list, and the executors read each file by its listed path."""
    images = tmp_path / "im ages #1"
    for seed in range(4):
        write_image(images / f"{seed} %.jpg", seed)
    plan = plan_job(job_config(images, tmp_path / "out"), "yolact")
    listing = src.local_files_listing(spark, plan.input_uri, [".jpg"], recursive=True, driver_max_files=0)
    _, indexed = index_todo(image_units(listing.where("path NOT LIKE '%0 \\%.jpg'")), 2)  # as run_waves does
    wave = wave_images(spark, plan, indexed, first=0, count=3, n_inputs=4)
    text = wave._jdf.queryExecution().executedPlan().toString()
    assert "content" not in wave.columns and "LocalTableScan" not in text, text
    assert text.count("InMemoryFileIndex(") == text.count("InMemoryFileIndex(1 paths)"), text
    fetch = bytes_fetcher(plan)
    assert fetch is src.read_local_file
    for row in wave.collect():
        name = row.path.rsplit("/", 1)[-1]
        assert fetch(row.path) == (images / name).read_bytes()


def test_the_listing_joins_the_file_index_only_when_it_holds_empty_files(spark, tmp_path):
    """Spark's scan skips zero-byte files; whole_listing adds them back from the file index, and only then: a
    listing without empty files is the scan itself (no join in its plan), counted once. (Spark's index lists the
    Hadoop inputs; a local directory stands in for one here.)"""
    images = tmp_path / "images"
    for seed in range(3):
        write_image(images / f"{seed}.jpg", seed)

    def plan_text(frame) -> str:
        return frame._jdf.queryExecution().optimizedPlan().toString()

    passes = []

    def count(frame):
        passes.append(frame)
        return (frame.count(),)

    listing, counts = src.whole_listing(src.spark_file_index(spark, str(images), [".jpg"]), count)
    assert counts == (3,) and len(passes) == 1 and "Join" not in plan_text(listing), plan_text(listing)
    listing.unpersist()

    (images / "empty one.jpg").write_bytes(b"")
    passes.clear()
    listing, counts = src.whole_listing(src.spark_file_index(spark, str(images), [".jpg"]), count)
    rows = {Path(row.path).name: row.size for row in listing.collect()}
    assert counts == (4,) and len(passes) == 2 and "Join" in plan_text(listing)
    assert rows == {**{f"{seed}.jpg": (images / f"{seed}.jpg").stat().st_size for seed in range(3)}, "empty one.jpg": 0}
    assert rows == {Path(row.path).name: row.size for row in src.list_images(spark, str(images), [".jpg"]).collect()}
    listing.unpersist()


def test_a_to_do_that_is_the_listing_is_indexed_from_the_listing_count(spark, tmp_path):
    """count_inputs counts the listing's rows per partition in its one pass; index_todo, given them for a to-do that
    is the listing itself (a first run), makes no copy and no Spark job of its own and numbers the rows exactly as
    its own pass would."""
    images = tmp_path / "images"
    for seed in range(7):
        write_image(images / f"d{seed % 3}" / f"{seed}.jpg", seed)
    video = JobConfig.from_dict(load_config()).input.video
    listing, counts = src.whole_listing(
        src.find_images(spark, str(images), [".jpg"]), lambda frame: count_inputs(frame, video)
    )
    assert counts.files == 7 and counts.videos == 0 and sum(counts.rows_per_partition.values()) == 7
    assert len(counts.rows_per_partition) > 1, "the test needs a listing of several partitions"
    units = image_units(listing)
    context = spark.sparkContext
    try:
        context.setJobGroup(f"{GROUP}-index", "index from the listing's counts")
        todo, indexed = index_todo(units, 3, counts.rows_per_partition)
        assert todo is units and not context.statusTracker().getJobIdsForGroup(f"{GROUP}-index")
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    columns = ("path", "idx", "part", "part_key")
    _, reference = index_todo(units, 3)
    assert sorted(indexed.select(*columns).collect()) == sorted(reference.select(*columns).collect())
    assert sorted(row.idx for row in indexed.collect()) == list(range(7))
    listing.unpersist()


def test_each_job_runs_its_own_bundled_model_unless_given_one(tmp_path):
    config = load_config()
    config["input"]["uri"], config["output"]["uri"] = str(tmp_path), str(tmp_path / "out")
    assert config["model"]["dir"] is None
    for family, bundled in (("yolact", "yolact_default"), ("detector", "detector_default")):
        plan = plan_job(config, family)
        assert plan.manifest.model == family and plan.manifest.root.name == bundled
        assert plan.config.model.dir.endswith(bundled)  # what the summary's config says
    config["model"]["dir"] = str(DEFAULT_MODEL_DIR)
    assert plan_job(config, "yolact").manifest.root == DEFAULT_MODEL_DIR.resolve()
