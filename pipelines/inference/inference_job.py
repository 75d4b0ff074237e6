"""The batch-inference job as a recipe: config -> read -> transform -> write, for every model family.

`run(spark, config, family)` is what `jobs/infer_yolact.py`, `jobs/infer_detector.py`, the Databricks notebook and
the sweeps call. The family picks the executor-side postprocess; the engine (pipelines.inference.engine) how the
images become result rows; everything else is shared. A run reads as list -> lock -> plan -> waves -> finish:
planning in job_plan (pure Python, before any JVM), resume (what is left to do), waves (index, run, commit),
job_summary (summary.json and the report).
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from dataclasses import replace

from pyspark.sql import SparkSession

from pipelines.errors import RunFailed
from pipelines.inference import image_sources as src
from pipelines.inference.engine import Engine
from pipelines.inference.job_plan import JobPlan, plan_job, runtime_settings
from pipelines.inference.job_summary import make_summary, render_report
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.inference.progress import say
from pipelines.inference.resume import OutputTables, RunCounts, plan_work
from pipelines.inference.waves import infer, no_totals, write_empty_tables
from pipelines.io.azure_credentials import AzureCredentials
from pipelines.io.run_lock import HeldLock, LockSettings, RunLock
from pipelines.job_config import JobConfig
from pipelines.results.coco_results import write_coco_results
from pipelines.results.done_index import table_file_names, update_after_run
from pipelines.results.results_writer import holds_tables, write_summary
from pipelines.spark.session_kind import hadoop_files, session_kind
from pipelines.spark.session_settings import planning_settings, restore_session_settings, set_session_settings

log = logging.getLogger(__name__)


class JobFailed(RunFailed):
    """The job ran but its outcome is not acceptable (e.g. too many errors); the summary was written."""


def run(
    spark: SparkSession,
    config: JobConfig | dict,
    family: str = "yolact",
    azure_credentials: AzureCredentials | None = None,
    engine: Engine | None = None,
) -> dict:
    """Run the job for a `family` model; return the summary (also written to <output>/summary.json).
    `azure_credentials` (e.g. from a Databricks secret scope) replace the environment's; `engine`: the backend the
    config's inference.engine names (pipelines.job_cli.choose_engine), None for the native engine. See run_plan."""
    return run_plan(spark, plan_job(config, family, azure_credentials, engine))


def run_plan(spark: SparkSession, plan: JobPlan) -> dict:
    """Run a planned job. Holds the output's lock (pipelines.io.run_lock) from after the listing to the end; raises
    LockHeld when another run holds it, JobFailed when the errors exceed run.max_error_fraction."""
    prepare_session(spark, plan)
    say(f"run {plan.run_id}: listing {plan.input_uri}")
    with start_workers(spark, plan):
        return list_and_infer(spark, plan)


def prepare_session(spark: SparkSession, plan: JobPlan) -> None:
    """Before any work: the stores and the workers' Python checked for this kind of session (classic or Spark
    Connect: how the run reaches Spark beyond DataFrames), the library shipped."""
    kind = session_kind(spark)
    kind.check_stores(plan.input_uri, plan.output.uri)
    kind.ship_library()
    kind.check_workers(plan.engine.worker_modules)


def list_and_infer(spark: SparkSession, plan: JobPlan) -> dict:
    """run_plan's work: list -> lock -> plan -> waves -> finish."""
    found = list_input(spark, plan)  # before the lock: a missing input leaves no output directory behind
    lock = hold_output(spark, plan)
    try:
        summary, _, totals = infer_listing(spark, plan, found, lock)
        return finish(spark, plan, summary, totals)
    finally:
        lock.release()


def hold_output(spark: SparkSession, plan: JobPlan) -> RunLock:
    """The output's run lock for this run (LockHeld when a live run has it). Breaking the lock of a dead Connect
    client also interrupts what its session still runs on the server, before this run plans its work."""
    run_cfg, kind = plan.config.run, session_kind(spark)
    lock = RunLock.acquire(
        plan.output,
        plan.run_id,
        LockSettings(run_cfg.lock_stale_after_s, run_cfg.lock_heartbeat_s, run_cfg.break_lock),
        hadoop_files=lambda uri: hadoop_files(spark, uri),
        session=kind.session_id,
    )
    if lock.broke is not None and lock.broke.session is not None:
        kind.end_session(lock.broke.session)
    return lock


def infer_listing(
    spark: SparkSession, plan: JobPlan, found: src.ImageListing, lock: HeldLock
) -> tuple[dict, RunCounts, dict]:
    """What the run does with a listing while it holds `lock`: plan -> waves -> record (the batch job's whole
    listing, or a stream's micro-batch), all under the job's session settings (the record's queries too: with the
    session's own, adaptive execution ran each of their query stages as a job). Returns the run's summary (not
    written), its counts and the waves' totals."""
    restore: dict[str, str | None] = {}
    try:
        set_session_settings(spark, planning_settings(plan.config), restore)
        tables = OutputTables.at_start(spark, plan.output)  # under the lock: no other run writes to it now
        work = plan_work(spark, plan, found, tables, restore)
        settings = runtime_settings(spark, plan.config.inference)
        totals = no_totals()
        if work.counts.todo:
            totals = infer(spark, plan, work, settings, lock)
        elif tables.new:  # nothing listed: the tables exist all the same, empty
            write_empty_tables(spark, plan)
        work.listing.unpersist()
        work.units.unpersist()
        lock.ensure_held()
        return record_run(spark, plan, settings, work.counts, totals, tables), work.counts, totals
    finally:
        restore_session_settings(spark, restore)


def list_input(spark: SparkSession, plan: JobPlan) -> src.ImageListing:
    """The input's files of the listed extensions (the output's own files left out where it lies under the input)."""
    inputs = plan.config.input
    found = src.find_images(
        spark,
        plan.input_uri,
        inputs.listed_extensions,
        inputs.recursive,
        plan.reader,
        plan.credentials,
        plan.output.uri,
    )
    if found.excluded:
        say(f"the output lies under the input: its files ({found.excluded}...) are not inputs")
    return found


def finish(spark: SparkSession, plan: JobPlan, summary: dict, totals: dict) -> dict:
    """The run's end, under its lock: summary.json and the report where the config asks for it; JobFailed when
    more images failed than run.max_error_fraction allows."""
    write_summary(plan.output, summary)
    if plan.config.output.overlays:
        summary["report"] = render_report(spark, plan.output, summary)
    check_error_budget(plan, totals)
    return summary


def record_run(
    spark: SparkSession,
    plan: JobPlan,
    settings: RuntimeSettings,
    counts: RunCounts,
    totals: dict,
    tables: OutputTables,
) -> dict:
    """After the waves, under the lock: the resume index and COCO results updated; the run's summary (not written)."""
    tables = replace(tables, files_after=table_file_names(plan.output))
    update_after_run(spark, plan.output, tables.files_after)  # the resume index, when the tables outgrew it
    if plan.config.output.coco_results:
        write_coco_results(spark, plan.output)
    return make_summary(spark, plan, settings, counts, totals, tables)


def check_error_budget(plan: JobPlan, totals: dict) -> None:
    """JobFailed when the run's failed result rows exceed run.max_error_fraction of those it processed."""
    processed = totals["done"] + totals["failed"]
    max_fraction = plan.config.run.max_error_fraction
    if processed and totals["failed"] / processed > max_fraction:
        raise JobFailed(
            f"{int(totals['failed'])} of {processed} images failed (more than "
            f"run.max_error_fraction {max_fraction}): see {plan.output_uri}/errors and summary.json; "
            f"raise run.max_error_fraction (1.0: never fail on errors) if that many are expected"
        )


def start_workers(spark: SparkSession, plan: JobPlan) -> AbstractContextManager:
    """The engine's executors started while the driver lists the input (executor_warmup), when the run will infer
    whatever it lists: a new output, or `run.force`. Not on a resume, which may find nothing new: there the
    workers' start would compete with the planning for the cores."""
    if holds_tables(spark, plan.output) and not plan.config.run.force:
        return contextlib.nullcontext()
    return plan.engine.start_workers(spark, plan.run_id)
