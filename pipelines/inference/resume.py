"""Resume: what a run has to do. The listing counted and cut into units of work (images, video segments), less the
units the output already holds for this model (done_index.done_keys), unless run.force."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.inference import image_sources as src
from pipelines.inference import video_sources as videos
from pipelines.inference.job_plan import JobPlan, bytes_fetcher, tasks_per_wave
from pipelines.inference.model_manifest import ModelManifest
from pipelines.inference.progress import say
from pipelines.io.storage import Location
from pipelines.job_config import VideoSettings
from pipelines.results.done_index import done_keys, table_file_names
from pipelines.results.results_writer import holds_tables, read_summary, remove_uncommitted_writes
from pipelines.results.table_index import rows_before_run
from pipelines.spark.session_kind import session_kind
from pipelines.spark.session_settings import session_settings_for, set_session_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputTables:
    """The output's tables as the run found them, under its lock: `new`, none yet; `files_before`, their files
    (done_index.table_file_names) and `rows_before`, their records where known without a pass
    (table_index.rows_before_run), both None on a new output; `files_after`, their files once the run is done."""

    new: bool
    files_before: dict[str, dict[str, str]] | None
    rows_before: dict[str, int] | None
    files_after: dict[str, dict[str, str]] | None = None

    @classmethod
    def at_start(cls, spark: SparkSession, output: Location) -> OutputTables:
        """The tables at the run's start, after removing what a killed run left uncommitted (hold the lock)."""
        new = not holds_tables(spark, output)
        for leftover in remove_uncommitted_writes(spark, output):
            log.warning("removed %s: the uncommitted files of an earlier run that was killed", leftover)
        files = None if new else table_file_names(output)
        return cls(new, files, None if new else rows_before_run(output, files))


@dataclass(frozen=True)
class RunCounts:
    """What the run counted before its waves: `inputs` files listed, `videos` of them videos, `units` images and
    video segments, `todo` units not done yet for this model (the others are `skipped`), `partitions` tasks per
    wave."""

    inputs: int
    videos: int
    units: int
    todo: int
    partitions: int

    @property
    def skipped(self) -> int:
        return self.units - self.todo


class Work(NamedTuple):
    """The run's work: the persisted `listing` and its `units` (unpersist both when the run is done), the `todo`
    among them, their `counts`, and the to-do's rows per partition where the to-do is the listing itself
    (index_todo), else None."""

    listing: DataFrame
    units: DataFrame
    todo: DataFrame
    counts: RunCounts
    rows_per_partition: dict[int, int] | None


def plan_work(
    spark: SparkSession,
    plan: JobPlan,
    found: src.ImageListing,
    tables: OutputTables,
    restore: dict[str, str | None],
) -> Work:
    """The listing counted (one pass), cut into units and less the units done: the run's Work. Sets the session's
    settings for a job of that size; `restore` gains the values they replace."""
    config = plan.config
    run_cfg, video = config.run, config.input.video

    def sized_to(frame: DataFrame) -> InputCounts:
        """The count of `frame`, and the session's shuffles sized to it from the next query on (the listing's
        zero-byte files are joined in by one)."""
        counts = count_inputs(frame, video)
        set_session_settings(spark, session_settings_for(counts.files, config), restore)
        return counts

    # on disk only: each wave reads it back (index_todo), and MEMORY_AND_DISK would pull whole blocks of a
    # 10^7-row listing into a 1 g driver's heap (see index_todo)
    listing, counts = src.whole_listing(found, sized_to, StorageLevel.DISK_ONLY)
    n_inputs, n_videos = counts.files, counts.videos
    units = work_units(spark, plan, listing, video, n_videos)
    n_units = units.count() if n_videos else n_inputs
    rows_before = tables.rows_before
    todo = todo_listing(
        spark,
        units,
        plan.output,
        plan.manifest,
        run_cfg.force,
        run_cfg.broadcast_max_rows,
        sum(rows_before.values()) if rows_before else None,
        tables.files_before,
        retries=run_cfg.retries,
    )
    n_todo = n_units if todo is units else todo.count()  # the units themselves: nothing done before, or force
    partitions = tasks_per_wave(
        config.inference, session_kind(spark).default_parallelism(), min(run_cfg.commit_every or n_todo, n_todo)
    )
    own_rows = counts.rows_per_partition if todo is units and not n_videos else None  # the listing's
    work = Work(listing, units, todo, RunCounts(n_inputs, n_videos, n_units, n_todo, partitions), own_rows)
    tell_what_to_do(plan, found, work.counts)
    return work


def tell_what_to_do(plan: JobPlan, found: src.ImageListing, counts: RunCounts) -> None:
    """The planning's lines: what was listed and what is left to do; what the listing left out; a warning when the
    images already done were written with other output settings."""
    inputs = plan.config.input
    if counts.videos:
        say(
            f"{counts.inputs} files ({counts.videos} videos in {counts.units - counts.inputs + counts.videos} "
            f"segments), {counts.todo} images and segments to do ({counts.skipped} already done for this model)"
        )
    else:
        say(f"{counts.inputs} images, {counts.todo} to do ({counts.inputs - counts.todo} already done for this model)")
    if counts.todo < counts.units and not plan.config.run.force:
        warn_if_output_settings_changed(plan, read_summary(plan.output), counts.skipped)
    if not counts.inputs:
        say(src.nothing_listed(plan.input_uri, inputs.listed_extensions, inputs.recursive, found.excluded))
    elif counts.inputs <= src.DRIVER_LISTING_MAX_FILES:  # a second walk of a listing the driver could hold anyway
        hidden = src.underscored_note(plan.input_uri, inputs.listed_extensions, inputs.recursive, found.excluded)
        if hidden:
            log.warning(hidden)


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
    if not plan.engine.takes_videos:
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
