"""The streaming job: images processed as they land (`--stream`, `--available-now`).

A Structured Streaming query over the input location whose micro-batches are listings (path, size,
modification_time, the batch listing's spelling) run by the batch job's own code (inference_job.infer_listing):
less the output's done keys (a re-delivered micro-batch finds its images done and writes nothing), in waves, with the
same writers and commits, the summary's counts accumulated over the micro-batches in summary.json. The file source
never reads a file's content here (only path, length and modificationTime are selected); videos are read by path.

The query's checkpoint is `<output>/_sparkseg_stream/checkpoint`, with the input and model it was made for beside it
(a checkpoint from another input or model is refused at start, exit 2). The stream holds the output's run lock for
its lifetime, so a batch run on the same output is refused (exit 4), and the other way round. SIGTERM or Ctrl-C ends
the query once the micro-batch in progress has committed (exit 0); a second signal stops at once.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Protocol

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import DataStreamReader, StreamingQuery

from pipelines.errors import RunFailed, SparkSegError, UsageError
from pipelines.inference import image_sources as src
from pipelines.inference.engine import Engine
from pipelines.inference.image_content import extension_glob
from pipelines.inference.inference_job import hold_output, infer_listing, plan_job, prepare_session, start_workers
from pipelines.inference.job_plan import JobPlan
from pipelines.inference.progress import say
from pipelines.io.azure_credentials import AzureCredentials
from pipelines.io.run_lock import HeldLock, LockWatch
from pipelines.io.storage import Location, spark_read_path, to_spark_uri
from pipelines.job_config import JobConfig, StreamSettings
from pipelines.results.results_writer import write_summary
from pipelines.spark.session_kind import session_kind
from pipelines.spark.session_settings import (
    file_stream_settings,
    planning_settings,
    restore_session_settings,
    set_session_settings,
)
from pipelines.spark.stop_signals import stop_deferred_to

STREAM_DIR = "_sparkseg_stream"  # hidden from Spark's listings (a leading underscore), like the lock
BINARY_FILE_SCHEMA = T.StructType(  # the binaryFile source's own schema (a stream must be given one)
    [
        T.StructField("path", T.StringType(), False),
        T.StructField("modificationTime", T.TimestampType(), False),
        T.StructField("length", T.LongType(), False),
        T.StructField("content", T.BinaryType(), True),
    ]
)
SUMMED_COUNTS = ("inputs", "videos", "units", "skipped", "done", "failed", "frames", "instances")
MAX_FAILED_LISTED = 10  # summary.json's failed_images, as a batch run's


class StopRequested(SparkSegError):
    """A micro-batch that began after SIGTERM or Ctrl-C: not run (nor committed: the next start runs it)."""

    exit_code = 0


class FileSource:
    """Spark's file source (binaryFile): every Spark, any Hadoop URI."""

    format = "binaryFile"
    prefix = ""  # of the bounds' option names

    def reader(self, spark: SparkSession, extensions: list[str], recursive: bool, cfg: StreamSettings):
        options = {
            "recursiveFileLookup": str(bool(recursive)).lower(),
            "pathGlobFilter": extension_glob(extensions),  # the batch listing's rule: the extensions, any case
            **self.own_options(),
        }
        if cfg.max_files_per_trigger:
            options[f"{self.prefix}maxFilesPerTrigger"] = str(cfg.max_files_per_trigger)
        if cfg.max_bytes_per_trigger:
            options[f"{self.prefix}maxBytesPerTrigger"] = str(cfg.max_bytes_per_trigger)
        return spark.readStream.format(self.format).schema(BINARY_FILE_SCHEMA).options(**options)

    def own_options(self) -> dict[str, str]:
        return {}


class AutoLoaderSource(FileSource):
    """Databricks Auto Loader (`cloudFiles`): file notifications or incremental listing, Databricks only."""

    format = "cloudFiles"
    prefix = "cloudFiles."

    def own_options(self) -> dict[str, str]:
        return {"cloudFiles.format": "binaryFile"}


SOURCES = {"file": FileSource, "cloudFiles": AutoLoaderSource}  # stream.source -> its reader


def stream_dir(plan: JobPlan) -> Location:
    return plan.output / STREAM_DIR


def check_checkpoint(plan: JobPlan) -> None:
    """Before any JVM: a checkpoint under the output made for another input or model is refused (UsageError, exit 2)
    naming both; its files would list other images as done or skip this input's."""
    identity = stream_dir(plan) / "source.json"
    if not identity.exists():
        return
    recorded = json.loads(identity.read_bytes())
    wanted = {"input": plan.input_uri, "model_sha256": plan.manifest.model_sha256}
    if recorded != wanted:
        raise UsageError(
            f"{stream_dir(plan).uri}: this stream checkpoint is for input {recorded.get('input')} and model "
            f"{str(recorded.get('model_sha256'))[:12]}, not input {plan.input_uri} and model "
            f"{plan.manifest.model_sha256[:12]}: give the stream an --output of its own (or remove "
            f"{stream_dir(plan).uri} to start this input's stream from scratch)"
        )


def record_source(plan: JobPlan) -> None:
    """The input and model beside a new checkpoint (check_checkpoint reads them at every start)."""
    check_checkpoint(plan)  # again, under the lock: another stream may have started on this output since
    identity = stream_dir(plan) / "source.json"
    if not identity.exists():
        identity.write_bytes_atomic(
            json.dumps({"input": plan.input_uri, "model_sha256": plan.manifest.model_sha256}).encode()
        )


class StopFile:
    """A stop request that micro-batches run by a Spark Connect server see: the run's id in a file under the stream's
    directory (the client sets it on SIGTERM or Ctrl-C; a later run's id differs, so it is never removed)."""

    def __init__(self, plan: JobPlan) -> None:
        self.location, self.run_id = stream_dir(plan) / "stop", plan.run_id

    def set(self) -> None:
        self.location.write_bytes_atomic(self.run_id.encode())

    def is_set(self) -> bool:
        return self.location.exists() and self.location.read_bytes().decode() == self.run_id


class Stop(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...


class MicroBatches:
    """The query's foreachBatch function: each micro-batch through infer_listing under the stream's lock, the
    summary accumulated and written. On a Spark Connect session it runs pickled in a Python process of the server
    (its `lock` a LockWatch, its `stop` a StopFile), on a classic one in this process."""

    def __init__(self, plan: JobPlan, lock: HeldLock, stop: Stop, prefix: str | None) -> None:
        self.plan, self.lock, self.stop, self.prefix = plan, lock, stop, prefix
        self.summary: dict | None = None
        self.batches = 0
        self.failure: BaseException | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self.stop.is_set():
            raise StopRequested(f"micro-batch {batch_id} not run: the stream is stopping")
        try:
            self.run(batch, batch_id)
        except BaseException as error:
            self.failure = error  # the query ends with a Java error; the main thread raises this one
            raise

    def run(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        plan = replace(self.plan, run_id=f"{self.plan.run_id}-b{batch_id:05d}", started=started)
        spark = batch.sparkSession  # the query's session (foreachBatch's frames belong to it)
        listing = src.ImageListing(src.without_prefix(batch, self.prefix))
        summary, counts, totals = infer_listing(spark, plan, listing, self.lock)
        self.batches += 1
        self.summary = accumulated(self.summary, summary, self.plan, batch_id, self.batches)
        self.lock.ensure_held()
        write_summary(plan.output, self.summary)
        elapsed = max(time.time() - started, 1e-9)
        processed = int(totals["done"] + totals["failed"])
        frames = f", {int(totals['frames'])} video frames" if totals["frames"] else ""
        say(
            f"micro-batch {batch_id}: {counts.inputs} new files{frames}, {int(totals['done'])} done, "
            f"{int(totals['failed'])} failed, {counts.skipped} already done, {processed / elapsed:.2f} images/s; "
            f"{self.summary['counts']['done']} done since the stream started"
        )


def accumulated(before: dict | None, batch: dict, plan: JobPlan, batch_id: int, batches: int) -> dict:
    """The stream's summary: the latest micro-batch's, with its counts, stage seconds and failures summed over the
    micro-batches so far, the speed over the stream's wall time."""
    total = dict(batch)
    if before is not None:
        total["counts"] = {key: before["counts"][key] + batch["counts"][key] for key in SUMMED_COUNTS}
        total["stage_seconds"] = {
            key: round(before["stage_seconds"][key] + value, 3) for key, value in batch["stage_seconds"].items()
        }
        total["failed_images"] = (before["failed_images"] + batch["failed_images"])[:MAX_FAILED_LISTED]
        total["failed_types"] = dict(Counter(before["failed_types"]) + Counter(batch["failed_types"]))
    elapsed = time.time() - plan.started
    counts = total["counts"]
    processed = counts["done"] + counts["failed"]
    total.update(
        run_id=plan.run_id,
        wall_seconds=round(elapsed, 3),
        images_per_second=round(processed / elapsed, 3) if processed else 0.0,
        frames_per_second=round(counts["frames"] / elapsed, 3) if counts["frames"] else 0.0,
        stream={"batches": batches, "last_batch_id": batch_id, "checkpoint": stream_dir(plan).uri},
    )
    return total


def stream(
    spark: SparkSession,
    config: JobConfig | dict,
    family: str = "yolact",
    azure_credentials: AzureCredentials | None = None,
    engine: Engine | None = None,
) -> dict | None:
    """inference_job.run's streaming twin (notebooks, scheduled jobs): run the config's stream (stream.available_now
    for a run that stops once what is there is done); the summary over its micro-batches, None where it found
    nothing new."""
    return run_stream(spark, plan_job(config, family, azure_credentials, engine))


def run_stream(spark: SparkSession, plan: JobPlan, stop: threading.Event | None = None) -> dict | None:
    """Run the stream until `stop` is set (where the command line's signal handlers are set, a first Ctrl-C or
    SIGTERM sets it: stop_signals.stop_deferred_to), then end it once no micro-batch is in progress; with
    stream.available_now, until every file there at its start is done. Returns the summary
    accumulated over its micro-batches, None where it ran none. Raises LockHeld when another run holds the
    output."""
    if plan.reader != "spark":
        raise UsageError(
            f"{plan.input_uri}: a stream reads its input with Spark's file source; give the container as an "
            "abfss:// URI (hadoop-azure on the cluster), or run batch jobs on a schedule"
        )
    check_checkpoint(plan)
    prepare_session(spark, plan)
    stop = stop or threading.Event()
    lock = hold_output(spark, plan)
    restore: dict[str, str | None] = {}
    try:
        record_source(plan)
        prefix = src.output_prefix(spark, plan.input_uri, plan.output_uri)
        here = session_kind(spark).streams_here
        if here:
            batches = MicroBatches(plan, lock, stop, prefix)
        else:  # the server runs the micro-batches: what they check travels with them
            batches = MicroBatches(plan, LockWatch(plan.output, plan.run_id, lock.settings), StopFile(plan), prefix)
        # the query's session is a copy of this one made at its start: the job's settings first (no adaptive
        # execution, which a streaming query would turn off with a warning)
        parallelism = session_kind(spark).default_parallelism()
        settings = {**planning_settings(plan.config), **file_stream_settings(plan.config, parallelism)}
        set_session_settings(spark, settings, restore)
        with start_workers(spark, plan), stop_deferred_to(stop.set):  # the first worker starts with the query
            query = start_query(spark, plan, batches)
            say(f"stream {plan.run_id}: watching {plan.input_uri} ({describe_trigger(plan.config.stream)})")
            wait_for_end(query, stop, batches)
        return batches.summary if here else written_summary(plan)
    finally:
        lock.release()
        restore_session_settings(spark, restore)


def describe_trigger(cfg: StreamSettings) -> str:
    return "available now: what is there, then stop" if cfg.available_now else f"every {cfg.trigger_interval}"


def start_query(spark: SparkSession, plan: JobPlan, batches: MicroBatches) -> StreamingQuery:
    """The query: the input's new files of the listed extensions as (path, size, modification_time), each
    micro-batch to `batches`."""
    cfg, inputs = plan.config.stream, plan.config.input
    reader: DataStreamReader = SOURCES[cfg.source]().reader(spark, inputs.listed_extensions, inputs.recursive, cfg)
    try:
        files = reader.load(spark_read_path(plan.input_uri))
    except Exception as err:  # AnalysisException, Py4JJavaError: a missing path, an unknown scheme or source
        raise UsageError(f"{plan.input_uri}: cannot stream this input: {str(err).splitlines()[0]}") from None
    listing = files.select("path", F.col("length").alias("size"), F.col("modificationTime").alias("modification_time"))
    writer = listing.writeStream.foreachBatch(batches).option(
        "checkpointLocation", to_spark_uri((stream_dir(plan) / "checkpoint").uri)
    )
    if cfg.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{round(cfg.interval_s() * 1000)} milliseconds")
    return writer.queryName(f"sparkseg-{plan.run_id}").start()


def wait_for_end(query: StreamingQuery, stop: threading.Event, batches: MicroBatches) -> None:
    """Until the query ends: by itself (available now), or on a stop request once no micro-batch is in progress
    (one that begins after the request is refused: StopRequested). A micro-batch's error is raised as itself (from a
    Spark Connect server's worker: as the same class, rebuilt from its message)."""
    told = -1
    remote = isinstance(batches.stop, StopFile)
    try:
        while not query.awaitTermination(1):  # a timeout: Python runs the signal handlers between the calls
            if stop.is_set():
                if remote and not batches.stop.is_set():
                    batches.stop.set()
                if not query.status["isTriggerActive"]:
                    query.stop()
                    break
            told = tell_progress(query.lastProgress, told, batches.plan if remote else None)
        tell_progress(query.lastProgress, told, batches.plan if remote else None)  # the last one (available now)
    except StreamingQueryException as error:
        if remote:
            raised = remote_error(str(error))
            if isinstance(raised, StopRequested):
                return
            raise raised from None
        if batches.failure is None:
            raise
        if not isinstance(batches.failure, StopRequested):
            raise batches.failure from None
    if batches.failure is not None and not isinstance(batches.failure, StopRequested):
        raise batches.failure


# a sparkseg error in a Python traceback: pipelines.io.run_lock.LockLost: <message>
_REMOTE_ERROR = re.compile(r"^\s*(pipelines(?:\.\w+)+)\.(\w+): (.*)$", re.MULTILINE)


def remote_error(text: str) -> Exception:
    """The sparkseg error a micro-batch raised in a Spark Connect server's worker, as its class again (the exit code
    follows it); any other error as a RunFailed with the first line of Spark's message."""
    for module, name, message in _REMOTE_ERROR.findall(text):
        try:
            kind = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(kind, type) and issubclass(kind, SparkSegError):
            return kind(message)
    return RunFailed(f"the stream's micro-batch failed on the Spark Connect server: {text.strip().splitlines()[0]}")


def written_summary(plan: JobPlan) -> dict | None:
    """This run's summary.json (a stream's micro-batches on a Spark Connect server write it there), None before its
    first micro-batch."""
    path = plan.output / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_bytes())
    return summary if summary.get("run_id") == plan.run_id else None


def tell_progress(progress: dict | None, told: int, remote: JobPlan | None = None) -> int:
    """One line per micro-batch: the backlog where the source reports it (Auto Loader's numFilesOutstanding; Spark's
    file source does not), and where a Spark Connect server ran it (`remote`: this run's plan), the counts its
    summary has so far (the micro-batch's own line is the server's). Returns the last micro-batch told about."""
    if not progress or progress["batchId"] <= told:
        return told
    metrics = (progress.get("sources") or [{}])[0].get("metrics") or {}
    if "numFilesOutstanding" in metrics:
        say(f"micro-batch {progress['batchId']}: backlog {metrics['numFilesOutstanding']} files")
    summary = written_summary(remote) if remote is not None else None
    if summary is not None:
        counts = summary["counts"]
        say(
            f"micro-batch {summary['stream']['last_batch_id']}: {counts['done']} done, {counts['failed']} failed, "
            f"{counts['skipped']} already done since the stream started"
        )
    return progress["batchId"]
