"""Waves: the to-do indexed once, then processed in waves of run.commit_every units, each through the plan's engine
and committed on its own (a killed driver loses at most one wave), while the run still holds its lock."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.inference import image_sources as src
from pipelines.inference import video_sources as videos
from pipelines.inference.crash_guard import MARKER_DIR, CrashGuard, remove_markers
from pipelines.inference.image_inference import ImageInference
from pipelines.inference.inference_tasks import inference_task_class
from pipelines.inference.job_plan import JobPlan, bytes_fetcher
from pipelines.inference.model_manifest import INFERENCE_ROLES, MANIFEST_NAME, ModelManifest
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.inference.progress import ProgressReporter
from pipelines.inference.resume import Work
from pipelines.io.run_lock import HeldLock
from pipelines.io.storage import publish_once
from pipelines.results.result_schema import RESULT_SCHEMA
from pipelines.results.results_writer import TIMING_FIELDS, write_results
from pipelines.spark.session_kind import qualify_root, session_kind


def no_totals() -> dict[str, float]:
    """The aggregates of a run that processed nothing (write_results' keys, summed over the waves)."""
    return {"done": 0, "failed": 0, "frames": 0, "instances": 0, **{name: 0.0 for name in TIMING_FIELDS}}


def infer(spark: SparkSession, plan: JobPlan, work: Work, settings: RuntimeSettings, lock: HeldLock) -> dict:
    """The to-do through the plan's engine in waves (run_waves), with a progress line and the engine's executors
    warmed up while the driver plans the first wave; the aggregates."""
    counts, kind = work.counts, session_kind(spark)
    if counts.videos:  # progress counts result rows: images and video frames
        total = videos.expected_rows(work.todo, plan.config.input.video)
        progress = ProgressReporter(kind, total, plan.config.run.progress_interval_s, unit="images+frames")
    else:
        progress = ProgressReporter(kind, counts.todo, plan.config.run.progress_interval_s)
    task = make_task(spark, plan, settings, progress)
    with progress, plan.engine.warm_up(spark, task, counts.partitions, plan.run_id):
        return run_waves(spark, plan, task, settings, work, lock, progress)


def write_empty_tables(spark: SparkSession, plan: JobPlan) -> None:
    """The tables of a new output where the run found nothing to do: they exist all the same, empty, for whatever
    reads them next."""
    write_results(
        tagged_results(spark.createDataFrame([], RESULT_SCHEMA), plan), plan.output, f"part-{plan.run_id}-empty"
    )


def run_waves(
    spark: SparkSession,
    plan: JobPlan,
    task: ImageInference,
    settings: RuntimeSettings,
    work: Work,
    lock: HeldLock,
    progress: ProgressReporter,
) -> dict:
    """Process the work's to-do in waves of `run.commit_every`, each committed on its own (a killed driver loses
    at most one wave) while the run still holds `lock` (LockLost otherwise); return the summed aggregates."""
    run_cfg, counts = plan.config.run, work.counts
    totals = no_totals()
    todo, indexed = index_todo(work.todo, counts.partitions, work.rows_per_partition)
    wave_size = run_cfg.commit_every or counts.todo
    for number, first in enumerate(range(0, counts.todo, wave_size)):
        count = min(wave_size, counts.todo - first)
        wave = wave_images(spark, plan, indexed, first, count, counts.inputs)
        name = f"{plan.run_id}-w{number:05d}"
        guard = CrashGuard(plan.output / MARKER_DIR / name, run_cfg.poison_attempts)
        results, intermediates = plan.engine.results(
            src.balanced(wave, min(counts.partitions, count)),
            replace(task, crash_guard=guard),
            plan.manifest,
            settings.precision,
        )
        results = tagged_results(results, plan).persist(StorageLevel.MEMORY_AND_DISK)
        lock.ensure_held()
        wave_totals = write_results(results, plan.output, f"part-{name}")
        progress.committed(int(wave_totals.get("done", 0) + wave_totals.get("failed", 0)))
        remove_markers(plan.output)
        results.unpersist()
        for frame in intermediates:
            frame.unpersist()
        for key in totals:
            totals[key] += wave_totals.get(key, 0)
    todo.unpersist()
    return totals


def ship_model(spark: SparkSession, manifest: ModelManifest) -> str:
    """Send the files inference needs to every executor once, as a zip archive named by the model's hash
    (the session kind's ship_archive: Spark copies and unpacks it on each executor; directories can't be added with
    addFile outside local mode). Returns the driver-side staging directory: executors that share the driver's
    filesystem read it directly, the others use the shipped copy (shipped_files.shipped_path)."""
    name = f"sparkseg-model-{manifest.model_sha256[:16]}"
    staged = Path(tempfile.gettempdir()) / name
    archive = staged.with_suffix(".zip")
    if not (staged / MANIFEST_NAME).is_file() or not archive.is_file():
        tmp = Path(tempfile.mkdtemp(prefix=name + "."))
        files = manifest.data["files"]  # a detector has no priors
        for rel in [files[role] for role in INFERENCE_ROLES if role in files] + [MANIFEST_NAME]:
            shutil.copy2(manifest.root / rel, tmp / rel)
        publish_once(Path(shutil.make_archive(str(tmp), "zip", root_dir=tmp)), archive)
        if staged.exists() and not (staged / MANIFEST_NAME).is_file():
            shutil.rmtree(staged, ignore_errors=True)  # incomplete; a complete one may be in use by another job
        try:
            os.replace(tmp, staged)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another job staged it first
    session_kind(spark).ship_archive(archive)
    return str(staged)


def make_task(
    spark: SparkSession, plan: JobPlan, settings: RuntimeSettings, progress: ProgressReporter
) -> ImageInference:
    """The executor-side function (small, picklable); the model ships separately, once per executor."""
    manifest, inference, output = plan.manifest, plan.config.inference, plan.config.output
    return inference_task_class(plan.family)(
        model_dir=ship_model(spark, manifest),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess={**manifest.postprocess, "nms": inference.nms},
        settings=settings,
        output=plan.output,
        input_root=qualify_root(spark, plan.input_uri) if plan.reader == "spark" else plan.input_uri,
        masks=output.masks,
        score_threshold=output.score_threshold,
        max_image_pixels=inference.max_image_pixels,
        jpeg_draft=inference.jpeg_draft,
        fetch_bytes=bytes_fetcher(plan),
        progress=progress.executor_count,
        video=plan.config.input.video,
        frames_per_batch=inference.batch_size,
    )


def tagged_results(results: DataFrame, plan: JobPlan) -> DataFrame:
    """The result rows with the columns that say which model and run wrote them."""
    return (
        results.withColumn("model_name", F.lit(plan.manifest.name))
        .withColumn("model_sha256", F.lit(plan.manifest.model_sha256))
        .withColumn("run_id", F.lit(plan.run_id))
    )


def index_todo(
    todo: DataFrame, partitions: int, rows_per_partition: dict[int, int] | None = None
) -> tuple[DataFrame, DataFrame]:
    """The to-do, detached from the output table and persisted (unpersist it when the run is done), and its rows
    with assign_partitions' dense `idx` and balancing key, computed from that one persisted copy. Where the to-do is
    the persisted listing's own rows (nothing done before, or run.force), `rows_per_partition` gives them per
    partition (count_inputs): it is indexed as it is, without a copy or a pass of its own."""
    order = ("path", "segment_start")
    if rows_per_partition is not None:
        return todo, src.assign_partitions(todo, partitions, order, rows_per_partition)
    # on disk only: read back once per wave; MEMORY_AND_DISK pulled whole blocks of a 10^7-row to-do back into a 1 g
    # driver's heap (OutOfMemoryError in BlockManager.maybeCacheDiskBytesInMemory, bench_planning)
    todo = without_table_lineage(todo).persist(StorageLevel.DISK_ONLY)
    return todo, src.assign_partitions(todo, partitions, order)


def without_table_lineage(df: DataFrame) -> DataFrame:
    """`df` with a plan that no longer names the files it was read from (session_kind's detached). The
    to-do is the listing minus the output's done rows; when a wave appends to the output, Spark re-caches every
    cached plan that reads that path (recacheByPath), which would recompute a cached to-do without this wave's
    images and shift the waves after it."""
    return session_kind(df.sparkSession).detached(df)


def wave_images(
    spark: SparkSession, plan: JobPlan, indexed: DataFrame, first: int, count: int, n_inputs: int
) -> DataFrame:
    """The images of one wave (rows idx in [first, first + count) of assign_partitions' output) as inference gets
    them: paths the executors read themselves (local files, Azure), or with Spark's `content` (other schemes)."""
    wave = indexed.where((F.col("idx") >= first) & (F.col("idx") < first + count))
    if plan.reader == "spark" and not src.reads_on_executors(plan.input_uri):
        inputs = plan.config.input
        wave = src.with_content(
            spark,
            wave,
            count,
            plan.input_uri,
            inputs.listed_extensions,
            inputs.recursive,
            all_listed=(count == n_inputs),
        )
    return wave
