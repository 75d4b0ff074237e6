"""Spark beyond the DataFrame API: one object per kind of session, picked once from the session (session_kind).

- ClassicSession: a JVM in or beside this process (local mode, spark-submit, a classic Databricks cluster), reached
  through py4j: the library and the model shipped with addPyFile / addArchive, images counted by an accumulator as
  the tasks report them, job groups, the Hadoop FileSystem on the driver for every scheme Spark reads.
- ConnectSession: a client of a Spark Connect server (`SparkSession.builder.remote(...)`, Databricks serverless and
  standard access mode): no JVM here. The library and the model are session artifacts (addArtifacts), images are
  counted as each wave commits and the running tasks come from the server's progress reports, jobs are tagged
  (addTag / interruptTag), and the driver reaches local (or mounted) paths itself and az:// through the Azure SDK;
  hdfs:// and abfss:// outputs need the Hadoop FileSystem, which a Connect client has not: a UsageError before any
  work (check_stores).

Nothing else in the project touches sparkContext, py4j or accumulators (tests/test_import_structure.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pipelines.errors import UsageError
from pipelines.io.uris import store_of
from pipelines.spark import connect_ops
from pipelines.spark.driver_files import HadoopFiles, LocalFiles
from pipelines.spark.executor_loss import ExecutorLossWatch, NoLossWatch
from pipelines.spark.hash_partitioning import partition_keys
from pipelines.spark.spark_session import is_connect, ship_library, ship_once, staged_library_archive

log = logging.getLogger(__name__)

_KINDS: dict[int, tuple[SparkSession, Any]] = {}
_KINDS_LOCK = threading.Lock()


def session_kind(spark: SparkSession) -> ClassicSession | ConnectSession:
    """The kind object of `spark`, made once per session (it holds what it learns: shipped files, parallelism)."""
    with _KINDS_LOCK:
        known = _KINDS.get(id(spark))
        if known is None or known[0] is not spark:
            known = (spark, ConnectSession(spark) if is_connect(spark) else ClassicSession(spark))
            _KINDS[id(spark)] = known
        return known[1]


class AccumulatorCount:
    """Images counted by the executors (a Spark accumulator): `value` on the driver moves as tasks end."""

    def __init__(self, accumulator) -> None:
        self.executor_side = accumulator  # what the executor-side function adds to

    @property
    def value(self) -> int:
        return self.executor_side.value

    def committed(self, rows: int) -> None:
        """Nothing: the executors counted these rows already."""


class CommitCount:
    """Images counted on the driver as each wave commits (a Connect session has no accumulators)."""

    executor_side = None

    def __init__(self) -> None:
        self.value = 0

    def committed(self, rows: int) -> None:
        self.value += rows


class ClassicSession:
    """A session with a JVM in reach (see the module docstring)."""

    name = "classic"
    # foreachBatch runs the job's micro-batch function in this process (the stream's lock, its stop event)
    streams_here = True

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.context = spark.sparkContext

    def check_stores(self, *uris: str) -> None:
        """Every store works on a classic session."""

    @property
    def session_id(self) -> None:
        """None: a classic driver's jobs run in its own JVM and end with it (nothing to record in the lock)."""
        return None

    def end_session(self, session_id: str) -> int:
        """Nothing (0 operations): only Connect sessions outlive their client."""
        return 0

    def check_workers(self, modules: tuple[str, ...]) -> None:
        """Nothing: a classic job's executors run the env it ships or the driver's own (local mode)."""

    def ship_library(self) -> None:
        ship_library(self.spark)

    def ship_package(self, package: Path) -> None:
        """Another package directory (model_export/) importable on every executor, once per SparkContext."""
        add = lambda: self.context.addPyFile(str(staged_library_archive(package)))  # noqa: E731
        ship_once(self.context, package.name, add)

    def driver_resources(self, name: str) -> list[str] | None:
        """The addresses of the driver's resource `name` (e.g. its GPUs); None where the session has none."""
        found = self.context.resources.get(name)
        return None if found is None else list(found.addresses)

    def ship_archive(self, archive: Path) -> None:
        """`archive` (a zip) unpacked on every executor as SparkFiles.get(archive.name), once per SparkContext."""
        ship_once(self.context, archive.stem, lambda: self.context.addArchive(str(archive)))

    def default_parallelism(self) -> int:
        return self.context.defaultParallelism

    def task_cpus(self) -> int:
        return int(self.context.getConf().get("spark.task.cpus", "1"))

    def progress_count(self) -> AccumulatorCount:
        return AccumulatorCount(self.context.accumulator(0))

    def running_tasks(self) -> int:
        """Tasks running now, from Spark's status store."""
        tracker = self.context.statusTracker()
        stages = (tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds())
        return sum(stage.numActiveTasks for stage in stages if stage is not None)

    def loss_watch(self) -> ExecutorLossWatch:
        """The executors lost from now on, from Spark's status store, and the log file with Spark's detail."""
        return ExecutorLossWatch(self.context)

    @contextlib.contextmanager
    def tagged(self, tag: str, description: str) -> Iterator[None]:
        """The jobs this thread starts in the block belong to job group `tag` (the UI shows `description`)."""
        self.context.setJobGroup(tag, description)
        yield

    def cancel(self, tag: str) -> None:
        """Cancel the running jobs of `tag` (only when there are: Spark warns on the console about none)."""
        tracker = self.context.statusTracker()
        jobs = (tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(tag))
        if any(job is not None and job.status == "RUNNING" for job in jobs):
            self.context.cancelJobGroup(tag)

    def detached(self, df: DataFrame) -> DataFrame:
        """`df` with a plan that no longer names the files it was read from (an RDD of its rows, all in the JVM)."""
        return DataFrame(self.spark._jsparkSession.createDataFrame(df._jdf.rdd(), df._jdf.schema()), self.spark)

    def indexed_files(self, source: DataFrame) -> int:
        """Files in `source`'s file index (a number from the JVM: no Spark job, no Python list)."""
        return len(source._jdf.inputFiles())

    def input_files(self, source: DataFrame) -> DataFrame:
        """DataFrame[value] of the URIs in `source`'s file index; the list stays in the JVM."""
        jvm = self.context._jvm
        files = source._jdf.inputFiles()  # a JVM String[], wrapped as the Seq createDataset takes, without a copy
        if jvm.scala.util.Properties.versionNumberString().startswith("2.12"):  # Spark 3.5 (the BigDL env)
            files = jvm.scala.Predef.genericWrapArray(files)
        else:
            files = jvm.scala.collection.immutable.ArraySeq.unsafeWrapArray(files)
        encoder = jvm.org.apache.spark.sql.Encoders.STRING()
        return DataFrame(self.spark._jsparkSession.createDataset(files, encoder).toDF(), self.spark)

    def parallelized(self, rows: list[tuple], schema: str, partitions: int) -> DataFrame:
        """A DataFrame of driver-side `rows` in `partitions` partitions, without a shuffle."""
        return self.spark.createDataFrame(self.context.parallelize(rows, max(1, partitions)), schema)

    def fanned_out(self, seed: Any, top, part, schema, partitions: int) -> DataFrame:
        """Rows of `schema`: one task runs `top(seed)` (entries), the entries dealt round-robin over `partitions`
        (RDD.repartition moves Python's pickled batches, not entries: a few hundred would all land in one task),
        then `part(entry)` (rows) in each."""
        entries = self.context.parallelize([seed], 1).flatMap(top)
        numbered = entries.mapPartitions(lambda rows: enumerate(rows))
        spread = numbered.partitionBy(partitions, lambda number: number % partitions).values()
        return self.spark.createDataFrame(spread.flatMap(part), schema)

    def hadoop_files(self, uri: str) -> HadoopFiles:
        """The driver's Hadoop FileSystem for `uri` (any scheme this Spark reads)."""
        return HadoopFiles(self.context, uri)


class RunningTasks:
    """A Connect progress handler: the tasks each running operation reports in flight."""

    def __init__(self) -> None:
        self.by_operation: dict[str, int] = {}

    def __call__(self, stages, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        key = operation_id or ""
        if done:
            self.by_operation.pop(key, None)
        else:
            self.by_operation[key] = inflight_tasks

    def count(self) -> int:
        return sum(list(self.by_operation.values()))


class ConnectSession:
    """A Spark Connect client session (see the module docstring)."""

    name = "connect"
    # foreachBatch runs the function pickled in a Python process of the server: the stream's lock and stop request
    # travel with it as what that process can check (stream_job.LockWatch, StopFile)
    streams_here = False

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._shipped: set[str] = set()
        self._parallelism: int | None = None
        self._running = RunningTasks()
        spark.registerProgressHandler(self._running)

    def check_stores(self, *uris: str) -> None:
        """A UsageError, before any work, for a URI whose driver-side operations need Hadoop's FileSystem."""
        for uri in uris:
            if store_of(uri) == "hadoop":
                raise UsageError(
                    f"{uri}: a Spark Connect session has no Hadoop FileSystem on the driver for the run's lock, "
                    "indexes and summary: use a local or mounted path (a Unity Catalog volume, /Volumes/...) or "
                    "az://container/path (the Azure SDK), or run on a classic session"
                )

    @property
    def session_id(self) -> str:
        return self.spark.session_id

    def end_session(self, session_id: str) -> int:
        """Interrupt and release another client's session on this server (connect_ops.end_session)."""
        return connect_ops.end_session(self.spark, session_id)

    def check_workers(self, modules: tuple[str, ...]) -> None:
        """A UsageError, before any work, when the server's Python workers cannot import `modules`."""
        connect_ops.check_workers(self.spark, modules)

    def _add_once(self, path: Path, **kind: bool) -> None:
        if path.name not in self._shipped:
            self.spark.addArtifacts(str(path), **kind)
            self._shipped.add(path.name)

    def ship_library(self) -> None:
        """`pipelines` (the package this client runs) as a session artifact on the server's Python workers."""
        self.ship_package(Path(__file__).resolve().parents[1])

    def ship_package(self, package: Path) -> None:
        self._add_once(staged_library_archive(package), pyfile=True)

    def driver_resources(self, name: str) -> list[str] | None:
        """Unknown to a client: the server's driver is not this process."""
        return None

    def ship_archive(self, archive: Path) -> None:
        """`archive` unpacked for the session's tasks as SparkFiles.get(archive.name)."""
        self._add_once(archive, archive=True)

    def default_parallelism(self) -> int:
        """spark.default.parallelism where set, else the partitions of a large range (Spark sizes it by the
        cluster's cores): a tiny job, once per session."""
        if self._parallelism is None:
            from pyspark.sql import functions as F

            given = self.spark.conf.get("spark.default.parallelism", None)
            if given:
                self._parallelism = int(given)
            else:
                ids = self.spark.range(0, 1 << 20).select(F.spark_partition_id().alias("p"))
                self._parallelism = int(ids.agg(F.max("p")).first()[0]) + 1
        return self._parallelism

    def task_cpus(self) -> int:
        return int(self.spark.conf.get("spark.task.cpus", "1") or 1)

    def progress_count(self) -> CommitCount:
        return CommitCount()

    def running_tasks(self) -> int:
        return self._running.count()

    def loss_watch(self) -> NoLossWatch:
        """Nothing: the server's executors and log are the server's."""
        return NoLossWatch()

    @contextlib.contextmanager
    def tagged(self, tag: str, description: str) -> Iterator[None]:
        """The operations this thread starts in the block carry tag `tag` (Connect's tags are per thread)."""
        self.spark.addTag(tag)
        try:
            yield
        finally:
            self.spark.removeTag(tag)

    def cancel(self, tag: str) -> None:
        self.spark.interruptTag(tag)

    def detached(self, df: DataFrame) -> DataFrame:
        """`df` cut from its plan (a local checkpoint: the server holds its rows)."""
        return df.localCheckpoint(eager=True)

    def indexed_files(self, source: DataFrame) -> int:
        return len(source.inputFiles())

    def input_files(self, source: DataFrame) -> DataFrame:
        """DataFrame[value] of the URIs in `source`'s file index (through this client: a list here)."""
        return self.spark.createDataFrame([(uri,) for uri in source.inputFiles()], "value string")

    def parallelized(self, rows: list[tuple], schema: str, partitions: int) -> DataFrame:
        return self.spark.createDataFrame(rows, schema).repartition(max(1, partitions))

    def fanned_out(self, seed: Any, top, part, schema, partitions: int) -> DataFrame:
        """ClassicSession.fanned_out through DataFrames: the entries travel pickled, each with a key that Spark's
        hash partitioning sends to the partition of its turn (partition_keys), so they are dealt round-robin."""
        keys, names = partition_keys(partitions), schema.fieldNames()

        def tops(batches):
            import pickle

            import pandas as pd

            for batch in batches:
                for value in batch["seed"]:
                    entries = [pickle.dumps(entry) for entry in top(value)]
                    turns = [keys[number % partitions] for number in range(len(entries))]
                    yield pd.DataFrame(
                        {"key": pd.Series(turns, dtype="int64"), "entry": pd.Series(entries, dtype=object)}
                    )

        def parts(batches):
            import pickle

            import pandas as pd

            for batch in batches:
                for entry in batch["entry"]:
                    rows = [tuple(row) for row in part(pickle.loads(entry))]
                    if rows:
                        yield pd.DataFrame(rows, columns=names)

        seeds = self.spark.createDataFrame([(str(seed),)], "seed string")
        entries = seeds.mapInPandas(tops, "key long, entry binary")
        return entries.repartition(partitions, "key").mapInPandas(parts, schema)

    def hadoop_files(self, uri: str) -> LocalFiles:
        self.check_stores(uri)
        return LocalFiles(uri)


def hadoop_files(spark: SparkSession, uri: str) -> HadoopFiles | LocalFiles:
    """Driver-side operations on `uri` for `spark`'s kind of session."""
    return session_kind(spark).hadoop_files(uri)


def qualify_root(spark: SparkSession, root: str) -> str:
    """The root as Spark lists files under it (hdfs:///d -> hdfs://nn:8020/d, rel/dir -> file:/cwd/rel/dir)."""
    return hadoop_files(spark, root).qualified()


def classic_context(spark: SparkSession | None = None, what: str = "this"):
    """The SparkContext behind a classic `spark` (None: the one this process runs or is launched with, started now
    where spark-submit launched it) for what only a JVM in reach can do (the bigdl engine's JVM library, the class
    archive's build); a UsageError on a Spark Connect session."""
    from pyspark import SparkContext

    if spark is not None and is_connect(spark):
        raise UsageError(f"{what} needs a classic Spark session (a JVM in reach), not a Spark Connect one")
    if spark is not None:
        return spark.sparkContext
    SparkContext._ensure_initialized()
    return SparkContext._active_spark_context


def classic_jvm(spark: SparkSession | None = None, what: str = "this"):
    """The py4j view of the JVM of classic_context (None for spark: the launcher's JVM, with or without a context)."""
    from pyspark import SparkContext

    if spark is None:
        SparkContext._ensure_initialized()
        return SparkContext._jvm
    return classic_context(spark, what)._jvm


def classic_gateway(spark: SparkSession, what: str = "this"):
    """The py4j gateway to the JVM this process started for a classic `spark` (its process: gateway.proc)."""
    return classic_context(spark, what)._gateway
