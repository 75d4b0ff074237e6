"""The driver JVM's log4j2 configuration (conf/log4j2.properties): warnings and errors on the console, without
Spark's start-up noise or its words on a lost executor, and everything in a log file."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

try:  # classic pyspark; the Spark Connect client package (pyspark-client) has no SparkContext
    from pyspark import SparkContext
except ImportError:
    SparkContext = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

LOG4J_CONFIG_NAME = "log4j2.properties"
SPARK_LOG_PROPERTY = "sparkseg.spark.log"  # the JVM system property conf/log4j2.properties' log file is named by
SPARK_LOG4J_DEFAULTS = "org/apache/spark/log4j2-defaults.properties"  # what a JVM without a config of its own runs
LOG4J_FALLBACK = "org.apache.logging.log4j.core.config.DefaultConfiguration"  # log4j2's before anything configured it
LOG_FILE_APPENDER = "file"  # conf/log4j2.properties' appender of everything the driver JVM logs


def log4j_config_path() -> Path:
    """conf/log4j2.properties (the installed package's pipelines/conf copy, else the checkout's): WARN and up, without
    Spark's start-up noise. Used by jobs that start their own JVM, and under spark-submit by a JVM that runs Spark's
    defaults (quiet_running_jvm); to pass it yourself: --driver-java-options
    "-Dlog4j2.configurationFile=file:<this path>" (python -m pipelines.spark.spark_session --log4j-config)."""
    from pipelines.job_config import DEFAULT_CONFIG_CANDIDATES

    for candidate in DEFAULT_CONFIG_CANDIDATES:
        if (candidate.parent / LOG4J_CONFIG_NAME).is_file():
            return candidate.parent / LOG4J_CONFIG_NAME
    raise FileNotFoundError(f"{LOG4J_CONFIG_NAME} is missing beside the default config: reinstall sparkseg")


def spark_log_path() -> Path:
    """The driver JVM's log file (conf/log4j2.properties' `file` appender) for a JVM this process configures: one per
    driver process, in the temp directory (made only when Spark logs something)."""
    return Path(tempfile.gettempdir()) / f"sparkseg-spark-{os.getpid()}.log"


def quiet_jvm_options(conf: dict) -> dict:
    """`conf` with the driver JVM pointed at log4j_config_path() and its log file at spark_log_path() (appended to
    spark.driver.extraJavaOptions), unless the caller already chose a log4j2 configuration. Only effective when this
    process starts the JVM."""
    options = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" in options or "log4j.configurationFile" in options:
        return conf
    try:
        flag = f"-Dlog4j2.configurationFile=file:{log4j_config_path()} -D{SPARK_LOG_PROPERTY}={spark_log_path()}"
    except FileNotFoundError as err:
        log.warning("%s; Spark logs at its default level until the SparkContext starts", err)
        return conf
    return {**conf, "spark.driver.extraJavaOptions": f"{options} {flag}".strip()}


def quiet_running_jvm(jvm) -> None:
    """Switch the log4j2 configuration of a JVM that spark-submit started to log4j_config_path() (log file:
    spark_log_path()), where that JVM runs Spark's defaults or log4j2's own fallback: not where it was given
    -Dlog4j2.configurationFile or found a log4j2.properties in its SPARK_CONF_DIR. Once its SparkContext runs: the
    context's start puts Spark's defaults back (best effort: a JVM without log4j2-core keeps its configuration)."""
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    configuration = context.getConfiguration()
    location = str(configuration.getConfigurationSource().getLocation() or "")
    fallback = configuration.getClass().getName() == LOG4J_FALLBACK or location.endswith(SPARK_LOG4J_DEFAULTS)
    if jvm.System.getProperty("log4j2.configurationFile") or not fallback:
        return
    jvm.System.setProperty(SPARK_LOG_PROPERTY, str(spark_log_path()))
    context.setConfigLocation(jvm.java.net.URI(log4j_config_path().resolve().as_uri()))


def spark_log_file(jvm) -> str | None:
    """The file the driver JVM logs everything to (conf/log4j2.properties' `file` appender); None where its log4j2
    configuration has none (a configuration of the user's own)."""
    appender = (
        jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration().getAppender(LOG_FILE_APPENDER)
    )
    try:
        return str(appender.getFileName()) if appender is not None else None
    except Exception:  # noqa: BLE001 - an appender of that name that is no file appender (py4j's error classes)
        return None


def set_jvm_log_level(level: str) -> None:
    """Set the root log4j2 level of the JVM spark-submit started, before any SparkContext exists (its default
    profile logs INFO). Best effort: a JVM without log4j2-core keeps its level."""
    try:
        SparkContext._ensure_initialized()
        jvm = SparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setRootLevel(
            jvm.org.apache.logging.log4j.Level.toLevel(level)
        )
    except Exception as err:  # noqa: BLE001  (logging only; the SparkContext applies spark.log.level anyway)
        log.debug("could not set the JVM's log level early: %s", err)
