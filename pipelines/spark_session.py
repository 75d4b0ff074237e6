"""Building SparkSessions the way every job and test needs them."""
from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Families of settings whose keys are open-ended (Spark registers no entry per key).
OPEN_SETTING_PREFIXES = ("spark.hadoop.", "spark.executorEnv.", "spark.yarn.", "spark.kubernetes.",
                         "spark.driver.resource.", "spark.executor.resource.", "spark.sql.catalog.",
                         "spark.metrics.", "spark.databricks.", "spark.plugins.", "spark.eventLog.",
                         "spark.history.", "spark.ssl.", "spark.jars.", "spark.sparkseg.")

# Settings every sparkseg session gets unless the caller (or spark-submit) set them.
DEFAULT_CONF = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Our partitions are balanced on purpose; AQE must not merge them.
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def local_session(app_name: str = "sparkseg", master: str = "local[*]", conf: dict | None = None) -> SparkSession:
    """A local-mode session whose Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    merged = {**DEFAULT_CONF, "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
              "spark.sql.shuffle.partitions": "4", **(conf or {})}
    for key, value in merged.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def ship_library(session: SparkSession) -> None:
    """Make `pipelines` importable on every executor (clusters whose Python env lacks sparkseg): zip the package
    this driver runs and add it with addPyFile, once per SparkContext."""
    import shutil
    import tempfile
    from pathlib import Path

    context = session.sparkContext
    if session.conf.get("spark.sparkseg.libraryShipped", "false") == "true":
        return
    package = Path(__file__).resolve().parent
    staging = Path(tempfile.mkdtemp(prefix="sparkseg-lib-"))
    archive = shutil.make_archive(str(staging / "sparkseg_pipelines"), "zip", root_dir=package.parent,
                                  base_dir=package.name)
    context.addPyFile(archive)
    session.conf.set("spark.sparkseg.libraryShipped", "true")


def job_session(spark_config: dict, engine: str = "native") -> SparkSession:
    """The session for a job: under spark-submit (or Databricks) the existing master and settings win; run as a plain
    `python jobs/...` script it starts `spark_config['master']` (local[*] by default). The bigdl engine gets a
    session with BigDL's jars and settings (fails on the driver, naming the install command, without BigDL)."""
    active = SparkSession.getActiveSession()
    if active is not None and engine != "bigdl":
        return active
    conf = {str(k): str(v) for k, v in (spark_config.get("conf") or {}).items()}
    if engine == "bigdl":
        from pipelines.bigdl_engine import bigdl_python_env

        return bigdl_python_env(spark_config.get("master", "local[*]"), spark_config.get("app_name", "sparkseg"), conf)
    if os.environ.get("PYSPARK_GATEWAY_PORT"):   # launched by spark-submit: its master and conf win
        builder = SparkSession.builder.appName(spark_config.get("app_name", "sparkseg"))
        for key, value in {**DEFAULT_CONF, **conf}.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    else:
        session = local_session(spark_config.get("app_name", "sparkseg"), spark_config.get("master", "local[*]"), conf)
    return session


def warn_unknown_spark_settings(session: SparkSession, settings: dict) -> list[str]:
    """Log a warning for each key of `settings` that this Spark has no setting for (a typo such as
    spark.executor.core is passed on silently by Spark and changes nothing); return those keys. Spark's registry
    of settings (ConfigEntry) knows the core and SQL ones; open-ended families (spark.hadoop.*, ...) are not checked."""
    registry = session.sparkContext._jvm.org.apache.spark.internal.config.ConfigEntry
    unknown = [key for key in settings if not key.startswith(OPEN_SETTING_PREFIXES)
               and registry.findEntry(key) is None]
    for key in unknown:
        log.warning("--conf %s: Spark %s has no such setting (a typo?); passed on as given", key, session.version)
    return unknown
