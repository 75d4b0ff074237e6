"""The SQL settings a job sets on its session, and gives back when it ends (a notebook's session outlives the job):
no adaptive execution and one-partition shuffles from the first query, then Arrow batches and shuffles sized to the
job once its input is counted. Never Spark's 200 shuffle partitions, which a session the job did not start has
(spark-submit, a notebook's, a Spark Connect server's). A setting the config's spark.conf gives always wins."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipelines.job_config import JobConfig

ROWS_PER_SHUFFLE_PARTITION = 100_000


def shuffle_partitions_for(rows: int) -> int:
    """Partitions of every planning shuffle (sort, anti-join, counts) for a job of `rows` images: one per
    ROWS_PER_SHUFFLE_PARTITION, so a 9-image run needs one task per shuffle, not Spark's 200."""
    return max(1, -(-int(rows) // ROWS_PER_SHUFFLE_PARTITION))


PLANNING = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": str(shuffle_partitions_for(0))}


def planning_settings(config: JobConfig) -> dict[str, str]:
    """The SQL settings a job runs with from its first query (unless the config's spark.conf sets them):
    - no adaptive execution. Every shuffle is sized by the job and every join strategy chosen by it, so it has
      nothing to re-plan; with it, a wave's persisted results were materialized by a stage of their own and read
      back by another for the detections write, and the listing's count ran as 3 jobs;
    - one shuffle partition until the input is counted (session_settings_for): the count's shuffle carries one row
      per listing partition."""
    return {key: value for key, value in PLANNING.items() if key not in config.spark.conf}


def file_stream_settings(config: JobConfig, parallelism: int) -> dict[str, str]:
    """The settings of a file stream's query (unless the config's spark.conf sets them): each micro-batch looks up the
    status of its files, and beyond 32 files Spark does so in a job of one task per file (up to 10 000): a 500-file
    micro-batch ran 500 tasks, seconds on a small cluster. One task per core (`parallelism`) instead."""
    key = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    return {} if key in config.spark.conf else {key: str(max(1, parallelism))}


def session_settings_for(rows: int, config: JobConfig) -> dict[str, str]:
    """The SQL settings a job of `rows` units runs with once they are counted: Arrow batches of
    inference.batch_size images, and planning shuffles sized to the job (unless the config's spark.conf sets them)."""
    settings = {"spark.sql.execution.arrow.maxRecordsPerBatch": str(config.inference.batch_size)}
    if "spark.sql.shuffle.partitions" not in config.spark.conf:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions_for(rows))
    return settings


def set_session_settings(
    spark: SparkSession, settings: dict[str, str], restore: dict[str, str | None] | None = None
) -> dict[str, str | None]:
    """Apply `settings` to the session; return the values they replace (None: unset), to restore when the job ends
    (a notebook's session outlives the job). `restore` gains those of the keys it does not hold yet (it keeps the
    values from before the job when a setting is set twice)."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    if restore is not None:
        for key, value in previous.items():
            restore.setdefault(key, value)
    return previous


def restore_session_settings(spark: SparkSession, previous: dict[str, str | None]) -> None:
    for key, value in previous.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)
