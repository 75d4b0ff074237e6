"""The batch-inference job as a recipe: config -> read -> transform -> write, for every model family.

`run(spark, config, family)` is what `jobs/infer_yolact.py`, `jobs/infer_detector.py`, the Databricks notebook and
the sweeps call. The family picks the executor-side postprocess; everything else is shared.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.errors import RunFailed
from pipelines.inference import image_sources as src
from pipelines.inference import video_sources as videos
from pipelines.inference.crash_guard import MARKER_DIR, CrashGuard, remove_markers
from pipelines.inference.executor_warmup import ExecutorWarmUp, LoadModel, load_compiled_loops
from pipelines.inference.image_inference import ImageInference
from pipelines.inference.inference_tasks import inference_task_class
from pipelines.inference.model_manifest import INFERENCE_ROLES, MANIFEST_NAME, ModelManifest, load_manifest
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.inference.progress import ProgressReporter, say
from pipelines.io.output_paths import qualify_root
from pipelines.io.run_lock import LockSettings, RunLock
from pipelines.io.storage import Location, publish_once
from pipelines.job_config import InferenceSettings, JobConfig, VideoSettings, local_path, resolve_local, resolve_output
from pipelines.results.coco_results import write_coco_results
from pipelines.results.done_index import done_keys, table_file_names, update_after_run
from pipelines.results.result_schema import RESULT_SCHEMA
from pipelines.results.results_writer import (
    TIMING_FIELDS,
    choose_writer,
    failed_paths,
    failure_types,
    holds_tables,
    read_summary,
    remove_uncommitted_writes,
    write_results,
    write_summary,
)
from pipelines.results.table_index import counts_after_run, rows_before_run
from pipelines.spark.spark_session import ship_library, ship_once

log = logging.getLogger(__name__)


class JobFailed(RunFailed):
    """The job ran but its outcome is not acceptable (e.g. too many errors); the summary was written."""


def ship_model(spark: SparkSession, manifest: ModelManifest) -> str:
    """Send the files inference needs to every executor once, as a zip archive named by the model's hash
    (SparkContext.addArchive: Spark copies and unpacks it on each executor; directories can't be added with
    addFile outside local mode). Returns the driver-side staging directory: executors that share the driver's
    filesystem read it directly, the others use SparkFiles.get(<name>.zip)."""
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
    ship_once(spark.sparkContext, name, lambda: spark.sparkContext.addArchive(str(archive)))
    return str(staged)


def runtime_settings(spark: SparkSession, inference: InferenceSettings) -> RuntimeSettings:
    task_cpus = int(spark.sparkContext.getConf().get("spark.task.cpus", "1"))
    return RuntimeSettings.for_task_cpus(
        task_cpus,
        precision=inference.precision,
        threads=inference.openvino_threads or None,
        streams=inference.openvino_streams or None,
        pin_cores=inference.pin_cores,
    )


ROWS_PER_SHUFFLE_PARTITION = 100_000


def todo_listing(
    spark: SparkSession,
    listing: DataFrame,
    output: Location | str,
    manifest: ModelManifest,
    force: bool,
    broadcast_max_rows: int,
    table_rows: int | None = None,
    table_files: dict[str, dict[str, str]] | None = None,
    *,
    retries: int,
) -> DataFrame:
    """Images not yet done for this model (same path, size and modification time; done_index.done_keys, with
    `retries` for the failures that were not the image's), unless `force`. The done keys are broadcast only up to
    `broadcast_max_rows`; beyond, a sort-merge anti-join: neither the driver's nor an executor's memory grows with
    the history. `table_rows`: the tables' records of every model, where known without a pass
    (table_index.rows_before_run), an upper bound of the done keys; else they are counted (one column-pruned pass).
    `table_files`: the tables' files (done_index.table_file_names), where the caller listed them."""
    if force:
        return listing
    done = done_keys(spark, output, manifest.model_sha256, retries, table_files)
    if done is None:
        return listing
    broadcast = (table_rows is not None and table_rows <= broadcast_max_rows) or done.count() <= broadcast_max_rows
    return without_done(listing, done, broadcast=broadcast)


def without_done(listing: DataFrame, done: DataFrame, broadcast: bool) -> DataFrame:
    """Transform: the listing rows whose (path, size, modification_time) is not in `done`; `done` broadcast, or both
    sides shuffled and sorted (a merge hint: Spark must not broadcast it by its own size estimate)."""
    keys = ("path", "size", "modification_time", "segment_start", "segment_end")
    done = done.select(*[F.col(k).alias(f"done_{k}") for k in keys])
    same = (
        (listing.path == done.done_path)
        & (listing.size == done.done_size)
        & listing.modification_time.eqNullSafe(done.done_modification_time)
    )  # empty files have no mtime
    if "segment_start" in listing.columns:  # work units (video_sources.UNIT_SCHEMA): a video is done per segment
        same = (
            same
            & listing.segment_start.eqNullSafe(done.done_segment_start)
            & listing.segment_end.eqNullSafe(done.done_segment_end)
        )
    return listing.join(F.broadcast(done) if broadcast else done.hint("merge"), same, "left_anti")


def shuffle_partitions_for(rows: int) -> int:
    """Partitions of every planning shuffle (sort, anti-join, counts) for a job of `rows` images: one per
    ROWS_PER_SHUFFLE_PARTITION, so a 9-image run needs one task per shuffle, not Spark's 200."""
    return max(1, -(-int(rows) // ROWS_PER_SHUFFLE_PARTITION))


def planning_settings(config: JobConfig) -> dict[str, str]:
    """The SQL settings a job runs with from its first query: no adaptive execution (unless the config's spark.conf
    sets it). Every shuffle is sized by the job and every join strategy chosen by it, so it has nothing to re-plan;
    with it, a wave's persisted results were materialized by a stage of their own and read back by another for the
    detections write (~2 ms per image on 2 cores), and the listing's count ran as 3 jobs."""
    return {} if "spark.sql.adaptive.enabled" in config.spark.conf else {"spark.sql.adaptive.enabled": "false"}


def session_settings_for(rows: int, config: JobConfig) -> dict[str, str]:
    """The SQL settings a job of `rows` units runs with once they are counted: Arrow batches of
    inference.batch_size images, and planning shuffles sized to the job (unless the config's spark.conf sets them)."""
    settings = {"spark.sql.execution.arrow.maxRecordsPerBatch": str(config.inference.batch_size)}
    if "spark.sql.shuffle.partitions" not in config.spark.conf:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions_for(rows))
    return settings


def set_session_settings(spark: SparkSession, settings: dict[str, str]) -> dict[str, str | None]:
    """Apply `settings` to the session; return the values they replace (None: unset), to restore when the job ends
    (a notebook's session outlives the job)."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    return previous


def restore_session_settings(spark: SparkSession, previous: dict[str, str | None]) -> None:
    for key, value in previous.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


@dataclass
class JobPlan:
    """What the driver resolved before any Spark task: where from, where to, which model, how."""

    config: JobConfig
    family: str
    input_uri: str
    output: Location  # the output URI and the job's Azure credentials: every write goes through it
    manifest: ModelManifest
    engine: str
    reader: str
    run_id: str = field(
        default_factory=lambda: f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    )
    started: float = field(default_factory=time.time)  # the summary's wall time counts from here

    @property
    def output_uri(self) -> str:
        return self.output.uri

    @property
    def credentials(self):
        """The job's Azure credentials (AzureCredentials; None where nothing is on Azure), for input and output."""
        return self.output.credentials


def plan_job(config: JobConfig | dict, family: str, azure_credentials=None) -> JobPlan:
    """Resolve URIs, check the settings (a dict of the YAML layer is typed here), the local input and output, verify
    the model and the engine, find credentials: everything that can fail on bad input, in pure Python, before any JVM
    or Spark task."""
    config = JobConfig.of(config)
    bundled = config.model.dir is None
    config = replace(config, model=replace(config.model, dir=config.model.dir_for(family)))  # as the summary says
    input_uri, output_uri = resolve_local(config.input.uri), resolve_output(config.output.uri)
    check_local_paths(input_uri, output_uri, config.input.uri)
    model_dir = resolve_local(config.model.dir)
    if bundled and not Path(model_dir).is_dir():
        raise src.InputError(
            f"no --model (model.dir) given, and the bundled {family} model is not here "
            f"({config.model.dir}): the bundled models ship with the source checkout "
            "(samples/models), not with an installed package; pass --model an export directory "
            f"(python -m model_export {family} ..., or a copy of the checkout's {config.model.dir})"
        )
    manifest = load_manifest(model_dir, verify=True)
    if manifest.model != family:
        raise src.InputError(
            f"{manifest.root}: a '{manifest.model}' model; this job needs a {family} export "
            f"(python -m model_export {family} ...)"
        )
    engine = config.inference.engine
    if engine == "bigdl":
        from pipelines.engines.bigdl_engine import require_bigdl

        require_bigdl()
    reader = src.choose_reader(input_uri, config.input.reader)
    credentials = azure_credentials
    if reader == "azure_sdk" or choose_writer(output_uri) == "azure_sdk":
        require_azure_sdk(engine)
        if credentials is None:
            from pipelines.io.azure_storage import AzureCredentials

            credentials = AzureCredentials.from_env()
    return JobPlan(config, family, input_uri, Location(output_uri, credentials), manifest, engine, reader)


def require_azure_sdk(engine: str) -> None:
    """az:// and abfs:// are read and written with the Azure SDK (setup.py's `azure` extra): an env without it
    (the bigdl engine's pinned env has none) stops here, saying what to do."""
    import importlib.util

    try:
        found = importlib.util.find_spec("azure.storage.blob") is not None
    except ModuleNotFoundError:  # no azure (or azure.storage) package at all
        found = False
    if not found:
        where = (
            "the bigdl engine's env (make bigdl-env) has no Azure SDK: run this input or output with --engine "
            "native, or read it as abfss:// through Spark's hadoop-azure"
            if engine == "bigdl"
            else "this env has no Azure SDK: pip install -c constraints.txt '.[azure]'"
        )
        raise src.InputError(f"az:// and abfs:// inputs and outputs need the Azure SDK; {where}")


def check_local_paths(input_uri: str, output_uri: str, given_input: str | None = None) -> None:
    """A local --input must exist (the error names it as `given_input`, the user's spelling); a local --output must
    be a directory or not exist yet (other schemes are checked by their store when the job lists and locks them)."""
    source, target = local_path(input_uri), local_path(output_uri)
    if source is not None and not source.exists():
        raise src.missing_input(given_input or input_uri)
    if source is not None and target is not None and source.resolve() == target.resolve():
        raise src.output_is_input(output_uri)  # before Spark starts (other stores: when the input is listed)
    if target is not None and target.exists() and not target.is_dir():
        raise src.InputError(
            f"{output_uri}: --output names an existing file; give a directory (new or a previous run's output)"
        )
    if target is not None and not target.exists():
        parent = next(folder for folder in target.absolute().parents if folder.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise src.InputError(
                f"{output_uri}: --output cannot be created: {parent} is "
                f"{'a file' if not parent.is_dir() else 'not writable for this user'}; give a "
                "directory that can be"
            )


def run(spark: SparkSession, config: JobConfig | dict, family: str = "yolact", azure_credentials=None) -> dict:
    """Run the job for a `family` model; return the summary (also written to <output>/summary.json).
    `azure_credentials` (e.g. from a Databricks secret scope) replace the environment's. See run_plan."""
    return run_plan(spark, plan_job(config, family, azure_credentials))


def run_plan(spark: SparkSession, plan: JobPlan) -> dict:
    """Run a planned job. Holds the output's lock (pipelines.io.run_lock) from after the listing to the end; raises
    LockHeld when another run holds it, JobFailed when the errors exceed run.max_error_fraction."""
    ship_library(spark)
    say(f"run {plan.run_id}: listing {plan.input_uri}")
    with start_workers(spark, plan):
        return list_and_infer(spark, plan)


def list_and_infer(spark: SparkSession, plan: JobPlan) -> dict:
    """run_plan's listing, resume planning, waves and summary."""
    started, config = plan.started, plan.config
    run_cfg, video = config.run, config.input.video
    # listed (the input path checked) before the lock: a missing input leaves no output directory behind
    found = src.find_images(
        spark,
        plan.input_uri,
        config.input.listed_extensions,
        config.input.recursive,
        plan.reader,
        plan.credentials,
        plan.output.uri,
    )
    if found.excluded:
        say(f"the output lies under the input: its files ({found.excluded}...) are not inputs")
    lock_settings = LockSettings(run_cfg.lock_stale_after_s, run_cfg.lock_heartbeat_s, run_cfg.break_lock)
    lock = RunLock.acquire(plan.output, plan.run_id, lock_settings, spark=spark)
    previous_settings = {}
    try:
        previous_settings = set_session_settings(spark, planning_settings(config))
        new_output = not holds_tables(spark, plan.output)  # under the lock: no other run writes to it now
        for leftover in remove_uncommitted_writes(spark, plan.output):
            log.warning("removed %s: the uncommitted files of an earlier run that was killed", leftover)
        tables_before = None if new_output else table_file_names(plan.output)
        rows_before = None if new_output else rows_before_run(plan.output, tables_before)
        # on disk only: each wave reads it back (index_todo), and MEMORY_AND_DISK would pull whole blocks of a
        # 10^7-row listing into a 1 g driver's heap (see index_todo)
        listing, counts = src.whole_listing(found, lambda frame: count_inputs(frame, video), StorageLevel.DISK_ONLY)
        n_inputs, n_videos = counts.files, counts.videos
        previous_settings.update(set_session_settings(spark, session_settings_for(n_inputs, config)))
        units = work_units(spark, plan, listing, video, n_videos)
        n_units = units.count() if n_videos else n_inputs
        todo = todo_listing(
            spark,
            units,
            plan.output,
            plan.manifest,
            run_cfg.force,
            run_cfg.broadcast_max_rows,
            sum(rows_before.values()) if rows_before else None,
            tables_before,
            retries=run_cfg.retries,
        )
        n_todo = n_units if todo is units else todo.count()  # the units themselves: nothing done before, or force
        if n_videos:
            say(
                f"{n_inputs} files ({n_videos} videos in {n_units - n_inputs + n_videos} segments), {n_todo} images "
                f"and segments to do ({n_units - n_todo} already done for this model)"
            )
        else:
            say(f"{n_inputs} images, {n_todo} to do ({n_inputs - n_todo} already done for this model)")
        if n_todo < n_units and not run_cfg.force:
            warn_if_output_settings_changed(plan, read_summary(plan.output), n_units - n_todo)
        if not n_inputs:
            say(
                src.nothing_listed(
                    plan.input_uri, config.input.listed_extensions, config.input.recursive, found.excluded
                )
            )
        elif n_inputs <= src.DRIVER_LISTING_MAX_FILES:  # a second walk of a listing the driver could hold anyway
            hidden = src.underscored_note(
                plan.input_uri, config.input.listed_extensions, config.input.recursive, found.excluded
            )
            if hidden:
                log.warning(hidden)
        partitions = tasks_per_wave(
            config.inference, spark.sparkContext.defaultParallelism, min(run_cfg.commit_every or n_todo, n_todo)
        )
        settings = runtime_settings(spark, config.inference)
        if n_videos:  # progress counts result rows: images and video frames
            progress = ProgressReporter(
                spark, videos.expected_rows(todo, video), run_cfg.progress_interval_s, unit="images+frames"
            )
        else:
            progress = ProgressReporter(spark, n_todo, run_cfg.progress_interval_s)
        totals = {"done": 0, "failed": 0, "frames": 0, "instances": 0, **{name: 0.0 for name in TIMING_FIELDS}}
        if n_todo:
            task = make_task(spark, plan, settings, progress)
            with progress, warm_up(spark, plan, task, partitions):
                own_rows = counts.rows_per_partition if todo is units and not n_videos else None  # the listing's
                totals = run_waves(spark, plan, task, settings, todo, n_todo, n_inputs, partitions, lock, own_rows)
        elif new_output:  # nothing listed: the tables exist all the same, empty, for whatever reads them next
            write_results(
                tagged_results(spark.createDataFrame([], RESULT_SCHEMA), plan), plan.output, f"part-{plan.run_id}-empty"
            )
        listing.unpersist()
        units.unpersist()
        lock.ensure_held()
        tables_after = table_file_names(plan.output)
        update_after_run(spark, plan.output, tables_after)  # the resume index, when the tables outgrew it
        if config.output.coco_results:
            write_coco_results(spark, plan.output)
        summary = make_summary(
            spark,
            plan,
            settings,
            totals,
            n_inputs,
            n_todo,
            partitions,
            time.time() - started,
            n_units=n_units,
            n_videos=n_videos,
            new_output=new_output,
            rows_before=rows_before,
            tables_after=tables_after,
        )
        write_summary(plan.output, summary)
        if config.output.overlays:
            summary["report"] = render_report(spark, plan.output, summary)
        processed = totals["done"] + totals["failed"]
        max_fraction = run_cfg.max_error_fraction
        if processed and totals["failed"] / processed > max_fraction:
            raise JobFailed(
                f"{int(totals['failed'])} of {processed} images failed (more than "
                f"run.max_error_fraction {max_fraction}): see {plan.output_uri}/errors and summary.json; "
                f"raise run.max_error_fraction (1.0: never fail on errors) if that many are expected"
            )
        return summary
    finally:
        lock.release()
        restore_session_settings(spark, previous_settings)


def warn_if_output_settings_changed(plan: JobPlan, previous: dict | None, n_done: int) -> None:
    """Images already done keep the rows they were written with: warn when the last run on this output wrote this
    model's rows with other output.masks or score threshold than this run's (one table would mix both)."""
    if not previous or (previous.get("model") or {}).get("sha256") != plan.manifest.model_sha256:
        return
    before = (previous.get("config") or {}).get("output") or {}
    now = plan.config.output
    changed = [
        f"{name} {before.get(key)!r} -> {value!r}"
        for name, key, value in (
            ("output.masks (--masks)", "masks", now.masks),
            ("output.score_threshold (--score-threshold)", "score_threshold", now.score_threshold),
        )
        if key in before and before[key] != value
    ]
    if changed:
        log.warning(
            "%d images already done keep the rows the last run wrote (%s): only new images get this run's; "
            "--force redoes them all, or write to a new --output",
            n_done,
            ", ".join(changed),
        )


MAX_ROUNDS_PER_WAVE = 64  # the driver keeps a few KB per task of a stage: a huge wave (run.commit_every 0) gets
# larger tasks, not more than 64 per core


def tasks_per_wave(inference: InferenceSettings, parallelism: int, wave_images: int) -> int:
    """Tasks a wave of `wave_images` images is split into: inference.partitions where set; else `parallelism` (every
    core busy), times the rounds it takes for no task to hold more than inference.max_images_per_task images, up to
    MAX_ROUNDS_PER_WAVE (equal tasks end together, round after round: the progress line, fed as tasks end, moves at
    each round). Never more tasks than images."""
    wanted = inference.partitions
    if not wanted:
        per_round = parallelism * inference.max_images_per_task
        rounds = min(max(1, -(-wave_images // per_round)), MAX_ROUNDS_PER_WAVE) if per_round else 1
        wanted = parallelism * rounds
    return max(1, min(wanted, wave_images))


class InputCounts(NamedTuple):
    """What one pass over the listing counts: its files, the videos among them, and its rows per partition (the
    first pass of assign_partitions, when the to-do is the listing itself)."""

    files: int
    videos: int
    rows_per_partition: dict[int, int]


def count_inputs(listing: DataFrame, video: VideoSettings) -> InputCounts:
    """Files listed, videos among them and rows per partition of `listing`, in one pass (one row per partition
    reaches the driver)."""
    rows = (
        listing.groupBy(F.spark_partition_id().alias("partition"))
        .agg(
            F.count(F.lit(1)).alias("files"),
            F.sum(F.when(videos.is_video(F.col("path"), video.extensions), 1).otherwise(0)).alias("videos"),
        )
        .collect()
    )
    return InputCounts(
        sum(row["files"] for row in rows),
        sum(row["videos"] for row in rows),
        {row["partition"]: row["files"] for row in rows},
    )


def work_units(
    spark: SparkSession, plan: JobPlan, listing: DataFrame, video: VideoSettings, n_videos: int
) -> DataFrame:
    """The listing as units of work (video_sources.UNIT_SCHEMA): its images, and its `n_videos` videos' segments
    from a scan on the executors (persisted: each video is scanned once per run)."""
    if not n_videos:
        return videos.image_units(listing)
    is_video = videos.is_video(F.col("path"), video.extensions)
    clips = listing.where(is_video)
    if plan.engine != "native":
        raise src.InputError(f"{plan.input_uri}: holds {n_videos} videos; video input needs inference.engine native")
    if plan.reader == "spark" and not src.reads_on_executors(plan.input_uri):
        clips = src.with_content(
            spark,
            clips,
            n_videos,
            plan.input_uri,
            list(video.extensions),
            plan.config.input.recursive,
            all_listed=False,
        )
    units = videos.image_units(listing.where(~is_video)).unionByName(
        videos.video_units(clips, video, bytes_fetcher(plan))
    )
    return units.persist(StorageLevel.MEMORY_AND_DISK)


def start_workers(spark: SparkSession, plan: JobPlan):
    """The native engine's first Python worker started while the driver lists the input (executor_warmup), when the
    run will infer whatever it lists: a new output, or `run.force`. Not on a resume, which may find nothing new:
    there the worker's start (the daemon's numba start-up with it) would compete with the planning for the cores
    (an empty incremental run of 200 images on 2 cores: 6.6 -> 7.2 s). Nothing for BigDL, whose executors run no
    Python model."""
    if plan.engine != "native" or (holds_tables(spark, plan.output) and not plan.config.run.force):
        return contextlib.nullcontext()
    return ExecutorWarmUp(spark, load_compiled_loops, 1, f"{plan.run_id}-workers", "start a Python worker")


def warm_up(spark: SparkSession, plan: JobPlan, task: ImageInference, partitions: int):
    """The native engine's executors started while the driver plans (executor_warmup), one task per core the first
    round of `partitions` tasks uses; nothing for BigDL, whose executors run no Python model."""
    if plan.engine != "native":
        return contextlib.nullcontext()
    return ExecutorWarmUp(
        spark,
        LoadModel(task),
        min(partitions, spark.sparkContext.defaultParallelism),
        plan.run_id,
        "start Python workers, load the model",
    )


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
        progress=progress.accumulator,
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


def run_waves(
    spark: SparkSession,
    plan: JobPlan,
    task: ImageInference,
    settings: RuntimeSettings,
    todo: DataFrame,
    n_todo: int,
    n_inputs: int,
    partitions: int,
    lock: RunLock,
    rows_per_partition: dict[int, int] | None = None,
) -> dict:
    """Process the to-do images in waves of `run.commit_every`, each committed on its own (a killed driver loses
    at most one wave) while the run still holds `lock` (LockLost otherwise); return the summed aggregates.
    `rows_per_partition`: see index_todo."""
    run_cfg = plan.config.run
    totals = {"done": 0, "failed": 0, "frames": 0, "instances": 0, **{name: 0.0 for name in TIMING_FIELDS}}
    todo, indexed = index_todo(todo, partitions, rows_per_partition)
    wave_size = run_cfg.commit_every or n_todo
    for number, first in enumerate(range(0, n_todo, wave_size)):
        count = min(wave_size, n_todo - first)
        wave = wave_images(spark, plan, indexed, first, count, n_inputs)
        name = f"{plan.run_id}-w{number:05d}"
        guard = CrashGuard(plan.output / MARKER_DIR / name, run_cfg.poison_attempts)
        results, intermediates = wave_results(
            src.balanced(wave, min(partitions, count)), replace(task, crash_guard=guard), plan, settings
        )
        results = tagged_results(results, plan).persist(StorageLevel.MEMORY_AND_DISK)
        lock.ensure_held()
        wave_totals = write_results(results, plan.output, f"part-{name}")
        remove_markers(plan.output)
        results.unpersist()
        for frame in intermediates:
            frame.unpersist()
        for key in totals:
            totals[key] += wave_totals.get(key, 0)
    todo.unpersist()
    return totals


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
    """`df` with a plan that no longer names the files it was read from (an RDD of its rows, all in the JVM). The
    to-do is the listing minus the output's done rows; when a wave appends to the output, Spark re-caches every
    cached plan that reads that path (recacheByPath), which would recompute a cached to-do without this wave's
    images and shift the waves after it."""
    spark = df.sparkSession
    return DataFrame(spark._jsparkSession.createDataFrame(df._jdf.rdd(), df._jdf.schema()), spark)


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


def wave_results(
    images: DataFrame, task: ImageInference, plan: JobPlan, settings: RuntimeSettings
) -> tuple[DataFrame, list[DataFrame]]:
    """Transform: images (with content or fetchable paths) -> (RESULT_SCHEMA rows, by the plan's engine; the
    intermediate frames the engine persisted for them, to unpersist once the rows are written)."""
    if plan.engine == "bigdl":
        from pipelines.engines.bigdl_inference import bigdl_results

        return bigdl_results(images, task, plan.manifest, settings.precision)
    return images.mapInArrow(task, RESULT_SCHEMA), []


def make_summary(
    spark: SparkSession,
    plan: JobPlan,
    settings: RuntimeSettings,
    totals: dict,
    n_inputs: int,
    n_todo: int,
    partitions: int,
    elapsed: float,
    n_units: int | None = None,
    n_videos: int = 0,
    new_output: bool = False,
    rows_before: dict[str, int] | None = None,
    tables_after: dict[str, dict[str, str]] | None = None,
) -> dict:
    """The run's summary. Counts: `inputs` files listed, `videos` of them videos, `units` images + video segments,
    `skipped` units already done, `done`/`failed` result rows (images and video frames), `frames` of `done`.
    `new_output`: the output held no tables when the run began; `rows_before`: their rows then, where known
    (table_index.counts_after_run); `tables_after`: the tables' files now (done_index.table_file_names)."""
    n_units = n_inputs if n_units is None else n_units
    manifest = plan.manifest
    processed = totals["done"] + totals["failed"]
    return {
        "run_id": plan.run_id,
        "engine": plan.engine,
        "input": plan.input_uri,
        "output": plan.output_uri,
        "model": {
            "name": manifest.name,
            "sha256": manifest.model_sha256,
            "dir": str(manifest.root),
            "trained": manifest.trained,
            "classes": manifest.class_names,
            "note": manifest.data.get("note")
            if manifest.trained
            else "RANDOM WEIGHTS: this model is "
            "untrained; its detections only show that the pipeline works, they mean nothing",
        },
        "counts": {
            "inputs": n_inputs,
            "videos": n_videos,
            "units": n_units,
            "skipped": n_units - n_todo,
            "done": int(totals["done"]),
            "failed": int(totals["failed"]),
            "frames": int(totals.get("frames", 0)),
            "instances": int(totals["instances"]),
        },
        "failed_images": failed_paths(spark, plan.output, plan.run_id, 10)
        if totals["failed"]
        else [],  # the first 10 of this run (errors/ has them all)
        "failed_types": failure_types(spark, plan.output, plan.run_id) if totals["failed"] else {},
        "partitions": partitions,
        "wall_seconds": round(elapsed, 3),
        "images_per_second": round(processed / elapsed, 3) if processed else 0.0,
        "frames_per_second": round(totals.get("frames", 0) / elapsed, 3) if totals.get("frames") else 0.0,
        "stage_seconds": {name.removesuffix("_s"): round(totals[name], 3) for name in TIMING_FIELDS},
        "runtime": {
            "precision": settings.precision,
            "threads": settings.threads,
            "streams": settings.streams,
            "pin_cores": settings.pin_cores,
        },
        "config": asdict(plan.config),
        "table": counts_after_run(
            spark,
            plan.output,
            manifest.model_sha256,
            plan.run_id,  # current rows
            {"detections": int(totals["done"]), "errors": int(totals["failed"])},
            one_record_per_key=not n_videos,
            new_output=new_output,
            rows_before=rows_before,
            files_now=tables_after,
        ),
    }


LOCAL_REPORT_MAX_RECORDS = 50_000  # outputs up to this many records: the report's rows read on the driver (pyarrow,
# ~1 KB each, faster there than Spark's jobs); beyond: gathered by Spark


def render_report(spark: SparkSession, output: Location, summary: dict) -> str | None:
    """output.overlays: overlays and report.html (pipelines.report.render) for a local output; the report's path.
    The rows it draws and counts are read on the driver for a small output (summary's `table`: its records), else
    gathered by Spark, so that the driver holds the rows it draws, not a key per image."""
    from pipelines.report.render import render
    from pipelines.report.tables import OutputError

    try:
        return str(
            render(output.uri, spark=None if sum(summary["table"].values()) <= LOCAL_REPORT_MAX_RECORDS else spark)
        )
    except OutputError as err:  # not a local output: the job's results stand, the report is for later
        log.warning("no report: %s (python -m pipelines.report.render --output DIR draws it)", err)
        return None


def bytes_fetcher(plan: JobPlan):
    """What the executors call to read an image's bytes by path, or None where Spark ships them (`content`)."""
    if plan.reader != "spark":
        return _azure_fetcher(plan.credentials)
    return src.read_local_file if src.reads_on_executors(plan.input_uri) else None


def _azure_fetcher(credentials):
    """One AzureBlobStore per task (it travels with the task function; only the credentials are pickled): its SDK
    client, made on the executor at the first read, serves every image of the task."""
    from pipelines.io.azure_storage import AzureBlobStore

    return AzureBlobStore(credentials).read
