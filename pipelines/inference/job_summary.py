"""Summary: what a run did, as summary.json holds it (counts, speed, per-stage seconds, the runtime and the config,
the output's records), and the report drawn from its output."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

from pyspark.sql import SparkSession

from pipelines.inference.job_plan import JobPlan
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.inference.resume import OutputTables, RunCounts
from pipelines.io.storage import Location
from pipelines.report.render import render
from pipelines.report.tables import OutputError
from pipelines.results.results_writer import TIMING_FIELDS, failed_paths, failure_types
from pipelines.results.table_index import counts_after_run

log = logging.getLogger(__name__)


def make_summary(
    spark: SparkSession,
    plan: JobPlan,
    settings: RuntimeSettings,
    counts: RunCounts,
    totals: dict,
    tables: OutputTables,
) -> dict:
    """The run's summary, its wall time counted from the plan's start to now. `counts`: what the run counted before
    its waves; `totals`: the waves' aggregates, `done`/`failed` result rows (images and video frames), `frames` of
    `done`; `tables`: the output's tables at the run's start and end (table_index.counts_after_run)."""
    elapsed = time.time() - plan.started
    manifest = plan.manifest
    processed = totals["done"] + totals["failed"]
    return {
        "run_id": plan.run_id,
        "engine": plan.engine.name,
        "input": plan.input_uri,
        "output": plan.output_uri,
        "model": {
            "name": manifest.name,
            "sha256": manifest.model_sha256,
            "dir": str(manifest.root),
            "given": plan.config.model.dir,  # as given: the directory, or the models:/ URI it was downloaded from
            "trained": manifest.trained,
            "classes": manifest.class_names,
            "note": manifest.data.get("note")
            if manifest.trained
            else "RANDOM WEIGHTS: this model is "
            "untrained; its detections only show that the pipeline works, they mean nothing",
        },
        "counts": {
            "inputs": counts.inputs,
            "videos": counts.videos,
            "units": counts.units,
            "skipped": counts.skipped,
            "done": int(totals["done"]),
            "failed": int(totals["failed"]),
            "frames": int(totals.get("frames", 0)),
            "instances": int(totals["instances"]),
        },
        "failed_images": failed_paths(spark, plan.output, plan.run_id, 10)
        if totals["failed"]
        else [],  # the first 10 of this run (errors/ has them all)
        "failed_types": failure_types(spark, plan.output, plan.run_id) if totals["failed"] else {},
        "partitions": counts.partitions,
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
            one_record_per_key=not counts.videos,
            new_output=tables.new,
            rows_before=tables.rows_before,
            files_now=tables.files_after,
        ),
    }


# outputs up to this many records: the report's rows read on the driver (pyarrow, faster there than Spark's jobs for
# rows of about a KB); beyond: gathered by Spark
LOCAL_REPORT_MAX_RECORDS = 50_000


def render_report(spark: SparkSession, output: Location, summary: dict) -> str | None:
    """output.overlays: overlays and report.html (pipelines.report.render) for a local output; the report's path.
    The rows it draws and counts are read on the driver for a small output (summary's `table`: its records), else
    gathered by Spark, so that the driver holds the rows it draws, not a key per image."""
    try:
        return str(
            render(output.uri, spark=None if sum(summary["table"].values()) <= LOCAL_REPORT_MAX_RECORDS else spark)
        )
    except OutputError as err:  # not a local output: the job's results stand, the report is for later
        log.warning("no report: %s (python -m pipelines.report.render --output DIR draws it)", err)
        return None
